"""`AsyncDurablePostgresSaver`: the async twin of `DurablePostgresSaver` (psycopg's async API).

Imported from `graph_durable.checkpointers.postgres`. Same tables, same statements
(`postgres/_sql`, and the ledger's `checkpointers/_sql`), same transaction per write:
READ COMMITTED, the thread's advisory lock, then its fencing token and flow pin checked
on the server's clock. Nothing here blocks the event loop: every statement is awaited,
and the sync methods (for the lease renewer's thread, or a sync caller elsewhere) run
the async ones on the saver's loop.

On an `AsyncConnectionPool`, a transaction holds one pooled connection and no
saver-wide lock, so tasks writing different threads run in parallel; writes of one
thread that arrive together (parallel tool calls of a step) share one transaction, as
`DurableSqliteSaver`'s group commit does. On a single `AsyncConnection`, one statement
sequence runs at a time.

The group commit (`aapply`, `aclaim_many`) is in `_group`, the leases and the server's
clock in `_leases`; the statements shared with the sync saver in `_sql` (imported as
`_pg`, beside the ledger's own `checkpointers._sql`).

This module is over 400 lines: it follows `saver.py` method for method, each awaited,
with the transaction plumbing the writes run in.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, nullcontext
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
from langgraph.checkpoint.postgres import _ainternal
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from psycopg import (
    AsyncConnection,
    AsyncCursor,
    DatabaseError,
    IsolationLevel,
    OperationalError,
)
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row, tuple_row
from psycopg_pool import AsyncConnectionPool

from graph_durable.checkpointers import _sql, _steps
from graph_durable.checkpointers.postgres import _sql as _pg
from graph_durable.checkpointers._base import DurableSaverMixin, IntentExists, actor_of
from graph_durable.checkpointers._decode import CheckedCheckpoints, lease_from_row
from graph_durable.checkpointers._durability import (
    POSTGRES_SETTINGS,
    POSTGRES_STANDBYS,
    postgres_report,
)
from graph_durable.checkpointers.postgres._sql import TransactionDeferred
from graph_durable.checkpointers.postgres._sql import arun as _run
from graph_durable.checkpointers.postgres._group import AsyncGroupCommit, _QueuedWrite
from graph_durable.checkpointers.postgres._leases import AsyncPostgresLeases
from graph_durable.checkpointers._reads import AsyncLedgerReads
from graph_durable.checkpointers._schema import (
    LATEST_APPLIED,
    PG_MIGRATIONS,
    PG_MIGRATIONS_TABLE,
    PG_RUNS_FROM,
    SETUP_STATE,
    SETUP_TABLES,
    UPSERT_RUNS_FROM,
    check_readable,
    is_current,
    runs_from_value,
    statements,
)
from graph_durable.checkpointers._twins import (
    AsyncEagerListing,
    AsyncFencedPuts,
    AsyncLeaseScope,
    SyncFromAsync,
)
from graph_durable.durability import DurabilityReport
from graph_durable.errors import DatabaseUnavailable, IllegalTransition, LeaseLost
from graph_durable.leases import check_fence
from graph_durable.ledger import EffectRecord, IntentWrite, TransitionWrite

__all__ = ["AsyncDurablePostgresSaver"]

T = TypeVar("T")

_FENCED_WRITE: ContextVar[
    tuple[str, RunnableConfig, Callable[[], list[Any]], bool, bool] | None] = (
    ContextVar("graph_durable_apg_fenced_write", default=None))
"""Set while `aput`/`aput_writes` run LangGraph's own statements, so that `_cursor`
runs them inside a fenced transaction of that thread."""




async def _aretried_on_deadlock(migrate: Callable[[], Awaitable[T]], attempts: int = 3) -> T:
    """`DurablePostgresSaver`'s `_retried_on_deadlock`, awaited."""
    from psycopg.errors import DeadlockDetected

    for attempt in range(1, attempts + 1):
        try:
            return await migrate()
        except DeadlockDetected:
            if attempt == attempts:
                raise
            await asyncio.sleep(0.05 * attempt)
    raise AssertionError("unreachable")


@asynccontextmanager
async def _setup_mutex(conn: _ainternal.Conn) -> AsyncIterator[AsyncConnection[Any]]:
    """Hold the database-wide setup lock; yield the connection holding it (see
    `postgres._setup_mutex`: tried, never waited for inside a statement)."""
    async with _ainternal.get_connection(conn) as held:
        async with held.cursor(row_factory=tuple_row) as cur:
            while not (await (await cur.execute(_pg.TRY_LOCK_SETUP)).fetchone())[0]:
                await asyncio.sleep(0.05)
        try:
            yield held
        finally:
            async with held.cursor(row_factory=tuple_row) as cur:
                await cur.execute(_pg.UNLOCK_SETUP)


@asynccontextmanager
async def _read_committed(conn: AsyncConnection[Any]) -> AsyncIterator[None]:
    """Begin this block's transactions READ COMMITTED (see `postgres._read_committed`)."""
    before = conn.isolation_level
    if before is IsolationLevel.READ_COMMITTED:
        yield
        return
    await conn.set_isolation_level(IsolationLevel.READ_COMMITTED)
    try:
        yield
    finally:
        if not conn.closed:
            await conn.set_isolation_level(before)


async def _arows(cur: Any, statement: _steps.Statement) -> list[Any] | None:
    """Run one of `_steps`' statements; its rows, when it asks for them."""
    await _run(cur, statement.sql, statement.params)
    return await cur.fetchall() if statement.fetch else None


class AsyncDurablePostgresSaver(TransactionDeferred, DurableSaverMixin, CheckedCheckpoints,
                                AsyncGroupCommit,
                                AsyncPostgresLeases, AsyncLedgerReads, AsyncEagerListing,
                                AsyncFencedPuts, AsyncLeaseScope, SyncFromAsync,
                                AsyncPostgresSaver):
    """An async LangGraph checkpointer on PostgreSQL that also keeps the effect ledger.

    Use it wherever an `AsyncPostgresSaver` goes (construct it inside the event loop
    that runs the graph); `EffectGuardNode` finds the ledger through it.

    After `conn` it takes `AsyncPostgresSaver`'s `pipe` (a pipeline of `conn`, not of
    a pool) and `serde`; its keyword arguments are `DurableSqliteSaver`'s.

    Args:
        conn: A psycopg `AsyncConnection` (autocommit, `dict_row`) or an
            `AsyncConnectionPool` of them.
    """

    _SELECT_CALLED_TASKS = _pg.SELECT_CALLED_TASKS
    _SELECT_STEP_WRITES = _pg.SELECT_STEP_WRITES

    def _init_engine(self) -> None:
        self.is_setup = False
        self._setup_lock = asyncio.Lock()
        self._groups: dict[str, list[_QueuedWrite]] = {}
        self._group_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary())
        self._server_clock: tuple[float, float] | None = None

    @classmethod
    @asynccontextmanager
    async def from_conn_string(  # type: ignore[override]
        cls, conn_string: str, *, pipeline: bool = False, **options: Any
    ) -> AsyncIterator[AsyncDurablePostgresSaver]:
        """Connect to `conn_string` (a libpq string or URL) and yield a saver on it
        (`pipeline=True`: in pipeline mode, as `AsyncPostgresSaver.from_conn_string`);
        `options` are the saver's keyword arguments (`serde`, `flow_version`, ...)."""
        async with await AsyncConnection.connect(
            conn_string, autocommit=True, prepare_threshold=0, row_factory=dict_row
        ) as conn, (conn.pipeline() if pipeline else nullcontext()) as pipe:
            yield cls(conn, pipe, **options)

    @classmethod
    async def open_read_only(
        cls, conn_string: str, *, serde: SerializerProtocol | None = None
    ) -> AsyncDurablePostgresSaver:
        """A saver that only reads (see `DurablePostgresSaver.open_read_only`); close its
        `conn` when done.

        Raises:
            GraphDurableError: the database has no graph_durable ledger, or one an older
                graph_durable wrote that a writer has not migrated yet.
        """
        conn = await AsyncConnection.connect(
            conn_string, autocommit=True, prepare_threshold=0, row_factory=dict_row,
            connect_timeout=10, options="-c default_transaction_read_only=on")
        try:
            async with conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute("SELECT table_name FROM information_schema.tables "
                                  "WHERE table_schema = current_schema()")
                tables = {row[0] for row in await cur.fetchall()}
                applied = -1
                if "graph_durable_migrations" in tables:
                    applied = (await (await cur.execute(LATEST_APPLIED)).fetchone())[0]
            check_readable(conn_string.split("@")[-1], "AsyncDurablePostgresSaver", tables,
                           lambda: applied, len(PG_MIGRATIONS))
        except BaseException:
            await conn.close()
            raise
        return cls._reader(conn, serde)

    # -- schema ------------------------------------------------------------------------

    async def setup(self) -> None:
        """Create LangGraph's tables and apply pending ledger migrations (safe to repeat).

        Called on first use too; concurrent first calls from several processes are
        serialized by an advisory lock, and the whole setup runs on the connection
        holding it (a pool of one connection would otherwise wait for a second).
        """
        if self.is_setup:
            return
        async with self._setup_lock:
            if self.is_setup:
                return
            if await self._schema_current():
                self.is_setup = True
                return
            pool = self.conn
            try:
                async with _setup_mutex(pool) as held:
                    self.conn = held
                    try:
                        await super().setup()
                        await _aretried_on_deadlock(self._migrate)
                    finally:
                        self.conn = pool
            except BaseException as exc:
                _pg.raise_refused(exc, None, _pg.SETUP_NEEDS)
            self.is_setup = True

    async def _schema_current(self) -> bool:
        """Whether every table is up to date (see `DurablePostgresSaver._schema_current`)."""
        async with self._own_lock(), _ainternal.get_connection(self.conn) as conn, \
                conn.cursor(row_factory=tuple_row) as cur:
            tables = {row[0] for row in await (await cur.execute(_pg.SCHEMA_TABLES)).fetchall()}
            if "checkpoint_migrations" not in tables or (await (await cur.execute(
                    _pg.LANGGRAPH_APPLIED)).fetchone())[0] + 1 < len(self.MIGRATIONS):
                return False
            if not SETUP_TABLES <= tables:
                return False
            state = await (await cur.execute(SETUP_STATE)).fetchone()
            if not is_current(tables, lambda: state, len(PG_MIGRATIONS)):
                return False
            self._learn_row_fences((await (await cur.execute(_pg.ROW_FENCES)).fetchone())[0])
            return True

    async def _migrate(self) -> None:
        async with self._own_lock(), _ainternal.get_connection(self.conn) as conn:
            async with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute(PG_MIGRATIONS_TABLE)
                await cur.execute("SELECT COALESCE(MAX(v), -1) FROM graph_durable_migrations")
                applied = (await cur.fetchone())[0]
                for version in range(applied + 1, len(PG_MIGRATIONS)):
                    for statement in statements(PG_MIGRATIONS[version]):
                        await cur.execute(statement)
                    await cur.execute("INSERT INTO graph_durable_migrations (v, applied_at) "
                                      "VALUES (%s, %s)", (version, time.time()))
                if applied + 1 < len(PG_MIGRATIONS):  # migrated: which releases run on it
                    await _run(cur, UPSERT_RUNS_FROM, (
                        runs_from_value(len(PG_MIGRATIONS) - 1, PG_RUNS_FROM),))
                await _run(cur, _sql.INSERT_DB_KEY_SECRET, self._db_secret_params())
                await cur.execute(_pg.ROW_FENCES)
                self._learn_row_fences((await cur.fetchone())[0])

    def _own_lock(self) -> Any:
        """The saver's lock on a single connection (one statement sequence at a time);
        nothing on a pool, where each transaction has a connection of its own."""
        return nullcontext() if isinstance(self.conn, AsyncConnectionPool) else self.lock

    def _write_connection(self, thread_id: str | None) -> Any:
        """The connection a write runs on (an async context manager): the saver's own,
        or one of its pool's (see `DurablePostgresSaver._write_connection`)."""
        if isinstance(self.conn, AsyncConnection):
            return nullcontext(self.conn)
        return _pg.aconnected(_ainternal.get_connection(self.conn), thread_id)

    @asynccontextmanager
    async def _txn(
        self, thread_id: str | None = None, config: RunnableConfig | None = None, *,
        writing: str | None = None, pipelined: bool = False, durable: bool = False,
    ) -> AsyncIterator[AsyncCursor[Any]]:
        """One write transaction; with `thread_id`, locked, fenced and flow-pinned first
        (see `DurablePostgresSaver._txn`). Yields a tuple-row cursor. `writing` names
        the thread written, for errors, when the caller fences it itself.

        `pipelined` sends the statements in pipeline mode: the results a decision needs
        are fetched as they are needed, the rest goes with the commit. `durable`: a
        ledger write, committed durably whatever the server's settings
        (`_pg.DURABLE_COMMIT`)."""
        writing = thread_id or writing
        await self.setup()
        async with self._own_lock(), self._write_connection(writing) as conn, \
                _read_committed(conn):
            with self._deferred_scope():
                try:
                    async with conn.pipeline() if pipelined else nullcontext(), \
                            conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
                        if durable:
                            await cur.execute(_pg.DURABLE_COMMIT)
                        if thread_id is not None:
                            await self._check_write_txn(cur, thread_id, config)
                        yield cur
                except BaseException as exc:
                    self._deferred_rolled_back()
                    self._write_failed(exc, conn, writing)
                else:
                    self._deferred_committed()

    @asynccontextmanager
    async def _one_trip(self, thread_id: str,
                        config: RunnableConfig | None, *, fenced_by_block: bool = False,
                        durable: bool = False, langgraph: bool = False, rows: bool = False
                        ) -> AsyncIterator[AsyncCursor[Any]]:
        """`DurablePostgresSaver._one_trip` on an async connection: the fence, the
        thread's deferred receipts and the block's statements in one pipeline, one
        transaction; results are read after the block. Raises
        `_pg.ImplicitNotReadCommitted` as it does. `langgraph`: the block gets
        LangGraph's cursor (binary, dict rows), the fence sent on it too; `rows`: as
        there."""
        await self.setup()
        async with self._own_lock(), self._write_connection(thread_id) as conn:
            with self._deferred_scope():
                carried: list[tuple[Any, AsyncCursor[Any]]] = []
                try:
                    carrying, opening, closing = self._one_trip_plan(
                        conn.autocommit, thread_id, config, fenced_by_block, durable, rows)
                    async with conn.pipeline(), (
                            conn.cursor(binary=True, row_factory=dict_row) if langgraph
                            else conn.cursor(row_factory=tuple_row)) as cur:
                        for statement in opening:
                            await cur.execute(*statement)
                        if not langgraph:  # before the block (see the sync twin)
                            await self._send_carried(conn, carrying, carried)
                        yield cur
                        if langgraph:
                            await self._send_carried(conn, carrying, carried)
                        if closing is not None:
                            await cur.execute(closing)
                    for writes, outcome in carried:
                        self._carried_outcome(writes, await outcome.fetchall())
                except BaseException as exc:
                    self._deferred_rolled_back()
                    if not conn.closed and not conn.broken \
                            and conn.pgconn.transaction_status != TransactionStatus.IDLE:
                        await conn.rollback()
                    if isinstance(exc, DatabaseError) and exc.sqlstate == _pg.FENCE_REFUSED:
                        await self._refused_by_fence(conn, thread_id, config)
                    self._write_failed(exc, conn, thread_id, one_trip=True)
                finally:
                    for _, outcome in carried:
                        await outcome.close()
                self._deferred_committed()

    @staticmethod
    def _unavailable(exc: BaseException, writing: str | None) -> DatabaseUnavailable:
        return _pg.broke_under_write(exc, writing, "An AsyncConnectionPool")

    @staticmethod
    async def _send_carried(conn: AsyncConnection[Any], carrying: list[tuple[Any, Any]],
                            carried: list[tuple[Any, AsyncCursor[Any]]]) -> None:
        """`DurablePostgresSaver._send_carried`, awaited."""
        for write, statement in carrying:
            carried.append((write, conn.cursor(row_factory=tuple_row)))
            await carried[-1][1].execute(*statement)

    async def _refused_by_fence(self, conn: AsyncConnection[Any], thread_id: str,
                                config: RunnableConfig | None) -> None:
        """Raise what the server's fence refused a write for (`check_fence`'s error)."""
        async with conn.cursor(row_factory=tuple_row) as cur:
            await cur.execute(_pg.SELECT_LEASE_WITH_CLOCK, (thread_id,))
            row, now = _pg.lease_and_clock(await cur.fetchone())
        token = actor_of(config)[1]
        check_fence(lease_from_row(thread_id, row), thread_id, token, self._saw_clock(now))
        raise LeaseLost(  # the lease changed again since: the fence refused the old one
            f"Write to thread {thread_id!r} with fencing token {token} was refused: the "
            "thread's lease was taken or ended meanwhile. Its write was rejected; stop this "
            "run.", thread_id=thread_id, token=token)

    def _has_deferred(self, thread_id: str) -> bool:
        with self._deferred_lock:
            return bool(self._deferred.get(thread_id))

    @asynccontextmanager
    async def _cursor(self, *, pipeline: bool = False) -> AsyncIterator[AsyncCursor[Any]]:
        """LangGraph's cursor (without a saver-wide lock on a pool); for the writes of
        `aput`/`aput_writes`, a fenced transaction's."""
        fenced = _FENCED_WRITE.get() if pipeline else None
        if fenced is None:
            async with self._own_lock(), _ainternal.get_connection(self.conn) as conn:
                async with conn.cursor(binary=True, row_factory=dict_row) as cur:
                    yield cur
            return
        thread_id, config, after, may_trip, rows = fenced
        if may_trip and self._one_trip_possible(thread_id):
            async with self._one_trip(thread_id, config, langgraph=True, rows=rows) as cur:
                yield cur
                for statement in after():
                    await _run(cur, *statement)
            return
        async with self._txn(thread_id, config, pipelined=True) as ledger_cur:
            async with ledger_cur.connection.cursor(binary=True, row_factory=dict_row) as cur:
                yield cur
            for statement in after():
                await _run(ledger_cur, *statement)

    async def _fenced(self, config: RunnableConfig, write: Callable[[], Awaitable[T]],
                      after: Callable[[], list[Any]] = list, *, one_trip: bool = True,
                      rows: bool = True) -> T:
        """Await `write()` (LangGraph's writes) in a fenced transaction, then `after()`'s
        statements; once more, begun explicitly, if it went without `BEGIN` in a
        transaction that was not READ COMMITTED (nothing of it was written).

        `one_trip=False` when `after()` must be asked once the thread's lock is held:
        a resume value's save asks whether a decision batch consumed it meanwhile (see
        `_resume_consumed`), and in one round trip it would ask before the lock.
        `rows=False`: see `DurablePostgresSaver._fenced`."""
        await self.setup()
        token = _FENCED_WRITE.set((str(config["configurable"]["thread_id"]), config, after,
                                   one_trip, rows))
        try:
            try:
                return await write()
            except _pg.ImplicitNotReadCommitted:
                return await write()
        finally:
            _FENCED_WRITE.reset(token)

    # -- checkpoints: LangGraph's behaviour, fenced -------------------------------------

    async def _abefore_list(self) -> None:
        await self.setup()

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Fetch a checkpoint tuple (see `AsyncPostgresSaver.aget_tuple`)."""
        await self.setup()
        return await super().aget_tuple(config)

    async def _aput_fenced(self, config: RunnableConfig, checkpoint: Checkpoint,
                           metadata: CheckpointMetadata, new_versions: ChannelVersions
                           ) -> RunnableConfig:
        return await self._fenced(config, lambda: AsyncPostgresSaver.aput(
            self, config, checkpoint, metadata, new_versions))

    async def _aput_writes_fenced(self, config: RunnableConfig,
                                  writes: Sequence[tuple[str, Any]], task_id: str,
                                  task_path: str) -> None:
        late, one_trip = self._late_resume_after(config, writes, task_id)
        await self._fenced(config, lambda: AsyncPostgresSaver.aput_writes(
            self, config, writes, task_id, task_path), late, one_trip=one_trip,
            rows=bool(writes))

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete the thread's checkpoints, blobs, writes, effects, events and flow pin."""
        self._forget_stored()
        async with self._txn() as cur:
            for statement in (*_pg.DELETE_THREAD_CHECKPOINTS, *_sql.DELETE_THREAD_LEDGER):
                await _run(cur, statement, (str(thread_id),))
        self._flow_checked.discard(str(thread_id))
        self._forget_deferred(str(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) created by these runs; keep the ledger."""
        self._forget_stored()
        async with self._txn() as cur:
            await cur.execute(_pg.SELECT_RUN_CHECKPOINTS, ([str(r) for r in run_ids],))
            for row in await cur.fetchall():
                await cur.execute(_pg.DELETE_CHECKPOINT, row)
                await cur.execute(_pg.DELETE_CHECKPOINT_WRITES, row)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy checkpoints, blobs, writes, effects and events of one thread to another;
        the copy's effects keep the keys of the thread it came from."""
        params = (str(target_thread_id), str(source_thread_id))
        async with self._txn() as cur:
            # The source's writes wait: the copy point is where it stands, copied.
            await cur.execute(_pg.LOCK_THREAD, (str(source_thread_id),))
            await cur.execute(_pg.MARK_FENCED, (str(target_thread_id),))  # not fenced
            await self._flush_deferred(cur, str(source_thread_id))
            for statement in _pg.COPY_THREAD_CHECKPOINTS:
                await cur.execute(statement, params)
            for statement in _sql.COPY_THREAD_LEDGER:
                await _run(cur, statement, params)
            await _run(cur, _sql.UPSERT_ORIGIN, self._origin_params(*reversed(params)))
            await _steps.aperformed(
                _steps.copy_point(params[1], params[0], _pg.SELECT_STEP_WRITES),
                lambda statement: _arows(cur, statement))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune checkpoints: `keep_latest` keeps the newest per namespace (LangGraph's
        rules) and the whole ledger; `delete` is `adelete_thread`."""
        if self._prune_deletes(thread_ids, strategy):
            for thread_id in thread_ids:
                await self.adelete_thread(thread_id)
            return
        await self.setup()
        for thread_id in thread_ids:  # the writes the steps after a copy point come from
            await self._arun_statements(_steps.anchors_before_prune(
                str(thread_id), _pg.SELECT_STEP_WRITES, _pg.SELECT_COPY_POINT_STEPS))
        await super().aprune(thread_ids, strategy=strategy)

    # -- fencing and ledger writes inside a transaction --------------------------------

    async def _check_write_txn(
        self, cur: AsyncCursor[Any], thread_id: str, config: RunnableConfig | None
    ) -> None:
        """Lock the thread, fence, pin, and commit its deferred receipts with this write."""
        await cur.execute(_pg.LOCK_THREAD_READ_LEASE, (thread_id,))
        row, now = _pg.lease_and_clock(await cur.fetchone())
        check_fence(lease_from_row(thread_id, row), thread_id, actor_of(config)[1], self._saw_clock(now))
        if self._needs_flow_check(thread_id):
            pinned = await (await _run(cur, _sql.SELECT_FLOW_VERSION, (thread_id,))).fetchone()
            for sql, params in self._flow_statements(pinned, thread_id):
                await _run(cur, sql, params)
        await self._flush_deferred(cur, thread_id)

    async def _flush_deferred(self, cur: AsyncCursor[Any], thread_id: str) -> None:
        """`DurablePostgresSaver._flush_deferred`, awaited."""
        if thread_id not in self._deferred:
            return
        with self._carrying():
            for write, write_config in self._take_deferred(thread_id):
                try:
                    await self._apply_one_txn(cur, write, actor_of(write_config))
                except IllegalTransition as refused:
                    self._refused_deferred(write, refused)

    async def _apply_one_txn(
        self, cur: AsyncCursor[Any], one: IntentWrite | TransitionWrite,
        actor: tuple[str | None, int | None],
    ) -> EffectRecord:
        async def recorded() -> EffectRecord:
            await _run(cur, _sql.SELECT_EFFECT, (one.thread_id, one.key))
            return self._record(await cur.fetchone())

        if isinstance(one, IntentWrite):
            (inherit, inherited), (insert, *after), record = self._plan_intent(one, actor)
            await _run(cur, *_pg.lock_keys([one.key]))
            if await _pg.arun_counted(cur, *inherit) == 1:
                await _run(cur, *inherited)
                raise IntentExists(await recorded())
            if await _pg.arun_counted(cur, *insert) == 0:
                # The key is already known: the intent stands, report what is recorded.
                raise IntentExists(await recorded())
            for statement in after:
                await _run(cur, *statement)
            return record
        now = time.time()
        rows = await (await _run(cur, *self._plan_update(one, now))).fetchall()
        if not rows:
            await _run(cur, _sql.SELECT_EFFECT, (one.thread_id, one.key))
            raise _sql.refusal(await cur.fetchone(), thread_id=one.thread_id, key=one.key,
                               to=one.to)
        record = self._record(rows[0])
        await _run(cur, *self._transition_event(record, one, now, actor))
        return record

    async def arecord_task_run(self, thread_id: str, run_id: str, checkpoint_ns: str,
                               node: str, kind: str) -> None:
        """Log that a node (or a model call in it) started, for `graph_durable.operators.audit`."""
        async with self._txn() as cur:
            await _run(cur, _sql.INSERT_TASK_RUN,
                       (str(thread_id), run_id, checkpoint_ns, node, kind, time.time()))

    async def _arun_statements(self, statements: Any) -> Any:
        async with self._txn() as cur:
            return await _steps.aperformed(statements, lambda statement: _arows(cur, statement))

    # -- the ledger ----------------------------------------------------------------------

    async def _aquery(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Every row of one read (the reads are in `AsyncLedgerReads`); a read whose
        pooled connection broke is tried once more on a fresh one."""
        await self.setup()
        try:
            return await self._read_rows(sql, params)
        except OperationalError as exc:
            if not isinstance(self.conn, AsyncConnectionPool):
                raise DatabaseUnavailable(
                    f"The connection to PostgreSQL broke under a read ({type(exc).__name__}: "
                    f"{' '.join(str(exc).split())}); reconnect the saver, then try again.") from exc
        try:
            return await self._read_rows(sql, params)  # the pool has dropped the broken one
        except OperationalError as exc:  # PoolTimeout too: no connection works
            raise _pg.unanswered_read(exc) from exc

    async def adurability(self) -> DurabilityReport:
        """`DurablePostgresSaver.durability`, read on this saver's connection."""
        [settings] = await self._read_rows(POSTGRES_SETTINGS, ())
        return postgres_report(settings, await self._read_rows(POSTGRES_STANDBYS, ()))

    async def _read_rows(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        async with self._own_lock(), _ainternal.get_connection(self.conn) as conn:
            async with conn.cursor(row_factory=tuple_row) as cur:
                await _run(cur, sql, params)
                return await cur.fetchall()

