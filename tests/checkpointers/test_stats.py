"""`saver.stats()` / `astats()`: the ledger's gauges (effects by status, the questions
waiting for a person and the oldest), on SQLite and on a real PostgreSQL, sync and async."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from graph_durable import AsyncDurableSqliteSaver, DurableSqliteSaver
from graph_durable.checkpointers.postgres import AsyncDurablePostgresSaver, DurablePostgresSaver
from graph_durable.ledger import EffectStatus, IntentWrite, TransitionWrite
from graph_durable.telemetry import LedgerStats

S = EffectStatus


def ledger_writes() -> list[IntentWrite | TransitionWrite]:
    """Two threads: one call in flight, one unknown and asked, one awaiting approval
    (asked), one approved but not yet sent (asked, decided), one applied."""
    def intent(thread: str, key: str, status: EffectStatus = S.IN_FLIGHT) -> IntentWrite:
        return IntentWrite(key=key, thread_id=thread, checkpoint_ns="tools:x",
                           tool_call_id=f"c-{key}", tool="pay", args={"card": "4242"},
                           status=status)

    def move(thread: str, key: str, to: EffectStatus, kind: str, **kw: Any) -> TransitionWrite:
        return TransitionWrite(thread_id=thread, key=key, to=to, kind=kind, **kw)

    return [
        intent("t1", "k1"),
        intent("t1", "k2"), move("t1", "k2", S.UNKNOWN, "unknown", error="timeout"),
        move("t1", "k2", S.UNKNOWN, "asked", asked=True),
        intent("t2", "k3", S.AWAITING_APPROVAL),
        move("t2", "k3", S.AWAITING_APPROVAL, "asked", asked=True),
        intent("t2", "k4", S.AWAITING_APPROVAL),
        move("t2", "k4", S.AWAITING_APPROVAL, "asked", asked=True),
        move("t2", "k4", S.AWAITING_APPROVAL, "decision", decision={"type": "approve"}),
        intent("t2", "k5"), move("t2", "k5", S.APPLIED, "receipt", receipt={"id": 1},
                                 result="ok"),
    ]


def fill(saver: Any) -> None:
    for write in ledger_writes():
        saver.apply(write)


async def afill(saver: Any) -> None:
    for write in ledger_writes():
        await saver.aapply(write)


def check(stats: LedgerStats, asked_at: float) -> None:
    assert stats.effects == {**{s.value: 0 for s in S}, "in_flight": 1, "unknown": 1,
                             "awaiting_approval": 2, "applied": 1}
    assert (stats.in_flight, stats.unknown, stats.threads) == (1, 1, 2)
    assert stats.questions_waiting == 2  # the approved call no longer waits for anyone
    assert stats.oldest_question_at == asked_at
    assert stats.oldest_question_age is not None and 0 <= stats.oldest_question_age < 60
    assert stats.orphans is None  # the saver reads the ledger only


def test_sqlite(tmp_path: Path) -> None:
    saver = DurableSqliteSaver(sqlite3.connect(tmp_path / "a.sqlite", check_same_thread=False))
    empty = saver.stats()
    assert sum(empty.effects.values()) == 0 and empty.questions_waiting == 0
    assert empty.oldest_question_at is None and empty.oldest_question_age is None
    fill(saver)
    check(saver.stats(), saver.effect("k2", "t1").updated_at)  # type: ignore[union-attr]


async def test_sqlite_async_and_the_async_twin_of_the_sync_saver(tmp_path: Path) -> None:
    async with AsyncDurableSqliteSaver.from_conn_string(str(tmp_path / "a.sqlite")) as saver:
        await afill(saver)
        asked_at = (await saver.aeffect("k2", "t1")).updated_at  # type: ignore[union-attr]
        check(await saver.astats(), asked_at)
    sync = DurableSqliteSaver(sqlite3.connect(tmp_path / "a.sqlite", check_same_thread=False))
    check(await sync.astats(), asked_at)


def test_postgres(postgres_conninfo: str) -> None:
    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as saver:
        assert saver.stats().questions_waiting == 0
        fill(saver)
        check(saver.stats(), saver.effect("k2", "t1").updated_at)  # type: ignore[union-attr]


async def test_postgres_async(postgres_conninfo: str) -> None:
    async with AsyncDurablePostgresSaver.from_conn_string(postgres_conninfo) as saver:
        await saver.setup()
        await afill(saver)
        asked_at = (await saver.aeffect("k2", "t1")).updated_at  # type: ignore[union-attr]
        check(await saver.astats(), asked_at)


def test_the_summary_and_dict_say_the_same() -> None:
    stats = LedgerStats(effects={"unknown": 2, "in_flight": 0}, questions_waiting=1,
                        oldest_question_at=100.0, read_at=160.0, orphans=3, threads=1)
    assert stats.to_dict()["oldest_question_age"] == 60.0
    text = stats.summary()
    assert "unknown: 2" in text and "questions waiting: 1 (oldest 60 s)" in text
    assert "orphans: 3" in text
