"""`AsyncDurableSqliteSaver`: the async twin of `DurableSqliteSaver` (aiosqlite).

Same tables, same SQL (`_sql.py`), same retention rules; see `sqlite.py` for what
`delete_thread`, `prune`, `delete_for_runs` and `copy_thread` do with the ledger.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
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
from graph_durable.checkpointers._base import DurableSaverMixin, actor_of
from graph_durable.checkpointers._schema import MIGRATIONS, MIGRATIONS_TABLE
from graph_durable.checkpointers.sqlite import _statements
from graph_durable.testing.faults import fault_point
from graph_durable.ledger import (
    EffectEvent,
    EffectRecord,
    EffectStatus,
    IntentWrite,
    LedgerWrite,
    WriteBatch,
)

__all__ = ["AsyncDurableSqliteSaver"]

T = TypeVar("T")


class AsyncDurableSqliteSaver(DurableSaverMixin, AsyncSqliteSaver):
    """An async LangGraph checkpointer on SQLite that also keeps the effect ledger.

    Args:
        conn: An `aiosqlite.Connection`.
        serde: Serializer for checkpoints and stored tool results.
        flow_version: Version of the graph's flow this saver pins threads to.
    """

    def __init__(
        self,
        conn: aiosqlite.Connection,
        *,
        serde: SerializerProtocol | None = None,
        flow_version: str | None = None,
    ) -> None:
        super().__init__(conn, serde=serde)
        self.flow_version = flow_version
        self._migrated = False

    @classmethod
    @asynccontextmanager
    async def from_conn_string(
        cls, conn_string: str, *, flow_version: str | None = None
    ) -> AsyncIterator[AsyncDurableSqliteSaver]:
        """Open `conn_string` (a file path or `:memory:`) and yield a saver on it."""
        async with aiosqlite.connect(conn_string) as conn:
            yield cls(conn, flow_version=flow_version)

    async def setup(self) -> None:
        """Create LangGraph's tables and apply pending ledger migrations (safe to repeat)."""
        if self._migrated:
            return
        await super().setup()
        async with self.lock:
            if self._migrated:
                return
            await self.conn.execute("PRAGMA synchronous=FULL")
            await self.conn.execute(MIGRATIONS_TABLE)
            await self.conn.commit()
            await self.conn.execute("BEGIN IMMEDIATE")
            try:
                async with self.conn.execute(
                    "SELECT COALESCE(MAX(v), -1) FROM graph_durable_migrations"
                ) as cur:
                    applied = (await cur.fetchone())[0]
                for version in range(applied + 1, len(MIGRATIONS)):
                    for statement in _statements(MIGRATIONS[version]):
                        await self.conn.execute(statement)
                    await self.conn.execute(
                        "INSERT INTO graph_durable_migrations (v, applied_at) VALUES (?, ?)",
                        (version, time.time()),
                    )
            except BaseException:
                await self.conn.rollback()
                raise
            await self.conn.commit()
            self._migrated = True

    @asynccontextmanager
    async def _txn(self) -> AsyncIterator[aiosqlite.Cursor]:
        """One write transaction, taken with `BEGIN IMMEDIATE` so reads in it are current."""
        await self.setup()
        async with self.lock, self.conn.cursor() as cur:
            await cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
            except BaseException:
                await self.conn.rollback()
                raise
            await self.conn.commit()

    async def _fetchall(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        await self.setup()
        async with self.lock, self.conn.execute(sql, params) as cur:
            return list(await cur.fetchall())

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
        """Save a checkpoint (LangGraph's `aput`, between two fault points)."""
        fault_point("before_put")
        stored = await super().aput(config, checkpoint, metadata, new_versions)
        fault_point("after_put")
        return stored

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Save a task's pending writes (LangGraph's `aput_writes`, between fault points)."""
        fault_point("before_put_writes")
        await super().aput_writes(config, writes, task_id, task_path)
        fault_point("after_put_writes")

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete the thread's checkpoints, writes, effects and journal events."""
        async with self._txn() as cur:
            for statement in (*_sql.DELETE_THREAD_CHECKPOINTS, *_sql.DELETE_THREAD_LEDGER):
                await cur.execute(statement, (str(thread_id),))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) created by these runs; keep the ledger."""
        async with self._txn() as cur:
            for run_id in run_ids:
                await cur.execute(_sql.SELECT_RUN_CHECKPOINTS, (str(run_id),))
                for row in await cur.fetchall():
                    await cur.execute(_sql.DELETE_CHECKPOINT, tuple(row))
                    await cur.execute(_sql.DELETE_CHECKPOINT_WRITES, tuple(row))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy checkpoints, writes, effects and events of one thread to another."""
        params = (str(target_thread_id), str(source_thread_id))
        async with self._txn() as cur:
            for statement in (*_sql.COPY_THREAD_CHECKPOINTS, *_sql.COPY_THREAD_LEDGER):
                await cur.execute(statement, params)

    async def aprune(
        self, thread_ids: Sequence[str], *, strategy: str = "keep_latest"
    ) -> None:
        """Prune checkpoints: `keep_latest` keeps the newest per namespace, `delete` all."""
        if strategy == "delete":
            for thread_id in thread_ids:
                await self.adelete_thread(thread_id)
            return
        if strategy != "keep_latest":
            raise ValueError(f"Unknown prune strategy {strategy!r}; use 'keep_latest' or 'delete'")
        async with self._txn() as cur:
            for thread_id in thread_ids:
                await cur.execute(_sql.SELECT_PRUNABLE, (str(thread_id),))
                for row in await cur.fetchall():
                    await cur.execute(_sql.DELETE_CHECKPOINT, tuple(row))
                    await cur.execute(_sql.DELETE_CHECKPOINT_WRITES, tuple(row))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Sync `adelete_for_runs`."""
        self._sync(self.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Sync `acopy_thread`."""
        self._sync(self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Sync `aprune`."""
        self._sync(self.aprune(thread_ids, strategy=strategy))

    # -- the ledger ----------------------------------------------------------------------

    async def aeffect(self, key: str, thread_id: str | None = None) -> EffectRecord | None:
        """The effect with this key (in `thread_id`, or its first thread), or `None`."""
        if thread_id is None:
            rows = await self._fetchall(_sql.SELECT_EFFECT_BY_KEY, (key,))
        else:
            rows = await self._fetchall(_sql.SELECT_EFFECT, (str(thread_id), key))
        return _sql.effect_from_row(rows[0]) if rows else None

    async def aeffects(
        self, thread_id: str | None = None, status: EffectStatus | str | None = None
    ) -> list[EffectRecord]:
        """Effects, oldest first, optionally of one thread and one status."""
        sql, params = _sql.select_effects(
            None if thread_id is None else str(thread_id),
            None if status is None else EffectStatus(status).value,
        )
        return [_sql.effect_from_row(row) for row in await self._fetchall(sql, params)]

    async def aevents(
        self, thread_id: str | None = None, key: str | None = None
    ) -> list[EffectEvent]:
        """The append-only journal, in order, optionally of one thread and one key."""
        sql, params = _sql.select_events(None if thread_id is None else str(thread_id), key)
        return [_sql.event_from_row(row) for row in await self._fetchall(sql, params)]

    async def astored_result(self, thread_id: str, key: str) -> Any:
        """The ToolMessage or Command stored with a terminal effect, for replay."""
        rows = await self._fetchall(_sql.SELECT_RESULT, (str(thread_id), key))
        return self._load_result(rows[0] if rows else None)

    async def aasked_in_task(self, thread_id: str, checkpoint_ns: str) -> list[EffectRecord]:
        """Effects of one task that a pending interrupt asks a human about."""
        rows = await self._fetchall(_sql.SELECT_ASKED_IN_TASK, (str(thread_id), checkpoint_ns))
        return [_sql.effect_from_row(row) for row in rows]

    async def acheckpoint_exists(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str
    ) -> bool:
        """Whether this checkpoint is durably stored."""
        rows = await self._fetchall(
            _sql.SELECT_CHECKPOINT_EXISTS, (str(thread_id), checkpoint_ns, checkpoint_id)
        )
        return bool(rows)

    async def aapply(
        self, write: LedgerWrite, config: RunnableConfig | None = None
    ) -> list[EffectRecord]:
        """Apply one ledger write in one durable transaction; return the changed effects."""
        actor = actor_of(config)
        writes = write.writes if isinstance(write, WriteBatch) else (write,)
        async with self._txn() as cur:
            for one in writes:
                if isinstance(one, IntentWrite):
                    plan = self._plan_intent(one, actor)
                else:
                    await cur.execute(_sql.SELECT_EFFECT, (one.thread_id, one.key))
                    plan = self._plan_transition(await cur.fetchone(), one, actor)
                for sql, params in plan:
                    await cur.execute(sql, params)
            if isinstance(write, WriteBatch) and write.resume_at is not None:
                await cur.execute(_sql.DELETE_NULL_RESUME, (write.thread_id, *write.resume_at))
            changed = []
            for one in writes:
                await cur.execute(_sql.SELECT_EFFECT, (one.thread_id, one.key))
                changed.append(_sql.effect_from_row(await cur.fetchone()))
            return changed

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

    def apply(self, write: LedgerWrite, config: RunnableConfig | None = None) -> list[EffectRecord]:
        """Sync `aapply`."""
        return self._sync(self.aapply(write, config))
