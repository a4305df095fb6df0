"""`DurablePostgresSaver` and `AsyncDurablePostgresSaver`: LangGraph's PostgreSQL savers
(`PostgresSaver`, `AsyncPostgresSaver`) plus the effect ledger in the same database.

For workers on several machines: every checkpoint and ledger write of a thread runs in
one transaction that first takes a transaction-level advisory lock on the thread, then
checks the lease's fencing token and the flow-version pin, so the same guarantees hold
as with `DurableSqliteSaver` (whose file lock serializes all writers). Once the thread's
flow pin is known, such a write is one round trip: the fence checked on the server, the
thread's deferred receipts and the write's statements go out together in pipeline mode,
one implicit transaction up to the pipeline's sync, which the fence checks is READ
COMMITTED (PostgreSQL migration 9; on a server whose default isolation is another, the
writes are begun explicitly). A step's claim is one server-side call that fences
itself (migration 10).

Install with `pip install 'graph-durable[postgres]'`. The connection must be opened
with `autocommit=True` and `row_factory=dict_row`, as for LangGraph's `PostgresSaver`
(`from_conn_string` does it); a `psycopg_pool.ConnectionPool` works too (for the async
saver, an `AsyncConnection` or an `AsyncConnectionPool`). Pipeline mode is not
supported: a durable write needs its own transaction.

Retention keeps the ledger as `DurableSqliteSaver` does: `delete_thread` deletes it with
the thread, `prune(strategy="keep_latest")` (LangGraph's PostgreSQL rules for which
checkpoints stay) and `delete_for_runs` keep it, and `copy_thread` copies it and keys
the copy's effects by the thread it came from.

This module is `DurablePostgresSaver` alone (the async saver is `async_saver`, the leases
`_leases`, the statements `_sql`); it stays over 400 lines because the transaction it
opens (`_txn`, `_one_trip`, `_fenced`) and the checkpoint and ledger writes that run
inside it are read together: each write's fence and flow-pin check is in that plumbing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    SerializerProtocol,
)

from graph_durable._extras import require

require("postgres", "DurablePostgresSaver", "psycopg", "psycopg_pool",
        "langgraph.checkpoint.postgres")

from langgraph.checkpoint.postgres import PostgresSaver, _internal  # noqa: E402
from psycopg import (
    Connection,
    Cursor,
    DatabaseError,
    IsolationLevel,
    OperationalError,
)
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool
from psycopg.rows import dict_row, tuple_row

from graph_durable.checkpointers import _sql, _steps
from graph_durable.checkpointers.postgres._sql import (
    COPY_THREAD_CHECKPOINTS,
    DELETE_CHECKPOINT,
    DELETE_CHECKPOINT_WRITES,
    DELETE_NULL_RESUME,
    DELETE_THREAD_CHECKPOINTS,
    DURABLE_COMMIT,
    FENCE_REFUSED,
    KEYED_AS,
    LANGGRAPH_APPLIED,
    LOCK_THREAD_READ_LEASE,
    LOCK_THREAD,
    MARK_FENCED,
    ROW_FENCES,
    SELECT_CALLED_TASKS,
    SELECT_COPY_POINT_STEPS,
    SELECT_STEP_WRITES,
    SELECT_LEASE_WITH_CLOCK,
    SCHEMA_TABLES,
    SELECT_RUN_CHECKPOINTS,
    TRY_LOCK_SETUP,
    UNLOCK_SETUP,
    ImplicitNotReadCommitted,
    TransactionDeferred,
    broke_under_write,
    claim_call,
    lock_keys,
    pg_sql,
    predicted_of,
    raise_refused,
    unanswered_read,
)
from graph_durable.checkpointers.postgres._leases import PostgresLeases
from graph_durable.checkpointers.postgres._sql import SETUP_NEEDS, connected
from graph_durable.checkpointers.postgres._sql import lease_and_clock as _lease_and_clock
from graph_durable.checkpointers.postgres._sql import run as _run
from graph_durable.checkpointers.postgres.async_saver import AsyncDurablePostgresSaver
from graph_durable.checkpointers._base import DurableSaverMixin, IntentExists, actor_of
from graph_durable.checkpointers._decode import CheckedCheckpoints, lease_from_row
from graph_durable.checkpointers._durability import (
    POSTGRES_SETTINGS,
    POSTGRES_STANDBYS,
    postgres_report,
)
from graph_durable.checkpointers._reads import SyncLedgerReads
from graph_durable.checkpointers._schema import (
    LATEST_APPLIED,
    PG_MIGRATIONS,
    PG_MIGRATIONS_TABLE,
    PG_RUNS_FROM,
    SETUP_STATE,
    UPSERT_RUNS_FROM,
    check_readable,
    is_current,
    runs_from_value,
    statements,
)
from graph_durable.checkpointers._twins import AsyncFromSync, EagerListing, FencedPuts
from graph_durable.durability import DurabilityReport
from graph_durable.errors import DatabaseUnavailable, IllegalTransition, LeaseLost
from graph_durable.leases import check_fence
from graph_durable.ledger import (
    EffectRecord,
    IntentWrite,
    Keying,
    LedgerWrite,
    TransitionWrite,
    WriteBatch,
)

__all__ = ["AsyncDurablePostgresSaver", "DurablePostgresSaver", "pg_sql"]

T = TypeVar("T")

# Set while `put`/`put_writes` run LangGraph's own statements, so that `_cursor` runs
# them inside a fenced transaction of that thread (in one round trip if the flag allows).
_FENCED_WRITE: ContextVar[
    tuple[str, RunnableConfig, Callable[[], list[Any]], bool, bool] | None] = (
    ContextVar("graph_durable_pg_fenced_write", default=None))


def _retried_on_deadlock(migrate: Callable[[], T], attempts: int = 3) -> T:
    """`migrate()`, again (up to `attempts` in all) if the server broke a deadlock by
    aborting it: creating a trigger on LangGraph's tables waits for the writes under
    way, and a write taking them in another order deadlocks with it. Nothing of an
    aborted migration stays (it is one transaction)."""
    from psycopg.errors import DeadlockDetected

    for attempt in range(1, attempts + 1):
        try:
            return migrate()
        except DeadlockDetected:
            if attempt == attempts:
                raise
            time.sleep(0.05 * attempt)
    raise AssertionError("unreachable")


@contextmanager
def _setup_mutex(conn: _internal.Conn) -> Iterator[Connection[Any]]:
    """Hold a database-wide lock while the schema is created or migrated; yields the
    connection that holds it, for the setup to run on.

    `CREATE TABLE IF NOT EXISTS` is not safe against a concurrent twin in PostgreSQL,
    so processes starting together take turns. The lock is tried, not waited for: a
    session blocked inside a statement would keep LangGraph's `CREATE INDEX
    CONCURRENTLY` waiting on it.
    """
    with _internal.get_connection(conn) as held, held.cursor(row_factory=tuple_row) as cur:
        while not cur.execute(TRY_LOCK_SETUP).fetchone()[0]:
            time.sleep(0.05)
        try:
            yield held
        finally:
            cur.execute(UNLOCK_SETUP)


@contextmanager
def _read_committed(conn: Connection[Any]) -> Iterator[None]:
    """Begin the transactions of this block `READ COMMITTED`, whatever the server's
    `default_transaction_isolation`: the fence reads the thread's lease row after the
    advisory lock is granted, and only a statement snapshot taken then (not one taken
    when the transaction began, as `REPEATABLE READ` does) sees a lease committed while
    it waited. psycopg puts the level in the `BEGIN` itself: no extra round trip."""
    before = conn.isolation_level
    if before is IsolationLevel.READ_COMMITTED:
        yield
        return
    conn.isolation_level = IsolationLevel.READ_COMMITTED
    try:
        yield
    finally:
        if not conn.closed:  # a broken connection is dropped by its pool anyway
            conn.isolation_level = before


def _rows(cur: Any, statement: _steps.Statement) -> list[Any] | None:
    """Run one of `_steps`' statements; its rows, when it asks for them."""
    ran = _run(cur, statement.sql, statement.params)
    return ran.fetchall() if statement.fetch else None


class DurablePostgresSaver(TransactionDeferred, PostgresLeases, DurableSaverMixin,
                           CheckedCheckpoints, SyncLedgerReads,
                           EagerListing, FencedPuts, AsyncFromSync, PostgresSaver):
    """A LangGraph checkpointer on PostgreSQL that also keeps the effect ledger.

    Use it wherever a `PostgresSaver` goes; `EffectGuardNode` finds the ledger through
    it. Its async methods run the sync ones; under `ainvoke`, `AsyncDurablePostgresSaver`
    does not block the event loop.

    After `conn` it takes `PostgresSaver`'s `pipe` (a pipeline of `conn`, not of a
    pool) and `serde`; its keyword arguments (`serde`, `flow_version`,
    `compatible_flow_versions`, `key_secret`) are `DurableSqliteSaver`'s.

    Args:
        conn: A psycopg `Connection` (autocommit, `dict_row`) or a `ConnectionPool`.
    """

    _SELECT_CALLED_TASKS = SELECT_CALLED_TASKS
    _SELECT_STEP_WRITES = SELECT_STEP_WRITES

    def _init_engine(self) -> None:
        self.is_setup = False
        self._setup_lock = threading.Lock()

    @classmethod
    @contextmanager
    def from_conn_string(  # type: ignore[override]
        cls, conn_string: str, *, pipeline: bool = False, **options: Any
    ) -> Iterator[DurablePostgresSaver]:
        """Connect to `conn_string` (a libpq string or URL) and yield a saver on it
        (`pipeline=True`: in pipeline mode, as `PostgresSaver.from_conn_string`);
        `options` are the saver's keyword arguments (`serde`, `flow_version`, ...)."""
        with Connection.connect(
            conn_string, autocommit=True, prepare_threshold=0, row_factory=dict_row
        ) as conn, (conn.pipeline() if pipeline else nullcontext()) as pipe:
            yield cls(conn, pipe, **options)

    @classmethod
    def open_read_only(
        cls, conn_string: str, *, serde: SerializerProtocol | None = None
    ) -> DurablePostgresSaver:
        """A saver that only reads: every transaction of its connection is read-only
        (`default_transaction_read_only`), and it never creates or migrates the schema.
        For operators' tools: a sealed value `serde` cannot open reads as
        `graph_durable.secrets.SEALED`.

        Raises:
            GraphDurableError: the database has no graph_durable ledger, or one an older
                graph_durable wrote that a writer has not migrated yet.
        """
        conn = Connection.connect(conn_string, autocommit=True, prepare_threshold=0,
                                  row_factory=dict_row, connect_timeout=10,
                                  options="-c default_transaction_read_only=on")
        where = conn_string.split("@")[-1]
        try:
            with conn.cursor(row_factory=tuple_row) as cur:
                tables = {row[0] for row in cur.execute(
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = current_schema()")}
                check_readable(where, "DurablePostgresSaver", tables,
                               lambda: cur.execute(LATEST_APPLIED).fetchone()[0],
                               len(PG_MIGRATIONS))
        except BaseException:
            conn.close()
            raise
        return cls._reader(conn, serde)

    # -- schema ------------------------------------------------------------------------

    def setup(self) -> None:
        """Create LangGraph's tables and apply pending ledger migrations (safe to repeat).

        Called on first use too; concurrent first calls from several processes are
        serialized by an advisory lock.
        """
        if self.is_setup:
            return  # set once, never unset: every write asks, so no lock for the answer
        with self._setup_lock:
            if self.is_setup:
                return
            if self._schema_current():
                self.is_setup = True
                return
            pool = self.conn
            try:
                with _setup_mutex(pool) as held:
                    # The whole setup runs on the connection that holds the setup lock:
                    # a pool of one connection (or two savers sharing a pool of two)
                    # would otherwise wait for a second connection while holding the first.
                    self.conn = held
                    try:
                        super().setup()
                        _retried_on_deadlock(self._migrate)
                    finally:
                        self.conn = pool
            except BaseException as exc:
                raise_refused(exc, None, SETUP_NEEDS)
            self.is_setup = True

    def _schema_current(self) -> bool:
        """Whether LangGraph's tables and the ledger's are up to date: only reads, takes
        no lock (so setup on a read-only connection or a replica works)."""
        with self._own_lock(), _internal.get_connection(self.conn) as conn, \
                conn.cursor(row_factory=tuple_row) as cur:
            tables = {row[0] for row in cur.execute(SCHEMA_TABLES).fetchall()}
            if "checkpoint_migrations" not in tables or \
                    cur.execute(LANGGRAPH_APPLIED).fetchone()[0] + 1 < len(self.MIGRATIONS):
                return False
            if not is_current(tables, lambda: cur.execute(SETUP_STATE).fetchone(),
                              len(PG_MIGRATIONS)):
                return False
            self._learn_row_fences(cur.execute(ROW_FENCES).fetchone()[0])
            return True

    def _migrate(self) -> None:
        with self.lock, _internal.get_connection(self.conn) as conn, conn.transaction():
            with conn.cursor(row_factory=tuple_row) as cur:
                cur.execute(PG_MIGRATIONS_TABLE)
                row = cur.execute(
                    "SELECT COALESCE(MAX(v), -1) FROM graph_durable_migrations"
                ).fetchone()
                for version in range(row[0] + 1, len(PG_MIGRATIONS)):
                    for statement in statements(PG_MIGRATIONS[version]):
                        cur.execute(statement)
                    cur.execute(
                        "INSERT INTO graph_durable_migrations (v, applied_at) "
                        "VALUES (%s, %s)", (version, time.time()),
                    )
                if row[0] + 1 < len(PG_MIGRATIONS):  # migrated: which releases run on it
                    _run(cur, UPSERT_RUNS_FROM, (
                        runs_from_value(len(PG_MIGRATIONS) - 1, PG_RUNS_FROM),))
                _run(cur, _sql.INSERT_DB_KEY_SECRET, self._db_secret_params())
                self._learn_row_fences(cur.execute(ROW_FENCES).fetchone()[0])

    def durability(self) -> DurabilityReport:
        """The settings this database's commits depend on, as the saver's own session
        sees them, and what each risks: `fsync`, `full_page_writes`,
        `synchronous_commit` (enforced at `on` for ledger writes),
        `synchronous_standby_names` and each standby's `sync_state` (see
        `graph_durable.durability`). Reads only."""
        with self._read() as cur:
            settings = cur.execute(POSTGRES_SETTINGS).fetchone()
            standbys = cur.execute(POSTGRES_STANDBYS).fetchall()
        return postgres_report(settings, standbys)

    @contextmanager
    def _txn(
        self, thread_id: str | None = None, config: RunnableConfig | None = None, *,
        durable: bool = False,
    ) -> Iterator[Cursor[Any]]:
        """One write transaction; with `thread_id`, locked, fenced and flow-pinned first.

        Yields a tuple-row cursor; a stale fencing token or another flow version raises
        before anything is written, and the whole transaction rolls back on any error.
        `durable`: a ledger write, committed durably whatever the server's settings
        (`_sql.DURABLE_COMMIT`).
        """
        self.setup()
        with self._own_lock(), self._write_connection(thread_id) as conn, \
                _read_committed(conn), self._deferred_scope():
            try:
                with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
                    if durable:
                        cur.execute(DURABLE_COMMIT)
                    if thread_id is not None:
                        self._check_write_txn(cur, thread_id, config)
                    yield cur
            except BaseException as exc:
                self._deferred_rolled_back()
                self._write_failed(exc, conn, thread_id)
            self._deferred_committed()

    @contextmanager
    def _one_trip(self, thread_id: str,
                  config: RunnableConfig | None, *,
                  fenced_by_block: bool = False, durable: bool = False,
                  langgraph: bool = False, rows: bool = False) -> Iterator[Cursor[Any]]:
        """A fenced write of a thread whose flow pin is known, in one round trip: the
        fence checked on the server (after the thread's lock), the thread's deferred
        receipts (`carried_transition`) and the block's statements are sent together in
        pipeline mode, as one transaction (`_fence_statements`: implicit up to the
        pipeline's sync, or between `BEGIN` and `COMMIT`). A refused fence aborts the
        transaction, so nothing sent after it commits; the refusal is then explained
        from the lease row. Results the block asks for are read after the block (the
        commit): give each its own cursor, and fetch nothing inside it (a fetch syncs
        the pipeline, which would end the implicit transaction there).
        `fenced_by_block`: the block's first statement fences the transaction itself
        (`CLAIM_STEP`); the fence is sent anyway if deferred receipts go before it
        (they do, but after LangGraph's rows: see `rows`).

        Raises `ImplicitNotReadCommitted` if the implicit transaction was not READ
        COMMITTED (nothing was written; send the write again).
        `langgraph`: the block gets LangGraph's cursor (binary, dict rows) for its
        checkpoint writes, the fence sent on it too (it fetches nothing). `rows`: the
        block first writes rows of the thread into LangGraph's tables, which fence it
        themselves when the writer has no fencing token (`_one_trip_plan`)."""
        self.setup()
        with self._own_lock(), self._write_connection(thread_id) as conn, \
                self._deferred_scope():
            carried: list[tuple[Any, Cursor[Any]]] = []
            try:
                carrying, opening, closing = self._one_trip_plan(
                    conn.autocommit, thread_id, config, fenced_by_block, durable, rows)
                with conn.pipeline(), (conn.cursor(binary=True, row_factory=dict_row)
                                       if langgraph else conn.cursor(row_factory=tuple_row)
                                       ) as cur:
                    for statement in opening:
                        cur.execute(*statement)
                    if not langgraph:  # before the block: its journal entries come first
                        self._send_carried(conn, carrying, carried)
                    yield cur
                    if langgraph:  # LangGraph's rows: after them, which fenced them
                        self._send_carried(conn, carrying, carried)
                    if closing is not None:
                        cur.execute(closing)
                for writes, outcome in carried:
                    self._carried_outcome(writes, outcome.fetchall())
            except BaseException as exc:
                self._deferred_rolled_back()
                if not conn.closed and not conn.broken \
                        and conn.pgconn.transaction_status != TransactionStatus.IDLE:
                    conn.rollback()
                if isinstance(exc, DatabaseError) and exc.sqlstate == FENCE_REFUSED:
                    self._refused_by_fence(conn, thread_id, config)
                self._write_failed(exc, conn, thread_id, one_trip=True)
            finally:
                for _, outcome in carried:
                    outcome.close()
            self._deferred_committed()

    @staticmethod
    def _send_carried(conn: Connection[Any], carrying: list[tuple[Any, Any]],
                      carried: list[tuple[Any, Cursor[Any]]]) -> None:
        """Send the deferred receipts a one-round-trip write carries, each on a cursor
        of its own (read after the commit)."""
        for write, statement in carrying:
            carried.append((write, conn.cursor(row_factory=tuple_row)))
            carried[-1][1].execute(*statement)

    def _refused_by_fence(self, conn: Connection[Any], thread_id: str,
                          config: RunnableConfig | None) -> None:
        """Raise what the server's fence refused a write for (`check_fence`'s error)."""
        with conn.cursor(row_factory=tuple_row) as cur:
            row, now = _lease_and_clock(
                cur.execute(SELECT_LEASE_WITH_CLOCK, (thread_id,)).fetchone())
        token = actor_of(config)[1]
        check_fence(lease_from_row(thread_id, row), thread_id, token, now)
        raise LeaseLost(  # the lease changed again since: the fence refused the old one
            f"Write to thread {thread_id!r} with fencing token {token} was refused: the "
            "thread's lease was taken or ended meanwhile. Its write was rejected; stop this "
            "run.", thread_id=thread_id, token=token)

    @staticmethod
    def _unavailable(exc: BaseException, thread_id: str | None) -> DatabaseUnavailable:
        return broke_under_write(exc, thread_id, "A ConnectionPool")

    def _write_connection(self, thread_id: str | None) -> Any:
        """The connection a write runs on (a context manager): the saver's own, or one
        of its pool's, whose timeout raises `connected`'s error. Every write asks: a
        single connection is handed over as it is."""
        if isinstance(self.conn, Connection):
            return nullcontext(self.conn)
        return connected(_internal.get_connection(self.conn), thread_id)

    def _own_lock(self) -> Any:
        """What a ledger transaction holds while it runs: the saver's lock on a single
        connection (one transaction at a time), nothing on a `ConnectionPool` (each
        transaction has a connection of its own, so one waiting for a thread's advisory
        lock never holds up another thread's write)."""
        return nullcontext() if isinstance(self.conn, ConnectionPool) else self.lock

    @contextmanager
    def _read(self) -> Iterator[Cursor[Any]]:
        self.setup()
        with self._own_lock(), (nullcontext(self.conn) if isinstance(self.conn, Connection)
                                else _internal.get_connection(self.conn)) as conn:
            with conn.cursor(row_factory=tuple_row) as cur:
                yield cur

    @contextmanager
    def _cursor(self, *, pipeline: bool = False) -> Iterator[Cursor[Any]]:
        """LangGraph's cursor; for the writes of `put`/`put_writes`, a fenced transaction's."""
        fenced = _FENCED_WRITE.get() if pipeline else None
        if fenced is None:
            with super()._cursor(pipeline=pipeline) as cur:
                yield cur
            return
        thread_id, config, after, may_trip, rows = fenced
        if may_trip and self._one_trip_possible(thread_id):
            with self._one_trip(thread_id, config, langgraph=True, rows=rows) as cur:
                yield cur
                for statement in after():
                    _run(cur, *statement)
            return
        with self._txn(thread_id, config) as ledger_cur:
            with ledger_cur.connection.cursor(binary=True, row_factory=dict_row) as cur:
                yield cur
            for statement in after():
                _run(ledger_cur, *statement)

    def _fenced(self, config: RunnableConfig, write: Callable[[], T],
                after: Callable[[], list[Any]] = list, *, one_trip: bool = True,
                rows: bool = True) -> T:
        """Run `write()` (LangGraph's writes) in a fenced transaction, then `after()`'s
        statements; once more, begun explicitly, if it went without `BEGIN` in a
        transaction that was not READ COMMITTED (nothing of it was written).

        `one_trip=False` when `after()` must be asked once the thread's lock is held
        (see `AsyncDurablePostgresSaver._fenced`). `rows=False` when `write()` may write
        no row (`put_writes` of no writes): the fence is then sent whatever the tables
        do (see `_one_trip_plan`)."""
        self.setup()
        token = _FENCED_WRITE.set((str(config["configurable"]["thread_id"]), config, after,
                                   one_trip, rows))
        try:
            try:
                return write()
            except ImplicitNotReadCommitted:
                return write()
        finally:
            _FENCED_WRITE.reset(token)

    # -- checkpoints: LangGraph's behaviour, fenced, without its traps -------------------

    def _before_list(self) -> None:
        self.setup()

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Fetch a checkpoint tuple (see `PostgresSaver.get_tuple`)."""
        self.setup()
        return super().get_tuple(config)

    def _put_fenced(self, config: RunnableConfig, checkpoint: Checkpoint,
                    metadata: CheckpointMetadata, new_versions: ChannelVersions
                    ) -> RunnableConfig:
        return self._fenced(config, lambda: PostgresSaver.put(
            self, config, checkpoint, metadata, new_versions))

    def _put_writes_fenced(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                           task_id: str, task_path: str) -> None:
        late, one_trip = self._late_resume_after(config, writes, task_id)
        self._fenced(config, lambda: PostgresSaver.put_writes(
            self, config, writes, task_id, task_path), late, one_trip=one_trip,
            rows=bool(writes))

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's checkpoints, blobs, writes, effects, events and flow pin."""
        self._forget_stored()
        with self._txn() as cur:
            for statement in (*DELETE_THREAD_CHECKPOINTS, *_sql.DELETE_THREAD_LEDGER):
                _run(cur, statement, (str(thread_id),))
        self._flow_checked.discard(str(thread_id))
        self._forget_deferred(str(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) created by these runs; keep the ledger."""
        self._forget_stored()
        with self._txn() as cur:
            rows = cur.execute(SELECT_RUN_CHECKPOINTS, ([str(r) for r in run_ids],)).fetchall()
            for row in rows:
                cur.execute(DELETE_CHECKPOINT, row)
                cur.execute(DELETE_CHECKPOINT_WRITES, row)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy checkpoints, blobs, writes, effects and events of one thread to another."""
        params = (str(target_thread_id), str(source_thread_id))
        with self._txn() as cur:
            # The source's writes wait: the copy point is where it stands, copied.
            cur.execute(LOCK_THREAD, (str(source_thread_id),))
            cur.execute(MARK_FENCED, (str(target_thread_id),))  # the target is not fenced
            self._flush_deferred(cur, str(source_thread_id))
            for statement in COPY_THREAD_CHECKPOINTS:
                cur.execute(statement, params)
            for statement in _sql.COPY_THREAD_LEDGER:
                _run(cur, statement, params)
            _run(cur, _sql.UPSERT_ORIGIN, self._origin_params(*reversed(params)))
            _steps.performed(_steps.copy_point(params[1], params[0], SELECT_STEP_WRITES),
                             lambda statement: _rows(cur, statement))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune checkpoints: `keep_latest` keeps the newest per namespace (LangGraph's
        rules) and the whole ledger; `delete` is `delete_thread`."""
        if self._prune_deletes(thread_ids, strategy):
            for thread_id in thread_ids:
                self.delete_thread(thread_id)
            return
        self.setup()
        for thread_id in thread_ids:  # the writes the steps after a copy point come from
            self._run_statements(_steps.anchors_before_prune(
                str(thread_id), SELECT_STEP_WRITES, SELECT_COPY_POINT_STEPS))
        super().prune(thread_ids, strategy=strategy)

    # -- fencing and ledger writes inside a transaction --------------------------------

    def _check_write_txn(
        self, cur: Cursor[Any], thread_id: str, config: RunnableConfig | None
    ) -> None:
        """Lock the thread, fence, pin, and commit its deferred receipts with this write."""
        row, now = _lease_and_clock(cur.execute(LOCK_THREAD_READ_LEASE, (thread_id,)).fetchone())
        check_fence(lease_from_row(thread_id, row), thread_id, actor_of(config)[1], now)
        if self._needs_flow_check(thread_id):
            row = _run(cur, _sql.SELECT_FLOW_VERSION, (thread_id,)).fetchone()
            for sql, params in self._flow_statements(row, thread_id):
                _run(cur, sql, params)
        self._flush_deferred(cur, thread_id)

    def _flush_deferred(self, cur: Cursor[Any], thread_id: str) -> None:
        """Carry the thread's deferred receipts in this transaction."""
        if thread_id not in self._deferred:
            return
        with self._carrying():
            for write, write_config in self._take_deferred(thread_id):
                try:
                    self._apply_one_txn(cur, write, actor_of(write_config))
                except IllegalTransition as refused:
                    self._refused_deferred(write, refused)

    def _apply_one_txn(
        self, cur: Cursor[Any], one: IntentWrite | TransitionWrite,
        actor: tuple[str | None, int | None],
    ) -> EffectRecord:
        if isinstance(one, IntentWrite):
            (inherit, inherited), (insert, *after), record = self._plan_intent(one, actor)
            _run(cur, *lock_keys([one.key]))
            if _run(cur, *inherit).rowcount == 1:
                _run(cur, *inherited)
                row = _run(cur, _sql.SELECT_EFFECT, (one.thread_id, one.key)).fetchone()
                raise IntentExists(self._record(row))
            if _run(cur, *insert).rowcount == 0:
                # The key is already known: the intent stands, report what is recorded.
                row = _run(cur, _sql.SELECT_EFFECT, (one.thread_id, one.key)).fetchone()
                raise IntentExists(self._record(row))
            for statement in after:
                _run(cur, *statement)
            return record
        now = time.time()
        rows = _run(cur, *self._plan_update(one, now)).fetchall()
        if not rows:
            row = _run(cur, _sql.SELECT_EFFECT, (one.thread_id, one.key)).fetchone()
            raise _sql.refusal(row, thread_id=one.thread_id, key=one.key, to=one.to)
        record = self._record(rows[0])
        _run(cur, *self._transition_event(record, one, now, actor))
        return record

    # -- leases (PostgresLeases in _leases) and the run log ------------------------------

    def record_task_run(self, thread_id: str, run_id: str, checkpoint_ns: str, node: str,
                        kind: str) -> None:
        """Log that a node (or a model call in it) started, for `graph_durable.operators.audit`."""
        with self._txn() as cur:
            _run(cur, _sql.INSERT_TASK_RUN,
                 (str(thread_id), run_id, checkpoint_ns, node, kind, time.time()))

    def _run_statements(self, statements: Any) -> Any:
        with self._txn() as cur:
            return _steps.performed(statements, lambda statement: _rows(cur, statement))

    # -- the ledger ----------------------------------------------------------------------

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Every row of one read (the ledger's reads are in `SyncLedgerReads`); a read
        whose pooled connection broke is tried once more on a fresh one."""
        try:
            with self._read() as cur:
                return _run(cur, sql, params).fetchall()
        except OperationalError as exc:
            if not isinstance(self.conn, ConnectionPool):
                raise DatabaseUnavailable(
                    f"The connection to PostgreSQL broke under a read ({type(exc).__name__}: "
                    f"{str(exc).strip()}); reconnect the saver, then try again.") from exc
        try:
            with self._read() as cur:  # the pool has dropped the broken connection
                return _run(cur, sql, params).fetchall()
        except OperationalError as exc:  # PoolTimeout too: no connection works
            raise unanswered_read(exc) from exc

    def apply(
        self, write: LedgerWrite, config: RunnableConfig | None = None
    ) -> list[EffectRecord]:
        """Apply one ledger write in one durable transaction; return the changed effects.

        Raises `IllegalTransition` if the lifecycle forbids it, `LeaseLost` or
        `FlowVersionMismatch` if the write is fenced out; in each case nothing of this
        write is stored. A write marked `defer` returns at once and is committed with
        the thread's next write.
        """
        if self._defer(write, config):
            return []
        actor = actor_of(config)
        writes = write.writes if isinstance(write, WriteBatch) else (write,)
        try:
            with self._txn(write.thread_id, config, durable=True) as cur:
                changed = [self._apply_one_txn(cur, one, actor) for one in writes]
                if isinstance(write, WriteBatch) and write.resume_at is not None:
                    deleted = _run(cur, DELETE_NULL_RESUME,
                                   (write.thread_id, *write.resume_at)).rowcount
                    self._resume_consumed(write, deleted)
        except IntentExists as exists:
            raise IllegalTransition(
                f"Effect {exists.record.key!r} of thread {write.thread_id!r} is already "
                f"recorded ({exists.record.status.value}); claim() reports its state.",
                thread_id=write.thread_id,
            ) from None
        return changed

    def claim_many(
        self, intents: Sequence[IntentWrite], config: RunnableConfig | None = None
    ) -> list[tuple[EffectRecord, bool]]:
        """`claim` several intents of one thread in one transaction."""
        if not intents:
            return []
        thread_id = intents[0].thread_id
        if any(intent.thread_id != thread_id for intent in intents):
            raise ValueError("claim_many claims intents of one thread")
        if self._one_trip_possible(thread_id):
            return self._claim_in_one_trip(thread_id, intents, config)
        actor = actor_of(config)
        claimed: list[tuple[EffectRecord, bool]] = []
        predicted = predicted_of(intents)
        with self._txn(thread_id, config, durable=True) as cur:
            _run(cur, *lock_keys([intent.key for intent in intents]))
            for intent in intents:
                try:
                    claimed.append((self._apply_one_txn(cur, intent, actor), True))
                except IntentExists as exists:
                    # Nothing of this intent was written: its key was already known.
                    claimed.append((exists.record, False))
            if predicted is not None:
                cur.execute(KEYED_AS, (thread_id, predicted.pin))
        return claimed

    def _claim_in_one_trip(
        self, thread_id: str, intents: Sequence[IntentWrite], config: RunnableConfig | None
    ) -> list[tuple[EffectRecord, bool]]:
        """`claim_many` as one `CLAIM_STEP` call in a one-round-trip fenced write."""
        actor = actor_of(config)
        planned = [plan[1:] for plan in self._plan_intents(intents, actor)]
        predicted = predicted_of(intents)
        try:
            return self._claim_planned(thread_id, planned, config, predicted)
        except ImplicitNotReadCommitted:  # nothing was written: now begun explicitly
            return self._claim_planned(thread_id, planned, config, predicted)

    def _claim_planned(
        self, thread_id: str, planned: Sequence[tuple[list[Any], EffectRecord]],
        config: RunnableConfig | None, predicted: Keying | None = None,
    ) -> list[tuple[EffectRecord, bool]]:
        # The claim's statement makes its commit durable and checks `predicted` itself.
        with self._one_trip(thread_id, config, fenced_by_block=True) as fenced:
            cur = fenced.connection.cursor(row_factory=tuple_row, binary=True)
            cur.execute(*claim_call(thread_id, planned, actor_of(config), predicted))
        with cur:
            return self._claimed_rows(planned, cur.fetchall())
