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

import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    SerializerProtocol,
)
from langgraph.checkpoint.sqlite import SqliteSaver

from graph_durable.checkpointers._base import DurableSaverMixin
from graph_durable.checkpointers._decode import CheckedCheckpoints
from graph_durable.checkpointers._durability import read_sqlite
from graph_durable.checkpointers._reads import SyncLedgerReads
from graph_durable.checkpointers.sqlite._locked import busy_timeout, retry_locked
from graph_durable.checkpointers.sqlite._readonly import (
    connect_read_only,
    setup_ledger,
    setup_refused,
)
from graph_durable.checkpointers.sqlite._txn import (
    CheckpointWrite,
    QueuedWrite,
    SqliteTransactions,
)
from graph_durable.checkpointers._twins import AsyncFromSync, EagerListing, FencedPuts
from graph_durable.durability import DurabilityReport
from graph_durable.leases import Lease
from graph_durable.ledger import EffectRecord, IntentWrite, LedgerWrite

__all__ = ["DurableSqliteSaver"]


class DurableSqliteSaver(DurableSaverMixin, CheckedCheckpoints, SqliteTransactions, SyncLedgerReads, EagerListing,
                         FencedPuts, AsyncFromSync, SqliteSaver):
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

    def _init_engine(self) -> None:
        self._init_queue()

    @classmethod
    @contextmanager
    def from_conn_string(
        cls, conn_string: str, **options: Any
    ) -> Iterator[DurableSqliteSaver]:
        """Open `conn_string` (a file path or `:memory:`) and yield a saver on it;
        `options` are the saver's keyword arguments (`serde`, `flow_version`, ...)."""
        with closing(sqlite3.connect(conn_string, check_same_thread=False)) as conn:
            yield cls(conn, **options)

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
        return cls._reader(connect_read_only(path, "DurableSqliteSaver"), serde)

    def setup(self) -> None:
        """Create LangGraph's tables and apply pending ledger migrations (safe to repeat).

        On a database already up to date it only reads: it takes no write lock (so it
        does not wait behind another process's write) and works on a read-only
        connection. Any number of savers may set up one new file at once: a setup
        refused by another's lock is tried again for the connection's busy timeout.
        Creating or migrating the schema needs write access; on a read-only connection
        that raises `ReadOnlyDatabase`, unless the schema is one this release reads as
        it is (`SQLITE_READABLE_FROM`): then the saver reads, and the first writer
        migrates.
        """
        if self.is_setup:
            return
        try:
            retry_locked(self._setup_once, busy_timeout(self.conn))
        except sqlite3.OperationalError as exc:
            self.is_setup = False
            setup_refused(exc)
        self.is_setup = True

    def _setup_once(self) -> None:
        self.is_setup = False
        super().setup()
        self.is_setup = False
        setup_ledger(self.conn, self._db_secret_params())

    def durability(self) -> DurabilityReport:
        """The settings this database's commits depend on, and what each risks (see
        `graph_durable.durability`); read on the saver's connection, nothing written."""
        with self.lock:
            return read_sqlite(self.conn)

    @contextmanager
    def _txn(
        self, thread_id: str | None = None, config: RunnableConfig | None = None
    ) -> Iterator[sqlite3.Cursor]:
        """One write transaction under the saver's lock (see `_transaction`)."""
        with self.lock:
            self.setup()
            with self._transaction(self.conn, thread_id, config) as cur:
                yield cur

    # -- checkpoints: LangGraph's behaviour, without its traps ---------------------------

    def _put_fenced(self, config: RunnableConfig, checkpoint: Checkpoint,
                    metadata: CheckpointMetadata, new_versions: ChannelVersions
                    ) -> RunnableConfig:
        """`put`'s write: committed with the group (the writes of other threads that
        arrive meanwhile share its transaction)."""
        write, stored = self._checkpoint_write(config, checkpoint, metadata)
        self._store(write, config)
        return stored

    def _put_writes_fenced(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                           task_id: str, task_path: str) -> None:
        self._store(self._writes_write(config, writes, task_id, task_path), config)

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's checkpoints, writes, effects, events and flow pin."""
        self._forget_stored()
        with self._txn() as cur:
            self._delete_thread_txn(cur, str(thread_id))
        self._flow_checked.discard(str(thread_id))
        self._forget_deferred(str(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) created by these runs; keep the ledger."""
        self._forget_stored()
        with self._txn() as cur:
            self._delete_for_runs_txn(cur, run_ids)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy checkpoints, writes, effects and events of one thread to another."""
        with self._txn() as cur:
            self._copy_thread_txn(cur, str(source_thread_id), str(target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune checkpoints: `keep_latest` keeps the newest per namespace, `delete` all.

        `keep_latest` keeps the ledger; `delete` deletes it with the thread.
        """
        if self._prune_deletes(thread_ids, strategy):
            for thread_id in thread_ids:
                self.delete_thread(thread_id)
            return
        with self._txn() as cur:
            self._prune_txn(cur, thread_ids)

    # -- leases --------------------------------------------------------------------------

    def acquire_lease(self, thread_id: str, owner: str, ttl: float = 30.0) -> Lease:
        """Take the thread with a new, higher fencing token (see `lease`)."""
        with self._txn() as cur:
            return self._acquire_lease_txn(cur, str(thread_id), owner, ttl)

    def renew_lease(self, lease: Lease) -> bool:
        """Extend a live lease by its ttl; `False` if it expired or was taken over."""
        started = time.monotonic()
        now = time.time()
        expires_at = now + lease.ttl
        with self._txn() as cur:
            renewed = self._renew_lease_txn(cur, lease, expires_at, now)
        if renewed:
            lease.extended(expires_at, started)
        return renewed

    def release_lease(self, lease: Lease) -> None:
        """End a lease now (a no-op if another owner has taken the thread since)."""
        with self._txn() as cur:
            self._release_lease_txn(cur, lease)

    def record_task_run(self, thread_id: str, run_id: str, checkpoint_ns: str, node: str,
                        kind: str) -> None:
        """Log that a node (or a model call in it) started, for `graph_durable.operators.audit`."""
        with self._txn() as cur:
            self._record_task_run_txn(cur, str(thread_id), run_id, checkpoint_ns, node, kind)

    def _run_statements(self, statements: Any) -> Any:
        with self._txn() as cur:
            return self._statements_txn(cur, statements)

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
        return self._applied(item, "claim")

    def claim_many(
        self, intents: Sequence[IntentWrite], config: RunnableConfig | None = None
    ) -> list[tuple[EffectRecord, bool]]:
        """`claim` several intents in one transaction (one fsync for all of them).

        `EffectGuardNode` claims the write calls of a step together before running
        them. Each intent is claimed on its own: a known key reports its record, and a
        refused intent (`LeaseLost`, `FlowVersionMismatch`) raises after the others
        were committed.
        """
        return self._claimed(self._commit_with_group(intents, config))

    def _store(self, write: CheckpointWrite, config: RunnableConfig) -> None:
        """Commit a checkpoint write, fenced, with the group."""
        [item] = self._commit_with_group([write], config)
        if item.error is not None:
            raise item.error

    def _commit_with_group(
        self, writes: Sequence[LedgerWrite | CheckpointWrite], config: RunnableConfig | None
    ) -> list[QueuedWrite]:
        items = self._enqueue(writes, config)
        with self.lock:
            if items and not items[-1].done:  # one enqueue is committed whole, in one batch
                self.setup()
                self._commit_queue(self.conn)
        return items
