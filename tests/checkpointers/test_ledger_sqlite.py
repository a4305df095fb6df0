"""DurableSqliteSaver's ledger: migrations, transitions, journal and retention."""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.sqlite import SqliteSaver

from graph_durable import DurableSqliteSaver
from graph_durable.checkpointers._schema import MIGRATIONS, SQLITE_READABLE_FROM
from graph_durable.errors import GraphDurableError, IllegalTransition, LeaseLost
from graph_durable.ledger import EffectStatus, IntentWrite, TransitionWrite

S = EffectStatus


def open_saver(path: Path) -> DurableSqliteSaver:
    return DurableSqliteSaver(sqlite3.connect(path, check_same_thread=False))


def intent(thread_id: str = "t", key: str = "k1") -> IntentWrite:
    return IntentWrite(key=key, thread_id=thread_id, checkpoint_ns="tools:x",
                       tool_call_id="c1", tool="pay", args={"cents": 5}, status=S.IN_FLIGHT)


def put_checkpoint(saver: DurableSqliteSaver, thread_id: str, parent: dict | None = None) -> dict:
    config = parent or {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    return saver.put(config, empty_checkpoint(), {"step": 0}, {})


def test_setup_is_idempotent_and_records_the_version(tmp_path: Path) -> None:
    saver = open_saver(tmp_path / "a.sqlite")
    saver.setup()
    saver.setup()
    again = open_saver(tmp_path / "a.sqlite")
    again.setup()
    versions = again.conn.execute("SELECT v FROM graph_durable_migrations").fetchall()
    assert versions == [(v,) for v in range(len(MIGRATIONS))]


def test_a_stock_sqlite_database_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "stock.sqlite"
    stock = SqliteSaver(sqlite3.connect(path, check_same_thread=False))
    stored = put_checkpoint(stock, "old")
    saver = open_saver(path)
    assert saver.get_tuple(stored) is not None
    saver.apply(intent())
    assert saver.effect("k1").status is S.IN_FLIGHT


def test_transitions_are_journaled_in_order(tmp_path: Path) -> None:
    saver = open_saver(tmp_path / "a.sqlite")
    saver.apply(intent())
    [record] = saver.apply(TransitionWrite(thread_id="t", key="k1", to=S.APPLIED,
                                           kind="receipt", receipt={"id": 7}, result="ok"))
    assert record.status is S.APPLIED and record.receipt == {"id": 7}
    assert saver.stored_result("t", "k1") == "ok"
    events = saver.events("t")
    assert [e.kind for e in events] == ["intent", "receipt"]
    assert events[0].seq < events[1].seq


def test_an_illegal_transition_writes_nothing(tmp_path: Path) -> None:
    saver = open_saver(tmp_path / "a.sqlite")
    saver.apply(intent())
    saver.apply(TransitionWrite(thread_id="t", key="k1", to=S.FAILED, kind="failure",
                                error="declined"))
    before = (saver.effects(), saver.events())
    with pytest.raises(IllegalTransition, match="failed; it cannot become in_flight"):
        saver.apply(TransitionWrite(thread_id="t", key="k1", to=S.IN_FLIGHT, kind="attempt",
                                    bump_attempts=True))
    assert (saver.effects(), saver.events()) == before


def test_delete_thread_removes_the_ledger_too(tmp_path: Path) -> None:
    saver = open_saver(tmp_path / "a.sqlite")
    put_checkpoint(saver, "t")
    saver.apply(intent("t"))
    saver.apply(intent("u", key="k2"))
    saver.delete_thread("t")
    assert [r.thread_id for r in saver.effects()] == ["u"]
    assert {e.thread_id for e in saver.events()} == {"u"}


def test_prune_keep_latest_keeps_the_ledger_and_delete_removes_it(tmp_path: Path) -> None:
    saver = open_saver(tmp_path / "a.sqlite")
    first = put_checkpoint(saver, "t")
    put_checkpoint(saver, "t", parent=first)
    saver.apply(intent("t"))
    saver.prune(["t"])
    assert len(list(saver.list({"configurable": {"thread_id": "t"}}))) == 1
    assert len(saver.effects("t")) == 1
    saver.prune(["t"], strategy="delete")
    assert saver.effects("t") == [] and saver.events("t") == []


def test_copy_thread_copies_effects_under_the_same_keys(tmp_path: Path) -> None:
    saver = open_saver(tmp_path / "a.sqlite")
    put_checkpoint(saver, "src")
    saver.apply(intent("src", key="k1"))
    saver.copy_thread("src", "dst")
    copied = saver.effect("k1", "dst")
    assert copied is not None and copied.status is S.IN_FLIGHT
    assert [e.kind for e in saver.events("dst")] == ["intent"]
    assert saver.get_tuple({"configurable": {"thread_id": "dst", "checkpoint_ns": ""}})


def _as_migrated_to(path: Path, version: int, *extra: str) -> None:
    """Make the database at `path` look as a release whose last migration was `version`
    left it (its extra statements run first)."""
    conn = sqlite3.connect(path)
    for statement in extra:
        conn.execute(statement)
    conn.execute("DELETE FROM graph_durable_migrations WHERE v > ?", (version,))
    conn.commit()
    conn.close()


def test_the_journal_has_no_index_by_key_and_a_keys_entries_are_read_in_every_thread(
        tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite"
    saver = open_saver(path)
    put_checkpoint(saver, "src")
    saver.apply(intent("src", key="k1"))
    saver.apply(intent("src", key="k2"))
    saver.copy_thread("src", "dst")
    saver.apply(TransitionWrite(thread_id="dst", key="k1", to=S.APPLIED, kind="receipt",
                                receipt={"id": 7}, result="ok"))
    saver.apply(intent("other", key="k3"))
    saver.conn.close()
    # The database as the release before migration 9 left it: the journal's key index there.
    _as_migrated_to(path, 8, "CREATE INDEX effect_events_key ON effect_events (key, seq)")

    reader = DurableSqliteSaver.open_read_only(str(path))  # schema 8 reads as it is
    assert [(e.thread_id, e.kind) for e in reader.events(key="k1")] == [
        ("src", "intent"), ("dst", "intent"), ("dst", "receipt")]
    reader.conn.close()

    again = open_saver(path)
    again.setup()
    indexes = {name for (name,) in again.conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "effect_events_key" not in indexes and "effect_events_thread" in indexes
    versions = again.conn.execute("SELECT MAX(v) FROM graph_durable_migrations").fetchone()
    assert versions == (len(MIGRATIONS) - 1,)
    events = again.events(key="k1")
    assert [(e.thread_id, e.kind) for e in events] == [
        ("src", "intent"), ("dst", "intent"), ("dst", "receipt")]
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    assert [e.kind for e in again.events("dst", key="k1")] == ["intent", "receipt"]
    assert again.events(key="k9") == []


def test_a_reader_refuses_a_ledger_older_than_it_reads(tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite"
    open_saver(path).setup()
    _as_migrated_to(path, SQLITE_READABLE_FROM - 1)
    with pytest.raises(GraphDurableError, match=rf"schema {SQLITE_READABLE_FROM - 1}, this one "
                                                rf"reads {SQLITE_READABLE_FROM} and later"):
        DurableSqliteSaver.open_read_only(str(path))


def test_delete_for_runs_keeps_the_ledger(tmp_path: Path) -> None:
    saver = open_saver(tmp_path / "a.sqlite")
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "run_id": "r1"}}
    saver.put(config, empty_checkpoint(), {"step": 0, "run_id": "r1"}, {})
    saver.apply(intent("t"))
    saver.delete_for_runs(["r1"])
    assert list(saver.list({"configurable": {"thread_id": "t"}})) == []
    assert len(saver.effects("t")) == 1


def test_list_can_be_consumed_while_calling_get_tuple(tmp_path: Path) -> None:
    """The stock saver holds its lock while yielding: this deadlocks there."""
    saver = open_saver(tmp_path / "a.sqlite")
    first = put_checkpoint(saver, "t")
    put_checkpoint(saver, "t", parent=first)
    seen: list[bool] = []

    def walk() -> None:
        for item in saver.list({"configurable": {"thread_id": "t"}}):
            seen.append(saver.get_tuple(item.config) is not None)

    worker = threading.Thread(target=walk, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive() and seen == [True, True]


# -- claims and deferred receipts ----------------------------------------------------------


def receipt(thread_id: str = "t", key: str = "k1") -> TransitionWrite:
    return TransitionWrite(thread_id=thread_id, key=key, to=S.APPLIED, kind="receipt",
                           receipt={"id": 7}, result="ok", error=None, defer=True)


def test_claim_many_records_new_keys_and_reports_known_ones(tmp_path: Path) -> None:
    saver = open_saver(tmp_path / "a.sqlite")
    saver.claim(intent(key="k1"))
    claimed = saver.claim_many([intent(key="k1"), intent(key="k2"), intent(key="k3")])
    assert [(record.key, created) for record, created in claimed] == [
        ("k1", False), ("k2", True), ("k3", True)]
    assert [(e.key, e.kind) for e in saver.events("t")] == [
        ("k1", "intent"), ("k2", "intent"), ("k3", "intent")]
    # Committed: another connection sees every claimed intent.
    other = open_saver(tmp_path / "a.sqlite")
    assert {r.key for r in other.effects("t", status="in_flight")} == {"k1", "k2", "k3"}


def test_claim_many_fenced_out_records_nothing(tmp_path: Path) -> None:
    saver = open_saver(tmp_path / "a.sqlite")
    saver.acquire_lease("t", "someone-else", ttl=60)
    with pytest.raises(LeaseLost):
        saver.claim_many([intent(key="k1"), intent(key="k2")])
    assert saver.effects() == [] and saver.events() == []


def test_a_deferred_receipt_commits_with_the_threads_next_write(tmp_path: Path) -> None:
    saver = open_saver(tmp_path / "a.sqlite")
    saver.claim(intent())
    assert saver.apply(receipt()) == []
    assert saver.effect("k1", "t").status is S.IN_FLIGHT
    put_checkpoint(saver, "u")  # another thread's write does not carry it
    assert saver.effect("k1", "t").status is S.IN_FLIGHT
    put_checkpoint(saver, "t")
    record = saver.effect("k1", "t")
    assert record.status is S.APPLIED and record.receipt == {"id": 7} and record.error is None
    assert saver.stored_result("t", "k1") == "ok"
    assert [e.kind for e in saver.events("t")] == ["intent", "receipt"]


def test_a_deferred_write_is_journaled_as_one_committed_at_once(tmp_path: Path) -> None:
    saver = open_saver(tmp_path / "a.sqlite")
    for thread_id in ("now", "deferred"):
        key = f"k-{thread_id}"
        with saver.lease(thread_id, "worker", ttl=60) as lease:
            saver.claim(intent(thread_id, key), lease.config)
            for write in (
                TransitionWrite(thread_id=thread_id, key=key, to=S.IN_FLIGHT, kind="attempt",
                                bump_attempts=True, data={"reason": "again"}),
                receipt(thread_id, key),
            ):
                saver.apply(dataclasses.replace(write, defer=thread_id == "deferred"),
                            lease.config)
            put_checkpoint(saver, thread_id, {"configurable": {
                "checkpoint_ns": "", **lease.config["configurable"]}})

    def journal(thread_id: str) -> list[tuple]:
        return [(e.kind, e.data, e.owner, e.fencing_token) for e in saver.events(thread_id)]

    def effect(thread_id: str) -> dict:
        return saver.effect(f"k-{thread_id}", thread_id).model_dump(
            exclude={"key", "thread_id", "created_at", "updated_at"})

    assert journal("deferred") == journal("now")
    assert [data for _, data, _, _ in journal("deferred")][1:] == [
        {"status": "in_flight", "reason": "again", "attempt": 2}, {"status": "applied"}]
    assert effect("deferred") == effect("now")
    assert effect("deferred")["attempts"] == 2


def test_a_deferred_receipt_the_lifecycle_no_longer_allows_is_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    saver = open_saver(tmp_path / "a.sqlite")
    saver.claim(intent())
    saver.apply(receipt())
    # Meanwhile another process settles the effect (say, a reviewer says it failed).
    open_saver(tmp_path / "a.sqlite").apply(TransitionWrite(
        thread_id="t", key="k1", to=S.FAILED, kind="failure", error="declined"))
    assert_the_deferred_receipt_is_dropped(saver, put_checkpoint, caplog)


def assert_the_deferred_receipt_is_dropped(saver: Any, put_checkpoint: Any,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """The next checkpoint of thread `t` stores, and drops with a warning the deferred
    receipt of effect `k1` (settled meanwhile): the ledger stays as it was."""
    before = (saver.effects(), saver.events())
    with caplog.at_level("WARNING", logger="graph_durable"):
        put_checkpoint(saver, "t")
    assert (saver.effects(), saver.events()) == before
    assert len(list(saver.list({"configurable": {"thread_id": "t"}}))) == 1
    assert "Deferred receipt of effect 'k1' in thread 't' dropped" in caplog.text


def assert_still_deferred(saver: DurableSqliteSaver) -> None:
    """Effect `k1` of thread `t` is in flight, and its deferred receipt rides on the
    thread's next write."""
    assert saver.effect("k1", "t").status is S.IN_FLIGHT
    put_checkpoint(saver, "t")
    assert saver.effect("k1", "t").status is S.APPLIED


def test_a_deferred_receipt_survives_a_write_that_rolls_back(tmp_path: Path) -> None:
    saver = open_saver(tmp_path / "a.sqlite")
    saver.claim(intent())
    saver.apply(receipt())
    saver._checkpoint_statement = lambda *args: (("INSERT INTO nowhere VALUES (?)", (1,)),
                                                 None)
    with pytest.raises(sqlite3.OperationalError, match="nowhere"):
        put_checkpoint(saver, "t")
    del saver._checkpoint_statement
    assert_still_deferred(saver)


def test_a_second_check_of_a_thread_in_one_transaction_does_not_carry_its_receipt_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A batch checks a thread once per fencing token, in one transaction: the receipt
    the first check carries is not carried (and refused) again by the second, so it is
    neither warned of nor dropped, and survives the transaction rolling back."""
    saver = open_saver(tmp_path / "a.sqlite")
    saver.claim(intent())
    saver.apply(receipt())
    with caplog.at_level("DEBUG", logger="graph_durable"):
        with pytest.raises(RuntimeError, match="rolled back"):
            with saver._txn("t") as cur:  # the first check carries the receipt
                saver._check_write_txn(cur, "t", None)  # a second fencing token's check
                raise RuntimeError("rolled back")
    assert "Deferred receipt" not in caplog.text
    assert_still_deferred(saver)
    assert [e.kind for e in saver.events("t")] == ["intent", "receipt"]


def test_a_receipt_whose_carrying_savepoint_rolled_back_stays_deferred(tmp_path: Path) -> None:
    """A batch's check runs in a savepoint: when carrying the receipts fails there, the
    savepoint undoes them while the batch's other writes commit; the receipts stay
    deferred for the next write."""
    from graph_durable.checkpointers.sqlite._txn import _in_savepoint

    saver = open_saver(tmp_path / "a.sqlite")
    saver.claim(intent())
    saver.apply(receipt())
    apply_deferred = saver._apply_deferred_txn

    def broken(*args: Any, **kwargs: Any) -> Any:
        apply_deferred(*args, **kwargs)  # the update is made, then the flush fails
        raise RuntimeError("a row that does not decode")

    saver._apply_deferred_txn = broken
    with saver._txn() as cur:
        error = _in_savepoint(cur, lambda: saver._check_write_txn(cur, "t", None))
    assert isinstance(error, RuntimeError)
    del saver._apply_deferred_txn
    assert_still_deferred(saver)


def test_a_receipt_already_applied_when_carried_is_dropped_without_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The receipt another write carrying it committed first (or one recorded
    elsewhere): the effect is already applied, so the lifecycle refuses it again, and
    that is no news."""
    saver = open_saver(tmp_path / "a.sqlite")
    saver.claim(intent())
    saver.apply(receipt())
    open_saver(tmp_path / "a.sqlite").apply(dataclasses.replace(receipt(), defer=False))
    with caplog.at_level("WARNING", logger="graph_durable"):
        put_checkpoint(saver, "t")
    assert "Deferred receipt" not in caplog.text
    assert saver._deferred == {} and saver._encoded == {}
    assert [e.kind for e in saver.events("t")] == ["intent", "receipt"]


def test_deleting_a_thread_drops_its_deferred_receipts(tmp_path: Path) -> None:
    saver = open_saver(tmp_path / "a.sqlite")
    saver.claim(intent())
    saver.apply(receipt())
    saver.delete_thread("t")
    put_checkpoint(saver, "t")  # the thread id reused: nothing left to carry
    assert saver.effects() == [] and saver.events() == []


def test_a_copy_carries_its_sources_deferred_receipts(tmp_path: Path) -> None:
    saver = open_saver(tmp_path / "a.sqlite")
    put_checkpoint(saver, "t")
    saver.claim(intent())
    saver.apply(receipt())
    saver.copy_thread("t", "fork")
    assert saver.effect("k1", "fork").status is S.APPLIED
    assert saver.effect("k1", "t").status is S.APPLIED
    assert saver.key_thread("fork") == "t" and saver.key_thread("t") == "t"
