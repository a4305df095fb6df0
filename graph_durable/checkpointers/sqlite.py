"""`DurableSqliteSaver`: LangGraph's SQLite saver plus the effect ledger in the same file.

Retention and the ledger:

- `delete_thread(thread_id)` deletes the thread's checkpoints, writes, effects and events.
- `prune(ids, strategy="keep_latest")` keeps the ledger whole: the kept checkpoint may
  still replay a step whose receipts live there. `strategy="delete"` is `delete_thread`.
- `delete_for_runs(run_ids)` deletes checkpoints and writes only: effects belong to the
  thread, not to a run, and other runs of the thread may replay them.
- `copy_thread(src, dst)` copies checkpoints, writes, effects and events, and records
  `src` (or its own origin) as the origin of `dst`: the copy's effects are keyed by the
  origin's id (`key_thread`), so it replays receipts and reconciles in-flight effects
  under the keys the provider saw instead of sending them again.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import closing, contextmanager
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    SerializerProtocol,
)
from langgraph.checkpoint.sqlite import SqliteSaver

from graph_durable.checkpointers import _sql
from graph_durable.checkpointers._base import DurableSaverMixin, IntentExists, actor_of
from graph_durable.checkpointers._reads import SyncLedgerReads
from graph_durable.checkpointers._schema import (
    LATEST_APPLIED,
    MIGRATIONS,
    MIGRATIONS_TABLE,
    check_readable,
    statements,
)
from graph_durable.checkpointers._twins import AsyncFromSync
from graph_durable.errors import GraphDurableError, IllegalTransition
from graph_durable.leases import Lease
from graph_durable.ledger import (
    EffectRecord,
    IntentWrite,
    LedgerWrite,
    TransitionWrite,
    WriteBatch,
)
from graph_durable.faults import fault_point

__all__ = ["DurableSqliteSaver"]


class _QueuedWrite:
    """A ledger write waiting for the group commit that will hold it."""

    __slots__ = ("write", "config", "result", "error", "done")

    def __init__(self, write: LedgerWrite, config: RunnableConfig | None) -> None:
        self.write = write
        self.config = config
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


class DurableSqliteSaver(DurableSaverMixin, SyncLedgerReads, AsyncFromSync, SqliteSaver):
    """A LangGraph checkpointer on SQLite that also keeps the effect ledger.

    Use it wherever a `SqliteSaver` goes; `EffectGuardNode` finds the ledger through it.
    Its async methods run the sync ones (use `AsyncDurableSqliteSaver` under heavy load).

    Args:
        conn: A `sqlite3.Connection` (opened with `check_same_thread=False`).
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
        conn: sqlite3.Connection,
        *,
        serde: SerializerProtocol | None = None,
        flow_version: str | None = None,
        compatible_flow_versions: Collection[str] = (),
        key_secret: str | bytes | Sequence[str | bytes] | None = None,
    ) -> None:
        super().__init__(conn, serde=serde)
        self._init_durable(flow_version, compatible_flow_versions, key_secret)
        self._queue: list[_QueuedWrite] = []
        self._queue_lock = threading.Lock()

    @classmethod
    @contextmanager
    def from_conn_string(
        cls, conn_string: str, *, flow_version: str | None = None,
        compatible_flow_versions: Collection[str] = (), serde: SerializerProtocol | None = None,
        key_secret: str | bytes | Sequence[str | bytes] | None = None,
    ) -> Iterator[DurableSqliteSaver]:
        """Open `conn_string` (a file path or `:memory:`) and yield a saver on it."""
        with closing(sqlite3.connect(conn_string, check_same_thread=False)) as conn:
            yield cls(conn, flow_version=flow_version,
                      compatible_flow_versions=compatible_flow_versions, serde=serde,
                      key_secret=key_secret)

    # -- schema ------------------------------------------------------------------------

    @classmethod
    def open_read_only(
        cls, path: str, *, serde: SerializerProtocol | None = None
    ) -> DurableSqliteSaver:
        """A saver that only reads the database at `path`: never creates, migrates or
        writes it (SQLite opens it with `mode=ro`). For operators' tools: a sealed value
        `serde` cannot open (no key, or another) reads as `graph_durable.secrets.SEALED`.

        Raises:
            GraphDurableError: no such file; not a SQLite database; a LangGraph database
                without graph_durable's ledger; or a ledger an older graph_durable wrote
                and a writer has not migrated yet. Each says what to do.
        """
        if not os.path.isfile(path):
            raise GraphDurableError(
                f"{path!r}: no such file. Check the path; read commands never create a "
                "database.")
        uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        try:
            tables = {row[0] for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            check_readable(path, "DurableSqliteSaver", tables,
                           lambda: conn.execute(LATEST_APPLIED).fetchone()[0], len(MIGRATIONS))
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise GraphDurableError(f"{path!r} is not a SQLite database ({exc}).") from None
        except BaseException:
            conn.close()
            raise
        saver = cls(conn, serde=serde)
        saver.is_setup = True  # the schema is there; creating or migrating is not ours
        saver._lenient = True
        return saver

    def setup(self) -> None:
        """Create LangGraph's tables and apply pending ledger migrations (safe to repeat)."""
        if self.is_setup:
            return
        super().setup()
        self.is_setup = False
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute(MIGRATIONS_TABLE)
        self.conn.commit()
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            applied = self.conn.execute(
                "SELECT COALESCE(MAX(v), -1) FROM graph_durable_migrations"
            ).fetchone()[0]
            for version in range(applied + 1, len(MIGRATIONS)):
                for statement in statements(MIGRATIONS[version]):
                    self.conn.execute(statement)
                self.conn.execute(
                    "INSERT INTO graph_durable_migrations (v, applied_at) VALUES (?, ?)",
                    (version, time.time()),
                )
            self.conn.execute(_sql.INSERT_DB_KEY_SECRET, self._db_secret_params())
        except BaseException:
            self.conn.rollback()
            raise
        self.conn.commit()
        self.is_setup = True

    @contextmanager
    def _txn(
        self, thread_id: str | None = None, config: RunnableConfig | None = None
    ) -> Iterator[sqlite3.Cursor]:
        """One write transaction, taken with `BEGIN IMMEDIATE` so reads in it are current.

        With `thread_id`, the write is fenced and flow-pinned first, in the same
        transaction: a stale token or another flow version writes nothing.
        """
        with self.lock:
            self.setup()
            cur = self.conn.cursor()
            try:
                cur.execute("BEGIN IMMEDIATE")
                if thread_id is not None:
                    self._check_write_txn(cur, thread_id, config)
                yield cur
            except BaseException:
                self.conn.rollback()
                self._deferred_rolled_back()
                raise
            else:
                self.conn.commit()
                self._deferred_committed()
            finally:
                cur.close()

    # -- checkpoints: LangGraph's behaviour, without its traps ---------------------------

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """List checkpoints, newest first.

        Results are read before the first is yielded, so the caller may call other saver
        methods while iterating (the stock saver holds its lock across yields).
        """
        yield from [
            *super().list(config, filter=filter, before=before, limit=limit)
        ]

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Save a checkpoint, fenced and flow-pinned in the same transaction."""
        fault_point("before_put")
        statement, stored = self._checkpoint_statement(config, checkpoint, metadata)
        with self._txn(str(config["configurable"]["thread_id"]), config) as cur:
            cur.execute(*statement)
        self._remember_stored(stored)
        fault_point("after_put")
        return stored

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Save a task's pending writes, fenced and flow-pinned in the same transaction."""
        fault_point("before_put_writes")
        sql, rows = self._writes_statement(config, writes, task_id, task_path)
        with self._txn(str(config["configurable"]["thread_id"]), config) as cur:
            cur.executemany(sql, rows)
            for statement in self._late_resume(config, writes, task_id):
                cur.execute(*statement)
        fault_point("after_put_writes")

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's checkpoints, writes, effects, events and flow pin."""
        self._forget_stored()
        with self._txn() as cur:
            for statement in (*_sql.DELETE_THREAD_CHECKPOINTS, *_sql.DELETE_THREAD_LEDGER):
                cur.execute(statement, (str(thread_id),))
        self._flow_checked.discard(str(thread_id))
        self._forget_deferred(str(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) created by these runs; keep the ledger."""
        self._forget_stored()
        with self._txn() as cur:
            for run_id in run_ids:
                rows = cur.execute(_sql.SELECT_RUN_CHECKPOINTS, (str(run_id),)).fetchall()
                for row in rows:
                    cur.execute(_sql.DELETE_CHECKPOINT, row)
                    cur.execute(_sql.DELETE_CHECKPOINT_WRITES, row)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy checkpoints, writes, effects and events of one thread to another."""
        params = (str(target_thread_id), str(source_thread_id))
        with self._txn() as cur:
            self._flush_deferred(cur, str(source_thread_id))
            for statement in (*_sql.COPY_THREAD_CHECKPOINTS, *_sql.COPY_THREAD_LEDGER):
                cur.execute(statement, params)
            cur.execute(_sql.UPSERT_ORIGIN, self._origin_params(*reversed(params)))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune checkpoints: `keep_latest` keeps the newest per namespace, `delete` all.

        `keep_latest` keeps the ledger; `delete` deletes it with the thread.
        """
        self._forget_stored()
        if strategy == "delete":
            for thread_id in thread_ids:
                self.delete_thread(thread_id)
            return
        if strategy != "keep_latest":
            raise ValueError(f"Unknown prune strategy {strategy!r}; use 'keep_latest' or 'delete'")
        with self._txn() as cur:
            for thread_id in thread_ids:
                rows = cur.execute(_sql.SELECT_PRUNABLE, (str(thread_id),)).fetchall()
                for row in rows:
                    cur.execute(_sql.DELETE_CHECKPOINT, row)
                    cur.execute(_sql.DELETE_CHECKPOINT_WRITES, row)

    def _check_write_txn(
        self, cur: sqlite3.Cursor, thread_id: str, config: RunnableConfig | None
    ) -> None:
        """Fence, pin, and commit the thread's deferred receipts with this write."""
        self._check_fence(cur.execute(_sql.SELECT_LEASE, (thread_id,)).fetchone(), thread_id,
                          config)
        if self._needs_flow_check(thread_id):
            row = cur.execute(_sql.SELECT_FLOW_VERSION, (thread_id,)).fetchone()
            for statement in self._flow_statements(row, thread_id):
                cur.execute(*statement)
        self._flush_deferred(cur, thread_id)

    def _flush_deferred(self, cur: sqlite3.Cursor, thread_id: str) -> None:
        for write, write_config in self._take_deferred(thread_id):
            try:
                self._apply_one_txn(cur, write, actor_of(write_config))
            except IllegalTransition as refused:
                self._refused_deferred(write, refused)

    def _apply_one_txn(
        self, cur: sqlite3.Cursor, one: IntentWrite | TransitionWrite,
        actor: tuple[str | None, int | None],
    ) -> EffectRecord:
        if isinstance(one, IntentWrite):
            (inherit, inherited), (insert, *after), record = self._plan_intent(one, actor)
            if cur.execute(*inherit).rowcount == 1:
                cur.execute(*inherited)
                row = cur.execute(_sql.SELECT_EFFECT, (one.thread_id, one.key)).fetchone()
                raise IntentExists(self._record(row))
            if cur.execute(*insert).rowcount == 0:
                # The key is already known: the intent stands, report what is recorded.
                row = cur.execute(_sql.SELECT_EFFECT, (one.thread_id, one.key)).fetchone()
                raise IntentExists(self._record(row))
            for statement in after:
                cur.execute(*statement)
            return record
        now = time.time()
        rows = cur.execute(*self._plan_update(one, now)).fetchall()
        if not rows:
            row = cur.execute(_sql.SELECT_EFFECT, (one.thread_id, one.key)).fetchone()
            raise _sql.refusal(row, thread_id=one.thread_id, key=one.key, to=one.to)
        record = self._record(rows[0])
        cur.execute(*self._transition_event(record, one, now, actor))
        return record

    # -- leases --------------------------------------------------------------------------

    def acquire_lease(self, thread_id: str, owner: str, ttl: float = 30.0) -> Lease:
        """Take the thread with a new, higher fencing token (see `lease`)."""
        with self._txn() as cur:
            row = cur.execute(_sql.SELECT_LEASE, (str(thread_id),)).fetchone()
            lease, statement = self._new_lease(row, str(thread_id), owner, ttl)
            cur.execute(*statement)
        return lease

    def renew_lease(self, lease: Lease) -> bool:
        """Extend a live lease by its ttl; `False` if it expired or was taken over."""
        started = time.monotonic()
        now = time.time()
        expires_at = now + lease.ttl
        with self._txn() as cur:
            cur.execute(_sql.RENEW_LEASE, (expires_at, lease.thread_id, lease.token, now))
            renewed = cur.rowcount == 1
        if renewed:
            lease.extended(expires_at, started)
        return renewed

    def release_lease(self, lease: Lease) -> None:
        """End a lease now (a no-op if another owner has taken the thread since)."""
        with self._txn() as cur:
            cur.execute(_sql.RELEASE_LEASE, (lease.thread_id, lease.token))

    def record_task_run(self, thread_id: str, run_id: str, checkpoint_ns: str, node: str,
                        kind: str) -> None:
        """Log that a node (or a model call in it) started, for `graph_durable.audit`."""
        with self._txn() as cur:
            cur.execute(_sql.INSERT_TASK_RUN,
                        (str(thread_id), run_id, checkpoint_ns, node, kind, time.time()))

    # -- the ledger ----------------------------------------------------------------------

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Every row of one read (the ledger's reads are in `SyncLedgerReads`)."""
        with self.cursor(transaction=False) as cur:
            return cur.execute(sql, tuple(params)).fetchall()

    def apply(
        self, write: LedgerWrite, config: RunnableConfig | None = None
    ) -> list[EffectRecord]:
        """Apply one ledger write durably; return the changed effects.

        Called by the effect guard. Raises `IllegalTransition` if the lifecycle forbids
        it, `LeaseLost` or `FlowVersionMismatch` if the write is fenced out; in each
        case nothing of this write is stored.

        Writes arriving from parallel tool calls while a commit is under way are
        committed together (group commit): each caller still returns only after the
        commit holding its write, but several writes share one fsync. A write marked
        `defer` returns at once and is committed with the thread's next write.
        """
        if self._defer(write, config):
            return []
        [item] = self._commit_with_group([write], config)
        if isinstance(item.error, IntentExists):
            raise IllegalTransition(
                f"Effect {item.error.record.key!r} of thread {write.thread_id!r} is already "
                f"recorded ({item.error.record.status.value}); claim() reports its state.",
                thread_id=write.thread_id,
            )
        if item.error is not None:
            raise item.error
        return item.result

    def claim_many(
        self, intents: Sequence[IntentWrite], config: RunnableConfig | None = None
    ) -> list[tuple[EffectRecord, bool]]:
        """`claim` several intents in one transaction (one fsync for all of them).

        `EffectGuardNode` claims the write calls of a step together before running
        them. Each intent is claimed on its own: a known key reports its record, and a
        refused intent (`LeaseLost`, `FlowVersionMismatch`) raises after the others
        were committed.
        """
        items = self._commit_with_group(intents, config)
        claimed: list[tuple[EffectRecord, bool]] = []
        for item in items:
            if isinstance(item.error, IntentExists):
                claimed.append((item.error.record, False))
            elif item.error is not None:
                raise item.error
            else:
                claimed.append((item.result[0], True))
        return claimed

    def _commit_with_group(
        self, writes: Sequence[LedgerWrite], config: RunnableConfig | None
    ) -> list[_QueuedWrite]:
        items = [_QueuedWrite(write, config) for write in writes]
        with self._queue_lock:
            self._queue.extend(items)
        with self.lock:
            if not all(item.done for item in items):
                self._commit_queue()
        return items

    def _commit_queue(self) -> None:
        """Commit every queued write in one transaction (the caller holds `self.lock`).

        Each thread is fenced and pinned once per transaction, for every write made with
        the same fencing token. A refused write must not undo its neighbours, so each
        write runs in a savepoint, except an intent: it is inserted whole or not at all.
        """
        with self._queue_lock:
            batch, self._queue = self._queue, []
        self.setup()
        cur = self.conn.cursor()
        checked: dict[tuple[str, int | None], BaseException | None] = {}
        try:
            cur.execute("BEGIN IMMEDIATE")
            for item in batch:
                write, config = item.write, item.config
                actor = actor_of(config)
                fenced = (write.thread_id, actor[1])
                if fenced not in checked:
                    checked[fenced] = _in_savepoint(
                        cur, lambda: self._check_write_txn(cur, write.thread_id, config))
                if checked[fenced] is not None:
                    item.error = checked[fenced]
                elif isinstance(write, IntentWrite):
                    try:
                        item.result = [self._apply_one_txn(cur, write, actor)]
                    except IntentExists as exists:
                        item.error = exists
                else:
                    item.error = _in_savepoint(cur, lambda: self._apply_txn(cur, item, actor))
            self.conn.commit()
            self._deferred_committed()
        except BaseException as exc:
            self.conn.rollback()
            self._deferred_rolled_back()
            for item in batch:
                item.error = item.error or exc
        finally:
            cur.close()
            for item in batch:
                item.done = True

    def _apply_txn(
        self, cur: sqlite3.Cursor, item: _QueuedWrite, actor: tuple[str | None, int | None]
    ) -> None:
        write = item.write
        writes = write.writes if isinstance(write, WriteBatch) else (write,)
        item.result = [self._apply_one_txn(cur, one, actor) for one in writes]
        if isinstance(write, WriteBatch) and write.resume_at is not None:
            cur.execute(_sql.DELETE_NULL_RESUME, (write.thread_id, *write.resume_at))
            self._resume_consumed(write, cur.rowcount)
