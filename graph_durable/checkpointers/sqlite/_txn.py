"""One SQLite write transaction of a durable saver, on a `sqlite3` connection.

`DurableSqliteSaver` runs these on its own connection under its lock;
`AsyncDurableSqliteSaver` runs them on aiosqlite's worker thread, whose `sqlite3`
connection it is, so that a whole transaction (fence, flow pin, deferred receipts, the
write itself, commit) is one round trip to that thread instead of one per statement.

Group commit: ledger writes and checkpoint writes queued while a transaction is under
way are committed together by the next one (`_commit_queue`), each still answered only
once the transaction holding it has committed: parallel tool calls of one step, and
agents of many threads on one saver, share fsyncs.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from langchain_core.runnables import RunnableConfig

from graph_durable.checkpointers import _sql, _steps
from graph_durable.checkpointers._base import IntentExists, actor_of, claims_of
from graph_durable.checkpointers.sqlite._readonly import WRITE_NEEDS, SqliteReadOnly, is_read_only
from graph_durable.checkpointers.sqlite._storage import storage_fault
from graph_durable.errors import IllegalTransition
from graph_durable.leases import Lease
from graph_durable.ledger import (
    EffectRecord,
    IntentWrite,
    LedgerWrite,
    TransitionWrite,
    WriteBatch,
)

__all__ = ["CheckpointWrite", "QueuedWrite", "SqliteTransactions"]


class CheckpointWrite:
    """A checkpoint (or a task's pending writes) to store: `body(cursor)` runs its
    statements in the transaction, after the thread's fence and flow pin."""

    __slots__ = ("thread_id", "body")

    def __init__(self, thread_id: str, body: Callable[[sqlite3.Cursor], Any]) -> None:
        self.thread_id = thread_id
        self.body = body


class QueuedWrite:
    """A ledger or checkpoint write waiting for the group commit that will hold it."""

    __slots__ = ("write", "config", "actor", "result", "error", "done")

    def __init__(self, write: LedgerWrite | CheckpointWrite,
                 config: RunnableConfig | None) -> None:
        self.write = write
        self.config = config
        self.actor = actor_of(config)
        """The lease owner and fencing token the write was made with (`actor_of`)."""
        self.result: list[EffectRecord] = []
        self.error: BaseException | None = None
        self.done = False


def _in_savepoint(cur: sqlite3.Cursor, action: Callable[[], Any]) -> BaseException | None:
    """Run `action` in a savepoint; undo only its own writes and return its error."""
    cur.execute("SAVEPOINT ledger_write")
    error: BaseException | None = None
    try:
        action()
    except BaseException as exc:
        cur.execute("ROLLBACK TO ledger_write")
        error = exc
    cur.execute("RELEASE ledger_write")
    return error


def _rows(cur: sqlite3.Cursor, statement: _steps.Statement) -> list[Any] | None:
    """Run one of `_steps`' statements; its rows, when it asks for them."""
    rows = cur.execute(statement.sql, statement.params).fetchall()
    return rows if statement.fetch else None


def _journal_txn(cur: sqlite3.Cursor, entries: Sequence[tuple[Any, ...]]) -> None:
    """Write journal entries (`_sql.INSERT_EVENT`'s parameters each), in their order."""
    if not entries:
        return
    for statement in _sql.insert_events(entries):
        cur.execute(*statement)


class SqliteTransactions:
    """Mixin (after `DurableSaverMixin`): write transactions and the group-commit queue.

    Every method here takes the `sqlite3` connection or cursor to use and does no
    locking: the caller holds the saver's lock (and, for the async saver, runs on the
    connection's worker thread).
    """

    def _init_queue(self) -> None:
        self._queue: list[QueuedWrite] = []
        self._queue_lock = threading.Lock()

    # -- one transaction ---------------------------------------------------------------

    @contextmanager
    def _transaction(
        self, conn: sqlite3.Connection, thread_id: str | None = None,
        config: RunnableConfig | None = None,
    ) -> Iterator[sqlite3.Cursor]:
        """One write transaction, taken with `BEGIN IMMEDIATE` so reads in it are current.

        With `thread_id`, the write is fenced and flow-pinned first, in the same
        transaction (a stale token or another flow version writes nothing), and the
        thread's deferred receipts are committed with it.
        """
        cur = conn.cursor()
        try:
            cur.execute("BEGIN IMMEDIATE")
            if thread_id is not None:
                self._check_write_txn(cur, thread_id, config)
            yield cur
        except BaseException as exc:
            conn.rollback()
            self._deferred_rolled_back()  # type: ignore[attr-defined]
            if is_read_only(exc):
                raise SqliteReadOnly.refused(WRITE_NEEDS, exc, thread_id=thread_id) from exc
            fault = storage_fault(exc, thread_id)
            if fault is not None:
                raise fault from exc
            raise
        else:
            conn.commit()
            self._deferred_committed()  # type: ignore[attr-defined]
        finally:
            cur.close()

    def _check_write_txn(
        self, cur: sqlite3.Cursor, thread_id: str, config: RunnableConfig | None
    ) -> None:
        """Fence, pin, and commit the thread's deferred receipts with this write."""
        self._check_fence(  # type: ignore[attr-defined]
            cur.execute(_sql.SELECT_LEASE, (thread_id,)).fetchone(), thread_id, config)
        if self._needs_flow_check(thread_id):  # type: ignore[attr-defined]
            row = cur.execute(_sql.SELECT_FLOW_VERSION, (thread_id,)).fetchone()
            for statement in self._flow_statements(row, thread_id):  # type: ignore[attr-defined]
                cur.execute(*statement)
        self._flush_deferred_txn(cur, thread_id)

    def _flush_deferred_txn(self, cur: sqlite3.Cursor, thread_id: str) -> None:
        """Carry out the thread's deferred transitions, then journal them together."""
        if thread_id not in self._deferred:  # type: ignore[attr-defined]
            return  # nothing deferred (a write deferred meanwhile rides on the next one)
        entries: list[tuple[Any, ...]] = []
        with self._carrying():  # type: ignore[attr-defined]
            taken = self._take_deferred(thread_id)  # type: ignore[attr-defined]
            receipts = self._receipt_texts([write for write, _ in taken])  # type: ignore[attr-defined]
            for (write, write_config), receipt in zip(taken, receipts, strict=True):
                try:
                    entries.append(self._apply_deferred_txn(
                        cur, write, actor_of(write_config), receipt))
                except IllegalTransition as refused:
                    self._refused_deferred(write, refused)  # type: ignore[attr-defined]
            _journal_txn(cur, entries)

    def _apply_deferred_txn(
        self, cur: sqlite3.Cursor, one: TransitionWrite, actor: tuple[str | None, int | None],
        receipt_text: str | None = None,
    ) -> tuple[Any, ...]:
        """Carry out a deferred transition (a receipt, its column `receipt_text` when
        already encoded); its journal entry, for the caller to write. No caller reads
        its record, and its journal entry needs only what the write says (and the
        attempt count, when it counts one more), so the update returns no row unless
        then, and none is decoded."""
        now = time.time()
        returning = "attempts" if one.bump_attempts else None
        cur.execute(*self._plan_update(one, now, returning, receipt_text))  # type: ignore[attr-defined]
        if returning is None:
            moved, attempts = cur.rowcount == 1, 0
        else:
            rows = cur.fetchall()
            moved, attempts = bool(rows), rows[0][0] if rows else 0
        if not moved:
            row = cur.execute(_sql.SELECT_EFFECT, (one.thread_id, one.key)).fetchone()
            raise _sql.refusal(row, thread_id=one.thread_id, key=one.key, to=one.to)
        journaled = _sql.Journaled(one.key, one.thread_id, one.to, attempts)
        return self._transition_event(journaled, one, now, actor)[1]  # type: ignore[attr-defined,no-any-return]

    def _claim_txn(
        self, cur: sqlite3.Cursor, items: Sequence[QueuedWrite],
        actor: tuple[str | None, int | None],
    ) -> None:
        """Claim the intents of `items` (made with the same fencing token), in order.

        An intent whose key no thread of the family holds (nearly every one) is one
        insert; the journal entries of such intents are written together, and a thread's
        key scheme is pinned once. Any other intent runs `_apply_one_txn`'s statements
        (the entries gathered so far written first, so the journal keeps the claims'
        order). Intents keyed by a predicted keying are claimed only if the thread is
        keyed so (`_keying_refusal`); else each gets its refusal, and nothing of them is
        written."""
        predicted = next((item.write.keying for item in items
                          if item.write.keying is not None), None)  # type: ignore[union-attr]
        if predicted is not None:
            thread_id = items[0].write.thread_id
            refusal = self._keying_refusal(  # type: ignore[attr-defined]
                cur.execute(_sql.SELECT_KEYING,
                            self._keying_params(thread_id)).fetchall(),  # type: ignore[attr-defined]
                thread_id, predicted)
            if refusal is not None:
                for item in items:
                    if item.write.keying is not None:  # type: ignore[union-attr]
                        item.error = refusal
                items = [item for item in items if item.write.keying is None]  # type: ignore[union-attr]
        entries: list[tuple[Any, ...]] = []
        pinned: set[tuple[Any, ...]] = set()
        plans = self._plan_intents([item.write for item in items], actor)  # type: ignore[attr-defined]
        for item, planned in zip(items, plans, strict=True):
            write = item.write
            assert isinstance(write, IntentWrite)
            (_insert_sql, params), (_event_sql, entry), *pins = planned[1]
            if cur.execute(_sql.INSERT_NEW_INTENT,
                           (*params, write.key, write.thread_id)).rowcount == 1:
                entries.append(entry)
                for pin_sql, pin in pins:
                    if pin[:3] not in pinned:
                        cur.execute(pin_sql, pin)
                        pinned.add(pin[:3])
                item.result = [planned[2]]
                continue
            _journal_txn(cur, entries)
            entries = []
            try:
                item.result = [self._claim_planned_txn(cur, write, planned)]
            except IntentExists as exists:
                item.error = exists
        _journal_txn(cur, entries)

    def _claim_planned_txn(self, cur: sqlite3.Cursor, one: IntentWrite, planned: Any
                           ) -> EffectRecord:
        """Claim one intent as `_plan_intent` planned it: take it over from the thread's
        family, else insert it; `IntentExists` if the key is already recorded here."""
        (inherit, inherited), (insert, *after), record = planned
        if cur.execute(*inherit).rowcount == 1:
            cur.execute(*inherited)
            row = cur.execute(_sql.SELECT_EFFECT, (one.thread_id, one.key)).fetchone()
            raise IntentExists(self._record(row))  # type: ignore[attr-defined]
        if cur.execute(*insert).rowcount == 0:
            # The key is already known: the intent stands, report what is recorded.
            row = cur.execute(_sql.SELECT_EFFECT, (one.thread_id, one.key)).fetchone()
            raise IntentExists(self._record(row))  # type: ignore[attr-defined]
        for statement in after:
            cur.execute(*statement)
        return record  # type: ignore[no-any-return]

    def _apply_one_txn(
        self, cur: sqlite3.Cursor, one: IntentWrite | TransitionWrite,
        actor: tuple[str | None, int | None],
    ) -> EffectRecord:
        """Carry out one intent or transition; the record it leaves."""
        if isinstance(one, IntentWrite):
            return self._claim_planned_txn(
                cur, one, self._plan_intent(one, actor))  # type: ignore[attr-defined]
        now = time.time()
        rows = cur.execute(*self._plan_update(one, now)).fetchall()  # type: ignore[attr-defined]
        if not rows:
            row = cur.execute(_sql.SELECT_EFFECT, (one.thread_id, one.key)).fetchone()
            raise _sql.refusal(row, thread_id=one.thread_id, key=one.key, to=one.to)
        record = self._record(rows[0])  # type: ignore[attr-defined]
        cur.execute(*self._transition_event(record, one, now, actor))  # type: ignore[attr-defined]
        return record  # type: ignore[no-any-return]

    # -- checkpoint writes, retention, leases and the run log: the bodies both savers run -

    def _checkpoint_write(self, config: RunnableConfig, checkpoint: Any, metadata: Any
                          ) -> tuple[CheckpointWrite, RunnableConfig]:
        """`put`'s write for the group commit, and the config it stores."""
        statement, stored = self._checkpoint_statement(  # type: ignore[attr-defined]
            config, checkpoint, metadata)
        return CheckpointWrite(str(config["configurable"]["thread_id"]),
                               lambda cur: cur.execute(*statement)), stored

    def _writes_write(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                      task_id: str, task_path: str) -> CheckpointWrite:
        """`put_writes`'s write for the group commit: the writes, and the resume values
        a decision batch consumed before they landed."""
        sql, rows = self._writes_statement(  # type: ignore[attr-defined]
            config, writes, task_id, task_path)

        def body(cur: sqlite3.Cursor) -> None:
            cur.executemany(sql, rows)
            for statement in self._late_resume(config, writes, task_id):  # type: ignore[attr-defined]
                cur.execute(*statement)

        return CheckpointWrite(str(config["configurable"]["thread_id"]), body)

    @staticmethod
    def _delete_thread_txn(cur: sqlite3.Cursor, thread_id: str) -> None:
        for statement in (*_sql.DELETE_THREAD_CHECKPOINTS, *_sql.DELETE_THREAD_LEDGER):
            cur.execute(statement, (thread_id,))

    @staticmethod
    def _delete_checkpoints_txn(cur: sqlite3.Cursor, select: str, keys: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) `select` finds for each key."""
        for key in keys:
            for row in cur.execute(select, (str(key),)).fetchall():
                cur.execute(_sql.DELETE_CHECKPOINT, row)
                cur.execute(_sql.DELETE_CHECKPOINT_WRITES, row)

    def _delete_for_runs_txn(self, cur: sqlite3.Cursor, run_ids: Sequence[str]) -> None:
        self._delete_checkpoints_txn(cur, _sql.SELECT_RUN_CHECKPOINTS, run_ids)

    def _copy_thread_txn(self, cur: sqlite3.Cursor, source_thread_id: str,
                         target_thread_id: str) -> None:
        params = (target_thread_id, source_thread_id)
        self._flush_deferred_txn(cur, source_thread_id)
        for statement in (*_sql.COPY_THREAD_CHECKPOINTS, *_sql.COPY_THREAD_LEDGER):
            cur.execute(statement, params)
        self._statements_txn(cur, _steps.copy_point(source_thread_id, target_thread_id,
                                                    _sql.SELECT_STEP_WRITES))
        cur.execute(_sql.UPSERT_ORIGIN, self._origin_params(  # type: ignore[attr-defined]
            source_thread_id, target_thread_id))

    def _prune_txn(self, cur: sqlite3.Cursor, thread_ids: Sequence[str]) -> None:
        """Delete all but the newest checkpoint of each namespace (and their writes),
        once the steps made after a copy point are anchored (`_steps`)."""
        for thread_id in thread_ids:
            self._statements_txn(cur, _steps.anchors_before_prune(
                str(thread_id), _sql.SELECT_STEP_WRITES))
        self._delete_checkpoints_txn(cur, _sql.SELECT_PRUNABLE, thread_ids)

    def _acquire_lease_txn(self, cur: sqlite3.Cursor, thread_id: str, owner: str,
                           ttl: float) -> Lease:
        row = cur.execute(_sql.SELECT_LEASE, (thread_id,)).fetchone()
        lease, statement = self._new_lease(row, thread_id, owner, ttl)  # type: ignore[attr-defined]
        cur.execute(*statement)
        return lease  # type: ignore[no-any-return]

    @staticmethod
    def _renew_lease_txn(cur: sqlite3.Cursor, lease: Lease, expires_at: float,
                         now: float) -> bool:
        cur.execute(_sql.RENEW_LEASE, (expires_at, lease.thread_id, lease.token, now))
        return cur.rowcount == 1

    @staticmethod
    def _release_lease_txn(cur: sqlite3.Cursor, lease: Lease) -> None:
        cur.execute(_sql.RELEASE_LEASE, (lease.thread_id, lease.token))

    @staticmethod
    def _statements_txn(cur: sqlite3.Cursor, statements: _steps.Statements) -> Any:
        """Run `statements` (`_steps`) on `cur`; what they return."""
        return _steps.performed(statements, lambda statement: _rows(cur, statement))

    @staticmethod
    def _record_task_run_txn(cur: sqlite3.Cursor, thread_id: str, run_id: str,
                             checkpoint_ns: str, node: str, kind: str) -> None:
        cur.execute(_sql.INSERT_TASK_RUN,
                    (thread_id, run_id, checkpoint_ns, node, kind, time.time()))

    # -- group commit --------------------------------------------------------------------

    def _enqueue(self, writes: Sequence[LedgerWrite | CheckpointWrite],
                 config: RunnableConfig | None) -> list[QueuedWrite]:
        """Queue writes for the next group commit; their items, to wait on."""
        items = [QueuedWrite(write, config) for write in writes]
        with self._queue_lock:
            self._queue.extend(items)
        return items

    def _commit_queue(self, conn: sqlite3.Connection) -> None:
        """Commit every queued write in one transaction (the caller holds the lock).

        A write alone in its transaction (the common case) runs as it is: its error rolls
        the transaction back. Of several, each thread is fenced and pinned once, for every
        write made with the same fencing token, and a refused write must not undo its
        neighbours, so each write runs in a savepoint, except an intent: it is inserted
        whole or not at all.
        """
        with self._queue_lock:
            batch, self._queue = self._queue, []
        if not batch:
            return
        cur = conn.cursor()
        try:
            cur.execute("BEGIN IMMEDIATE")
            if len(batch) == 1:
                self._write_alone_txn(cur, batch[0])
            else:
                self._write_batch_txn(cur, batch)
            conn.commit()
            self._deferred_committed()  # type: ignore[attr-defined]
        except BaseException as exc:
            conn.rollback()
            self._deferred_rolled_back()  # type: ignore[attr-defined]
            for item in batch:
                call_id = getattr(item.write, "tool_call_id", None)
                item.error = item.error or (
                    SqliteReadOnly.refused(WRITE_NEEDS, exc, thread_id=item.write.thread_id,
                                           tool_call_id=call_id)
                    if is_read_only(exc) else
                    storage_fault(exc, item.write.thread_id, call_id) or exc)
        finally:
            cur.close()
            for item in batch:
                item.done = True

    def _write_alone_txn(self, cur: sqlite3.Cursor, item: QueuedWrite) -> None:
        write = item.write
        self._check_write_txn(cur, write.thread_id, item.config)
        if isinstance(write, CheckpointWrite):
            write.body(cur)
        elif isinstance(write, IntentWrite):
            self._claim_txn(cur, [item], item.actor)
        else:
            self._apply_txn(cur, item, item.actor)

    def _write_batch_txn(self, cur: sqlite3.Cursor, batch: Sequence[QueuedWrite]) -> None:
        """Several writes in one transaction. A batch made with one fencing token for
        one thread (a step's claim) is fenced without a savepoint: a refused fence
        refuses every write of it, so the transaction rolls back whole."""
        fences = {(item.write.thread_id, item.actor[1]) for item in batch}
        checked: dict[tuple[str, int | None], BaseException | None] = {}
        if len(fences) == 1:
            first = batch[0]
            self._check_write_txn(cur, first.write.thread_id, first.config)
            checked = dict.fromkeys(fences)
        claims: list[QueuedWrite] = []
        for index, item in enumerate(batch):
            write, config, actor = item.write, item.config, item.actor
            fenced = (write.thread_id, actor[1])
            if fenced not in checked:
                checked[fenced] = _in_savepoint(
                    cur, lambda: self._check_write_txn(cur, write.thread_id, config))
            if checked[fenced] is not None:
                item.error = checked[fenced]
            elif isinstance(write, CheckpointWrite):
                item.error = _in_savepoint(cur, lambda: write.body(cur))
            elif isinstance(write, IntentWrite):
                # Consecutive intents of one thread and token (a step's claim) together.
                claims.append(item)
                following = batch[index + 1] if index + 1 < len(batch) else None
                if (following is None or not isinstance(following.write, IntentWrite)
                        or following.write.thread_id != write.thread_id
                        or following.actor != actor):
                    self._claim_txn(cur, claims, actor)
                    claims = []
            else:
                item.error = _in_savepoint(cur, lambda: self._apply_txn(cur, item, actor))

    def _apply_txn(
        self, cur: sqlite3.Cursor, item: QueuedWrite, actor: tuple[str | None, int | None]
    ) -> None:
        write = item.write
        writes = write.writes if isinstance(write, WriteBatch) else (write,)
        item.result = [self._apply_one_txn(cur, one, actor) for one in writes]
        if isinstance(write, WriteBatch) and write.resume_at is not None:
            cur.execute(_sql.DELETE_NULL_RESUME, (write.thread_id, *write.resume_at))
            self._resume_consumed(write, cur.rowcount)  # type: ignore[attr-defined]

    # -- what the callers get back --------------------------------------------------------

    @staticmethod
    def _applied(item: QueuedWrite, claim_method: str) -> list[EffectRecord]:
        """The changed records of one applied write, or its error raised."""
        if isinstance(item.error, IntentExists):
            record = item.error.record
            raise IllegalTransition(
                f"Effect {record.key!r} of thread {item.write.thread_id!r} is already "
                f"recorded ({record.status.value}); {claim_method}() reports its state.",
                thread_id=item.write.thread_id,
            )
        if item.error is not None:
            raise item.error
        return item.result

    _claimed = staticmethod(claims_of)
