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

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Collection, Coroutine, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import aiosqlite
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    SerializerProtocol,
)
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from graph_durable.checkpointers import _sql
from graph_durable.checkpointers.sqlite._aiosqlite import on_connection_thread
from graph_durable.checkpointers._base import DurableSaverMixin
from graph_durable.checkpointers.sqlite._readonly import (
    SETUP_NEEDS,
    SqliteReadOnly,
    check_read_only,
    is_read_only,
    migrate,
    read_only_uri,
    schema_current,
)
from graph_durable.checkpointers.sqlite._txn import (
    CheckpointWrite,
    QueuedWrite,
    SqliteTransactions,
)
from graph_durable.leases import Lease, cancelled_by, register, unregister
from graph_durable.ledger import (
    EffectEvent,
    EffectRecord,
    EffectStatus,
    IntentWrite,
    Keying,
    LedgerWrite,
)
from graph_durable.faults import fault_point

__all__ = ["AsyncDurableSqliteSaver"]

T = TypeVar("T")


class AsyncDurableSqliteSaver(DurableSaverMixin, SqliteTransactions, AsyncSqliteSaver):
    """An async LangGraph checkpointer on SQLite that also keeps the effect ledger.

    Args:
        conn: An `aiosqlite.Connection`.
        serde: Serializer for checkpoints, stored tool results and, when it encrypts
            (`EncryptedSerializer`), everything the ledger keeps about a call.
        flow_version: Version of the graph's flow: a thread's first write pins it, and a
            thread pinned to another version is refused (`FlowVersionMismatch`).
        compatible_flow_versions: Other pinned versions this graph may resume.
        key_secret: Secret the effects' keys are an HMAC under (one, or several newest
            first to rotate); default `GRAPH_DURABLE_KEY_SECRET`, else a random secret
            kept in the database. See `graph_durable.secrets`.
    """

    def __init__(
        self,
        conn: aiosqlite.Connection,
        *,
        serde: SerializerProtocol | None = None,
        flow_version: str | None = None,
        compatible_flow_versions: Collection[str] = (),
        key_secret: str | bytes | Sequence[str | bytes] | None = None,
    ) -> None:
        super().__init__(conn, serde=serde)
        self._init_durable(flow_version, compatible_flow_versions, key_secret)
        self._init_queue()
        self._migrated = False

    @classmethod
    @asynccontextmanager
    async def from_conn_string(
        cls, conn_string: str, *, flow_version: str | None = None,
        compatible_flow_versions: Collection[str] = (), serde: SerializerProtocol | None = None,
        key_secret: str | bytes | Sequence[str | bytes] | None = None,
    ) -> AsyncIterator[AsyncDurableSqliteSaver]:
        """Open `conn_string` (a file path or `:memory:`) and yield a saver on it."""
        async with aiosqlite.connect(conn_string) as conn:
            yield cls(conn, flow_version=flow_version,
                      compatible_flow_versions=compatible_flow_versions, serde=serde,
                      key_secret=key_secret)

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
        saver = cls(conn, serde=serde)
        saver.is_setup = saver._migrated = True  # creating or migrating is not ours
        saver._lenient = True
        return saver

    async def setup(self) -> None:
        """Create LangGraph's tables and apply pending ledger migrations (safe to repeat).

        On a database already up to date it only reads (see `DurableSqliteSaver.setup`:
        no write lock, works on a read-only connection).
        """
        if self._migrated:
            return
        try:
            await super().setup()
            async with self.lock:
                if self._migrated:
                    return
                await self.conn.execute("PRAGMA synchronous=FULL")
                if not await on_connection_thread(self.conn, schema_current):
                    await on_connection_thread(self.conn, migrate, self._db_secret_params())
                self._migrated = True
        except sqlite3.OperationalError as exc:
            if is_read_only(exc):
                raise SqliteReadOnly.refused(SETUP_NEEDS, exc) from exc
            raise

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

    async def _fetchall(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        await self.setup()
        async with self.lock:
            return await on_connection_thread(self.conn, _fetchall_now, sql, params)

    def _sync(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            if asyncio.get_running_loop() is self.loop:
                coro.close()
                raise asyncio.InvalidStateError(
                    "Synchronous calls to AsyncDurableSqliteSaver are only allowed from a "
                    "different thread; from the event loop, await the `a`-prefixed method."
                )
        except RuntimeError:
            pass
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    # -- checkpoints ---------------------------------------------------------------------

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """List checkpoints, newest first (read before yielding: safe to nest calls)."""
        items = [
            item async for item in super().alist(
                config, filter=filter, before=before, limit=limit
            )
        ]
        for item in items:
            yield item

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Sync `alist`, from a thread other than the saver's event loop."""

        async def collect() -> list[CheckpointTuple]:
            return [
                item async for item in self.alist(
                    config, filter=filter, before=before, limit=limit
                )
            ]

        yield from self._sync(collect())

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Save a checkpoint, fenced and flow-pinned in the same transaction."""
        fault_point("before_put")
        statement, stored = self._checkpoint_statement(config, checkpoint, metadata)
        await self._store(str(config["configurable"]["thread_id"]), config,
                          lambda cur: cur.execute(*statement))
        self._remember_stored(stored)
        fault_point("after_put")
        return stored

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Save a task's pending writes, fenced and flow-pinned in the same transaction."""
        fault_point("before_put_writes")
        sql, rows = self._writes_statement(config, writes, task_id, task_path)

        def body(cur: sqlite3.Cursor) -> None:
            cur.executemany(sql, rows)
            for statement in self._late_resume(config, writes, task_id):
                cur.execute(*statement)

        await self._store(str(config["configurable"]["thread_id"]), config, body)
        fault_point("after_put_writes")

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
        self._forget_stored()
        if strategy == "delete":
            for thread_id in thread_ids:
                await self.adelete_thread(thread_id)
            return
        if strategy != "keep_latest":
            raise ValueError(f"Unknown prune strategy {strategy!r}; use 'keep_latest' or 'delete'")
        await self._write(lambda cur: self._prune_txn(cur, thread_ids))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Sync `adelete_for_runs`."""
        self._sync(self.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Sync `acopy_thread`."""
        self._sync(self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Sync `aprune`."""
        self._sync(self.aprune(thread_ids, strategy=strategy))

    async def akey_thread(self, thread_id: str) -> str:
        """The thread whose id keys this thread's effects: itself, or for a copy, the
        thread it was copied from (so the copy finds its source's effects)."""
        return (await self.akeying(thread_id))[0]

    async def akeying(self, thread_id: str) -> Keying:
        """See `DurableSqliteSaver.keying`."""
        rows = await self._fetchall(_sql.SELECT_KEYING, self._keying_params(str(thread_id)))
        return self._keying_of(rows)

    def key_thread(self, thread_id: str) -> str:
        """Sync `akey_thread`, from a thread other than the saver's event loop."""
        return self._sync(self.akey_thread(thread_id))

    def keying(self, thread_id: str) -> Keying:
        """Sync `akeying`, from a thread other than the saver's event loop."""
        return self._sync(self.akeying(thread_id))

    # -- leases --------------------------------------------------------------------------

    @asynccontextmanager
    async def alease(
        self, thread_id: str, owner: str, ttl: float = 30.0
    ) -> AsyncIterator[Lease]:
        """Hold `thread_id` as `owner` while the block runs, renewing every `ttl / 3`.

        Raises:
            LeaseHeld: another owner's lease on the thread is live.
        """
        lease = await self.aacquire_lease(thread_id, owner, ttl)
        register(lease)
        lease.start_renewing(self.renew_lease)
        try:
            yield lease
        finally:
            lease.stop_renewing()
            unregister(lease)
            await self.arelease_lease(lease)

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

    async def alive_leases(self) -> dict[str, tuple[str, int, float]]:
        """`{thread_id: (owner, token, expires_at)}` of every live lease."""
        rows = await self._fetchall(_sql.SELECT_LIVE_LEASES, (time.time(),))
        return {thread_id: (owner, token, expires) for thread_id, owner, token, expires in rows}

    async def acancelled_by(self, thread_id: str) -> str | None:
        """Who `cancel()` stopped the thread for, or `None` (see `DurableSqliteSaver`)."""
        rows = await self._fetchall(_sql.SELECT_LEASE, (str(thread_id),))
        return cancelled_by(rows[0][0]) if rows else None

    async def arecord_task_run(self, thread_id: str, run_id: str, checkpoint_ns: str,
                               node: str, kind: str) -> None:
        """Log that a node (or a model call in it) started, for `graph_durable.operators.audit`."""
        await self._write(lambda cur: self._record_task_run_txn(
            cur, str(thread_id), run_id, checkpoint_ns, node, kind))

    async def atask_runs(self, thread_id: str) -> list[tuple[int, str, str, str, str, float]]:
        """The run log of an audited thread (see `DurableSqliteSaver.task_runs`)."""
        return [tuple(row) for row in
                await self._fetchall(_sql.SELECT_TASK_RUNS, (str(thread_id),))]  # type: ignore[misc]

    def record_task_run(self, thread_id: str, run_id: str, checkpoint_ns: str, node: str,
                        kind: str) -> None:
        """Sync `arecord_task_run`."""
        self._sync(self.arecord_task_run(thread_id, run_id, checkpoint_ns, node, kind))

    def task_runs(self, thread_id: str) -> list[tuple[int, str, str, str, str, float]]:
        """Sync `atask_runs`."""
        return self._sync(self.atask_runs(thread_id))

    async def athread_ids(self) -> list[str]:
        """Every thread with a checkpoint, sorted."""
        return [row[0] for row in await self._fetchall(_sql.SELECT_THREAD_IDS, ())]

    def acquire_lease(self, thread_id: str, owner: str, ttl: float = 30.0) -> Lease:
        """Sync `aacquire_lease`."""
        return self._sync(self.aacquire_lease(thread_id, owner, ttl))

    def renew_lease(self, lease: Lease) -> bool:
        """Sync `arenew_lease`."""
        return self._sync(self.arenew_lease(lease))

    def release_lease(self, lease: Lease) -> None:
        """Sync `arelease_lease`."""
        self._sync(self.arelease_lease(lease))

    def live_leases(self) -> dict[str, tuple[str, int, float]]:
        """Sync `alive_leases`."""
        return self._sync(self.alive_leases())

    def cancelled_by(self, thread_id: str) -> str | None:
        """Sync `acancelled_by`."""
        return self._sync(self.acancelled_by(thread_id))

    def thread_ids(self) -> list[str]:
        """Sync `athread_ids`."""
        return self._sync(self.athread_ids())

    # -- the ledger ----------------------------------------------------------------------

    async def aeffect(self, key: str, thread_id: str | None = None) -> EffectRecord | None:
        """The effect with this key (in `thread_id`, or its first thread), or `None`."""
        if thread_id is None:
            rows = await self._fetchall(_sql.SELECT_EFFECT_BY_KEY, (key,))
        else:
            rows = await self._fetchall(_sql.SELECT_EFFECT, (str(thread_id), key))
        return self._record(rows[0]) if rows else None

    async def asent_in_family(self, key: str, thread_id: str) -> EffectRecord | None:
        """The effect `key` as another thread of the family holds it once sent or on its
        way, or `None` (see `DurableSqliteSaver.sent_in_family`)."""
        rows = await self._fetchall(_sql.SELECT_SENT_IN_FAMILY, (key, str(thread_id)))
        return self._record(rows[0]) if rows else None

    def sent_in_family(self, key: str, thread_id: str) -> EffectRecord | None:
        """Sync `asent_in_family`, from a thread other than the saver's event loop."""
        return self._sync(self.asent_in_family(key, thread_id))

    async def aeffects(
        self, thread_id: str | None = None, status: EffectStatus | str | None = None
    ) -> list[EffectRecord]:
        """Effects, oldest first, optionally of one thread and one status."""
        sql, params = _sql.select_effects(
            None if thread_id is None else str(thread_id),
            None if status is None else EffectStatus(status).value,
        )
        return [self._record(row) for row in await self._fetchall(sql, params)]

    async def aevents(
        self, thread_id: str | None = None, key: str | None = None
    ) -> list[EffectEvent]:
        """The append-only journal, in order, optionally of one thread and one key."""
        sql, params = _sql.select_events(None if thread_id is None else str(thread_id), key)
        return [self._event(row) for row in await self._fetchall(sql, params)]

    async def astored_result(self, thread_id: str, key: str) -> Any:
        """The ToolMessage or Command stored with a terminal effect, for replay."""
        rows = await self._fetchall(_sql.SELECT_RESULT, (str(thread_id), key))
        return self._load_result(rows[0] if rows else None)

    async def aasked_in_task(self, thread_id: str, checkpoint_ns: str) -> list[EffectRecord]:
        """Effects of one task that a pending interrupt asks a human about."""
        rows = await self._fetchall(_sql.SELECT_ASKED_IN_TASK, (str(thread_id), checkpoint_ns))
        return [self._record(row) for row in rows]

    async def acheckpoint_exists(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str
    ) -> bool:
        """Whether this checkpoint is durably stored."""
        if self._known_stored(thread_id, checkpoint_ns, checkpoint_id):
            return True
        rows = await self._fetchall(
            _sql.SELECT_CHECKPOINT_EXISTS, (str(thread_id), checkpoint_ns, checkpoint_id)
        )
        return bool(rows)

    async def acalled_tasks(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str
                            ) -> set[str]:
        """Async `DurableSqliteSaver.called_tasks`."""
        rows = await self._fetchall(_sql.SELECT_CALLED_TASKS,
                                    (str(thread_id), checkpoint_ns, checkpoint_id))
        return {row[0] for row in rows}

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

    async def aclaim(
        self, intent: IntentWrite, config: RunnableConfig | None = None
    ) -> tuple[EffectRecord, bool]:
        """Record `intent` unless its key is already known; return it and whether new."""
        [claimed] = await self.aclaim_many([intent], config)
        return claimed

    async def aclaim_many(
        self, intents: Sequence[IntentWrite], config: RunnableConfig | None = None
    ) -> list[tuple[EffectRecord, bool]]:
        """`aclaim` several intents in one transaction (one fsync for all of them).

        Each intent is claimed on its own: a known key reports its record, and a refused
        intent (`LeaseLost`, `FlowVersionMismatch`) raises after the others were
        committed.
        """
        return self._claimed(await self._commit_with_group(intents, config))

    async def _store(self, thread_id: str, config: RunnableConfig,
                     body: Callable[[sqlite3.Cursor], Any]) -> None:
        """Commit a checkpoint write (`body`), fenced, with the group."""
        [item] = await self._commit_with_group([CheckpointWrite(thread_id, body)], config)
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

    def claim(
        self, intent: IntentWrite, config: RunnableConfig | None = None
    ) -> tuple[EffectRecord, bool]:
        """Sync `aclaim`."""
        return self._sync(self.aclaim(intent, config))

    def claim_many(
        self, intents: Sequence[IntentWrite], config: RunnableConfig | None = None
    ) -> list[tuple[EffectRecord, bool]]:
        """Sync `aclaim_many`."""
        return self._sync(self.aclaim_many(intents, config))

    def effect(self, key: str, thread_id: str | None = None) -> EffectRecord | None:
        """Sync `aeffect`, from a thread other than the saver's event loop."""
        return self._sync(self.aeffect(key, thread_id))

    def effects(
        self, thread_id: str | None = None, status: EffectStatus | str | None = None
    ) -> list[EffectRecord]:
        """Sync `aeffects`."""
        return self._sync(self.aeffects(thread_id, status))

    def events(self, thread_id: str | None = None, key: str | None = None) -> list[EffectEvent]:
        """Sync `aevents`."""
        return self._sync(self.aevents(thread_id, key))

    def stored_result(self, thread_id: str, key: str) -> Any:
        """Sync `astored_result`."""
        return self._sync(self.astored_result(thread_id, key))

    def asked_in_task(self, thread_id: str, checkpoint_ns: str) -> list[EffectRecord]:
        """Sync `aasked_in_task`."""
        return self._sync(self.aasked_in_task(thread_id, checkpoint_ns))

    def checkpoint_exists(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> bool:
        """Sync `acheckpoint_exists`."""
        return self._sync(self.acheckpoint_exists(thread_id, checkpoint_ns, checkpoint_id))

    def called_tasks(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> set[str]:
        """Sync `acalled_tasks`."""
        return self._sync(self.acalled_tasks(thread_id, checkpoint_ns, checkpoint_id))

    def apply(self, write: LedgerWrite, config: RunnableConfig | None = None) -> list[EffectRecord]:
        """Sync `aapply`."""
        return self._sync(self.aapply(write, config))


def _fetchall_now(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> list[Any]:
    cur = conn.execute(sql, params)
    try:
        return cur.fetchall()
    finally:
        cur.close()
