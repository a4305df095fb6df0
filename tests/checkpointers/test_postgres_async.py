"""AsyncDurablePostgresSaver on a real PostgreSQL server started by the tests.

The behaviour it shares with the other savers (guard, approvals, leases, crashes) is
tested through the parametrised `durable_saver` fixture; what is particular to an async
saver on a pool is tested here.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from graph_durable.checkpointers.postgres import AsyncDurablePostgresSaver
from graph_durable.errors import (
    DatabaseUnavailable,
    IllegalTransition,
    LeaseHeld,
    LeaseLost,
)
from graph_durable.ledger import EffectStatus, IntentWrite, TransitionWrite
from tests.checkpointers.test_conformance import _assert_all_passed

S = EffectStatus


def pool_of(conninfo: str, size: int) -> AsyncConnectionPool:
    return AsyncConnectionPool(conninfo, min_size=size, max_size=size, open=False,
                               kwargs={"autocommit": True, "prepare_threshold": 0,
                                       "row_factory": dict_row})


@pytest.mark.parametrize("conn", ["connection", "pool"])
async def test_passes_all_eight_conformance_capabilities(postgres_server, conn) -> None:
    counter = itertools.count()

    @checkpointer_test(name=f"AsyncDurablePostgresSaver ({conn})")
    async def factory():
        conninfo = postgres_server.create_database(f"gd_aconformance_{conn}_{next(counter)}")
        if conn == "connection":
            async with AsyncDurablePostgresSaver.from_conn_string(conninfo) as saver:
                yield saver
        else:
            async with pool_of(conninfo, 2) as pool:
                yield AsyncDurablePostgresSaver(pool)

    _assert_all_passed(await validate(factory))


# -- what an async saver on a pool adds ------------------------------------------------------


@pytest.fixture
async def pooled(postgres_conninfo: str):
    """A saver on a pool of 4, set up."""
    async with pool_of(postgres_conninfo, 4) as pool:
        saver = AsyncDurablePostgresSaver(pool)
        await saver.setup()
        yield saver


def intent(thread_id: str = "t", key: str = "k1") -> IntentWrite:
    return IntentWrite(key=key, thread_id=thread_id, checkpoint_ns="tools:x",
                       tool_call_id=f"c-{key}", tool="pay", args={"cents": 5},
                       status=S.IN_FLIGHT)


def receipt(thread_id: str, key: str, *, defer: bool = False) -> TransitionWrite:
    return TransitionWrite(thread_id=thread_id, key=key, to=S.APPLIED, kind="receipt",
                           receipt={"id": key}, result="ok", defer=defer)


def writes_config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": "",
                             "checkpoint_id": "1"}}


async def test_a_write_waiting_for_its_threads_lock_lets_the_loop_write_another_thread(
        pooled, postgres_conninfo) -> None:
    """Another worker holds thread a's lock until it sees thread b's write committed (or
    gives up). b's write can only commit first if the write waiting for a's lock left
    the event loop (and the pool) free."""
    locked, finished = threading.Event(), []

    def other_worker() -> None:
        with psycopg.connect(postgres_conninfo) as holder, psycopg.connect(
                postgres_conninfo, autocommit=True) as watcher:
            holder.execute("SELECT pg_advisory_xact_lock(hashtextextended('a', 0))")
            locked.set()
            for _ in range(400):  # gives up after about 20 s
                if watcher.execute("SELECT 1 FROM effects WHERE thread_id = 'b'").fetchone():
                    finished.append("saw b")
                    break
                time.sleep(0.05)
            holder.commit()

    worker = threading.Thread(target=other_worker)
    worker.start()
    await asyncio.to_thread(locked.wait)

    async def claim(thread_id: str) -> None:
        await pooled.aclaim(intent(thread_id))
        finished.append(thread_id)

    await asyncio.gather(claim("a"), claim("b"))
    await asyncio.to_thread(worker.join)
    assert finished == ["b", "saw b", "a"]


async def test_writes_to_one_thread_that_arrive_together_share_a_transaction(pooled) -> None:
    """The receipts of parallel calls: the first commits at once, the three that arrive
    while it commits go in the next transaction together (each transaction takes one
    connection from the pool); a refused one undoes nothing of its neighbours."""
    await pooled.aclaim_many([intent(key=k) for k in ("k1", "k2", "k4")])
    pooled.conn.pop_stats()
    results = await asyncio.gather(
        pooled.aapply(receipt("t", "k1")), pooled.aapply(receipt("t", "k2")),
        pooled.aapply(receipt("t", "k3")), pooled.aapply(receipt("t", "k4")),
        return_exceptions=True)
    assert pooled.conn.get_stats()["requests_num"] == 2
    assert isinstance(results[2], IllegalTransition) and "No effect 'k3'" in str(results[2])
    assert [r.status for r in await pooled.aeffects("t")] == [S.APPLIED] * 3
    assert [e.kind for e in await pooled.aevents("t")] == ["intent"] * 3 + ["receipt"] * 3


async def test_a_rolled_back_write_keeps_its_deferred_receipt_while_another_commits(
        pooled) -> None:
    """Two transactions at once on a pool, each taking its own thread's deferred
    receipt: the one that rolls back puts its receipt back, whatever the other does."""
    for thread_id in ("t1", "t2"):
        await pooled.aclaim(intent(thread_id))
        await pooled.aapply(receipt(thread_id, "k1", defer=True))
    with pytest.raises(RuntimeError, match="abandoned"):
        async with pooled._txn("t2"):  # a write to t2 that fails after its fence
            await pooled.aput_writes(writes_config("t1"), [("x", 1)], "task")
            raise RuntimeError("abandoned")
    assert (await pooled.aeffect("k1", "t1")).status is S.APPLIED
    assert (await pooled.aeffect("k1", "t2")).status is S.IN_FLIGHT
    await pooled.aput_writes(writes_config("t2"), [("x", 1)], "task")
    assert (await pooled.aeffect("k1", "t2")).status is S.APPLIED


async def test_a_receipt_another_write_carries_rides_on_every_write_until_one_commits(
        pooled, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a pool two writes of one thread may commit in another order than they began.
    A task's own write (`b`) begins after its call's receipt was deferred, while another
    write (`a`) that carries the receipt is still under way: `b` carries it too, so
    whenever `b` commits the receipt is stored, even if `a` never commits (a crash there
    must not leave the task's writes stored and its receipt lost)."""
    await pooled.aclaim(intent())
    await pooled.aapply(receipt("t", "k1", defer=True))
    carrying, release = asyncio.Event(), asyncio.Event()
    send_carried = pooled._send_carried

    async def paused(conn: Any, plans: Any, carried: Any) -> None:
        if asyncio.current_task() is first and plans:
            carrying.set()
            await release.wait()
            raise RuntimeError("a crashed before its commit")
        await send_carried(conn, plans, carried)

    monkeypatch.setattr(pooled, "_send_carried", paused)
    first = asyncio.ensure_future(pooled.aput_writes(writes_config("t"), [("x", 1)], "a"))
    await carrying.wait()
    second = asyncio.ensure_future(pooled.aput_writes(writes_config("t"), [("y", 2)], "b"))
    await asyncio.wait({second}, timeout=1.0)  # b waits for a's lock, if a holds it
    release.set()
    with pytest.raises(RuntimeError, match="crashed before its commit"):
        await first
    await second
    assert (await pooled.aeffect("k1", "t")).status is S.APPLIED
    assert [e.kind for e in await pooled.aevents("t")] == ["intent", "receipt"]
    await pooled.aput_writes(writes_config("t"), [("z", 3)], "c")  # nothing left to carry
    assert [e.kind for e in await pooled.aevents("t")] == ["intent", "receipt"]
    assert pooled._deferred == {} and pooled._encoded == {}


async def test_sync_methods_refuse_the_event_loop_and_serve_other_threads(pooled) -> None:
    await pooled.aclaim(intent())
    with pytest.raises(asyncio.InvalidStateError, match="await the `a`-prefixed method"):
        pooled.effects("t")
    assert [r.key for r in await asyncio.to_thread(pooled.effects, "t")] == ["k1"]
    lease = await asyncio.to_thread(pooled.acquire_lease, "t", "w", 30)
    assert lease.expires_at - await pooled.aclock() > 25  # on the server's clock


async def test_a_lease_fences_writes_from_another_saver(pooled, postgres_conninfo) -> None:
    async with AsyncDurablePostgresSaver.from_conn_string(postgres_conninfo) as other:
        async with other.alease("t", "worker-a", ttl=60) as lease:
            with pytest.raises(LeaseLost):
                await pooled.aclaim(intent())
            with pytest.raises(LeaseLost):  # LangGraph's statements were sent after the
                await pooled.aput_writes(writes_config("t"), [("x", 1)], "task")  # fence
            with pytest.raises(LeaseHeld):
                await pooled.aacquire_lease("t", "worker-b")
            await pooled.aclaim(intent(), lease.config)
        assert (await pooled.aacquire_lease("t", "worker-b")).token == lease.token + 1
    assert [e.fencing_token for e in await pooled.aevents("t")] == [lease.token]
    async with pooled.conn.connection() as conn:
        assert await (await conn.execute("SELECT * FROM checkpoint_writes")).fetchall() == []


@pytest.mark.parametrize("savers,size", [(1, 1), (2, 2)], ids=["one saver, pool of 1",
                                                               "two savers, pool of 2"])
async def test_savers_start_on_small_pools(postgres_conninfo: str, savers: int,
                                           size: int) -> None:
    """`setup()` runs on the connection holding its schema lock (see the sync twin)."""
    async with pool_of(postgres_conninfo, size) as pool:
        started = [AsyncDurablePostgresSaver(pool) for _ in range(savers)]
        await asyncio.wait_for(asyncio.gather(*(
            s.aclaim(intent(f"t{n}")) for n, s in enumerate(started))), timeout=60)
        assert len(await started[0].aeffects()) == savers


async def test_a_broken_pooled_connection_is_a_clear_error_for_a_write_and_a_retry_for_a_read(
        postgres_conninfo: str) -> None:
    async def terminate_the_pools_connections() -> None:
        async with await psycopg.AsyncConnection.connect(postgres_conninfo,
                                                         autocommit=True) as admin:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()")

    async with pool_of(postgres_conninfo, 1) as pool:
        saver = AsyncDurablePostgresSaver(pool)
        await saver.aclaim(intent(key="gd-1"))
        await terminate_the_pools_connections()
        assert [r.key for r in await saver.aeffects("t")] == ["gd-1"]  # retried
        await terminate_the_pools_connections()
        with pytest.raises(DatabaseUnavailable, match="broke under a write to thread 't'.*"
                                                      "nothing is lost"):
            await saver.aclaim(intent(key="gd-2"))
        await saver.aclaim(intent(key="gd-3"))  # the pool replaced the broken connection
        assert [r.key for r in await saver.aeffects("t")] == ["gd-1", "gd-3"]


async def test_open_read_only_reads_and_refuses_to_write(pooled, postgres_conninfo) -> None:
    await pooled.aclaim(intent())
    reader = await AsyncDurablePostgresSaver.open_read_only(postgres_conninfo)
    try:
        assert [r.key for r in await reader.aeffects("t")] == ["k1"]
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            await reader.aclaim(intent(key="k2"))
    finally:
        await reader.conn.close()


async def test_a_steps_claim_and_a_write_carrying_receipts_are_one_round_trip_each(
        postgres_conninfo) -> None:
    """As for the sync saver: the server's fence and the statements go out together, as
    one transaction, for a claim through the group commit and a write carrying receipts."""
    from langgraph.checkpoint.base import empty_checkpoint

    from graph_durable.testing.pg_trace import round_trips

    async with AsyncDurablePostgresSaver.from_conn_string(postgres_conninfo) as saver:
        known, _ = await saver.aclaim(intent(key="k0"))
        with round_trips(saver.conn) as claim:
            claimed = await saver.aclaim_many([intent(key=k) for k in ("k1", "k0", "k2")])
        assert claim.count == 1
        assert [(record.key, created) for record, created in claimed] == [
            ("k1", True), ("k0", False), ("k2", True)]
        assert claimed[1][0] == await saver.aeffect("k0", "t")
        for key in ("k1", "k2"):
            await saver.aapply(receipt("t", key, defer=True))
        with round_trips(saver.conn) as put:
            await saver.aput({"configurable": {"thread_id": "t", "checkpoint_ns": ""}},
                             empty_checkpoint(), {"step": 0}, {})
        assert put.count == 1
        assert {r.key: r.status for r in await saver.aeffects("t")} == {
            "k0": S.IN_FLIGHT, "k1": S.APPLIED, "k2": S.APPLIED}
        assert [e.kind for e in await saver.aevents("t")] == ["intent"] * 3 + ["receipt"] * 2


async def test_a_claim_refused_by_the_servers_fence_claims_nothing(pooled) -> None:
    lease = await pooled.aacquire_lease("t", "worker-b", ttl=30)
    with pytest.raises(LeaseLost, match="worker-b"):
        await pooled.aclaim_many([intent(key="k1"), intent(key="k2")])
    await pooled.arelease_lease(lease)
    assert await pooled.aeffects("t") == [] and await pooled.aevents("t") == []


async def test_a_deferred_receipt_the_lifecycle_no_longer_allows_is_dropped(
        pooled, postgres_conninfo, caplog: pytest.LogCaptureFixture) -> None:
    await pooled.aclaim(intent())
    await pooled.aapply(receipt("t", "k1", defer=True))
    # Meanwhile another worker settles the effect (say, a reviewer says it failed).
    async with AsyncDurablePostgresSaver.from_conn_string(postgres_conninfo) as other:
        await other.aapply(TransitionWrite(thread_id="t", key="k1", to=S.FAILED,
                                           kind="failure", error="declined"))
    before = (await pooled.aeffects(), await pooled.aevents())
    with caplog.at_level("WARNING", logger="graph_durable"):
        await pooled.aput_writes(writes_config("t"), [("x", 1)], "task")
    assert (await pooled.aeffects(), await pooled.aevents()) == before
    assert "Deferred receipt of effect 'k1' in thread 't' dropped" in caplog.text
    assert "failed; it cannot become applied" in caplog.text
