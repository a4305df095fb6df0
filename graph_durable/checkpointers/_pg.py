"""What the sync and async PostgreSQL savers share: statements in PostgreSQL's dialect.

The ledger's own statements (`_sql`) are written for SQLite; `pg_sql` turns each into
PostgreSQL's. The statements below are PostgreSQL's only: the thread's advisory lock,
leases on the server's clock, the setup lock, and LangGraph's PostgreSQL tables as the
retention methods touch them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from graph_durable.checkpointers import _sql

__all__ = ["TransactionDeferred", "arun", "arun_counted", "lease_and_clock", "pg_sql"]

LOCK_THREAD = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
"""Serializes the writes of one thread across connections until the transaction ends."""
LOCK_THREAD_READ_LEASE = (
    "SELECT owner, token, expires_at, now_at FROM graph_durable_lock_thread_at(%s)"
)
"""`LOCK_THREAD`, then the thread's lease row (NULLs when it has none) and the server's
clock, read after the lock is granted (see the PostgreSQL migrations): one round trip."""
NOW = "SELECT extract(epoch FROM clock_timestamp())::DOUBLE PRECISION"
TRY_LOCK_THREAD = "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))"
RENEW_LEASE_AT = (
    "UPDATE thread_leases SET expires_at = extract(epoch FROM clock_timestamp()) + %s "
    "WHERE thread_id = %s AND token = %s AND expires_at > extract(epoch FROM clock_timestamp()) "
    "RETURNING expires_at"
)
SELECT_LIVE_LEASES_AT = (
    "SELECT thread_id, owner, token, expires_at FROM thread_leases "
    "WHERE expires_at > extract(epoch FROM clock_timestamp())"
)
SELECT_LIVE_LEASES_WITH_CLOCK = (
    "SELECT l.thread_id, l.owner, l.token, l.expires_at, n.now_at FROM (SELECT "
    "extract(epoch FROM clock_timestamp())::DOUBLE PRECISION AS now_at) n "
    "LEFT JOIN thread_leases l ON l.expires_at > n.now_at"
)
"""`SELECT_LIVE_LEASES_AT` plus the server's clock on every row (one row of NULLs and
the clock when no lease is live)."""
BEGIN_READ_COMMITTED = "BEGIN ISOLATION LEVEL READ COMMITTED"
FENCE = "SELECT graph_durable_fence(%s, %s)"
"""`LOCK_THREAD`, then the fence checked on the server: raises `FENCE_REFUSED` if the
write must not commit (PostgreSQL migration 7)."""
FENCE_REFUSED = "GD001"
SELECT_LEASE_WITH_CLOCK = (
    "SELECT l.owner, l.token, l.expires_at, n.now_at FROM (SELECT "
    "extract(epoch FROM clock_timestamp())::DOUBLE PRECISION AS now_at) n "
    "LEFT JOIN thread_leases l ON l.thread_id = %s"
)
"""The thread's lease row (NULLs if none) and the server's clock, without the lock: to
say why `FENCE` refused a write."""
TRY_LOCK_SETUP = "SELECT pg_try_advisory_lock(hashtextextended('graph_durable_setup', 0))"
UNLOCK_SETUP = "SELECT pg_advisory_unlock(hashtextextended('graph_durable_setup', 0))"

DELETE_THREAD_CHECKPOINTS = (
    "DELETE FROM checkpoints WHERE thread_id = %s",
    "DELETE FROM checkpoint_blobs WHERE thread_id = %s",
    "DELETE FROM checkpoint_writes WHERE thread_id = %s",
)
COPY_THREAD_CHECKPOINTS = (
    "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, "
    "type, checkpoint, metadata) SELECT %s, checkpoint_ns, checkpoint_id, "
    "parent_checkpoint_id, type, checkpoint, metadata FROM checkpoints WHERE thread_id = %s "
    "ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET "
    "parent_checkpoint_id = EXCLUDED.parent_checkpoint_id, type = EXCLUDED.type, "
    "checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata",
    "INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob) "
    "SELECT %s, checkpoint_ns, channel, version, type, blob FROM checkpoint_blobs "
    "WHERE thread_id = %s ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING",
    "INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, "
    "task_path, idx, channel, type, blob) SELECT %s, checkpoint_ns, checkpoint_id, task_id, "
    "task_path, idx, channel, type, blob FROM checkpoint_writes WHERE thread_id = %s "
    "ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET "
    "channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob",
)
SELECT_RUN_CHECKPOINTS = (
    "SELECT thread_id, checkpoint_ns, checkpoint_id FROM checkpoints "
    "WHERE metadata->>'run_id' = ANY(%s)"
)
DELETE_CHECKPOINT = (
    "DELETE FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s"
)
DELETE_CHECKPOINT_WRITES = (
    "DELETE FROM checkpoint_writes WHERE thread_id = %s AND checkpoint_ns = %s "
    "AND checkpoint_id = %s"
)
DELETE_NULL_RESUME = _sql.DELETE_NULL_RESUME.replace("FROM writes", "FROM checkpoint_writes")


@functools.lru_cache(maxsize=256)
def pg_sql(sql: str) -> str:
    """A ledger statement written for SQLite, in PostgreSQL's dialect.

    The ledger's statements use `?` placeholders and `INSERT OR IGNORE`; psycopg wants
    `%s` (and a literal `%`, as in a `LIKE` pattern, doubled), and PostgreSQL
    `ON CONFLICT DO NOTHING`.
    """
    out = re.sub(r"%(?!s)", "%%", sql).replace("?", "%s")
    if out.startswith("INSERT OR IGNORE INTO"):
        out = "INSERT INTO" + out[len("INSERT OR IGNORE INTO"):] + " ON CONFLICT DO NOTHING"
    return out


def lease_and_clock(row: Sequence[Any]) -> tuple[tuple[str, int, float] | None, float]:
    """`(lease row or None, server clock)` from a `LOCK_THREAD_READ_LEASE` row."""
    owner, token, expires_at, now = row
    return (None if owner is None else (owner, token, expires_at)), float(now)




async def arun(cur: Any, sql: str, params: Sequence[Any] = ()) -> Any:
    """Run a ledger statement (written for SQLite) on an async psycopg cursor."""
    return await cur.execute(pg_sql(sql), tuple(params))


async def arun_counted(cur: Any, sql: str, params: Sequence[Any] = ()) -> int:
    """`arun` for an `INSERT`, `UPDATE` or `DELETE` (without `RETURNING`): how many rows
    it changed, read from rows it returns (in pipeline mode a row count is known only
    after a sync; returned rows are fetched at once)."""
    await cur.execute(pg_sql(sql) + " RETURNING 1", tuple(params))
    return len(await cur.fetchall())


_TAKEN: ContextVar[list[Any] | None] = ContextVar("graph_durable_pg_deferred_taken",
                                                   default=None)


class TransactionDeferred:
    """Mixin: the deferred receipts a transaction takes are its own, not the saver's.

    On a pool several transactions of one saver commit or roll back at once; with one
    list for the saver, one committing would forget what another took, and the other's
    rollback could not put it back (a receipt lost). Each transaction runs in
    `_deferred_scope()`, which holds its own list (per thread, per asyncio task).
    Put it before `DurableSaverMixin` in the bases.
    """

    @contextmanager
    def _deferred_scope(self) -> Iterator[None]:
        token = _TAKEN.set([])
        try:
            yield
        finally:
            _TAKEN.reset(token)

    def _take_deferred(self, thread_id: str) -> list[Any]:
        with self._deferred_lock:  # type: ignore[attr-defined]
            taken = self._deferred.pop(thread_id, [])  # type: ignore[attr-defined]
        mine = _TAKEN.get()
        assert mine is not None, "deferred receipts are taken inside a transaction"
        mine.extend(taken)
        return taken  # type: ignore[no-any-return]

    def _refused_deferred(self, write: Any, error: Any) -> None:
        mine = _TAKEN.get() or []
        mine[:] = [item for item in mine if item[0] is not write]
        super()._refused_deferred(write, error)  # type: ignore[misc]

    def _deferred_committed(self) -> None:
        (_TAKEN.get() or []).clear()

    def _deferred_rolled_back(self) -> None:
        mine = _TAKEN.get() or []
        with self._deferred_lock:  # type: ignore[attr-defined]
            for write, config in reversed(mine):
                self._deferred.setdefault(write.thread_id, []).insert(  # type: ignore[attr-defined]
                    0, (write, config))
        mine.clear()
