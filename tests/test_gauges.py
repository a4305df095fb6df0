"""`ledger_stats` counts the orphans `find_orphans` finds; `register_gauges` exports the
ledger's state as OpenTelemetry gauges, read once per collection."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from langgraph.checkpoint.base import empty_checkpoint
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from graph_durable import (
    AsyncDurableSqliteSaver,
    DurableSqliteSaver,
    aledger_stats,
    find_orphans,
    ledger_stats,
    register_gauges,
)
from tests.checkpointers.test_stats import afill, fill


def with_checkpoint(saver: Any, thread_id: str) -> None:
    """A checkpoint for `thread_id` whose next step runs no tools task: the thread's open
    effects are orphans (no pending task will run them again)."""
    saver.put({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}},
              empty_checkpoint(), {"step": 0}, {})


def saver_on(path: Path) -> DurableSqliteSaver:
    return DurableSqliteSaver(sqlite3.connect(path, check_same_thread=False))


def test_ledger_stats_counts_the_orphans(tmp_path: Path) -> None:
    saver = saver_on(tmp_path / "a.sqlite")
    fill(saver)
    assert ledger_stats(saver).orphans == 0  # no checkpoint: no thread to resume
    with_checkpoint(saver, "t1")
    orphans = find_orphans(saver)
    assert {o.key for o in orphans} == {"k1", "k2"}
    stats = ledger_stats(saver)
    assert stats.orphans == 2 and stats.unknown == 1


async def test_aledger_stats_on_an_async_saver(tmp_path: Path) -> None:
    async with AsyncDurableSqliteSaver.from_conn_string(str(tmp_path / "a.sqlite")) as saver:
        await afill(saver)
        await saver.aput({"configurable": {"thread_id": "t1", "checkpoint_ns": ""}},
                         empty_checkpoint(), {"step": 0}, {})
        stats = await aledger_stats(saver)
        assert stats.orphans == 2 and stats.questions_waiting == 2


def gauges(reader: InMemoryMetricReader) -> dict[str, list[tuple[Any, dict[str, Any]]]]:
    found: dict[str, list[tuple[Any, dict[str, Any]]]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found[metric.name] = [(p.value, dict(p.attributes or {}))
                                      for p in metric.data.data_points]
    return found


def test_register_gauges_exports_what_ledger_stats_reads(tmp_path: Path) -> None:
    saver = saver_on(tmp_path / "a.sqlite")
    fill(saver)
    with_checkpoint(saver, "t1")
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    reads = 0
    stats = saver.stats

    def counted() -> Any:
        nonlocal reads
        reads += 1
        return stats()

    saver.stats = counted  # type: ignore[method-assign]
    handle = register_gauges(saver, meter)
    found = gauges(reader)
    assert reads == 1  # one read serves every gauge of the collection
    effects = {attributes["graph_durable.effect.status"]: value
               for value, attributes in found["graph_durable.effects"]}
    assert effects["unknown"] == 1 and effects["awaiting_approval"] == 2
    assert found["graph_durable.questions.waiting"] == [(2, {})]
    [(age, _)] = found["graph_durable.questions.oldest_age"]
    assert 0 <= age < 60
    assert found["graph_durable.orphans"] == [(2, {})]
    handle.close()
    assert all(not points for points in gauges(reader).values())
