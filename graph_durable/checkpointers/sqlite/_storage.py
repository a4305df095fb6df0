"""SQLite's storage faults as the library's errors: a full disk (`StorageFull`), a disk
I/O error and a write lock held past the busy timeout (`DatabaseUnavailable`), each
naming the thread written, as PostgreSQL's savers name a broken connection. Each is
still a `sqlite3.OperationalError`, as the stock saver's error is, so code written
against it catches ours too. A guarded call's error then also names the call and says
whether it was sent (`graph_durable.nodes.storage`).
"""

from __future__ import annotations

import sqlite3

from graph_durable.errors import DatabaseUnavailable, StorageFull

__all__ = ["SqliteStorageFull", "SqliteUnavailable", "storage_fault"]


class SqliteStorageFull(StorageFull, sqlite3.OperationalError):
    """`StorageFull` on SQLite; still a `sqlite3.OperationalError`."""


class SqliteUnavailable(DatabaseUnavailable, sqlite3.OperationalError):
    """`DatabaseUnavailable` on SQLite; still a `sqlite3.OperationalError`."""


_FAULTS = (
    ("database or disk is full", SqliteStorageFull, "the disk holding the database is full",
     "free space, then resume the thread"),
    ("disk i/o error", SqliteUnavailable, "the disk failed to read or write it (disk I/O "
     "error)", "check the disk, then resume the thread"),
    ("database is locked", SqliteUnavailable, "another connection held the database's "
     "write lock past this connection's busy timeout", "try again, or give the connection "
     "a longer timeout (sqlite3.connect(path, timeout=...))"),
)


def storage_fault(exc: BaseException, thread_id: str | None,
                  tool_call_id: str | None = None) -> DatabaseUnavailable | None:
    """The library's error for `exc`, a write's `sqlite3` error, if it is a storage
    fault; `None` otherwise."""
    if not isinstance(exc, sqlite3.DatabaseError) or isinstance(exc, DatabaseUnavailable):
        return None
    text = str(exc).lower()
    for marker, error, reason, next_step in _FAULTS:
        if marker in text:
            where = f" to thread {thread_id!r}" if thread_id else ""
            return error(
                f"A write{where} was not committed: {reason} ({exc}). Nothing of it was "
                f"stored, and nothing is lost: {next_step}; what the thread had sent is "
                "reconciled from its ledger.", thread_id=thread_id, tool_call_id=tool_call_id)
    return None
