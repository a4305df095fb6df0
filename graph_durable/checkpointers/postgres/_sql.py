"""What the sync and async PostgreSQL savers share: statements in PostgreSQL's dialect.

The ledger's own statements (`_sql`) are written for SQLite; `pg_sql` turns each into
PostgreSQL's. The statements below are PostgreSQL's only: the thread's advisory lock,
leases on the server's clock, the setup lock, and LangGraph's PostgreSQL tables as the
retention methods touch them.

`TransactionDeferred` is the half of their transactions that does no I/O: whose deferred
receipts a transaction took, what a one-round-trip write sends besides its block, and
what a failed write raises.

This module is over 400 lines: every PostgreSQL-only statement is here once, for the
sync and the async saver, beside the transaction logic both run them in.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    AsyncExitStack,
    ExitStack,
    asynccontextmanager,
    contextmanager,
)
from contextvars import ContextVar
from typing import Any, NoReturn

from langchain_core.runnables import RunnableConfig

from graph_durable.checkpointers import _sql
from graph_durable.checkpointers._base import KeyingChanged, actor_of
from graph_durable.checkpointers.postgres._arrays import Texts
from graph_durable.checkpointers.postgres._storage import storage_fault
from graph_durable.errors import DatabaseUnavailable, ReadOnlyDatabase
from graph_durable.ledger import EffectRecord, EffectStatus, IntentWrite, Keying, TransitionWrite

__all__ = [
    "LANGGRAPH_APPLIED",
    "SCHEMA_TABLES",
    "ImplicitNotReadCommitted",
    "PostgresReadOnly",
    "TransactionDeferred",
    "arun",
    "arun_counted",
    "broke_under_write",
    "carried_transition",
    "claim_call",
    "DURABLE_COMMIT",
    "lease_and_clock",
    "lock_keys",
    "pg_sql",
    "raise_refused",
    "read_only_refused",
    "unanswered_read",
]

DURABLE_COMMIT = (
    "SELECT set_config('synchronous_commit', 'on', true) "
    "WHERE current_setting('synchronous_commit') IN ('off', 'local', 'remote_write')"
)
"""Make this transaction's commit wait until it is flushed (and, with synchronous standbys,
until they have flushed it), whatever the server, role, database or session set: the
first statement of every ledger write. An intent lost by a crash would let the guard
send its effect again, so `synchronous_commit` is raised to at least `on` for this
transaction alone (`remote_apply` stays); on a server already at `on` the `WHERE`
leaves it alone. Checkpoint writes keep what LangGraph and the application chose: a
later durable commit flushes the log up to it, so nothing committed before an intent
is lost with it. See `graph_durable.durability`."""
LOCK_THREAD = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
"""Serializes the writes of one thread across connections until the transaction ends."""
LOCK_THREAD_READ_LEASE = (
    "SELECT owner, token, expires_at, now_at FROM graph_durable_lock_thread_at(%s)"
)
"""`LOCK_THREAD`, then the thread's lease row (NULLs when it has none) and the server's
clock, read after the lock is granted (see the PostgreSQL migrations): one round trip."""
NOW = "SELECT extract(epoch FROM clock_timestamp())::DOUBLE PRECISION"
TRY_LOCK_THREAD = "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))"
RENEW_LEASE_AT = (
    "UPDATE thread_leases SET expires_at = extract(epoch FROM clock_timestamp()) + %s "
    "WHERE thread_id = %s AND token = %s AND expires_at > extract(epoch FROM clock_timestamp()) "
    "RETURNING expires_at"
)
SELECT_LIVE_LEASES_AT = (
    "SELECT thread_id, owner, token, expires_at FROM thread_leases "
    "WHERE expires_at > extract(epoch FROM clock_timestamp())"
)
SELECT_LIVE_LEASES_WITH_CLOCK = (
    "SELECT l.thread_id, l.owner, l.token, l.expires_at, n.now_at FROM (SELECT "
    "extract(epoch FROM clock_timestamp())::DOUBLE PRECISION AS now_at) n "
    "LEFT JOIN thread_leases l ON l.expires_at > n.now_at"
)
"""`SELECT_LIVE_LEASES_AT` plus the server's clock on every row (one row of NULLs and
the clock when no lease is live)."""
BEGIN_READ_COMMITTED = "BEGIN ISOLATION LEVEL READ COMMITTED"
FENCE = "SELECT graph_durable_fence(%s, %s)"
"""`LOCK_THREAD`, then the fence checked on the server: raises `FENCE_REFUSED` if the
write must not commit (PostgreSQL migration 7)."""
FENCE_REFUSED = "GD001"
ROW_FENCES = (
    "SELECT count(*) FROM pg_trigger WHERE tgname = 'graph_durable_fence' "
    "AND tgenabled IN ('O', 'A') AND tgrelid IN (to_regclass('checkpoints'), "
    "to_regclass('checkpoint_blobs'), to_regclass('checkpoint_writes')) "
    "AND current_setting('session_replication_role') = 'origin'"
)
"""How many of LangGraph's tables fence the rows written to them (PostgreSQL migration
15's trigger, enabled, in a session where triggers fire): three, or a checkpoint write
sends its fence itself."""
MARK_FENCED = "SELECT set_config('graph_durable.fenced', 'f:' || %s, true)"
"""Let this transaction write the thread's rows into LangGraph's tables without their
trigger fencing it (a copy into a thread, which is not fenced: see `copy_thread`)."""
KEY_LOCKS = 1735680001
"""The class id (first half) of the advisory locks on effect keys: a space of their own,
apart from the threads' one-number locks. The claim functions of PostgreSQL migrations 8
and 10 take the same locks on the server."""
LOCK_KEYS = (
    "SELECT pg_advisory_xact_lock(%s, hashtext(k)) "
    "FROM (SELECT DISTINCT unnest(%s::text[]) AS k ORDER BY k) AS keys"
)
"""Lock effect keys until the transaction ends, in one order (see `lock_keys`)."""
FENCE_READ_COMMITTED = "SELECT graph_durable_fence_read_committed(%s, %s)"
"""`FENCE` for a write sent without `BEGIN` (its statements up to the pipeline's sync are
one implicit transaction): refuses with `NOT_READ_COMMITTED` first unless that
transaction is READ COMMITTED (PostgreSQL migration 9)."""
NOT_READ_COMMITTED = "GD002"
KEYED_AS = "SELECT graph_durable_keyed_as(%s, %s)"
"""Check, after a step's claim made with a predicted keying, that its thread is keyed so:
raises `KEYING_CHANGED` otherwise, which aborts the claim (PostgreSQL migration 14)."""
KEYING_CHANGED = "GD003"
FENCED_CLAIM = "SELECT * FROM graph_durable_fenced_claim(" + ", ".join(["%s"] * 13) + ")"
"""Claim a step's intents in one statement that first fences its transaction, as
`FENCE_READ_COMMITTED` does (PostgreSQL migration 10; migration 8's `graph_durable_claim`,
which does not fence, stays for workers of the release before). One row per intent, in
order: `(claimed, *EFFECT_COLUMNS)`, the columns NULL for an intent it inserted; see
`claim_call`."""
CLAIM_STEP = (
    "SELECT * FROM graph_durable_claim_step(%s, %b::text[], %b::text[], %b::text[], "
    "%b::text[], %b::text[], %b::text[], %b::integer[], %b::text[], %b::text[], "
    "%b::double precision[], %s, %s, %s)"
)
"""`FENCED_CLAIM`, its commit made durable first (`DURABLE_COMMIT`) and its predicted
keying checked after (`KEYED_AS`, when the last parameter is not NULL), in one statement
(PostgreSQL migration 16). Its arrays are sent in binary (`%b`), as those of
`carried_transitions` are: psycopg's text format quotes a JSON value's every `"` by a
regular expression, some ten microseconds a value, where binary copies its bytes (its
lists of text as `Texts`, dumped in one pass)."""
SELECT_LEASE_WITH_CLOCK = (
    "SELECT l.owner, l.token, l.expires_at, n.now_at FROM (SELECT "
    "extract(epoch FROM clock_timestamp())::DOUBLE PRECISION AS now_at) n "
    "LEFT JOIN thread_leases l ON l.thread_id = %s"
)
"""The thread's lease row (NULLs if none) and the server's clock, without the lock: to
say why `FENCE` refused a write."""
TRY_LOCK_SETUP = "SELECT pg_try_advisory_lock(hashtextextended('graph_durable_setup', 0))"
UNLOCK_SETUP = "SELECT pg_advisory_unlock(hashtextextended('graph_durable_setup', 0))"

DELETE_THREAD_CHECKPOINTS = (
    "DELETE FROM checkpoints WHERE thread_id = %s",
    "DELETE FROM checkpoint_blobs WHERE thread_id = %s",
    "DELETE FROM checkpoint_writes WHERE thread_id = %s",
)
COPY_THREAD_CHECKPOINTS = (
    "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, "
    "type, checkpoint, metadata) SELECT %s, checkpoint_ns, checkpoint_id, "
    "parent_checkpoint_id, type, checkpoint, metadata FROM checkpoints WHERE thread_id = %s "
    "ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET "
    "parent_checkpoint_id = EXCLUDED.parent_checkpoint_id, type = EXCLUDED.type, "
    "checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata",
    "INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob) "
    "SELECT %s, checkpoint_ns, channel, version, type, blob FROM checkpoint_blobs "
    "WHERE thread_id = %s ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING",
    "INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, "
    "task_path, idx, channel, type, blob) SELECT %s, checkpoint_ns, checkpoint_id, task_id, "
    "task_path, idx, channel, type, blob FROM checkpoint_writes WHERE thread_id = %s "
    "ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET "
    "channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob",
)
SELECT_RUN_CHECKPOINTS = (
    "SELECT thread_id, checkpoint_ns, checkpoint_id FROM checkpoints "
    "WHERE metadata->>'run_id' = ANY(%s)"
)
DELETE_CHECKPOINT = (
    "DELETE FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s"
)
DELETE_CHECKPOINT_WRITES = (
    "DELETE FROM checkpoint_writes WHERE thread_id = %s AND checkpoint_ns = %s "
    "AND checkpoint_id = %s"
)
DELETE_NULL_RESUME = _sql.DELETE_NULL_RESUME.replace("FROM writes", "FROM checkpoint_writes")
SELECT_CALLED_TASKS = _sql.SELECT_CALLED_TASKS.replace("FROM writes", "FROM checkpoint_writes")
SELECT_STEP_WRITES = _sql.SELECT_STEP_WRITES.replace(
    "value FROM writes", "blob FROM checkpoint_writes")
SELECT_COPY_POINT_STEPS = _sql.SELECT_COPY_POINT_STEPS.replace(
    "json_extract(CAST(c.metadata AS TEXT), '$.source')", "c.metadata->>'source'")


@functools.lru_cache(maxsize=256)
def pg_sql(sql: str) -> str:
    """A ledger statement written for SQLite, in PostgreSQL's dialect.

    The ledger's statements use `?` placeholders and `INSERT OR IGNORE`; psycopg wants
    `%s` (and a literal `%`, as in a `LIKE` pattern, doubled), and PostgreSQL
    `ON CONFLICT DO NOTHING`.
    """
    out = re.sub(r"%(?!s)", "%%", sql).replace("?", "%s")
    if out.startswith("INSERT OR IGNORE INTO"):
        out = "INSERT INTO" + out[len("INSERT OR IGNORE INTO"):] + " ON CONFLICT DO NOTHING"
    return out


def lock_keys(keys: Sequence[str]) -> _sql.Statement:
    """`LOCK_KEYS` for the keys a claim is about to look up and insert.

    A key embeds its key thread, so the same key in another thread (a copy, a fork) is
    the same requested call, and a claim takes it over from there (`_sql.plan_inherit`).
    Each claim holds only its own thread's lock, so two threads of one family claiming a
    key at once could each look for the other's row before either committed, find none,
    and both insert it: the call sent twice. Locking the key first makes the second
    claim wait for the first to commit; its statements then see the first's row (each
    statement of a READ COMMITTED transaction reads what was committed when it began).
    Keys are locked in sorted order, so two claims of several keys cannot deadlock.
    """
    return LOCK_KEYS, (KEY_LOCKS, sorted(set(keys)))


def claim_call(
    thread_id: str, planned: Sequence[tuple[list[_sql.Statement], EffectRecord]],
    actor: tuple[str | None, int | None], keyed_as: Keying | None = None,
) -> _sql.Statement:
    """`CLAIM_STEP` for intents planned by `_plan_intent` (their inherit statements left
    out: the function applies the same rules), checked against the predicted keying
    `keyed_as` if any (`predicted_of`). Each plan is the intent's insert, its journal
    entry and maybe its key-scheme pin, in `_sql.plan_intent`'s order."""
    columns: list[list[Any]] = [[] if index in (6, 9) else Texts()  # attempts, times
                                for index in range(10)]
    for plan, _record in planned:
        insert, event, *pin = plan
        _, key, ns, tool_call_id, tool, args, status, attempts, now, _ = insert[1]
        scheme = pin[0][1][2] if pin else None
        for column, value in zip(columns, (key, ns, tool_call_id, tool, args, status, attempts,
                                           event[1][3], scheme, now), strict=True):
            column.append(value)
    return CLAIM_STEP, (thread_id, *columns, *actor,
                        None if keyed_as is None else keyed_as.pin)


def carried_transition(update: _sql.Statement, event: _sql.Statement) -> _sql.Statement:
    """A transition and its journal entry in one statement, the entry written only if
    the transition was allowed. For a deferred receipt sent in a fenced write's pipeline,
    whose outcome is read after the commit: a refused one writes nothing, as
    `_apply_one_txn` refusing before it writes. Returns one row: how many effects it
    changed (0 or 1), then the effect as it was before (`EFFECT_COLUMNS`, NULLs if there
    is none), which says why a refused one was refused."""
    update_sql, update_params = update
    _, (key, thread_id, *entry) = event
    return _carried_sql(update_sql), (*update_params, *entry, thread_id, key)


_EFFECT_BEFORE = ", ".join(f"e.{column.strip()}" for column in _sql.EFFECT_COLUMNS.split(","))
_COLUMN_TYPES = {"result": "bytea", "asked": "integer"}
"""The type of each column a transition may set that is not `text` (see
`DurableSaverMixin._transition_columns`)."""


def carried_transitions(
    thread_id: str, to: EffectStatus, now: float, columns: Sequence[str],
    rows: Sequence[tuple[str, Sequence[Any], str]], kind: str,
    actor: tuple[str | None, int | None],
) -> _sql.Statement:
    """`carried_transition` for several transitions of one thread, in one statement:
    each moves its effect (`key`) to `to` setting `columns` (the same ones, each with
    its own values) if its status allows it, and writes its journal entry (`kind`,
    its own `data`) only then; the entries in the order of `rows` (`(key, values,
    data)`, each key once). One row back per transition, in that order, as
    `carried_transition`'s."""
    arrays: list[list[Any]] = [Texts(key for key, _, _ in rows)]
    arrays += [(list if column in _COLUMN_TYPES else Texts)(values[index] for _, values, _ in rows)
               for index, column in enumerate(columns)]
    arrays.append(Texts(data for _, _, data in rows))
    return _carried_many_sql(to, tuple(columns)), (
        *arrays, to._value_, now, thread_id, *_sql.update_sources(to), thread_id, kind, now,
        *actor, thread_id)


@functools.lru_cache(maxsize=64)
def _carried_many_sql(to: EffectStatus, columns: tuple[str, ...]) -> str:
    """`carried_transitions`' statement (one per status and set of columns)."""
    names = ", ".join(("key", *(f"c{index}" for index in range(len(columns))), "data"))
    casts = ", ".join(f"%b::{_COLUMN_TYPES.get(column, 'text')}[]"
                      for column in ("key", *columns, "data"))
    sets = "".join(f", {column} = i.c{index}" for index, column in enumerate(columns))
    sources = ", ".join("%s" for _ in _sql.update_sources(to))
    return (
        f"WITH input AS (SELECT * FROM unnest({casts}) WITH ORDINALITY AS i({names}, n)), "
        f"changed AS (UPDATE effects e SET status = %s, updated_at = %s{sets} FROM input i "
        f"WHERE e.thread_id = %s AND e.key = i.key AND e.status IN ({sources}) "
        "RETURNING e.key), journal AS (INSERT INTO effect_events (key, thread_id, kind, "
        "data, at, owner, fencing_token) SELECT i.key, %s, %s, i.data, %s, %s, %s "
        "FROM input i JOIN changed c ON c.key = i.key ORDER BY i.n) "
        f"SELECT (c.key IS NOT NULL)::int, {_EFFECT_BEFORE} FROM input i "
        "LEFT JOIN changed c ON c.key = i.key "
        "LEFT JOIN effects e ON e.thread_id = %s AND e.key = i.key ORDER BY i.n"
    )


@functools.lru_cache(maxsize=64)
def _carried_sql(update_sql: str) -> str:
    """`carried_transition`'s statement around an update (one per set of columns)."""
    return (
        f"WITH changed AS ({pg_sql(update_sql)}), journal AS (INSERT INTO effect_events "
        "(key, thread_id, kind, data, at, owner, fencing_token) SELECT key, thread_id, "
        "%s, %s, %s, %s, %s FROM changed) SELECT (SELECT count(*) FROM changed), "
        f"{_EFFECT_BEFORE} FROM (SELECT 1) AS one LEFT JOIN effects e ON e.thread_id = %s "
        "AND e.key = %s"
    )


# What `setup()` reads before deciding it has anything to do (see `_schema.is_current`).
SCHEMA_TABLES = ("SELECT table_name FROM information_schema.tables "
                 "WHERE table_schema = current_schema()")
LANGGRAPH_APPLIED = "SELECT COALESCE(MAX(v), -1) FROM checkpoint_migrations"


def _read_only_base() -> type[Exception]:
    from psycopg.errors import ReadOnlySqlTransaction

    return ReadOnlySqlTransaction


class PostgresReadOnly(ReadOnlyDatabase, _read_only_base()):  # type: ignore[misc]
    """`ReadOnlyDatabase` on PostgreSQL; still a `psycopg.errors.ReadOnlySqlTransaction`,
    as the stock saver's error is, so code written against it catches ours too."""


SETUP_NEEDS = ("Creating or migrating the checkpoint and ledger tables (setup(), on "
               "first use)")


def read_only_refused(exc: BaseException, thread_id: str | None,
                      what: str = "This write (a checkpoint, a ledger entry, a lease or "
                                  "a deletion)") -> PostgresReadOnly | None:
    """The error for a write PostgreSQL refused as read-only (a read-only transaction,
    a hot standby), or None when `exc` is something else."""
    if isinstance(exc, _read_only_base()) and not isinstance(exc, ReadOnlyDatabase):
        return PostgresReadOnly.refused(what, exc, thread_id=thread_id)
    return None


def predicted_of(intents: Sequence[IntentWrite]) -> Keying | None:
    """The predicted keying a step's claim checks (`IntentWrite.keying`), if any: one for
    all the intents that carry one. The server checks the thread's origin, legacy flag
    and pinned scheme against it (`KEYED_AS`), which says as much as SQLite's comparison
    only for a prediction (`predicted_keying`: the thread's own id, not legacy, a scheme
    to pin), never for a keying that was read."""
    keyings = {intent.keying for intent in intents if intent.keying is not None}
    if len(keyings) > 1:
        raise ValueError("intents claimed together carry different predicted keyings")
    keying = next(iter(keyings), None)
    if keying is not None and (keying.pin is None or keying.legacy
                               or keying.key_thread != intents[0].thread_id):
        raise ValueError(f"IntentWrite.keying is a predicted keying, not {keying!r}")
    return keying


def raise_refused(exc: BaseException, thread_id: str | None,
                  what: str = "This write (a checkpoint, a ledger entry, a lease or "
                              "a deletion)") -> NoReturn:
    """Raise, from the `except` block handling `exc`, the `PostgresReadOnly` error it
    means (`read_only_refused`), the storage fault (`_storage.storage_fault`: a full
    disk, an I/O error), or `exc` itself."""
    refused = read_only_refused(exc, thread_id, what) or storage_fault(exc, thread_id)
    if refused is not None:
        raise refused from exc
    raise exc


def broke_under_write(exc: BaseException, thread_id: str | None,
                      pool: str) -> DatabaseUnavailable:
    """The error for a write whose connection broke; `pool` names the pool class that
    would replace the connection ("A ConnectionPool")."""
    return DatabaseUnavailable(
        f"The connection to PostgreSQL broke under a write"
        f"{f' to thread {thread_id!r}' if thread_id else ''} "
        f"({type(exc).__name__}: {' '.join(str(exc).split())}). It was not committed, "
        "unless the break hit its COMMIT; nothing is lost: run the thread again "
        f"(resume it, or recover()) and its ledger reconciles it. {pool} replaces the "
        "broken connection.",
        thread_id=thread_id)


def no_connection(exc: BaseException, thread_id: str | None) -> DatabaseUnavailable:
    """The error for a write that got no connection: its pool found none that works
    within its timeout (the server is down, or every connection is busy)."""
    return DatabaseUnavailable(
        f"No connection to PostgreSQL for a write"
        f"{f' to thread {thread_id!r}' if thread_id else ''}: the pool found none that "
        f"works within its timeout ({type(exc).__name__}: {' '.join(str(exc).split())}). "
        "Nothing was written; once the server answers again (or the pool has a free "
        "connection), run the thread again (resume it, or recover()) and its ledger "
        "reconciles it.",
        thread_id=thread_id)


@contextmanager
def connected(held: AbstractContextManager[Any], thread_id: str | None) -> Iterator[Any]:
    """Enter `held` (`_internal.get_connection(...)`) for a write: a pool that finds no
    connection within its timeout raises `no_connection`'s error, not `PoolTimeout`."""
    from psycopg_pool import PoolTimeout

    with ExitStack() as stack:
        try:
            conn = stack.enter_context(held)
        except PoolTimeout as exc:
            raise no_connection(exc, thread_id) from exc
        yield conn


@asynccontextmanager
async def aconnected(held: AbstractAsyncContextManager[Any],
                     thread_id: str | None) -> AsyncIterator[Any]:
    """`connected` for `_ainternal.get_connection(...)`."""
    from psycopg_pool import PoolTimeout

    async with AsyncExitStack() as stack:
        try:
            conn = await stack.enter_async_context(held)
        except PoolTimeout as exc:
            raise no_connection(exc, thread_id) from exc
        yield conn


def unanswered_read(exc: BaseException) -> DatabaseUnavailable:
    """The error for a read tried again on a fresh pooled connection that failed too (the
    server is down: the pool found no connection within its timeout)."""
    return DatabaseUnavailable(
        "PostgreSQL does not answer: a read's connection broke, and the pool found no "
        f"working connection to try it again ({type(exc).__name__}: "
        f"{' '.join(str(exc).split())}). Nothing was written; once the server answers "
        "again, run the thread again (resume it, or recover()).")


def lease_and_clock(row: Sequence[Any]) -> tuple[tuple[str, int, float] | None, float]:
    """`(lease row or None, server clock)` from a `LOCK_THREAD_READ_LEASE` row."""
    owner, token, expires_at, now = row
    return (None if owner is None else (owner, token, expires_at)), float(now)




def run(cur: Any, sql: str, params: Sequence[Any] = ()) -> Any:
    """Run one ledger statement (SQLite's dialect) on a psycopg cursor."""
    return cur.execute(pg_sql(sql), tuple(params))


async def arun(cur: Any, sql: str, params: Sequence[Any] = ()) -> Any:
    """Run a ledger statement (written for SQLite) on an async psycopg cursor."""
    return await cur.execute(pg_sql(sql), tuple(params))


async def arun_counted(cur: Any, sql: str, params: Sequence[Any] = ()) -> int:
    """`arun` for an `INSERT`, `UPDATE` or `DELETE` (without `RETURNING`): how many rows
    it changed, read from rows it returns (in pipeline mode a row count is known only
    after a sync; returned rows are fetched at once)."""
    await cur.execute(pg_sql(sql) + " RETURNING 1", tuple(params))
    return len(await cur.fetchall())


class ImplicitNotReadCommitted(Exception):
    """A fenced write sent without `BEGIN` ran in a transaction that is not READ
    COMMITTED (the server's or the session's default isolation is another), and the
    fence refused it before anything was written. The saver begins its writes
    explicitly from then on; the caller sends the write again (`_fenced`)."""


_TAKEN: ContextVar[list[Any] | None] = ContextVar("graph_durable_pg_deferred_taken",
                                                   default=None)


class _DeferredScope:
    """A transaction's own list of the deferred receipts it took (`_TAKEN`) while the
    block runs: a class, not a `contextmanager` generator, as every write enters one."""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _TAKEN.set([])

    def __exit__(self, *exc: object) -> None:
        _TAKEN.reset(self._token)


class TransactionDeferred:
    """Mixin: the deferred receipts a transaction takes are its own, not the saver's.

    On a pool several transactions of one saver run at once, and two of one thread may
    commit in another order than they began: each carries every receipt still
    deferred, and a receipt stops being deferred only when a transaction carrying it
    commits (`DurableSaverMixin._drop_deferred`). With one list for the saver, one
    committing would drop what another carries. Each transaction runs in
    `_deferred_scope()`, which holds its own list (per thread, per asyncio task).
    Put it before `DurableSaverMixin` in the bases.
    """

    def _late_resume_after(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                           task_id: str) -> tuple[Any, bool]:
        """For `put_writes`: the statements to run after LangGraph's (deleting resume
        values a decision batch consumed before they landed), asked once the thread is
        locked, and whether the write may go in one round trip (not when it carries a
        resume value: then the question must wait for the lock)."""

        def late() -> list[Any]:
            return [(DELETE_NULL_RESUME, params)
                    for _, params in self._late_resume(  # type: ignore[attr-defined]
                        config, writes, task_id)]

        carries_resume = task_id == _sql.NULL_TASK_ID and any(
            channel == _sql.RESUME_CHANNEL for channel, _ in writes)
        return late, not carries_resume

    def _deferred_scope(self) -> _DeferredScope:
        return _DeferredScope()

    def _taken(self) -> list[Any]:
        mine = _TAKEN.get()
        assert mine is not None, "deferred receipts are carried inside a transaction"
        return mine

    _begin_explicitly = False
    """Set once a write sent without `BEGIN` found its transaction not READ COMMITTED."""

    _rows_fenced = False
    """Whether LangGraph's tables fence the rows written to them (`ROW_FENCES`), as
    `setup()` found them."""

    def _learn_row_fences(self, count: int) -> None:
        self._rows_fenced = count == 3

    def _one_trip_plan(
        self, autocommit: bool, thread_id: str, config: RunnableConfig | None,
        fenced_by_block: bool, durable: bool = False, rows: bool = False,
    ) -> tuple[list[tuple[list[TransitionWrite], _sql.Statement]], list[_sql.Statement],
               str | None]:
        """What a one-round-trip write sends besides its block: the deferred receipts it
        carries (`_carry_deferred`), then how it opens and closes (`_fence_statements`;
        a block that fences itself is fenced anyway when receipts go before it).
        `durable`: a ledger write, committed durably whatever the server's settings
        (`DURABLE_COMMIT`, in the same round trip). `rows`: the block writes a row of
        the thread into LangGraph's tables before anything else, whose trigger fences
        the transaction (migration 15) for a writer without a fencing token; the
        receipts then go after the block (`_one_trip`), fenced by it too."""
        rows_fence = rows and self._rows_fenced and actor_of(config)[1] is None
        carrying = self._carry_deferred(thread_id)
        opening, closing = self._fence_statements(
            autocommit, thread_id, config,
            fenced_by_block=rows_fence or (fenced_by_block and not carrying))
        if durable:
            opening.append((DURABLE_COMMIT, ()))
        return carrying, opening, closing

    def _fence_statements(
        self, autocommit: bool, thread_id: str, config: RunnableConfig | None, *,
        fenced_by_block: bool = False,
    ) -> tuple[list[_sql.Statement], str | None]:
        """How a one-round-trip write opens (its fence) and what closes it.

        On an autocommit connection the fence is the first statement: up to the
        pipeline's sync the statements are one implicit transaction, which the fence
        checks is READ COMMITTED (`FENCE_READ_COMMITTED`). Otherwise, and once that check
        refused, `BEGIN ISOLATION LEVEL READ COMMITTED`, `FENCE` and, last, `COMMIT`.
        `fenced_by_block`: the block's first statement fences the transaction itself
        (`CLAIM_STEP`, LangGraph's rows), so no fence is sent before it."""
        fence = (thread_id, actor_of(config)[1])
        implicit = autocommit and not self._begin_explicitly
        opening: list[_sql.Statement] = [] if implicit else [(BEGIN_READ_COMMITTED, ())]
        if not fenced_by_block:
            opening.append((FENCE_READ_COMMITTED, fence) if implicit else (FENCE, fence))
        return opening, None if implicit else "COMMIT"

    def _write_failed(self, exc: BaseException, conn: Any, thread_id: str | None, *,
                      one_trip: bool = False) -> NoReturn:
        """Raise, from the `except` block of a failed write transaction, what its
        failure means: `ImplicitNotReadCommitted` (a one-trip write to send again),
        `StorageFull` (the server's disk is full), `DatabaseUnavailable` (its storage
        failed, or its connection broke), `PostgresReadOnly`, or `exc`."""
        from psycopg import OperationalError

        if getattr(exc, "sqlstate", None) == KEYING_CHANGED:
            raise KeyingChanged(str(thread_id)) from exc
        if one_trip and self._not_read_committed(exc):
            raise ImplicitNotReadCommitted(str(exc)) from exc
        fault = storage_fault(exc, thread_id)  # a full disk may also break the connection
        if fault is not None:
            raise fault from exc
        if isinstance(exc, OperationalError):
            if conn.broken:
                raise self._unavailable(exc, thread_id) from exc  # type: ignore[attr-defined]
            if not one_trip:
                raise
        raise_refused(exc, thread_id)

    def _not_read_committed(self, exc: BaseException) -> bool:
        """Whether `exc` is the fence refusing an implicit transaction that is not READ
        COMMITTED; if so, the saver's writes begin explicitly from now on."""
        refused = getattr(exc, "sqlstate", None) == NOT_READ_COMMITTED
        if refused:
            self._begin_explicitly = True
        return refused

    def _one_trip_possible(self, thread_id: str) -> bool:
        """Whether a fenced write of the thread may go in one round trip: its flow pin is
        known, and each deferred receipt it would carry is one `carried_transition`."""
        if self._needs_flow_check(thread_id):  # type: ignore[attr-defined]
            return False
        if thread_id not in self._deferred:  # type: ignore[attr-defined]
            return True  # nothing deferred: nothing to ask under the lock
        with self._deferred_lock:  # type: ignore[attr-defined]
            return not any(write.bump_attempts
                           for write, _ in self._deferred.get(thread_id, ()))  # type: ignore[attr-defined]

    def _carry_deferred(self, thread_id: str
                        ) -> list[tuple[list[TransitionWrite], _sql.Statement]]:
        """The thread's deferred receipts a one-round-trip write carries (they stay
        deferred until it commits), as statements: neighbours alike in one
        `carried_transitions`, any other in its own `carried_transition`; each with the
        receipts whose rows it returns. One whose journal entry needs the updated row (a
        new attempt's number) is left to a later write: only one arriving meanwhile,
        since `_one_trip_possible` said none was there."""
        if thread_id not in self._deferred:  # type: ignore[attr-defined]
            return []  # nothing deferred (one deferred meanwhile rides on the next write)
        taken = self._take_deferred(  # type: ignore[attr-defined]
            thread_id, lambda write: not write.bump_attempts)
        now = time.time()
        receipts = self._receipt_texts([write for write, _ in taken])  # type: ignore[attr-defined]
        # Neighbours that set the same columns alike (a step's receipts) go together.
        runs: list[tuple[Any, list[tuple[TransitionWrite, dict[str, Any], Any]]]] = []
        for (write, config), receipt in zip(taken, receipts, strict=True):
            columns = self._transition_columns(write, receipt)  # type: ignore[attr-defined]
            # The journal entry needs only what the transition sets (no attempt number).
            after = _sql.Journaled(write.key, write.thread_id, write.to, 0)
            event = self._transition_event(after, write, now, actor_of(config))  # type: ignore[attr-defined]
            alike = (write.to, write.kind, tuple(columns), event[1][5:])
            if runs and runs[-1][0] == alike and all(
                    write.key != other.key for other, _, _ in runs[-1][1]):
                runs[-1][1].append((write, columns, event))
            else:
                runs.append((alike, [(write, columns, event)]))
        carried: list[tuple[list[TransitionWrite], _sql.Statement]] = []
        for (to, kind, names, actor), run in runs:
            if len(run) == 1:
                [(write, columns, event)] = run
                carried.append(([write], carried_transition(_sql.plan_update(
                    thread_id=write.thread_id, key=write.key, to=to, now=now, columns=columns,
                    returning="key, thread_id"), event)))
                continue
            carried.append(([write for write, _, _ in run], carried_transitions(
                thread_id, to, now, names,
                [(write.key, list(columns.values()), event[1][3])
                 for write, columns, event in run], kind, actor)))
        return carried

    def _claimed_rows(
        self, planned: Sequence[tuple[list[_sql.Statement], EffectRecord]],
        rows: Sequence[Sequence[Any]],
    ) -> list[tuple[EffectRecord, bool]]:
        """`claim_many`'s answer from `CLAIM_STEP`'s rows: the planned record of an intent
        this call inserted, else the effect as recorded (known, or inherited)."""
        return [(record, True) if row[0] else (self._record(row[1:]), False)  # type: ignore[attr-defined]
                for (_plan, record), row in zip(planned, rows, strict=True)]

    def _carried_outcome(self, writes: Sequence[TransitionWrite],
                         rows: Sequence[Sequence[Any]]) -> None:
        """Carried receipts' rows (`carried_transition`'s, one per receipt), read after
        the commit: one that changed nothing is dropped as `_flush_deferred` drops one
        the lifecycle refuses."""
        for write, (changed, *before) in zip(writes, rows, strict=True):
            if changed == 0:
                self._refused_deferred(write, _sql.refusal(
                    None if before[0] is None else before, thread_id=write.thread_id,
                    key=write.key, to=write.to))

