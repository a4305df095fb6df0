"""The ledger's read methods of a sync durable saver, written once over one query primitive.

`DurableSqliteSaver` and `DurablePostgresSaver` differ in how they run a query (a
`sqlite3` cursor under the saver's lock, a psycopg cursor with `%s` placeholders), not
in what they ask; each provides `_query(sql, params) -> rows` and gets the rest here.
`AsyncLedgerReads` is the same for an async saver over `await _aquery(sql, params)`.

Every row is read through `_decode`. A read of one thread's rows (or of one row) raises
`LedgerDamaged` for a row it cannot read; a listing across every thread (`effects()`,
`events()`, `live_leases()`, `flow_versions()` with no thread) passes such a row by and
names it in its `damaged`, so one bad row never hides the healthy threads.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig

from graph_durable.checkpointers import _sql, _steps
from graph_durable.checkpointers._check import CheckReport, acheck_database, check_database
from graph_durable.checkpointers._decode import (
    Listing,
    ListingDict,
    flow_version_from_row,
    lease_from_row,
    listing,
    task_run_from_row,
)
from graph_durable.leases import cancelled_by
from graph_durable.ledger import (
    EffectEvent,
    EffectRecord,
    EffectStatus,
    IntentWrite,
    Keying,
    sent_from,
)
from graph_durable.telemetry.stats import LedgerStats, stats_of

__all__ = ["AsyncLedgerReads", "SyncLedgerReads"]


class SyncLedgerReads:
    """Mixin: effects, events, leases and threads as a sync durable saver reads them.

    Needs `_query(sql, params)` (SQL as written in `_sql`, `?` placeholders) returning
    every row as a tuple, plus the `DurableSaverMixin` caches and `claim_many`.
    """

    _SELECT_CALLED_TASKS = _sql.SELECT_CALLED_TASKS
    """`_sql.SELECT_CALLED_TASKS` on this database's table of writes."""
    _SELECT_STEP_WRITES = _sql.SELECT_STEP_WRITES
    """`_sql.SELECT_STEP_WRITES` on this database's table of writes."""

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def key_thread(self, thread_id: str) -> str:
        """The thread whose id keys this thread's effects: itself, or for a copy, the
        thread it was copied from (so the copy finds its source's effects)."""
        return self.keying(thread_id)[0]

    def keying(self, thread_id: str) -> Keying:
        """How this thread's calls are keyed (`Keying`): the thread whose id keys its
        effects, whether effects recorded before keys were anchored to the requesting
        message may be found under their legacy keys (see `graph_durable.nodes.anchor`),
        and the key secret (see `graph_durable.secrets.KeySecrets`).

        Raises:
            SecretUnavailable: the thread is pinned to a key secret this saver lacks.
        """
        rows = self._query(_sql.SELECT_KEYING, self._keying_params(str(thread_id)))  # type: ignore[attr-defined]
        return self._keying_of(rows, str(thread_id))  # type: ignore[attr-defined,no-any-return]

    def live_leases(self) -> ListingDict[tuple[str, int, float]]:
        """`{thread_id: (owner, token, expires_at)}` of every live lease; a lease row
        that cannot be read is passed by and named in the result's `damaged`."""
        return _leases(self._query(_sql.SELECT_LIVE_LEASES, (time.time(),)))

    def cancelled_by(self, thread_id: str) -> str | None:
        """Who `cancel()` stopped the thread for (its lease row keeps the canceller as
        owner), or `None`: one read of the thread's lease row."""
        rows = self._query(_sql.SELECT_LEASE, (str(thread_id),))
        return _cancelled_by(str(thread_id), rows)

    def task_runs(self, thread_id: str) -> list[tuple[int, str, str, str, str, float]]:
        """The run log of an audited thread, in order: `(seq, run_id, checkpoint_ns,
        node, kind, at)`, `kind` being `node` or `model` (see `graph_durable.operators.audit`)."""
        return [task_run_from_row(str(thread_id), row)
                for row in self._query(_sql.SELECT_TASK_RUNS, (str(thread_id),))]

    def flow_versions(self) -> ListingDict[str]:
        """`{thread_id: flow_version}` of every thread pinned to a flow version (a pin
        that cannot be read is named in the result's `damaged`)."""
        return _flow_versions(self._query(_sql.SELECT_FLOW_VERSIONS))

    def stats(self) -> LedgerStats:
        """How the ledger stands (`LedgerStats`): effects by status, the questions waiting
        for a person and the age of the oldest. Reads only; orphans are not counted here
        (they need the checkpoints: `graph_durable.ledger_stats(saver)` counts them)."""
        read_at = time.time()
        return stats_of(self._query(_sql.SELECT_STATUS_COUNTS),
                        self._query(_sql.SELECT_WAITING_QUESTIONS),
                        self._query(_sql.SELECT_EFFECT_THREADS), read_at)

    def thread_ids(self) -> list[str]:
        """Every thread with a checkpoint, sorted."""
        return [row[0] for row in self._query(_sql.SELECT_THREAD_IDS)]

    def effect(self, key: str, thread_id: str | None = None) -> EffectRecord | None:
        """The effect with this key (in `thread_id`, or its first thread), or `None`."""
        if thread_id is None:
            rows = self._query(_sql.SELECT_EFFECT_BY_KEY, (key,))
        else:
            rows = self._query(_sql.SELECT_EFFECT, (str(thread_id), key))
        return self._record(rows[0]) if rows else None

    def sent_in_family(self, key: str, thread_id: str) -> EffectRecord | None:
        """The effect `key` as another thread of the family (a copy, or the thread a
        copy came from) holds it once sent or on its way, or `None`. A call paused there
        on its tool's own question has sent nothing (see `sent_from`)."""
        rows = self._query(_sql.SELECT_SENT_IN_FAMILY, (key, str(thread_id)))
        return sent_from(self._record(row) for row in rows)  # type: ignore[attr-defined]

    def effects(
        self, thread_id: str | None = None, status: EffectStatus | str | None = None
    ) -> Listing[EffectRecord]:
        """Effects, oldest first, optionally of one thread and one status.

        Across every thread, a row that cannot be read is passed by and named in the
        result's `damaged`; of one thread, it raises.

        Raises:
            LedgerDamaged: `thread_id` is given and one of its rows cannot be read.
        """
        sql, params = _sql.select_effects(
            None if thread_id is None else str(thread_id),
            None if status is None else EffectStatus(status).value,
        )
        return _read(self._query(sql, params), self._record, thread_id)  # type: ignore[attr-defined]

    def events(
        self, thread_id: str | None = None, key: str | None = None
    ) -> Listing[EffectEvent]:
        """The append-only journal, in order, optionally of one thread and one key
        (damaged rows as `effects` says)."""
        sql, params = _sql.select_events(None if thread_id is None else str(thread_id), key)
        return _read(self._query(sql, params), self._event, thread_id)  # type: ignore[attr-defined]

    def check(self, *, full: bool = False) -> CheckReport:
        """Verify the database, read-only: the engine's own integrity check (SQLite's
        `PRAGMA quick_check`, `integrity_check` with `full`; PostgreSQL's amcheck when
        installed, its catalog otherwise), then every ledger row and each thread's latest
        checkpoint decoded, then the invariants the ledger relies on. Repairs nothing.
        See `graph_durable.checkpointers.CheckReport`."""
        return check_database(self, full=full)

    def stored_result(self, thread_id: str, key: str) -> Any:
        """The ToolMessage or Command stored with a terminal effect, for replay."""
        rows = self._query(_sql.SELECT_RESULT, (str(thread_id), key))
        return self._load_result(rows[0] if rows else None)  # type: ignore[attr-defined]

    def asked_in_task(self, thread_id: str, checkpoint_ns: str) -> list[EffectRecord]:
        """Effects of one task that a pending interrupt asks a human about."""
        rows = self._query(_sql.SELECT_ASKED_IN_TASK, (str(thread_id), checkpoint_ns))
        return [self._record(row) for row in rows]

    def checkpoint_exists(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> bool:
        """Whether this checkpoint is durably stored. Raises the `LeaseLost` the fence
        refused this saver's save of it with (the lease may have expired since)."""
        known = self._known_stored  # type: ignore[attr-defined]
        if known(thread_id, checkpoint_ns, checkpoint_id):
            return True
        return bool(self._query(_sql.SELECT_CHECKPOINT_EXISTS,
                                (str(thread_id), checkpoint_ns, checkpoint_id)))

    def called_tasks(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> set[str]:
        """Ids of the tasks with writes under this checkpoint that another task called
        (a functional-API `@task`): `get_state()` shows their questions only through
        their caller's own interrupt write (graph_durable's savers keep the path LangGraph
        gives each write, `_langgraph.CALLED_TASK_PATH`)."""
        rows = self._query(self._SELECT_CALLED_TASKS,
                           (str(thread_id), checkpoint_ns, checkpoint_id))
        return {row[0] for row in rows}

    def step_anchor(self, thread_id: str, checkpoint_id: str, parent_id: str | None
                    ) -> str | None:
        """The anchor of the step the root checkpoint `checkpoint_id` begins (made by a
        run from its parent `parent_id` and the parent's saved writes) when the thread
        was copied (or copied from) at that parent, else `None`: its guarded writes are
        anchored to the checkpoint's own id (see `_steps.step_anchor`,
        `graph_durable.nodes.write_keys`). One read, unless a copy point is there; a
        recorded anchor is answered whatever the parent (`None`: not known now)."""
        thread_id = str(thread_id)
        [(anchor, copied)] = self._query(
            _sql.SELECT_STEP_ANCHOR, (thread_id, thread_id, checkpoint_id, thread_id, parent_id))
        if anchor is not None or not copied:
            return anchor  # type: ignore[no-any-return]
        return self._run_statements(  # type: ignore[no-any-return]
            _steps.step_anchor(thread_id, checkpoint_id, parent_id, self._SELECT_STEP_WRITES))

    def _run_statements(self, statements: _steps.Statements) -> Any:
        """Run `statements` in one write transaction; what they return."""
        raise NotImplementedError

    def claim(
        self, intent: IntentWrite, config: RunnableConfig | None = None
    ) -> tuple[EffectRecord, bool]:
        """Record `intent` unless its key is already known, in one durable write.

        Returns the record and whether this call created it. The guard claims instead
        of reading and then writing, so an intent is never recorded twice.
        """
        [claimed] = self.claim_many([intent], config)  # type: ignore[attr-defined]
        return claimed  # type: ignore[no-any-return]


class AsyncLedgerReads:
    """Mixin: the same reads for an async durable saver, over `await _aquery(sql, params)`.

    Needs `_aquery` (SQL as written in `_sql`, `?` placeholders) returning every row as a
    tuple, plus the `DurableSaverMixin` caches and `aclaim_many`.
    """

    _SELECT_CALLED_TASKS = _sql.SELECT_CALLED_TASKS
    _SELECT_STEP_WRITES = _sql.SELECT_STEP_WRITES

    async def _aquery(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    async def akey_thread(self, thread_id: str) -> str:
        """Async `key_thread`."""
        return (await self.akeying(thread_id))[0]

    async def akeying(self, thread_id: str) -> Keying:
        """Async `keying` (see `SyncLedgerReads.keying`)."""
        rows = await self._aquery(_sql.SELECT_KEYING, self._keying_params(str(thread_id)))  # type: ignore[attr-defined]
        return self._keying_of(rows, str(thread_id))  # type: ignore[attr-defined,no-any-return]

    async def alive_leases(self) -> ListingDict[tuple[str, int, float]]:
        """Async `live_leases`."""
        return _leases(await self._aquery(_sql.SELECT_LIVE_LEASES, (time.time(),)))

    async def acancelled_by(self, thread_id: str) -> str | None:
        """Async `cancelled_by`."""
        rows = await self._aquery(_sql.SELECT_LEASE, (str(thread_id),))
        return _cancelled_by(str(thread_id), rows)

    async def atask_runs(self, thread_id: str) -> list[tuple[int, str, str, str, str, float]]:
        """Async `task_runs`."""
        return [task_run_from_row(str(thread_id), row)
                for row in await self._aquery(_sql.SELECT_TASK_RUNS, (str(thread_id),))]

    async def aflow_versions(self) -> ListingDict[str]:
        """Async `flow_versions`."""
        return _flow_versions(await self._aquery(_sql.SELECT_FLOW_VERSIONS))

    async def astats(self) -> LedgerStats:
        """Async `stats` (see `SyncLedgerReads.stats`)."""
        read_at = time.time()
        return stats_of(await self._aquery(_sql.SELECT_STATUS_COUNTS),
                        await self._aquery(_sql.SELECT_WAITING_QUESTIONS),
                        await self._aquery(_sql.SELECT_EFFECT_THREADS), read_at)

    async def athread_ids(self) -> list[str]:
        """Async `thread_ids`."""
        return [row[0] for row in await self._aquery(_sql.SELECT_THREAD_IDS)]

    async def aeffect(self, key: str, thread_id: str | None = None) -> EffectRecord | None:
        """Async `effect`."""
        if thread_id is None:
            rows = await self._aquery(_sql.SELECT_EFFECT_BY_KEY, (key,))
        else:
            rows = await self._aquery(_sql.SELECT_EFFECT, (str(thread_id), key))
        return self._record(rows[0]) if rows else None  # type: ignore[attr-defined,no-any-return]

    async def asent_in_family(self, key: str, thread_id: str) -> EffectRecord | None:
        """Async `sent_in_family`."""
        rows = await self._aquery(_sql.SELECT_SENT_IN_FAMILY, (key, str(thread_id)))
        return sent_from(self._record(row) for row in rows)  # type: ignore[attr-defined]

    async def aeffects(
        self, thread_id: str | None = None, status: EffectStatus | str | None = None
    ) -> Listing[EffectRecord]:
        """Async `effects`."""
        sql, params = _sql.select_effects(
            None if thread_id is None else str(thread_id),
            None if status is None else EffectStatus(status).value,
        )
        return _read(await self._aquery(sql, params), self._record, thread_id)  # type: ignore[attr-defined]

    async def aevents(
        self, thread_id: str | None = None, key: str | None = None
    ) -> Listing[EffectEvent]:
        """Async `events`."""
        sql, params = _sql.select_events(None if thread_id is None else str(thread_id), key)
        return _read(await self._aquery(sql, params), self._event, thread_id)  # type: ignore[attr-defined]

    async def acheck(self, *, full: bool = False) -> CheckReport:
        """Async `check` (see `SyncLedgerReads.check`)."""
        return await acheck_database(self, full=full)

    async def astored_result(self, thread_id: str, key: str) -> Any:
        """Async `stored_result`."""
        rows = await self._aquery(_sql.SELECT_RESULT, (str(thread_id), key))
        return self._load_result(rows[0] if rows else None)  # type: ignore[attr-defined]

    async def aasked_in_task(self, thread_id: str, checkpoint_ns: str) -> list[EffectRecord]:
        """Async `asked_in_task`."""
        rows = await self._aquery(_sql.SELECT_ASKED_IN_TASK, (str(thread_id), checkpoint_ns))
        return [self._record(row) for row in rows]  # type: ignore[attr-defined]

    async def acheckpoint_exists(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str
    ) -> bool:
        """Async `checkpoint_exists`."""
        if self._known_stored(thread_id, checkpoint_ns, checkpoint_id):  # type: ignore[attr-defined]
            return True
        return bool(await self._aquery(_sql.SELECT_CHECKPOINT_EXISTS,
                                       (str(thread_id), checkpoint_ns, checkpoint_id)))

    async def acalled_tasks(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str
                            ) -> set[str]:
        """Async `called_tasks`."""
        rows = await self._aquery(self._SELECT_CALLED_TASKS,
                                  (str(thread_id), checkpoint_ns, checkpoint_id))
        return {row[0] for row in rows}

    async def astep_anchor(self, thread_id: str, checkpoint_id: str, parent_id: str | None
                           ) -> str | None:
        """Async `step_anchor` (see `SyncLedgerReads.step_anchor`)."""
        thread_id = str(thread_id)
        [(anchor, copied)] = await self._aquery(
            _sql.SELECT_STEP_ANCHOR, (thread_id, thread_id, checkpoint_id, thread_id, parent_id))
        if anchor is not None or not copied:
            return anchor  # type: ignore[no-any-return]
        return await self._arun_statements(  # type: ignore[no-any-return]
            _steps.step_anchor(thread_id, checkpoint_id, parent_id, self._SELECT_STEP_WRITES))

    async def _arun_statements(self, statements: _steps.Statements) -> Any:
        """Run `statements` in one write transaction; what they return."""
        raise NotImplementedError

    async def aclaim(
        self, intent: IntentWrite, config: RunnableConfig | None = None
    ) -> tuple[EffectRecord, bool]:
        """Async `claim`."""
        [claimed] = await self.aclaim_many([intent], config)  # type: ignore[attr-defined]
        return claimed  # type: ignore[no-any-return]


def _read(rows: Sequence[Any], decode: Any, thread_id: str | None) -> Listing[Any]:
    """`rows` decoded: every one of them (one thread's), or the readable ones (all)."""
    if thread_id is not None:
        found: Listing[Any] = Listing(decode(row) for row in rows)
        return found
    return listing(rows, decode)


def _leases(rows: Sequence[Any]) -> ListingDict[tuple[str, int, float]]:
    found = listing(rows, lambda row: (row[0], lease_from_row(row[0], row[1:])))
    leases: ListingDict[tuple[str, int, float]] = ListingDict(found)  # type: ignore[arg-type]
    leases.damaged = found.damaged
    return leases


def _flow_versions(rows: Sequence[Any]) -> ListingDict[str]:
    found = listing(rows, flow_version_from_row)
    versions: ListingDict[str] = ListingDict(found)
    versions.damaged = found.damaged
    return versions


def _cancelled_by(thread_id: str, rows: Sequence[Any]) -> str | None:
    lease = lease_from_row(thread_id, rows[0][:3] if rows else None)
    return None if lease is None else cancelled_by(lease[0])
