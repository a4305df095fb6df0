"""The twin methods of a durable saver: async ones done by sync ones, or the reverse.

LangGraph's sync savers raise on every async method. A durable saver answers both
ways, so a graph run with `ainvoke` (and the guard's async driver) can use it:
`AsyncFromSync` runs each sync twin on the calling thread. An async saver answers sync
calls from other threads (the lease renewer's, a sync tool's, a `graph.invoke` run
elsewhere): `SyncFromAsync` runs each async twin on the saver's event loop and waits.

The methods both twins of every saver share, around the engine's I/O, are here too:
`list`/`alist` read every result before yielding the first (`EagerListing`,
`AsyncEagerListing`); `put`/`put_writes` and their async twins stop at the fault points
crash tests name and remember what they stored, around the engine's fenced write
(`FencedPuts`, `AsyncFencedPuts`, each saver supplying `_put_fenced` and
`_put_writes_fenced` or their async twins); `alease` holds a lease as
`DurableSaverMixin.lease` does (`AsyncLeaseScope`).

This module is over 400 lines: it is the table of methods a saver has in both forms,
each sync one beside its async twin, so that a saver's own modules hold only its I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)

from graph_durable.checkpointers._base import renewed
from graph_durable.errors import LeaseLost
from graph_durable.faults import fault_point
from graph_durable.leases import Lease
from graph_durable.ledger import (
    EffectEvent,
    EffectRecord,
    EffectStatus,
    IntentWrite,
    Keying,
    LedgerWrite,
)
from graph_durable.telemetry.stats import LedgerStats

__all__ = [
    "AsyncEagerListing",
    "AsyncFencedPuts",
    "AsyncFromSync",
    "AsyncLeaseScope",
    "EagerListing",
    "FencedPuts",
    "SyncFromAsync",
]

T = TypeVar("T")


class EagerListing:
    """Mixin for a sync saver: `list` reads every result before yielding the first, so
    the caller may call other saver methods while iterating (LangGraph's savers hold
    their lock, or a cursor, across yields).

    Put it before the LangGraph saver in the bases, whose `list` it wraps.
    """

    def _before_list(self) -> None:
        """What must run before LangGraph's `list` (nothing, unless the saver says)."""

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """List checkpoints, newest first (read before the first is yielded, so the
        caller may call other saver methods while iterating)."""
        self._before_list()
        yield from [*super().list(  # type: ignore[misc]
            config, filter=filter, before=before, limit=limit)]


class AsyncEagerListing:
    """Mixin for an async saver: `alist` reads every result before yielding the first
    (see `EagerListing`), and `list` is `alist` run on the saver's loop (`_sync`)."""

    async def _abefore_list(self) -> None:
        """What must run before LangGraph's `alist` (nothing, unless the saver says)."""

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """List checkpoints, newest first (read before yielding: safe to nest calls)."""
        await self._abefore_list()
        items = [item async for item in super().alist(  # type: ignore[misc]
            config, filter=filter, before=before, limit=limit)]
        for item in items:
            yield item

    def list(self, config: RunnableConfig | None, **options: Any) -> Iterator[CheckpointTuple]:
        """Sync `alist` (same keyword arguments), from a thread other than the saver's
        event loop."""

        async def collect() -> list[CheckpointTuple]:
            return [item async for item in self.alist(config, **options)]

        yield from self._sync(collect())  # type: ignore[attr-defined]


class FencedPuts:
    """Mixin for a sync saver: `put` and `put_writes` around the engine's fenced write
    (`_put_fenced`, `_put_writes_fenced`), with the fault points crash tests stop at and
    the cache of checkpoints this saver stored."""

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Save a checkpoint, fenced and flow-pinned in the same transaction."""
        fault_point("before_put")
        try:
            stored = self._put_fenced(config, checkpoint, metadata, new_versions)
        except LeaseLost as refused:
            self._remember_refused(config, checkpoint["id"], refused)  # type: ignore[attr-defined]
            raise
        self._remember_stored(stored)  # type: ignore[attr-defined]
        fault_point("after_put")
        return stored

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        """Save a task's pending writes, fenced and flow-pinned in the same transaction."""
        fault_point("before_put_writes")
        self._put_writes_fenced(config, writes, task_id, task_path)
        fault_point("after_put_writes")

    def _put_fenced(self, config: RunnableConfig, checkpoint: Checkpoint,
                    metadata: CheckpointMetadata, new_versions: ChannelVersions
                    ) -> RunnableConfig:
        raise NotImplementedError

    def _put_writes_fenced(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                           task_id: str, task_path: str) -> None:
        raise NotImplementedError


class AsyncFencedPuts:
    """`FencedPuts` for an async saver: `aput` and `aput_writes` around the engine's
    awaited fenced write (`_aput_fenced`, `_aput_writes_fenced`)."""

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions
                   ) -> RunnableConfig:
        """Save a checkpoint, fenced and flow-pinned in the same transaction."""
        fault_point("before_put")
        try:
            stored = await self._aput_fenced(config, checkpoint, metadata, new_versions)
        except LeaseLost as refused:
            self._remember_refused(config, checkpoint["id"], refused)  # type: ignore[attr-defined]
            raise
        self._remember_stored(stored)  # type: ignore[attr-defined]
        fault_point("after_put")
        return stored

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        """Save a task's pending writes, fenced and flow-pinned in the same transaction."""
        fault_point("before_put_writes")
        await self._aput_writes_fenced(config, writes, task_id, task_path)
        fault_point("after_put_writes")

    async def _aput_fenced(self, config: RunnableConfig, checkpoint: Checkpoint,
                           metadata: CheckpointMetadata, new_versions: ChannelVersions
                           ) -> RunnableConfig:
        raise NotImplementedError

    async def _aput_writes_fenced(self, config: RunnableConfig,
                                  writes: Sequence[tuple[str, Any]], task_id: str,
                                  task_path: str) -> None:
        raise NotImplementedError


class AsyncLeaseScope:
    """Mixin for an async saver: `alease`, the async twin of `DurableSaverMixin.lease`."""

    @asynccontextmanager
    async def alease(self, thread_id: str, owner: str, ttl: float = 30.0, *,
                     wait: bool = True) -> AsyncIterator[Lease]:
        """Hold `thread_id` as `owner` while the block runs, renewing every `ttl / 3`
        (see `lease`; `wait=False` does not wait for a thread being written, where the
        saver can tell: on PostgreSQL).

        Raises:
            LeaseHeld: another owner's lease on the thread is live.
        """
        try_acquire = getattr(self, "atry_acquire_lease", None)
        acquire = try_acquire if not wait and try_acquire is not None \
            else self.aacquire_lease  # type: ignore[attr-defined]
        lease = await acquire(thread_id, owner, ttl)
        try:
            # The renewal runs its coroutine on this loop: wait for it off the loop.
            with renewed(lease, self.renew_lease, wait=False):  # type: ignore[attr-defined]
                yield lease
        finally:
            try:
                await asyncio.to_thread(lease.join_renewal)
            finally:  # released even if cancelled again while waiting
                await self.arelease_lease(lease)  # type: ignore[attr-defined]


class AsyncFromSync:
    """Mixin: the async checkpoint and ledger methods, done by the sync ones.

    Put it before the LangGraph saver in the bases, whose async methods it replaces.
    """

    # -- checkpoints ---------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async `get_tuple` (runs the sync query)."""
        return self.get_tuple(config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async `list`."""
        for item in self.list(config, filter=filter, before=before, limit=limit):
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Async `put`."""
        return self.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Async `put_writes`."""
        self.put_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """Async `delete_thread`."""
        self.delete_thread(thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async `delete_for_runs`."""
        self.delete_for_runs(run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async `copy_thread`."""
        self.copy_thread(source_thread_id, target_thread_id)

    async def aprune(
        self, thread_ids: Sequence[str], *, strategy: str = "keep_latest"
    ) -> None:
        """Async `prune`."""
        self.prune(thread_ids, strategy=strategy)

    # -- the ledger, so the guard runs under ainvoke too -----------------------------------

    async def aeffect(self, key: str, thread_id: str | None = None) -> EffectRecord | None:
        """Async `effect`."""
        return self.effect(key, thread_id=thread_id)

    async def asent_in_family(self, key: str, thread_id: str) -> EffectRecord | None:
        """Async `sent_in_family`."""
        return self.sent_in_family(key, thread_id)

    async def aeffects(
        self, thread_id: str | None = None, status: EffectStatus | str | None = None
    ) -> list[EffectRecord]:
        """Async `effects`."""
        return self.effects(thread_id, status)

    async def astats(self) -> LedgerStats:
        """Async `stats`."""
        return self.stats()  # type: ignore[attr-defined,no-any-return]

    async def aevents(
        self, thread_id: str | None = None, key: str | None = None
    ) -> list[EffectEvent]:
        """Async `events`."""
        return self.events(thread_id, key)

    async def astored_result(self, thread_id: str, key: str) -> Any:
        """Async `stored_result`."""
        return self.stored_result(thread_id, key)

    async def aasked_in_task(self, thread_id: str, checkpoint_ns: str) -> list[EffectRecord]:
        """Async `asked_in_task`."""
        return self.asked_in_task(thread_id, checkpoint_ns)

    async def acalled_tasks(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str
                            ) -> set[str]:
        """Async `called_tasks`."""
        return self.called_tasks(thread_id, checkpoint_ns, checkpoint_id)  # type: ignore[attr-defined,no-any-return]

    async def acheckpoint_exists(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str
    ) -> bool:
        """Async `checkpoint_exists`."""
        return self.checkpoint_exists(thread_id, checkpoint_ns, checkpoint_id)

    async def acheck(self, *, full: bool = False) -> Any:
        """Async `check`."""
        return self.check(full=full)  # type: ignore[attr-defined]

    async def alive_leases(self) -> dict[str, tuple[str, int, float]]:
        """Async `live_leases`."""
        return self.live_leases()  # type: ignore[attr-defined,no-any-return]

    async def arecord_task_run(self, thread_id: str, run_id: str, checkpoint_ns: str,
                               node: str, kind: str) -> None:
        """Async `record_task_run`."""
        self.record_task_run(thread_id, run_id, checkpoint_ns, node, kind)  # type: ignore[attr-defined]

    async def atask_runs(self, thread_id: str) -> list[tuple[int, str, str, str, str, float]]:
        """Async `task_runs`."""
        return self.task_runs(thread_id)  # type: ignore[attr-defined,no-any-return]

    async def acancelled_by(self, thread_id: str) -> str | None:
        """Async `cancelled_by`."""
        return self.cancelled_by(thread_id)  # type: ignore[attr-defined,no-any-return]

    async def aapply(
        self, write: LedgerWrite, config: RunnableConfig | None = None
    ) -> list[EffectRecord]:
        """Async `apply`."""
        return self.apply(write, config)

    async def aclaim(
        self, intent: IntentWrite, config: RunnableConfig | None = None
    ) -> tuple[EffectRecord, bool]:
        """Async `claim`."""
        return self.claim(intent, config)

    async def akey_thread(self, thread_id: str) -> str:
        """Async `key_thread`."""
        return self.key_thread(thread_id)

    async def akeying(self, thread_id: str) -> Keying:
        """Async `keying`."""
        return self.keying(thread_id)

    async def astep_anchor(self, thread_id: str, checkpoint_id: str, parent_id: str | None
                           ) -> str | None:
        """Async `step_anchor`."""
        return self.step_anchor(thread_id, checkpoint_id, parent_id)  # type: ignore[attr-defined,no-any-return]

    async def aclaim_many(
        self, intents: Sequence[IntentWrite], config: RunnableConfig | None = None
    ) -> list[tuple[EffectRecord, bool]]:
        """Async `claim_many`."""
        return self.claim_many(intents, config)


class SyncFromAsync:
    """Mixin: the sync ledger, lease and retention methods, done by the async ones on the
    saver's event loop (`self.loop`), for callers on other threads.

    Put it before the LangGraph saver in the bases. From the event loop itself a sync
    call would wait for the loop it blocks: it raises instead, naming the method to await.
    """

    loop: asyncio.AbstractEventLoop

    def _sync(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            on_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            coro.close()
            raise asyncio.InvalidStateError(
                f"Synchronous calls to {type(self).__name__} are only allowed from a "
                "thread other than its event loop's; on the loop, await the `a`-prefixed "
                "method (or run the graph with `ainvoke`).")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    # -- retention -----------------------------------------------------------------------

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Sync `adelete_for_runs`."""
        self._sync(self.adelete_for_runs(run_ids))  # type: ignore[attr-defined]

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Sync `acopy_thread`."""
        self._sync(self.acopy_thread(source_thread_id, target_thread_id))  # type: ignore[attr-defined]

    # -- the ledger ----------------------------------------------------------------------

    def key_thread(self, thread_id: str) -> str:
        """Sync `akey_thread`."""
        return self._sync(self.akey_thread(thread_id))  # type: ignore[attr-defined]

    def keying(self, thread_id: str) -> Keying:
        """Sync `akeying`."""
        return self._sync(self.akeying(thread_id))  # type: ignore[attr-defined]

    def step_anchor(self, thread_id: str, checkpoint_id: str, parent_id: str | None
                    ) -> str | None:
        """Sync `astep_anchor`."""
        return self._sync(self.astep_anchor(  # type: ignore[attr-defined,no-any-return]
            thread_id, checkpoint_id, parent_id))

    def effect(self, key: str, thread_id: str | None = None) -> EffectRecord | None:
        """Sync `aeffect`."""
        return self._sync(self.aeffect(key, thread_id))  # type: ignore[attr-defined]

    def sent_in_family(self, key: str, thread_id: str) -> EffectRecord | None:
        """Sync `asent_in_family`."""
        return self._sync(self.asent_in_family(key, thread_id))  # type: ignore[attr-defined]

    def effects(
        self, thread_id: str | None = None, status: EffectStatus | str | None = None
    ) -> list[EffectRecord]:
        """Sync `aeffects`."""
        return self._sync(self.aeffects(thread_id, status))  # type: ignore[attr-defined]

    def events(self, thread_id: str | None = None, key: str | None = None) -> list[EffectEvent]:
        """Sync `aevents`."""
        return self._sync(self.aevents(thread_id, key))  # type: ignore[attr-defined]

    def stored_result(self, thread_id: str, key: str) -> Any:
        """Sync `astored_result`."""
        return self._sync(self.astored_result(thread_id, key))  # type: ignore[attr-defined]

    def asked_in_task(self, thread_id: str, checkpoint_ns: str) -> list[EffectRecord]:
        """Sync `aasked_in_task`."""
        return self._sync(self.aasked_in_task(thread_id, checkpoint_ns))  # type: ignore[attr-defined]

    def checkpoint_exists(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> bool:
        """Sync `acheckpoint_exists`."""
        return self._sync(self.acheckpoint_exists(  # type: ignore[attr-defined]
            thread_id, checkpoint_ns, checkpoint_id))

    def called_tasks(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> set[str]:
        """Sync `acalled_tasks`."""
        return self._sync(self.acalled_tasks(  # type: ignore[attr-defined]
            thread_id, checkpoint_ns, checkpoint_id))

    def apply(self, write: LedgerWrite, config: RunnableConfig | None = None) -> list[EffectRecord]:
        """Sync `aapply`."""
        return self._sync(self.aapply(write, config))  # type: ignore[attr-defined]

    def claim(
        self, intent: IntentWrite, config: RunnableConfig | None = None
    ) -> tuple[EffectRecord, bool]:
        """Sync `aclaim`."""
        return self._sync(self.aclaim(intent, config))  # type: ignore[attr-defined]

    def claim_many(
        self, intents: Sequence[IntentWrite], config: RunnableConfig | None = None
    ) -> list[tuple[EffectRecord, bool]]:
        """Sync `aclaim_many`."""
        return self._sync(self.aclaim_many(intents, config))  # type: ignore[attr-defined]

    # -- leases, the run log, threads ----------------------------------------------------

    def acquire_lease(self, thread_id: str, owner: str, ttl: float = 30.0) -> Lease:
        """Sync `aacquire_lease`."""
        return self._sync(self.aacquire_lease(thread_id, owner, ttl))  # type: ignore[attr-defined]

    def renew_lease(self, lease: Lease) -> bool:
        """Sync `arenew_lease`."""
        return self._sync(self.arenew_lease(lease))  # type: ignore[attr-defined]

    def release_lease(self, lease: Lease) -> None:
        """Sync `arelease_lease`."""
        self._sync(self.arelease_lease(lease))  # type: ignore[attr-defined]

    def live_leases(self) -> dict[str, tuple[str, int, float]]:
        """Sync `alive_leases`."""
        return self._sync(self.alive_leases())  # type: ignore[attr-defined]

    def cancelled_by(self, thread_id: str) -> str | None:
        """Sync `acancelled_by`."""
        return self._sync(self.acancelled_by(thread_id))  # type: ignore[attr-defined]

    def record_task_run(self, thread_id: str, run_id: str, checkpoint_ns: str, node: str,
                        kind: str) -> None:
        """Sync `arecord_task_run`."""
        self._sync(self.arecord_task_run(  # type: ignore[attr-defined]
            thread_id, run_id, checkpoint_ns, node, kind))

    def task_runs(self, thread_id: str) -> list[tuple[int, str, str, str, str, float]]:
        """Sync `atask_runs`."""
        return self._sync(self.atask_runs(thread_id))  # type: ignore[attr-defined]

    def check(self, *, full: bool = False) -> Any:
        """Sync `acheck`."""
        return self._sync(self.acheck(full=full))  # type: ignore[attr-defined]

    def flow_versions(self) -> dict[str, str]:
        """Sync `aflow_versions`."""
        return self._sync(self.aflow_versions())  # type: ignore[attr-defined]

    def thread_ids(self) -> list[str]:
        """Sync `athread_ids`."""
        return self._sync(self.athread_ids())  # type: ignore[attr-defined]

    def stats(self) -> LedgerStats:
        """Sync `astats`."""
        return self._sync(self.astats())  # type: ignore[attr-defined,no-any-return]
