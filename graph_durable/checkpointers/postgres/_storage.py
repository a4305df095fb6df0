"""PostgreSQL's storage faults as the library's errors: a server whose disk is full
(`StorageFull`, SQLSTATE 53100: "could not extend file ...: No space left on device")
and one whose storage failed (`DatabaseUnavailable`, SQLSTATE 58030: an I/O error),
each naming the thread written, as a broken connection is named
(`_sql.broke_under_write`). Each is still the `psycopg.errors` class the stock saver
raises, so code written against it catches ours too. A guarded call's error then also
names the call and says whether it was sent (`graph_durable.nodes.storage`).
"""

from __future__ import annotations

from psycopg.errors import DiskFull, IoError

from graph_durable.errors import DatabaseUnavailable, StorageFull

__all__ = ["PostgresIoError", "PostgresStorageFull", "storage_fault"]


class PostgresStorageFull(StorageFull, DiskFull):  # type: ignore[misc]
    """`StorageFull` on PostgreSQL; still a `psycopg.errors.DiskFull`."""


class PostgresIoError(DatabaseUnavailable, IoError):  # type: ignore[misc]
    """`DatabaseUnavailable` for a server's failed storage; still a
    `psycopg.errors.IoError`."""


_FAULTS: dict[str, tuple[type[DatabaseUnavailable], str, str]] = {
    DiskFull.sqlstate or "53100": (
        PostgresStorageFull, "the disk of the PostgreSQL server (its data directory or "
        "pg_wal) is full", "free space on the server, then resume the thread"),
    IoError.sqlstate or "58030": (
        PostgresIoError, "the PostgreSQL server's storage failed (an I/O error)",
        "check the server's disk and its log, then resume the thread"),
}


def storage_fault(exc: BaseException, thread_id: str | None) -> DatabaseUnavailable | None:
    """The library's error for `exc`, a write's psycopg error, if it is a storage fault
    of the server; `None` otherwise."""
    if isinstance(exc, DatabaseUnavailable):
        return None
    fault = _FAULTS.get(getattr(exc, "sqlstate", None) or "")
    if fault is None:
        return None
    error, reason, next_step = fault
    where = f" to thread {thread_id!r}" if thread_id else ""
    diag = getattr(exc, "diag", None)
    detail = " ".join(str(getattr(diag, "message_primary", None) or exc).split())[:300]
    return error(
        f"A write{where} was not committed: {reason} ({detail}). Nothing of it was "
        f"stored, and nothing is lost: {next_step}; what the thread had sent is "
        "reconciled from its ledger.", thread_id=thread_id)
