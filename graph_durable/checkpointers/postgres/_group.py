"""Group commit of `AsyncDurablePostgresSaver`: the ledger writes of one thread that
arrive while its transaction is under way are committed together in the next one."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from psycopg import AsyncConnection, AsyncCursor
from psycopg.rows import tuple_row

from graph_durable.checkpointers.postgres import _sql as _pg
from graph_durable.checkpointers._base import (
    IntentExists,
    KeyingChanged,
    actor_of,
    claims_of,
)
from graph_durable.errors import IllegalTransition, LeaseLost
from graph_durable.ledger import EffectRecord, IntentWrite, Keying, LedgerWrite, WriteBatch

__all__ = ["AsyncGroupCommit"]


class _QueuedWrite:
    """A ledger write waiting for the transaction that will commit its thread's group."""

    __slots__ = ("write", "config", "result", "error", "done")

    def __init__(self, write: LedgerWrite, config: RunnableConfig | None) -> None:
        self.write = write
        self.config = config
        self.result: list[EffectRecord] = []
        self.error: BaseException | None = None
        self.done = False


async def _refusal(conn: AsyncConnection[Any], action: Callable[[], Awaitable[Any]], *,
                   savepoint: bool) -> BaseException | None:
    """Run `action`; return its error. With `savepoint`, undo its own writes if it fails
    (an action without one must fail before it writes)."""
    try:
        if savepoint:
            async with conn.transaction():
                await action()
        else:
            await action()
    except (Exception, LeaseLost) as exc:
        return exc
    return None


class AsyncGroupCommit:
    """Mixin: `aapply` and `aclaim_many` through a per-thread group commit; needs the
    saver's `_txn`, `_check_write_txn`, `_apply_one_txn`, `_defer` and
    `_resume_consumed`, and `_groups`/`_group_locks` set in its `__init__`."""

    async def aapply(
        self, write: LedgerWrite, config: RunnableConfig | None = None
    ) -> list[EffectRecord]:
        """Apply one ledger write durably; return the changed effects.

        Raises `IllegalTransition` if the lifecycle forbids it, `LeaseLost` or
        `FlowVersionMismatch` if the write is fenced out; in each case nothing of this
        write is stored. Writes to one thread that arrive while its transaction is under
        way are committed together in the next (group commit); each caller returns once
        the commit holding its write is done. A write marked `defer` returns at once and
        is committed with the thread's next write.
        """
        if self._defer(write, config):
            return []
        [item] = await self._commit_with_group([write], config)
        if isinstance(item.error, IntentExists):
            raise IllegalTransition(
                f"Effect {item.error.record.key!r} of thread {write.thread_id!r} is already "
                f"recorded ({item.error.record.status.value}); aclaim() reports its state.",
                thread_id=write.thread_id)
        if item.error is not None:
            raise item.error
        return item.result

    async def aclaim_many(
        self, intents: Sequence[IntentWrite], config: RunnableConfig | None = None
    ) -> list[tuple[EffectRecord, bool]]:
        """`aclaim` several intents of one thread in one transaction.

        A known key reports its record; a refused intent (`LeaseLost`,
        `FlowVersionMismatch`) raises, and then none of them was claimed.
        """
        if not intents:
            return []
        if any(intent.thread_id != intents[0].thread_id for intent in intents):
            raise ValueError("aclaim_many claims intents of one thread")
        return claims_of(await self._commit_with_group(intents, config))

    async def _commit_with_group(
        self, writes: Sequence[LedgerWrite], config: RunnableConfig | None
    ) -> list[_QueuedWrite]:
        thread_id = writes[0].thread_id
        items = [_QueuedWrite(write, config) for write in writes]
        self._groups.setdefault(thread_id, []).extend(items)
        lock = self._group_locks.get(thread_id)
        if lock is None:
            lock = self._group_locks[thread_id] = asyncio.Lock()
        async with lock:
            if not all(item.done for item in items):
                await self._commit_group(thread_id)
        return items

    async def _commit_group(self, thread_id: str) -> None:
        """Commit every queued write of the thread in one transaction, in pipeline mode.

        The thread is fenced and pinned once per fencing token. A refused write must not
        undo its neighbours: a check or a single transition refuses before it writes
        anything; a batch of transitions, or a check that flushes deferred receipts or
        pins the flow, runs in a savepoint. An intent is inserted whole or not at all (a
        known key keeps what it inherited). A group of intents only, made with one
        fencing token, is claimed in one round trip (`_claim_in_one_trip`), and only
        such a group claims intents keyed by a predicted keying (`predicted_keying`), all
        by the same one: its check refuses the whole transaction, so in any other group
        they are refused (`KeyingChanged`, nothing written, nothing asked) and claimed
        again once read.
        """
        batch = self._groups.pop(thread_id, [])
        claims_only = all(isinstance(item.write, IntentWrite) for item in batch) \
            and len({actor_of(item.config) for item in batch}) == 1 \
            and self._one_trip_possible(thread_id)
        predicted = [item for item in batch if getattr(item.write, "keying", None) is not None]
        if predicted and (not claims_only or len(predicted) < len(batch)
                          or len({item.write.keying for item in predicted}) > 1):
            for item in predicted:
                item.error, item.done = KeyingChanged(thread_id), True
            batch = [item for item in batch if item.error is None]
            if not batch:
                return
        if claims_only:
            await self._claim_in_one_trip(thread_id, batch)
            return
        checked: dict[int | None, BaseException | None] = {}
        try:
            async with self._txn(writing=thread_id, pipelined=True, durable=True) as cur:
                conn = cur.connection
                for item in batch:
                    write, config = item.write, item.config
                    actor = actor_of(config)
                    if actor[1] not in checked:
                        writes_too = (self._has_deferred(thread_id)
                                      or self._needs_flow_check(thread_id))
                        checked[actor[1]] = await _refusal(
                            conn, lambda: self._check_write_txn(cur, thread_id, config),
                            savepoint=writes_too)
                    if checked[actor[1]] is not None:
                        item.error = checked[actor[1]]
                    elif isinstance(write, IntentWrite):
                        try:
                            item.result = [await self._apply_one_txn(cur, write, actor)]
                        except IntentExists as exists:
                            item.error = exists
                    else:
                        several = isinstance(write, WriteBatch) and (
                            len(write.writes) > 1 or write.resume_at is not None)
                        item.error = await _refusal(
                            conn, lambda: self._apply_txn(cur, item, actor), savepoint=several)
        except BaseException as exc:
            for item in batch:
                item.error = item.error or exc
            if not isinstance(exc, Exception):
                raise
        finally:
            for item in batch:
                item.done = True

    async def _claim_in_one_trip(self, thread_id: str, batch: list[_QueuedWrite]) -> None:
        """Claim a group of intents made with one fencing token as one `_pg.CLAIM_STEP` call
        in a one-round-trip fenced write; a refused fence refuses them all, as it would
        each of them."""
        config = batch[0].config
        actor = actor_of(config)
        intents = [item.write for item in batch]
        planned = [plan[1:] for plan in self._plan_intents(  # type: ignore[attr-defined]
            intents, actor)]
        try:
            predicted = _pg.predicted_of(intents)  # type: ignore[arg-type]
            try:
                claimed = await self._claim_planned(thread_id, planned, config, predicted)
            except _pg.ImplicitNotReadCommitted:  # nothing was written: now begun explicitly
                claimed = await self._claim_planned(thread_id, planned, config, predicted)
            for item, (record, created) in zip(batch, claimed, strict=True):
                if created:
                    item.result = [record]
                else:
                    item.error = IntentExists(record)
        except BaseException as exc:
            for item in batch:
                item.error = item.error or exc
            if not isinstance(exc, Exception | LeaseLost):
                raise
        finally:
            for item in batch:
                item.done = True

    async def _claim_planned(
        self, thread_id: str, planned: list[tuple[list[Any], EffectRecord]],
        config: RunnableConfig | None, predicted: Keying | None = None,
    ) -> list[tuple[EffectRecord, bool]]:
        # The claim's statement makes its commit durable and checks `predicted` itself.
        async with self._one_trip(thread_id, config, fenced_by_block=True) as fenced:
            cur = fenced.connection.cursor(row_factory=tuple_row, binary=True)
            await cur.execute(*_pg.claim_call(thread_id, planned, actor_of(config),
                                              predicted))
        async with cur:
            return self._claimed_rows(planned, await cur.fetchall())

    async def _apply_txn(self, cur: AsyncCursor[Any], item: _QueuedWrite,
                         actor: tuple[str | None, int | None]) -> None:
        write = item.write
        writes = write.writes if isinstance(write, WriteBatch) else (write,)
        item.result = [await self._apply_one_txn(cur, one, actor) for one in writes]
        if isinstance(write, WriteBatch) and write.resume_at is not None:
            deleted = await _pg.arun_counted(cur, _pg.DELETE_NULL_RESUME,
                                             (write.thread_id, *write.resume_at))
            self._resume_consumed(write, deleted)
