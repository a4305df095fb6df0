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
