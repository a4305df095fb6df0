"""The decoder every stored row is read through, and `saver.check()`'s passes: what each
kind of bad value becomes, the invariants, the engine's own check, the async twins."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import CheckpointTuple, empty_checkpoint

from graph_durable import DurableSqliteSaver, LedgerDamaged
from graph_durable.checkpointers._decode import (
    Listing,
    checked_checkpoint,
    effect_from_row,
    event_from_row,
    lease_from_row,
    listing,
    task_run_from_row,
)
from graph_durable.checkpointers.sqlite import AsyncDurableSqliteSaver
from graph_durable.ledger import EffectStatus, IntentWrite, TransitionWrite, WriteBatch

ROW = ("k1", "t", "tools:x", "c1", "pay", '{"cents": 5}', "applied", '{"id": 1}', None, 1,
       None, 0, 1.0, 2.0)
EVENT = (7, "k1", "t", "receipt", '{"status": "in_flight"}', 2.0, "w", 3)


@pytest.mark.parametrize(("column", "value", "says"), [
    (6, "bogus", "status this release does not know"),
    (5, "{not json", "is not JSON"),
    (5, "[1, 2]", "not a JSON object"),
    (7, "{x", "is not JSON"),
    (9, "3", "not an integer"),
    (12, "yesterday", "not a number"),
    (4, 42, "not text"),
    (10, '"approve"', "not a JSON object"),
])
def test_an_effect_row_that_cannot_be_read_names_its_thread_key_and_column(
        column: int, value: Any, says: str) -> None:
    names = ("key thread_id checkpoint_ns tool_call_id tool args status receipt error "
             "attempts decision asked created_at updated_at").split()
    row = list(ROW)
    row[column] = value
    with pytest.raises(LedgerDamaged) as raised:
        effect_from_row(row)
    damaged = raised.value
    assert (damaged.thread_id, damaged.key, damaged.column, damaged.table) == (
        "t", "k1", names[column], "effects")
    assert says in damaged.problem and "graph-durable check" in str(damaged)
    assert effect_from_row(ROW).status is EffectStatus.APPLIED


def test_an_event_a_lease_and_a_run_log_entry_that_cannot_be_read_are_named() -> None:
    with pytest.raises(LedgerDamaged, match="effect_events row '7', column data"):
        event_from_row((*EVENT[:4], "not json", *EVENT[5:]))
    with pytest.raises(LedgerDamaged, match="column fencing_token"):
        event_from_row((*EVENT[:7], "three"))
    assert event_from_row(EVENT).data == {"status": "in_flight"}
    now = time.time()
    assert lease_from_row("t", ("w", 2, now + 30), now) == ("w", 2, now + 30)
    with pytest.raises(LedgerDamaged, match="over a year ahead") as raised:
        lease_from_row("t", ("w", 2, now + 400 * 86400), now)
    assert (raised.value.thread_id, raised.value.column) == ("t", "expires_at")
    with pytest.raises(LedgerDamaged, match="column token"):
        lease_from_row("t", ("w", "2", now), now)
    with pytest.raises(LedgerDamaged, match="task_runs row '1', column at"):
        task_run_from_row("t", (1, "r", "", "agent", "node", "noon"))


def test_a_listing_passes_a_damaged_row_by_and_names_it() -> None:
    rows = [ROW, (*ROW[:6], "bogus", *ROW[7:]), ROW]
    found = listing(rows, effect_from_row)
    assert isinstance(found, Listing) and len(found) == 2
    assert [(d.thread_id, d.key, d.column) for d in found.damaged] == [("t", "k1", "status")]


def test_a_checkpoint_that_decodes_to_something_else_is_damaged() -> None:
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c"}}
    good = CheckpointTuple(config, empty_checkpoint(), {"step": 0}, None, [])
    assert checked_checkpoint(good, config) is good
    for bad, says in ((good._replace(checkpoint=5), "decodes to int 5"),
                      (good._replace(pending_writes=[("task", "x")]), "pending write")):
        with pytest.raises(LedgerDamaged, match=says) as raised:
            checked_checkpoint(bad, config)
        assert (raised.value.thread_id, raised.value.table) == ("t", "checkpoints")


def _saver(path: Path) -> DurableSqliteSaver:
    saver = DurableSqliteSaver(sqlite3.connect(path, check_same_thread=False))
    saver.setup()
    return saver


def _applied(saver: Any, thread: str, keys: list[str]) -> None:
    saver.put({"configurable": {"thread_id": thread, "checkpoint_ns": ""}}, empty_checkpoint(),
              {"step": 0}, {})
    saver.claim_many([IntentWrite(key=k, thread_id=thread, checkpoint_ns="tools:x",
                                  tool_call_id=f"c-{k}", tool="pay", args={"k": k},
                                  status=EffectStatus.IN_FLIGHT) for k in keys])
    saver.apply(WriteBatch(thread, tuple(
        TransitionWrite(thread_id=thread, key=k, to=EffectStatus.APPLIED, kind="receipt",
                        receipt={"id": k}) for k in keys)))


def test_check_names_each_broken_rule(tmp_path: Path) -> None:
    saver = _saver(tmp_path / "agent.sqlite")
    _applied(saver, "a", ["k1", "k2"])
    _applied(saver, "b", ["k3"])
    assert saver.check().ok
    with saver.conn:
        saver.conn.execute("UPDATE effects SET receipt = NULL WHERE key = 'k1'")
        saver.conn.execute("DELETE FROM effect_events WHERE key = 'k1' AND kind <> 'intent'")
        saver.conn.execute("DELETE FROM effects WHERE key = 'k2'")
        saver.conn.execute("INSERT INTO thread_origins VALUES ('b', 'gone', 0)")
    report = saver.check()
    found = {(d.kind, d.thread_id, d.table, d.column) for d in report.damage}
    assert found == {("rule", "a", "effects", "receipt"),
                     ("rule", "a", "effect_events", "key"),
                     ("rule", "b", "thread_origins", "origin_thread_id")}
    assert report.threads == ["a", "b"] and not report.ok
    assert report.to_dict()["damaged_threads"] == ["a", "b"]


def test_check_reports_what_the_engine_finds_in_a_damaged_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.sqlite"
    saver = _saver(path)
    _applied(saver, "a", [f"k{i}" for i in range(400)])
    saver.conn.close()
    with sqlite3.connect(path) as conn:  # the page of the effects_key index, overwritten
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'effects_key'"
                            ).fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    with open(path, "r+b") as file:
        file.seek((root - 1) * size)
        file.write(b"\x07" * size)
    reader = DurableSqliteSaver.open_read_only(str(path))
    report = reader.check(full=True)
    assert report.engine_check == "PRAGMA integrity_check"
    assert [d.kind for d in report.damage if d.kind == "engine"], report.damage


async def test_the_async_saver_checks_itself_on_its_loop(tmp_path: Path) -> None:
    path = tmp_path / "agent.sqlite"
    _applied(_saver(path), "a", ["k1"])
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE effect_events SET data = 'x' WHERE kind = 'receipt'")
    import aiosqlite

    async with aiosqlite.connect(path) as conn:
        saver = AsyncDurableSqliteSaver(conn)
        report = await saver.acheck()
        assert [(d.thread_id, d.table, d.column) for d in report.damage] == [
            ("a", "effect_events", "data")]
        with pytest.raises(LedgerDamaged):
            await saver.aevents("a")
        assert len(await saver.aevents()) == 1


def test_postgres_checks_with_amcheck_when_installed(postgres_conninfo: str) -> None:
    import psycopg

    from graph_durable.checkpointers.postgres import DurablePostgresSaver

    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as saver:
        saver.setup()
        _applied(saver, "a", ["k1", "k2"])
        assert saver.check().engine_check == "catalog" and saver.check().ok
        with psycopg.connect(postgres_conninfo, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS amcheck")
            conn.execute("UPDATE effects SET status = 'bogus' WHERE key = 'k2'")
        report = saver.check()
        assert report.engine_check.startswith("amcheck")
        assert [(d.thread_id, d.key, d.column) for d in report.damage] == [("a", "k2", "status")]


def test_a_healthy_database_of_ten_thousand_effects_checks_clean(tmp_path: Path) -> None:
    saver = _saver(tmp_path / "agent.sqlite")
    for thread in range(100):
        _applied(saver, f"t{thread}", [f"k{thread}-{i}" for i in range(100)])
    report = saver.check(full=True)
    assert report.ok, report.damage[:3]
    assert (report.rows["effects"], report.rows["effect_events"]) == (10_000, 20_000)
    assert report.seconds < 30  # about 0.4 s on a quiet machine


async def test_the_async_postgres_saver_checks_itself(postgres_conninfo: str) -> None:
    import psycopg

    from graph_durable.checkpointers.postgres import AsyncDurablePostgresSaver

    async with AsyncDurablePostgresSaver.from_conn_string(postgres_conninfo) as saver:
        await saver.setup()
        await saver.aput({"configurable": {"thread_id": "a", "checkpoint_ns": ""}},
                         empty_checkpoint(), {"step": 0}, {})
        assert (await saver.acheck()).ok
        with psycopg.connect(postgres_conninfo, autocommit=True) as conn:
            conn.execute("UPDATE checkpoints SET checkpoint = '[1]'::jsonb")
        report = await saver.acheck()
        assert [(d.thread_id, d.table, d.column) for d in report.damage] == [
            ("a", "checkpoints", "checkpoint")]
        with pytest.raises(LedgerDamaged):
            await saver.aget_tuple({"configurable": {"thread_id": "a", "checkpoint_ns": ""}})
