"""The fence reads `READ COMMITTED` on any server, as the saver says, not as the server's
default says: on a database whose `default_transaction_isolation` is `repeatable read`, a
write that waited for the thread's lock while another worker took its lease over must
still see the new lease, and be refused."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from graph_durable.errors import LeaseLost
from graph_durable.ledger import EffectStatus, IntentWrite

psycopg = pytest.importorskip("psycopg")

from graph_durable.checkpointers.postgres import DurablePostgresSaver  # noqa: E402


_numbers = itertools.count(1)


@pytest.fixture
def repeatable_read_db(postgres_server) -> str:
    name = f"gd_repeatable_read_{next(_numbers)}"
    conninfo = postgres_server.create_database(name)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {name} SET default_transaction_isolation = 'repeatable read'")
    with psycopg.connect(conninfo, autocommit=True) as conn, conn.transaction():
        assert conn.execute("SHOW transaction_isolation").fetchone()[0] == "repeatable read"
    return conninfo


def saver_on(conninfo: str) -> DurablePostgresSaver:
    from psycopg.rows import dict_row

    conn = psycopg.connect(conninfo, autocommit=True, prepare_threshold=0, row_factory=dict_row)
    saver = DurablePostgresSaver(conn)
    saver.setup()
    return saver


def intent(key: str) -> IntentWrite:
    return IntentWrite(key=key, thread_id="t", checkpoint_ns="", tool_call_id="c1",
                       tool="pay", args={"cents": 5}, status=EffectStatus.IN_FLIGHT)


def test_the_saver_transactions_read_committed_on_a_repeatable_read_database(
        repeatable_read_db: str) -> None:
    saver = saver_on(repeatable_read_db)
    with saver._txn() as cur:
        assert cur.execute("SHOW transaction_isolation").fetchone()[0] == "read committed"
    # The connection's own setting is left as it was for other users of it.
    assert saver.conn.isolation_level is None


def test_a_write_that_waited_for_a_lease_taken_over_meanwhile_is_refused(
        repeatable_read_db: str) -> None:
    saver = saver_on(repeatable_read_db)
    lease = saver.acquire_lease("t", "worker-1", ttl=60)
    outcome: dict[str, BaseException | None] = {}
    with psycopg.connect(repeatable_read_db, autocommit=True) as other:
        with other.transaction():
            # Another worker holds the thread's lock and takes the lease over...
            other.execute("SELECT pg_advisory_xact_lock(hashtextextended('t', 0))")
            other.execute("UPDATE thread_leases SET owner = 'worker-2', token = token + 1 "
                          "WHERE thread_id = 't'")

            def write() -> None:
                try:
                    saver.claim(intent("gd-k1"), lease.config)
                    outcome["error"] = None
                except BaseException as exc:  # LeaseLost is a BaseException
                    outcome["error"] = exc

            # ...while worker-1's write begins and waits for that lock.
            writer = threading.Thread(target=write)
            writer.start()
            time.sleep(0.5)
            assert writer.is_alive() and "error" not in outcome
        writer.join(10)
    assert isinstance(outcome["error"], LeaseLost), outcome
    assert saver.effects("t") == []


def test_on_a_pool_a_write_waiting_for_one_thread_never_holds_up_another(
        postgres_conninfo: str) -> None:
    """One process, one `ConnectionPool`: while a write to thread `a` waits for `a`'s lock
    (held elsewhere), a write to thread `b` goes through."""
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    with ConnectionPool(postgres_conninfo, min_size=2, max_size=2, open=True, kwargs={
            "autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}) as pool:
        saver = DurablePostgresSaver(pool)
        saver.setup()
        done: dict[str, float] = {}
        with psycopg.connect(postgres_conninfo, autocommit=True) as other:
            other.execute("SELECT pg_advisory_lock(hashtextextended('a', 0))")

            def write(thread_id: str) -> None:
                saver.claim(IntentWrite(key=f"gd-{thread_id}", thread_id=thread_id,
                                        checkpoint_ns="", tool_call_id="c1", tool="pay",
                                        args={}, status=EffectStatus.IN_FLIGHT))
                done[thread_id] = time.monotonic()

            waiting = threading.Thread(target=write, args=("a",))
            waiting.start()
            time.sleep(0.3)
            other_write = threading.Thread(target=write, args=("b",))
            other_write.start()
            other_write.join(5)
            b_went_through = "b" in done and "a" not in done
            other.execute("SELECT pg_advisory_unlock(hashtextextended('a', 0))")
        waiting.join(10)
        other_write.join(10)
        assert b_went_through, done
        assert {r.thread_id for r in saver.effects()} == {"a", "b"}


@pytest.mark.parametrize("savers,size", [(1, 1), (2, 2)], ids=["one saver, pool of 1",
                                                               "two savers, pool of 2"])
def test_savers_start_on_small_pools(postgres_conninfo: str, savers: int, size: int) -> None:
    """`setup()` holds one pooled connection for its schema lock and runs on it; it never
    asks the pool for a second one while holding the first."""
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    with ConnectionPool(postgres_conninfo, min_size=size, max_size=size, timeout=5,
                        open=True, kwargs={"autocommit": True, "prepare_threshold": 0,
                                           "row_factory": dict_row}) as pool:
        started = [DurablePostgresSaver(pool) for _ in range(savers)]
        errors: list[BaseException] = []

        def start(saver: DurablePostgresSaver) -> None:
            try:
                saver.setup()
                saver.claim(IntentWrite(key=f"gd-{id(saver)}", thread_id=f"t{id(saver)}",
                                        checkpoint_ns="", tool_call_id="c1", tool="pay",
                                        args={}, status=EffectStatus.IN_FLIGHT))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=start, args=(s,)) for s in started]
        for one in threads:
            one.start()
        for one in threads:
            one.join(30)
        assert errors == []
        assert len(started[0].effects()) == savers


def test_a_broken_pooled_connection_is_a_clear_error_for_a_write_and_a_retry_for_a_read(
        postgres_conninfo: str) -> None:
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    from graph_durable.errors import DatabaseUnavailable

    def terminate_the_pools_connections() -> None:
        with psycopg.connect(postgres_conninfo, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = current_database() AND pid <> pg_backend_pid()")

    with ConnectionPool(postgres_conninfo, min_size=1, max_size=1, open=True, kwargs={
            "autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}) as pool:
        saver = DurablePostgresSaver(pool)
        saver.setup()
        saver.claim(intent("gd-1"))
        terminate_the_pools_connections()
        assert [r.key for r in saver.effects("t")] == ["gd-1"]  # retried transparently
        terminate_the_pools_connections()
        with pytest.raises(DatabaseUnavailable, match="broke under a write to thread 't'.*"
                                                      "nothing is lost"):
            saver.claim(intent("gd-2"))
        saver.claim(intent("gd-3"))  # the pool replaced the broken connection
        assert [r.key for r in saver.effects("t")] == ["gd-1", "gd-3"]


def test_the_implicit_fence_refuses_a_transaction_that_is_not_read_committed(
        postgres_conninfo: str) -> None:
    """A write sent without `BEGIN` is fenced by `graph_durable_fence_read_committed`,
    which refuses (GD002) in any other isolation, before the thread's fence is read."""
    saver_on(postgres_conninfo)  # migrates
    with psycopg.connect(postgres_conninfo, autocommit=True) as conn:
        assert conn.execute("SELECT graph_durable_fence_read_committed('t', NULL)"
                            ).fetchone()[0] > 0
        for level in ("REPEATABLE READ", "SERIALIZABLE"):
            with pytest.raises(psycopg.DatabaseError, match="READ COMMITTED") as refused:
                with conn.transaction():
                    conn.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
                    conn.execute("SELECT graph_durable_fence_read_committed('t', NULL)")
            assert refused.value.sqlstate == "GD002"


def test_writes_on_a_repeatable_read_database_are_sent_again_read_committed(
        repeatable_read_db: str) -> None:
    """The first write sent without `BEGIN` is refused whole (nothing committed) and sent
    again inside `BEGIN ISOLATION LEVEL READ COMMITTED`: a claim, then a checkpoint that
    carries a deferred receipt, each stored once."""
    from langgraph.checkpoint.base import empty_checkpoint

    from graph_durable.ledger import TransitionWrite

    saver = saver_on(repeatable_read_db)
    [(record, created)] = saver.claim_many([intent("gd-k1")])
    assert created and record.status is EffectStatus.IN_FLIGHT
    saver.apply(TransitionWrite(thread_id="t", key="gd-k1", to=EffectStatus.APPLIED,
                                kind="receipt", receipt={"id": 1}, result="ok", defer=True))
    saver.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, empty_checkpoint(),
              {"step": 0}, {})
    assert [(r.key, r.status) for r in saver.effects("t")] == [
        ("gd-k1", EffectStatus.APPLIED)]
    assert [e.kind for e in saver.events("t")] == ["intent", "receipt"]
    assert len(list(saver.list({"configurable": {"thread_id": "t"}}))) == 1


def test_a_session_whose_default_isolation_changes_later_still_writes_read_committed(
        postgres_conninfo: str) -> None:
    """Writes go without `BEGIN` while the session's default is READ COMMITTED; once the
    session's default changes, the fence refuses the implicit transaction and the write
    is sent again, begun READ COMMITTED, and still fenced: a stale token is refused."""
    saver = saver_on(postgres_conninfo)
    lease = saver.acquire_lease("t", "worker-1", ttl=60)
    saver.claim(intent("gd-k1"), lease.config)
    saver.conn.execute("SET default_transaction_isolation = 'serializable'")
    saver.claim(intent("gd-k2"), lease.config)
    assert [r.key for r in saver.effects("t")] == ["gd-k1", "gd-k2"]
    saver.release_lease(lease)
    saver.acquire_lease("t", "worker-2", ttl=60)
    with pytest.raises(LeaseLost):
        saver.claim(intent("gd-k3"), lease.config)
    assert [r.key for r in saver.effects("t")] == ["gd-k1", "gd-k2"]


async def test_the_async_saver_sends_writes_again_read_committed_on_a_repeatable_read_database(
        repeatable_read_db: str) -> None:
    from langgraph.checkpoint.base import empty_checkpoint
    from psycopg.rows import dict_row

    from graph_durable.checkpointers.postgres import AsyncDurablePostgresSaver
    from graph_durable.ledger import TransitionWrite

    async with await psycopg.AsyncConnection.connect(
            repeatable_read_db, autocommit=True, prepare_threshold=0,
            row_factory=dict_row) as conn:
        saver = AsyncDurablePostgresSaver(conn)
        await saver.setup()
        [(_, created)] = await saver.aclaim_many([intent("gd-k1")])
        assert created
        await saver.aapply(TransitionWrite(thread_id="t", key="gd-k1", to=EffectStatus.APPLIED,
                                           kind="receipt", receipt={"id": 1}, result="ok",
                                           defer=True))
        await saver.aput({"configurable": {"thread_id": "t", "checkpoint_ns": ""}},
                         empty_checkpoint(), {"step": 0}, {})
        assert [(r.key, r.status) for r in await saver.aeffects("t")] == [
            ("gd-k1", EffectStatus.APPLIED)]
        assert [e.kind for e in await saver.aevents("t")] == ["intent", "receipt"]
