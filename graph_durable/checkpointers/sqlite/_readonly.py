"""SQLite on a read-only connection: opening one, telling a refused write, and the
check that lets `setup()` write nothing on a database already up to date.

Shared by `DurableSqliteSaver` and `AsyncDurableSqliteSaver` (which runs these on its
connection's worker thread).
"""

from __future__ import annotations

import os
import sqlite3
import time
import urllib.parse
from typing import Any, NoReturn

from graph_durable.checkpointers import _sql
from graph_durable.checkpointers._schema import (
    LATEST_APPLIED,
    LEDGER_TABLES,
    MIGRATIONS,
    MIGRATIONS_TABLE,
    SETUP_STATE,
    SETUP_TABLES,
    SQLITE_READABLE_FROM,
    SQLITE_RUNS_FROM,
    UPSERT_RUNS_FROM,
    check_readable,
    is_current,
    runs_from_value,
    statements,
)
from graph_durable.errors import GraphDurableError, ReadOnlyDatabase

__all__ = ["SETUP_NEEDS", "SqliteReadOnly", "WRITE_NEEDS", "check_read_only", "connect_read_only",
           "is_read_only", "migrate", "read_only_uri", "schema_current", "setup_ledger",
           "setup_refused"]

SETUP_NEEDS = ("Creating or migrating the checkpoint and ledger tables (setup(), on "
               "first use)")
WRITE_NEEDS = "This write (a checkpoint, a ledger entry, a lease or a deletion)"


class SqliteReadOnly(ReadOnlyDatabase, sqlite3.OperationalError):
    """`ReadOnlyDatabase` on SQLite; still a `sqlite3.OperationalError`, as the stock
    saver's error is, so code written against it catches ours too."""


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {row[0] for row in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'")}


def schema_current(conn: sqlite3.Connection) -> bool:
    """Whether the ledger's schema is up to date (read only: no write lock taken)."""
    return is_current(_tables(conn), lambda: conn.execute(SETUP_STATE).fetchone(),
                      len(MIGRATIONS))


def migrate(conn: sqlite3.Connection, secret_params: tuple[Any, ...]) -> None:
    """Create or migrate the ledger's tables, record which releases run on them
    (`RUNS_FROM`), and store the database's key secret (the first writer's stays), in
    one `BEGIN IMMEDIATE` transaction."""
    conn.execute(MIGRATIONS_TABLE)
    conn.commit()
    conn.execute("BEGIN IMMEDIATE")
    try:
        applied = conn.execute(LATEST_APPLIED).fetchone()[0]
        for version in range(applied + 1, len(MIGRATIONS)):
            for statement in statements(MIGRATIONS[version]):
                conn.execute(statement)
            conn.execute("INSERT INTO graph_durable_migrations (v, applied_at) VALUES (?, ?)",
                         (version, time.time()))
        if applied + 1 < len(MIGRATIONS):  # this release migrated: which releases run on it
            conn.execute(UPSERT_RUNS_FROM, (runs_from_value(len(MIGRATIONS) - 1,
                                                         SQLITE_RUNS_FROM),))
        conn.execute(_sql.INSERT_DB_KEY_SECRET, secret_params)
    except BaseException:
        conn.rollback()
        raise
    conn.commit()


def is_read_only(exc: BaseException) -> bool:
    """Whether `exc` is SQLite refusing a write on a read-only database."""
    if not isinstance(exc, sqlite3.OperationalError) or isinstance(exc, ReadOnlyDatabase):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF == sqlite3.SQLITE_READONLY
    return "readonly database" in str(exc)


def read_only_uri(path: str) -> str:
    """The `mode=ro` URI of the database file at `path` (which must exist)."""
    if not os.path.isfile(path):
        raise GraphDurableError(
            f"{path!r}: no such file. Check the path; read commands never create a "
            "database.")
    return "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"


def check_read_only(conn: sqlite3.Connection, path: str, saver: str) -> None:
    """Refuse what a reader cannot read (see `check_readable`); `conn` stays open."""
    try:
        check_readable(path, saver, _tables(conn),
                       lambda: conn.execute(LATEST_APPLIED).fetchone()[0], len(MIGRATIONS),
                       readable_from=SQLITE_READABLE_FROM)
    except sqlite3.DatabaseError as exc:
        raise GraphDurableError(f"{path!r} is not a SQLite database ({exc}).") from None


def connect_read_only(path: str, saver: str) -> sqlite3.Connection:
    """A `mode=ro` connection to the database at `path`, checked (`check_read_only`)."""
    conn = sqlite3.connect(read_only_uri(path), uri=True, check_same_thread=False)
    try:
        check_read_only(conn, path, saver)
    except BaseException:
        conn.close()
        raise
    return conn


def setup_ledger(conn: sqlite3.Connection, secret_params: tuple[Any, ...]) -> None:
    """The ledger's part of `setup()`, after LangGraph's: durable commits
    (`synchronous=FULL`), then the pending migrations, if any (it only reads when the
    schema is current, and on a read-only connection when it is readable as it is)."""
    conn.execute("PRAGMA synchronous=FULL")
    if schema_current(conn):
        return
    try:
        migrate(conn, secret_params)
    except sqlite3.OperationalError as exc:
        # A read-only connection cannot migrate; it reads a schema this release reads
        # as it is (`SQLITE_READABLE_FROM`) as `open_read_only` does. Its writes are
        # refused as on any read-only connection.
        if not (is_read_only(exc) and _readable_as_is(conn)):
            raise


def _readable_as_is(conn: sqlite3.Connection) -> bool:
    """Whether the ledger's schema is one this release reads without migrating it."""
    if not LEDGER_TABLES | SETUP_TABLES <= _tables(conn):
        return False
    return bool(conn.execute(LATEST_APPLIED).fetchone()[0] >= SQLITE_READABLE_FROM)


def setup_refused(exc: sqlite3.OperationalError) -> NoReturn:
    """Raise, from the `except` block handling `exc` (raised by `setup()`),
    `SqliteReadOnly` if SQLite refused a write as read-only, the library's error for a
    storage fault (a new process on a full disk cannot even create the write-ahead log),
    else `exc` itself."""
    from graph_durable.checkpointers.sqlite._storage import storage_fault

    if is_read_only(exc):
        raise SqliteReadOnly.refused(SETUP_NEEDS, exc) from exc
    fault = storage_fault(exc, None)
    if fault is not None:
        raise fault from exc
    raise exc
