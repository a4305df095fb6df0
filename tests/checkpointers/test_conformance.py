"""Both durable savers pass langgraph-checkpoint-conformance with all 8 capabilities."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import aiosqlite
import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from graph_durable import AsyncDurableSqliteSaver, DurableSqliteSaver


def _assert_all_passed(report) -> None:
    failures = {
        name: [f for f in result.failures]
        for name, result in report.results.items()
        if result.passed is not True
    }
    assert not failures, f"conformance failures: {failures}"
    assert {name for name, r in report.results.items() if r.detected} == {
        cap.value for cap in ALL_CAPABILITIES
    }
    assert report.conformance_level() == "FULL"


async def test_sync_saver_passes_all_eight_capabilities(tmp_path: Path) -> None:
    counter = iter(range(100))

    @checkpointer_test(name="DurableSqliteSaver")
    async def factory():
        conn = sqlite3.connect(tmp_path / f"c{next(counter)}.sqlite", check_same_thread=False)
        try:
            yield DurableSqliteSaver(conn)
        finally:
            conn.close()

    _assert_all_passed(await validate(factory))


async def test_async_saver_passes_all_eight_capabilities(tmp_path: Path) -> None:
    counter = iter(range(100))

    @checkpointer_test(name="AsyncDurableSqliteSaver")
    async def factory():
        async with aiosqlite.connect(tmp_path / f"a{next(counter)}.sqlite") as conn:
            yield AsyncDurableSqliteSaver(conn)

    _assert_all_passed(await validate(factory))


@pytest.mark.parametrize("saver_type", ["sqlite"])
async def test_stock_sync_saver_is_not_enough(tmp_path: Path, saver_type: str) -> None:
    """The reason the durable saver implements the async methods: the stock one fails."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    @checkpointer_test(name="SqliteSaver")
    async def factory():
        conn = sqlite3.connect(tmp_path / "stock.sqlite", check_same_thread=False)
        try:
            yield SqliteSaver(conn)
        finally:
            conn.close()

    report = await validate(factory)
    assert report.conformance_level() != "FULL"
