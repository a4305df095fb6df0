"""Savers on a database they may only read, or that another process is writing.

`setup()` on a database already up to date writes nothing and takes no write lock: a
process that only reads neither waits behind a writer nor fails on a read-only
connection (`mode=ro`, a replica, a file it may not write). A write tried there raises
`ReadOnlyDatabase`, which names what needed write access (and is still the driver's
read-only error, as the stock saver's is).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import aiosqlite
import psycopg
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from psycopg.rows import dict_row

from graph_durable.checkpointers import AsyncDurableSqliteSaver, DurableSqliteSaver
from graph_durable.checkpointers._schema import MIGRATIONS, SQLITE_READABLE_FROM
from graph_durable.checkpointers.postgres import AsyncDurablePostgresSaver, DurablePostgresSaver
from graph_durable.errors import GraphDurableError, ReadOnlyDatabase
from graph_durable.ledger import EffectStatus, IntentWrite

ROOT = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}


def intent(key: str = "k1") -> IntentWrite:
    return IntentWrite(key=key, thread_id="t", checkpoint_ns="tools:x", tool_call_id=f"c-{key}",
                       tool="pay", args={"cents": 5}, status=EffectStatus.IN_FLIGHT)


@pytest.fixture
def db(tmp_path: Path) -> str:
    """A database a writer set up, holding one checkpoint and one effect of thread t."""
    path = str(tmp_path / "agent.sqlite")
    with DurableSqliteSaver.from_conn_string(path) as saver:
        saver.put(ROOT, empty_checkpoint(), {"step": 0}, {})
        saver.claim(intent())
    return path


_WRITER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("INSERT INTO ledger_meta (name, value) VALUES ('busy', 'yes')")
print("holding", flush=True)
sys.stdin.read()  # until the test closes our stdin
conn.execute("ROLLBACK")
"""


@pytest.fixture
def writer_holding(db: str) -> Iterator[str]:
    """Another process holding a write transaction on `db` for the test's duration."""
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, db], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
        yield db
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def test_a_read_runs_while_another_process_holds_a_write_transaction(writer_holding) -> None:
    # timeout=0: any wait for the writer's lock would fail at once with "locked".
    with closing(sqlite3.connect(writer_holding, timeout=0, check_same_thread=False)) as conn:
        saver = DurableSqliteSaver(conn)
        assert saver.get_tuple(ROOT) is not None
        assert [r.key for r in saver.effects("t")] == ["k1"]


async def test_an_async_read_runs_while_another_process_holds_a_write_transaction(
        writer_holding) -> None:
    async with aiosqlite.connect(writer_holding, timeout=0) as conn:
        saver = AsyncDurableSqliteSaver(conn)
        assert await saver.aget_tuple(ROOT) is not None
        assert [r.key for r in await saver.aeffects("t")] == ["k1"]


def _assert_refused(exc: BaseException, driver_error: type[BaseException]) -> None:
    assert isinstance(exc, ReadOnlyDatabase) and isinstance(exc, driver_error)
    assert exc.thread_id == "t"
    assert "thread 't'" in str(exc) and "needs write access" in str(exc)
    assert "read-write" in str(exc)


def test_a_sync_saver_on_a_read_only_connection_reads_and_refuses_writes(db: str) -> None:
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True,
                                 check_same_thread=False)) as conn:
        saver = DurableSqliteSaver(conn)
        assert saver.get_tuple(ROOT) is not None
        assert [r.key for r in saver.effects("t")] == ["k1"]
        with pytest.raises(ReadOnlyDatabase) as put:
            saver.put(ROOT, empty_checkpoint(), {"step": 1}, {})
        _assert_refused(put.value, sqlite3.OperationalError)
        with pytest.raises(ReadOnlyDatabase) as claim:
            saver.claim(intent("k2"))
        _assert_refused(claim.value, sqlite3.OperationalError)
        assert claim.value.tool_call_id == "c-k2" and "tool call 'c-k2'" in str(claim.value)
    with DurableSqliteSaver.from_conn_string(db) as writer:
        assert [r.key for r in writer.effects("t")] == ["k1"]  # nothing was written


async def test_an_async_saver_on_a_read_only_connection_reads_and_refuses_writes(
        db: str) -> None:
    async with aiosqlite.connect(f"file:{db}?mode=ro", uri=True) as conn:
        saver = AsyncDurableSqliteSaver(conn)
        assert await saver.aget_tuple(ROOT) is not None
        with pytest.raises(ReadOnlyDatabase) as claim:
            await saver.aclaim(intent("k2"))
        _assert_refused(claim.value, sqlite3.OperationalError)


async def test_the_async_saver_opens_read_only_as_the_sync_one_does(db: str,
                                                                    tmp_path: Path) -> None:
    saver = await AsyncDurableSqliteSaver.open_read_only(db)
    try:
        assert await saver.aget_tuple(ROOT) is not None
        assert [r.key for r in await saver.aeffects("t")] == ["k1"]
        with pytest.raises(ReadOnlyDatabase) as put:
            await saver.aput(ROOT, empty_checkpoint(), {"step": 1}, {})
        _assert_refused(put.value, sqlite3.OperationalError)
    finally:
        await saver.conn.close()
    with pytest.raises(GraphDurableError, match="no such file"):
        await AsyncDurableSqliteSaver.open_read_only(str(tmp_path / "missing.sqlite"))


def test_setup_that_must_create_the_ledger_on_a_read_only_connection_says_so(
        tmp_path: Path) -> None:
    path = tmp_path / "plain.sqlite"
    sqlite3.connect(path).close()
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        with pytest.raises(ReadOnlyDatabase, match=r"Creating or migrating the checkpoint "
                                                   r"and ledger tables .* needs write access"):
            DurableSqliteSaver(conn).setup()


def _as_migrated_to(path: str, version: int, *extra: str) -> None:
    """Make the database at `path` look as a release whose last migration was `version`
    left it (its extra statements run first)."""
    with closing(sqlite3.connect(path)) as conn:
        for statement in extra:
            conn.execute(statement)
        conn.execute("DELETE FROM graph_durable_migrations WHERE v > ?", (version,))
        conn.commit()


_SCHEMA_8 = "CREATE INDEX effect_events_key ON effect_events (key, seq)"
"""What migration 9 drops: schema 8, as the release before it left a database."""


def test_a_saver_on_a_read_only_connection_reads_a_ledger_no_writer_migrated_yet(
        db: str) -> None:
    _as_migrated_to(db, SQLITE_READABLE_FROM, _SCHEMA_8)
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True,
                                 check_same_thread=False)) as conn:
        saver = DurableSqliteSaver(conn)
        assert saver.get_tuple(ROOT) is not None
        assert [r.key for r in saver.effects("t")] == ["k1"]
        assert [e.kind for e in saver.events("t")] == ["intent"]
        with pytest.raises(ReadOnlyDatabase) as claim:
            saver.claim(intent("k2"))
        _assert_refused(claim.value, sqlite3.OperationalError)
    with closing(sqlite3.connect(db)) as conn:  # nothing migrated, nothing written
        assert conn.execute("SELECT MAX(v) FROM graph_durable_migrations").fetchone() == (
            SQLITE_READABLE_FROM,)
        assert conn.execute("SELECT COUNT(*) FROM sqlite_master "
                            "WHERE name = 'effect_events_key'").fetchone() == (1,)
    with DurableSqliteSaver.from_conn_string(db) as writer:  # a writer migrates it
        writer.setup()
        assert writer.conn.execute("SELECT MAX(v) FROM graph_durable_migrations"
                                   ).fetchone() == (len(MIGRATIONS) - 1,)


async def test_an_async_saver_on_a_read_only_connection_reads_a_ledger_no_writer_migrated(
        db: str) -> None:
    _as_migrated_to(db, SQLITE_READABLE_FROM, _SCHEMA_8)
    async with aiosqlite.connect(f"file:{db}?mode=ro", uri=True) as conn:
        saver = AsyncDurableSqliteSaver(conn)
        assert await saver.aget_tuple(ROOT) is not None
        assert [r.key for r in await saver.aeffects("t")] == ["k1"]


def test_a_saver_on_a_read_only_connection_refuses_a_ledger_older_than_it_reads(
        db: str) -> None:
    # Schema 7: before migration 8's tables, and 9's index drop.
    _as_migrated_to(db, SQLITE_READABLE_FROM - 1, _SCHEMA_8, "DROP TABLE copy_points",
                    "DROP TABLE step_anchors")
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        with pytest.raises(ReadOnlyDatabase, match=r"Creating or migrating the checkpoint "
                                                   r"and ledger tables .* needs write access"):
            DurableSqliteSaver(conn).setup()


# -- PostgreSQL: a read-only connection (what a hot standby replica gives) -------------


def _read_only(conninfo: str) -> psycopg.Connection:
    return psycopg.Connection.connect(conninfo, autocommit=True, prepare_threshold=0,
                                      row_factory=dict_row,
                                      options="-c default_transaction_read_only=on")


def test_a_postgres_saver_on_a_read_only_connection_reads_and_refuses_writes(
        postgres_conninfo) -> None:
    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as writer:
        writer.setup()
        writer.put(ROOT, empty_checkpoint(), {"step": 0}, {})
        writer.claim(intent())
    with _read_only(postgres_conninfo) as conn:
        saver = DurablePostgresSaver(conn)
        assert saver.get_tuple(ROOT) is not None
        assert [r.key for r in saver.effects("t")] == ["k1"]
        with pytest.raises(ReadOnlyDatabase) as claim:
            saver.claim(intent("k2"))
        _assert_refused(claim.value, psycopg.errors.ReadOnlySqlTransaction)
        with pytest.raises(ReadOnlyDatabase) as put:
            saver.put(ROOT, empty_checkpoint(), {"step": 1}, {})
        _assert_refused(put.value, psycopg.errors.ReadOnlySqlTransaction)


def test_postgres_setup_that_must_create_the_tables_on_a_read_only_connection_says_so(
        postgres_conninfo) -> None:
    with _read_only(postgres_conninfo) as conn:
        with pytest.raises(ReadOnlyDatabase, match=r"Creating or migrating the checkpoint "
                                                   r"and ledger tables .* needs write access"):
            DurablePostgresSaver(conn).setup()


async def test_an_async_postgres_saver_on_a_read_only_connection_reads_and_refuses_writes(
        postgres_conninfo) -> None:
    async with AsyncDurablePostgresSaver.from_conn_string(postgres_conninfo) as writer:
        await writer.setup()
        await writer.aclaim(intent())
    async with await psycopg.AsyncConnection.connect(
            postgres_conninfo, autocommit=True, prepare_threshold=0, row_factory=dict_row,
            options="-c default_transaction_read_only=on") as conn:
        saver = AsyncDurablePostgresSaver(conn)
        assert [r.key for r in await saver.aeffects("t")] == ["k1"]
        assert await saver.aget_tuple(ROOT) is None  # no checkpoint was put, reads work
        with pytest.raises(ReadOnlyDatabase) as claim:
            await saver.aclaim(intent("k2"))
        _assert_refused(claim.value, psycopg.errors.ReadOnlySqlTransaction)
