"""`AsyncDurableSqliteSaver`: the async twin of `DurableSqliteSaver` (aiosqlite).

Same tables, same SQL (`checkpointers/_sql.py`), same transactions (`_txn.py`), same
retention rules; see `saver.py` for what `delete_thread`, `prune`, `delete_for_runs` and
`copy_thread` do with the ledger. Each transaction and each ledger read runs whole on
aiosqlite's worker thread, one round trip (`_aiosqlite.py`), and ledger writes arriving
while one commits are committed together by the next (group commit), as on the sync
saver.

This module is over 400 lines: it follows `saver.py` method for method, each awaited
on aiosqlite's thread rather than run inline.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import aiosqlite
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    SerializerProtocol,
)
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from graph_durable.checkpointers.sqlite._aiosqlite import on_connection_thread
from graph_durable.checkpointers._base import DurableSaverMixin
from graph_durable.checkpointers._decode import CheckedCheckpoints
from graph_durable.checkpointers._durability import read_sqlite
from graph_durable.checkpointers._reads import AsyncLedgerReads
from graph_durable.checkpointers.sqlite._locked import aretry_locked, busy_timeout, is_locked
from graph_durable.checkpointers.sqlite._readonly import (
    check_read_only,
    read_only_uri,
    setup_ledger,
    setup_refused,
)
from graph_durable.checkpointers._twins import (
    AsyncEagerListing,
    AsyncFencedPuts,
    AsyncLeaseScope,
    SyncFromAsync,
)
from graph_durable.checkpointers.sqlite._txn import (
    CheckpointWrite,
    QueuedWrite,
    SqliteTransactions,
)
from graph_durable.durability import DurabilityReport
from graph_durable.leases import Lease
from graph_durable.ledger import EffectRecord, IntentWrite, LedgerWrite

__all__ = ["AsyncDurableSqliteSaver"]

T = TypeVar("T")


class AsyncDurableSqliteSaver(DurableSaverMixin, CheckedCheckpoints, SqliteTransactions, AsyncEagerListing,
                              AsyncFencedPuts, AsyncLeaseScope, AsyncLedgerReads,
                              SyncFromAsync, AsyncSqliteSaver):
    """An async LangGraph checkpointer on SQLite that also keeps the effect ledger.

    Its keyword arguments besides `conn` (`serde`, `flow_version`,
    `compatible_flow_versions`, `key_secret`) are `DurableSqliteSaver`'s.

    Args:
        conn: An `aiosqlite.Connection`.
    """

    def _init_engine(self) -> None:
        self._init_queue()
        self._migrated = False

    @classmethod
    @asynccontextmanager
    async def from_conn_string(
        cls, conn_string: str, **options: Any
    ) -> AsyncIterator[AsyncDurableSqliteSaver]:
        """Open `conn_string` (a file path or `:memory:`) and yield a saver on it;
        `options` are the saver's keyword arguments (`serde`, `flow_version`, ...)."""
        async with aiosqlite.connect(conn_string) as conn:
            yield cls(conn, **options)

    @classmethod
    async def open_read_only(
        cls, path: str, *, serde: SerializerProtocol | None = None
    ) -> AsyncDurableSqliteSaver:
        """A saver that only reads the database at `path` (see
        `DurableSqliteSaver.open_read_only`: `mode=ro`, never creates, migrates or
        writes it); close its `conn` when done (`await saver.conn.close()`).

        Raises:
            GraphDurableError: no such file; not a SQLite database; a LangGraph database
                without graph_durable's ledger; or a ledger an older graph_durable wrote
                and a writer has not migrated yet. Each says what to do.
        """
        conn = await aiosqlite.connect(read_only_uri(path), uri=True)
        try:
            await on_connection_thread(conn, check_read_only, path, "AsyncDurableSqliteSaver")
        except BaseException:
            await conn.close()
            raise
        saver = cls._reader(conn, serde)
        saver._migrated = True
        return saver  # type: ignore[no-any-return]

    async def setup(self) -> None:
        """Create LangGraph's tables and apply pending ledger migrations (safe to repeat).

        On a database already up to date it only reads (see `DurableSqliteSaver.setup`:
        no write lock, works on a read-only connection); a setup refused by another
        connection's lock is tried again for the connection's busy timeout.
        """
        if self._migrated:
            return
        try:
            try:
                await self._setup_once()  # opens the connection first, if it is not yet
            except sqlite3.OperationalError as exc:
                if not is_locked(exc):
                    raise
                wait = await on_connection_thread(self.conn, busy_timeout)
                await aretry_locked(self._setup_once, wait)
        except sqlite3.OperationalError as exc:
            setup_refused(exc)

    async def adurability(self) -> DurabilityReport:
        """`DurableSqliteSaver.durability`, read on this saver's connection."""
        return await on_connection_thread(self.conn, read_sqlite)

    async def _setup_once(self) -> None:
        await super().setup()
        async with self.lock:
            if self._migrated:
                return
            await on_connection_thread(self.conn, setup_ledger, self._db_secret_params())
            self._migrated = True

    async def _write(
        self, body: Callable[[sqlite3.Cursor], T], thread_id: str | None = None,
        config: RunnableConfig | None = None,
    ) -> T:
        """`body(cursor)` in one write transaction (see `_transaction`), run whole on the
        connection's thread: one round trip. With `thread_id`, fenced and flow-pinned."""
        await self.setup()
        async with self.lock:
            return await on_connection_thread(self.conn, self._write_now, body, thread_id,
                                              config)

    def _write_now(self, conn: sqlite3.Connection, body: Callable[[sqlite3.Cursor], T],
                   thread_id: str | None, config: RunnableConfig | None) -> T:
        with self._transaction(conn, thread_id, config) as cur:
            return body(cur)

    async def _aquery(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Every row of one read (the ledger's reads are in `AsyncLedgerReads`), run on
        the connection's thread: one round trip."""
        await self.setup()
        async with self.lock:
            return await on_connection_thread(self.conn, _fetchall_now, sql, tuple(params))

    # -- checkpoints ---------------------------------------------------------------------

    async def _aput_fenced(self, config: RunnableConfig, checkpoint: Checkpoint,
                           metadata: CheckpointMetadata, new_versions: ChannelVersions
                           ) -> RunnableConfig:
        write, stored = self._checkpoint_write(config, checkpoint, metadata)
        await self._store(write, config)
        return stored

    async def _aput_writes_fenced(self, config: RunnableConfig,
                                  writes: Sequence[tuple[str, Any]], task_id: str,
                                  task_path: str) -> None:
        await self._store(self._writes_write(config, writes, task_id, task_path), config)

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete the thread's checkpoints, writes, effects, events and flow pin."""
        self._forget_stored()
        await self._write(lambda cur: self._delete_thread_txn(cur, str(thread_id)))
        self._flow_checked.discard(str(thread_id))
        self._forget_deferred(str(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) created by these runs; keep the ledger."""
        self._forget_stored()
        await self._write(lambda cur: self._delete_for_runs_txn(cur, run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy checkpoints, writes, effects and events of one thread to another."""
        await self._write(lambda cur: self._copy_thread_txn(
            cur, str(source_thread_id), str(target_thread_id)))

    async def aprune(
        self, thread_ids: Sequence[str], *, strategy: str = "keep_latest"
    ) -> None:
        """Prune checkpoints: `keep_latest` keeps the newest per namespace, `delete` all."""
        if self._prune_deletes(thread_ids, strategy):
            for thread_id in thread_ids:
                await self.adelete_thread(thread_id)
            return
        await self._write(lambda cur: self._prune_txn(cur, thread_ids))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Sync `aprune`."""
        self._sync(self.aprune(thread_ids, strategy=strategy))

    # -- leases --------------------------------------------------------------------------

    async def aacquire_lease(self, thread_id: str, owner: str, ttl: float = 30.0) -> Lease:
        """Take the thread with a new, higher fencing token (see `alease`)."""
        return await self._write(
            lambda cur: self._acquire_lease_txn(cur, str(thread_id), owner, ttl))

    async def arenew_lease(self, lease: Lease) -> bool:
        """Extend a live lease by its ttl; `False` if it expired or was taken over."""
        started = time.monotonic()
        now = time.time()
        expires_at = now + lease.ttl
        renewed = await self._write(
            lambda cur: self._renew_lease_txn(cur, lease, expires_at, now))
        if renewed:
            lease.extended(expires_at, started)
        return renewed

    async def arelease_lease(self, lease: Lease) -> None:
        """End a lease now (a no-op if another owner has taken the thread since)."""
        await self._write(lambda cur: self._release_lease_txn(cur, lease))

    async def arecord_task_run(self, thread_id: str, run_id: str, checkpoint_ns: str,
                               node: str, kind: str) -> None:
        """Log that a node (or a model call in it) started, for `graph_durable.operators.audit`."""
        await self._write(lambda cur: self._record_task_run_txn(
            cur, str(thread_id), run_id, checkpoint_ns, node, kind))

    async def _arun_statements(self, statements: Any) -> Any:
        return await self._write(lambda cur: self._statements_txn(cur, statements))

    # -- the ledger ----------------------------------------------------------------------

    async def aapply(
        self, write: LedgerWrite, config: RunnableConfig | None = None
    ) -> list[EffectRecord]:
        """Apply one ledger write in one durable transaction; return the changed effects.

        A write marked `defer` returns at once and is committed with the thread's next
        write.
        """
        if self._defer(write, config):
            return []
        [item] = await self._commit_with_group([write], config)
        return self._applied(item, "aclaim")

    async def aclaim_many(
        self, intents: Sequence[IntentWrite], config: RunnableConfig | None = None
    ) -> list[tuple[EffectRecord, bool]]:
        """`aclaim` several intents in one transaction (one fsync for all of them).

        Each intent is claimed on its own: a known key reports its record, and a refused
        intent (`LeaseLost`, `FlowVersionMismatch`) raises after the others were
        committed.
        """
        return self._claimed(await self._commit_with_group(intents, config))

    async def _store(self, write: CheckpointWrite, config: RunnableConfig) -> None:
        """Commit a checkpoint write, fenced, with the group."""
        [item] = await self._commit_with_group([write], config)
        if item.error is not None:
            raise item.error

    async def _commit_with_group(
        self, writes: Sequence[LedgerWrite | CheckpointWrite], config: RunnableConfig | None
    ) -> list[QueuedWrite]:
        """Queue `writes` and wait for the transaction that commits them: this caller's,
        or one already waiting for the lock, which takes every queued write along."""
        items = self._enqueue(writes, config)
        await self.setup()
        async with self.lock:
            if not all(item.done for item in items):
                await on_connection_thread(self.conn, self._commit_queue)
        return items


def _fetchall_now(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> list[Any]:
    cur = conn.execute(sql, params)
    try:
        return cur.fetchall()
    finally:
        cur.close()
