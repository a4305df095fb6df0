"""LangGraph's tables fence the rows written to them (PostgreSQL migration 15): a
checkpoint write without a fencing token sends no fence of its own, and is refused all
the same while another worker holds the thread's lease; so is any other writer's."""

from __future__ import annotations

from typing import Any

import pytest

psycopg = pytest.importorskip("psycopg")

from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402
from langgraph.checkpoint.postgres import PostgresSaver  # noqa: E402

from graph_durable.checkpointers.postgres import (  # noqa: E402
    AsyncDurablePostgresSaver,
    DurablePostgresSaver,
)
from graph_durable.errors import LeaseLost  # noqa: E402
from graph_durable.testing.pg_trace import round_trips  # noqa: E402

TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")


def config(thread_id: str, **configurable: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", **configurable}}


def executed(saver: DurablePostgresSaver, write: Any) -> int:
    """Statements `write()` sends on the saver's connection."""
    with round_trips(saver.conn) as seen:
        write()
    return sum(kind == "Execute" for sent in seen.sent for kind in sent)


def put(saver: Any, thread_id: str, **configurable: Any) -> dict[str, Any]:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"note": "x"}
    checkpoint["channel_versions"] = {"note": 1}
    return saver.put(config(thread_id, **configurable), checkpoint, {"step": 0},
                     {"note": 1})


def drop_triggers(conninfo: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for table in TABLES:
            conn.execute(f"DROP TRIGGER graph_durable_fence ON {table}")


def test_a_write_without_a_token_leaves_its_fence_to_the_tables(postgres_conninfo) -> None:
    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as fenced:
        fenced.setup()
        assert fenced._rows_fenced
        stored = put(fenced, "t")
        by_tables = executed(fenced, lambda: put(fenced, "t"))
        by_tables_writes = executed(fenced, lambda: fenced.put_writes(
            stored, [("note", "y")], "task-1"))
    drop_triggers(postgres_conninfo)
    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as unfenced:
        unfenced.setup()
        assert not unfenced._rows_fenced  # the saver sends the fence itself again
        stored = put(unfenced, "u")
        assert executed(unfenced, lambda: put(unfenced, "u")) == by_tables + 1
        assert executed(unfenced, lambda: unfenced.put_writes(
            stored, [("note", "y")], "task-1")) == by_tables_writes + 1


@pytest.mark.parametrize("triggers", [True, False], ids=["tables fence", "saver fences"])
def test_a_write_without_a_token_is_refused_while_another_worker_holds_the_lease(
        postgres_conninfo, triggers: bool) -> None:
    if not triggers:
        with DurablePostgresSaver.from_conn_string(postgres_conninfo) as first:
            first.setup()
        drop_triggers(postgres_conninfo)
    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as saver, \
            DurablePostgresSaver.from_conn_string(postgres_conninfo) as other:
        saver.setup()
        assert saver._rows_fenced is triggers
        stored = put(saver, "t")
        lease = other.acquire_lease("t", "worker-b", ttl=60)
        with pytest.raises(LeaseLost, match="worker-b"):
            put(saver, "t")
        with pytest.raises(LeaseLost, match="worker-b"):
            saver.put_writes(stored, [("note", "y")], "task-1")
        # The lease holder writes with its token, its fence sent (and marked) first.
        put(other, "t", **{k: v for k, v in lease.config["configurable"].items()
                           if k not in ("thread_id", "checkpoint_ns")})
        other.release_lease(lease)
        put(saver, "t")
        assert len(list(saver.list(config("t")))) == 3
        assert saver.get_tuple(stored).pending_writes == []


def test_the_tables_refuse_any_writer_into_a_thread_another_worker_holds(
        postgres_conninfo) -> None:
    """LangGraph's own saver, on the same database: its checkpoint of a leased thread
    is refused by the tables (SQLSTATE GD001), nothing of it stored."""
    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as durable, \
            PostgresSaver.from_conn_string(postgres_conninfo) as stock:
        durable.setup()
        lease = durable.acquire_lease("t", "worker-a", ttl=60)
        with pytest.raises(psycopg.DatabaseError) as refused:
            put(stock, "t")
        assert refused.value.sqlstate == "GD001"
        assert list(durable.list(config("t"))) == []
        put(stock, "free")  # a thread nobody holds
        durable.release_lease(lease)
        put(stock, "t")
        assert len(list(durable.list(config("t")))) == 1


def test_a_copy_into_a_thread_stays_unfenced(postgres_conninfo) -> None:
    """`copy_thread` fences neither thread (its source is locked while it copies):
    the tables let its rows into a target another worker holds, as before them."""
    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as saver, \
            DurablePostgresSaver.from_conn_string(postgres_conninfo) as other:
        put(saver, "src")
        lease = other.acquire_lease("dst", "worker-b", ttl=60)
        saver.copy_thread("src", "dst")
        other.release_lease(lease)
        assert len(list(saver.list(config("dst")))) == 1


async def test_the_async_saver_leaves_its_fence_to_the_tables_too(postgres_conninfo) -> None:
    async with AsyncDurablePostgresSaver.from_conn_string(postgres_conninfo) as saver:
        await saver.setup()
        assert saver._rows_fenced
        checkpoint = empty_checkpoint()
        stored = await saver.aput(config("t"), checkpoint, {"step": 0}, {})
        with round_trips(saver.conn) as seen:
            await saver.aput_writes(stored, [("note", "y")], "task-1")
        statements = sum(kind == "Execute" for sent in seen.sent for kind in sent)
        with DurablePostgresSaver.from_conn_string(postgres_conninfo) as other:
            lease = other.acquire_lease("t", "worker-b", ttl=60)
            with pytest.raises(LeaseLost, match="worker-b"):
                await saver.aput_writes(stored, [("note", "z")], "task-2")
            other.release_lease(lease)
        saver._rows_fenced = False
        with round_trips(saver.conn) as seen:
            await saver.aput_writes(stored, [("note", "y")], "task-3")
        assert sum(kind == "Execute" for sent in seen.sent for kind in sent) == statements + 1
        assert {w[0] for w in (await saver.aget_tuple(stored)).pending_writes} == {
            "task-1", "task-3"}


def test_a_deferred_receipt_rides_after_langgraphs_rows_which_fence_it(
        postgres_conninfo) -> None:
    """A checkpoint write carrying a deferred receipt sends it after LangGraph's rows,
    whose trigger fenced the transaction: no fence statement, and a refused write keeps
    the receipt for the next one."""
    from graph_durable.ledger import EffectStatus, IntentWrite, TransitionWrite

    def receipt(key: str) -> TransitionWrite:
        return TransitionWrite(thread_id="t", key=key, to=EffectStatus.APPLIED,
                               kind="receipt", receipt={"id": key}, result="ok", defer=True)

    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as saver, \
            DurablePostgresSaver.from_conn_string(postgres_conninfo) as other:
        saver.claim_many([IntentWrite(key=key, thread_id="t", checkpoint_ns="", tool="pay",
                                      tool_call_id=f"c-{key}", args={"cents": 5},
                                      status=EffectStatus.IN_FLIGHT) for key in "abc"])
        saver.apply(receipt("a"))
        by_tables = executed(saver, lambda: put(saver, "t"))
        saver._rows_fenced = False
        saver.apply(receipt("b"))
        assert executed(saver, lambda: put(saver, "t")) == by_tables + 1
        saver._rows_fenced = True
        saver.apply(receipt("c"))
        lease = other.acquire_lease("t", "worker-b", ttl=60)
        with pytest.raises(LeaseLost, match="worker-b"):
            put(saver, "t")
        assert [r.status for r in saver.effects("t")] == [
            EffectStatus.APPLIED, EffectStatus.APPLIED, EffectStatus.IN_FLIGHT]
        other.release_lease(lease)
        put(saver, "t")
        assert {r.status for r in saver.effects("t")} == {EffectStatus.APPLIED}
        assert [(e.key, e.kind) for e in saver.events("t")] == [
            ("a", "intent"), ("b", "intent"), ("c", "intent"),
            ("a", "receipt"), ("b", "receipt"), ("c", "receipt")]


def test_setup_creating_the_triggers_under_a_write_in_another_order_is_retried(
        postgres_conninfo) -> None:
    """A worker of the release before holds `checkpoints` and then writes
    `checkpoint_blobs` while a new worker's `setup()` creates the triggers (blobs first):
    the server breaks the deadlock by aborting the migration, which `setup()` runs again;
    both end."""
    import threading
    import time

    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as saver:
        saver.setup()
    with psycopg.connect(postgres_conninfo, autocommit=True) as conn:  # back to migration 14
        drop_triggers(postgres_conninfo)
        conn.execute("DROP FUNCTION graph_durable_fence_row()")
        conn.execute("DROP FUNCTION graph_durable_claim_step(TEXT, TEXT[], TEXT[], TEXT[], "
                     "TEXT[], TEXT[], TEXT[], INTEGER[], TEXT[], TEXT[], DOUBLE PRECISION[], "
                     "TEXT, BIGINT, TEXT)")
        conn.execute("DELETE FROM graph_durable_migrations WHERE v >= 15")
    outcome: dict[str, Any] = {}
    with psycopg.connect(postgres_conninfo) as worker:
        worker.execute("INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, "
                       "checkpoint, metadata) VALUES ('t', '', '1', '{}', '{}')")

        def upgrade() -> None:
            try:
                with DurablePostgresSaver.from_conn_string(postgres_conninfo) as new:
                    new.setup()
                    outcome["fenced"] = new._rows_fenced
            except Exception as exc:  # noqa: BLE001 - reported below
                outcome["error"] = exc

        upgrading = threading.Thread(target=upgrade)
        upgrading.start()
        time.sleep(0.5)  # the migration holds checkpoint_blobs, waits for checkpoints
        worker.execute("INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, "
                       "version, type, blob) VALUES ('t', '', 'a', '1', 'x', NULL)")
        worker.commit()
        upgrading.join(60)
    assert outcome == {"fenced": True}


def test_a_session_where_triggers_do_not_fire_sends_its_fence_itself(
        postgres_server, postgres_conninfo) -> None:
    """`session_replication_role = replica` (a database default here) keeps triggers
    from firing: a saver set up in such a session fences its writes itself."""
    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as first:
        first.setup()
    name = postgres_conninfo.rsplit("dbname=", 1)[1].split()[0]
    with psycopg.connect(postgres_conninfo, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {name} SET session_replication_role = replica")
    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as saver, \
            DurablePostgresSaver.from_conn_string(postgres_conninfo) as other:
        saver.setup()
        assert not saver._rows_fenced
        lease = other.acquire_lease("t", "worker-b", ttl=60)
        with pytest.raises(LeaseLost, match="worker-b"):
            put(saver, "t")
        other.release_lease(lease)
        assert list(saver.list(config("t"))) == []
