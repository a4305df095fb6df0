"""`saver.check()`: a database verifies itself, read-only, and names what it finds.

Three passes, as trusted stores check themselves on demand (SQLite's `integrity_check`,
PostgreSQL's `pg_amcheck`):

1. the engine's own check: SQLite's `PRAGMA quick_check` (`integrity_check` with
   `full=True`); on PostgreSQL, amcheck's `bt_index_check` on every index of the ledger
   when the extension is installed, else the catalog (every ledger table there, no index
   left invalid);
2. every ledger row decoded through `_decode` (effects, journal entries, leases, flow
   pins, origins, run-log entries) and each thread's latest checkpoint read;
3. the invariants the ledger relies on: every `applied` effect has a receipt, a stored
   result or a journaled reason; every journal entry names an existing effect; no lease
   expires implausibly far ahead; every copied thread's origin is known to the database;
   the schema version is one this release knows.

The passes are one generator of reads (`_steps`), run by `check_database` on a sync saver
and by `acheck_database` on an async one.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from graph_durable.checkpointers import _decode
from graph_durable.checkpointers._decode import Damage, damage_of
from graph_durable.checkpointers._schema import MIGRATIONS, PG_MIGRATIONS, RUNS_FROM, runs_on
from graph_durable.errors import LedgerDamaged
from graph_durable.ledger import EffectStatus
from graph_durable.secrets import LedgerCodec

__all__ = ["CheckReport", "acheck_database", "check_database"]

LEDGER_TABLES = ("effects", "effect_events", "thread_leases", "thread_flow_versions",
                 "thread_origins", "task_runs", "copy_points", "step_anchors",
                 "graph_durable_migrations")


@dataclass
class CheckReport:
    """What `saver.check()` found. `ok` when nothing; `damage` names each finding."""

    engine: str
    """`sqlite` or `postgresql`."""
    engine_check: str
    """Which integrity check the engine ran (`PRAGMA quick_check`, `amcheck`, ...)."""
    damage: list[Damage] = field(default_factory=list)
    """Every finding: a damaged row, a broken rule, the schema, the engine's own."""
    rows: dict[str, int] = field(default_factory=dict)
    """How many rows of each table were read."""
    schema: tuple[int, int] = (-1, -1)
    """`(applied, known)`: the database's schema version and the newest this release knows."""
    seconds: float = 0.0
    """How long the check took."""

    @property
    def ok(self) -> bool:
        """Whether nothing was found."""
        return not self.damage

    @property
    def threads(self) -> list[str]:
        """The threads a finding names, sorted."""
        return sorted({d.thread_id for d in self.damage if d.thread_id is not None})

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values."""
        return {"ok": self.ok, "engine": self.engine, "engine_check": self.engine_check,
                "schema": {"applied": self.schema[0], "known": self.schema[1]},
                "rows": dict(self.rows), "seconds": round(self.seconds, 3),
                "damaged_threads": self.threads,
                "damage": [d.to_dict() for d in self.damage]}


class _Sql(NamedTuple):
    sql: str
    params: tuple[Any, ...] = ()
    may_fail: bool = False
    """The engine's own check: a failure is a finding, not the end of the check."""


class _Latest(NamedTuple):
    thread_id: str


class _Failed(NamedTuple):
    error: BaseException


Steps = Generator[Any, Any, None]

_NEWER_SCHEMA = ("SELECT (SELECT COALESCE(MAX(v), -1) FROM graph_durable_migrations), "
                 f"(SELECT value FROM ledger_meta WHERE name = '{RUNS_FROM}')")
"""A newer schema and which releases run on it (`_schema.RUNS_FROM`): a newer schema
this release runs on is not a finding."""

_EFFECT_COLUMNS = ("key, thread_id, checkpoint_ns, tool_call_id, tool, args, status, "
                   "receipt, error, attempts, decision, asked, created_at, updated_at")


def _steps(report: CheckReport, codec: LedgerCodec, full: bool) -> Steps:
    """The check's reads, each yielded for a driver to run; findings go to `report`."""
    found = report.damage
    yield from _engine_steps(report, full)
    applied = (yield _Sql("SELECT COALESCE(MAX(v), -1) FROM graph_durable_migrations"))[0][0]
    known = len(PG_MIGRATIONS if report.engine == "postgresql" else MIGRATIONS) - 1
    report.schema = (int(applied), known)
    if applied > known:  # both again in one statement: a migration may land meanwhile
        applied, runs_from = (yield _Sql(_NEWER_SCHEMA))[0]
        report.schema = (int(applied), known)
    if applied > known and not runs_on(runs_from, applied, known):
        found.append(Damage("graph_durable_migrations", None, str(applied), "v",
                            f"schema {applied} was written by a newer graph_durable (this "
                            f"release knows up to {known}): upgrade before running it",
                            kind="schema"))

    def rows(table: str, sql: str) -> Generator[Any, Any, list[Any]]:
        got = yield _Sql(sql)
        report.rows[table] = len(got)
        return got

    effects = {}
    for row in (yield from rows("effects", f"SELECT {_EFFECT_COLUMNS}, result_type FROM effects")):
        try:
            record = _decode.effect_from_row(row[:-1], codec)
        except LedgerDamaged as exc:
            found.append(damage_of(exc))
            effects[(row[1], row[0])] = None
            continue
        effects[(record.thread_id, record.key)] = (record, row[-1] is not None)
    reasons: set[tuple[str, str]] = set()
    for row in (yield from rows("effect_events", "SELECT seq, key, thread_id, kind, data, at, "
                                "owner, fencing_token FROM effect_events ORDER BY seq")):
        try:
            event = _decode.event_from_row(row, codec)
        except LedgerDamaged as exc:
            found.append(damage_of(exc))
            continue
        if (event.thread_id, event.key) not in effects:
            found.append(Damage("effect_events", event.thread_id, str(event.seq), "key",
                                f"names effect {event.key!r}, which the thread does not "
                                "hold", kind="rule"))
        elif event.kind != "intent":
            reasons.add((event.thread_id, event.key))
    for (thread_id, key), known_record in effects.items():
        if known_record is None:
            continue
        record, has_result = known_record
        if (record.status is EffectStatus.APPLIED and record.receipt is None
                and not has_result and (thread_id, key) not in reasons):
            found.append(Damage("effects", thread_id, key, "receipt",
                                "applied, with no receipt, no stored result and no journaled "
                                "reason", kind="rule"))
    now = time.time()
    for row in (yield from rows("thread_leases",
                                "SELECT thread_id, owner, token, expires_at FROM thread_leases")):
        _collect(found, lambda row=row: _decode.lease_from_row(str(row[0]), row[1:], now))
    for row in (yield from rows("thread_flow_versions",
                                "SELECT thread_id, flow_version FROM thread_flow_versions")):
        _collect(found, lambda row=row: _decode.flow_version_from_row(row))
    for row in (yield from rows("task_runs", "SELECT thread_id, seq, run_id, checkpoint_ns, "
                                "node, kind, at FROM task_runs")):
        _collect(found, lambda row=row: _decode.task_run_from_row(str(row[0]), row[1:]))
    threads = {row[0] for row in (yield _Sql("SELECT DISTINCT thread_id FROM checkpoints"))}
    known_threads = threads | {t for t, _ in effects} | {
        row[0] for row in (yield _Sql("SELECT thread_id FROM thread_key_schemes"))}
    for row in (yield from rows("thread_origins",
                                "SELECT thread_id, origin_thread_id FROM thread_origins")):
        origin = _collect(found, lambda row=row: _decode.origin_from_row(row))
        if origin is not None and origin[1] not in known_threads:
            found.append(Damage("thread_origins", origin[0], origin[0], "origin_thread_id",
                                f"names origin {origin[1]!r}, a thread this database knows "
                                "nothing of", kind="rule"))
    report.rows["checkpoints (latest of each thread)"] = len(threads)
    for thread_id in sorted(t for t in threads if isinstance(t, str)):
        problem = yield _Latest(thread_id)
        if problem is not None:
            found.append(problem)


def _collect(found: list[Damage], decode: Any) -> Any:
    try:
        return decode()
    except LedgerDamaged as exc:
        found.append(damage_of(exc))
        return None


def _engine_steps(report: CheckReport, full: bool) -> Steps:
    """The engine's own integrity check."""
    if report.engine == "sqlite":
        pragma = "integrity_check" if full else "quick_check"
        report.engine_check = f"PRAGMA {pragma}"
        result = yield _Sql(f"PRAGMA {pragma}", may_fail=True)
        problems = ([str(result.error)] if isinstance(result, _Failed)
                    else [str(row[0]) for row in result if row[0] != "ok"])
    else:
        amcheck = yield _Sql("SELECT 1 FROM pg_extension WHERE extname = 'amcheck'")
        indexes = yield _Sql(
            "SELECT c.relname, a.amname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_class t ON t.oid = i.indrelid JOIN pg_am a ON a.oid = c.relam "
            "WHERE t.relnamespace = current_schema()::regnamespace AND t.relname IN ("
            + ", ".join(f"'{name}'" for name in LEDGER_TABLES) + ") "
            "AND NOT (i.indisvalid AND i.indisready)")
        problems = [f"index {name} is not valid (an interrupted CREATE INDEX "
                    "CONCURRENTLY, or damage): REINDEX it" for name, _ in indexes]
        present = yield _Sql("SELECT relname FROM pg_class WHERE relnamespace = "
                             "current_schema()::regnamespace AND relkind IN ('r', 'p')")
        problems += [f"table {name} is missing" for name in LEDGER_TABLES
                     if name not in {row[0] for row in present}]
        report.engine_check = "catalog"
        if amcheck:
            report.engine_check = "amcheck (bt_index_check) and catalog"
            btrees = yield _Sql(
                "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "JOIN pg_class t ON t.oid = i.indrelid JOIN pg_am a ON a.oid = c.relam "
                "WHERE a.amname = 'btree' AND i.indisvalid AND t.relnamespace = "
                "current_schema()::regnamespace AND t.relname IN ("
                + ", ".join(f"'{name}'" for name in LEDGER_TABLES) + ")")
            for (name,) in btrees:
                result = yield _Sql("SELECT bt_index_check(?::regclass)", (name,), may_fail=True)
                if isinstance(result, _Failed):
                    problems.append(f"index {name}: {' '.join(str(result.error).split())}")
    report.damage.extend(Damage("(database)", None, None, "", problem, kind="engine")
                         for problem in problems)


def _start(saver: Any) -> tuple[CheckReport, LedgerCodec]:
    engine = "postgresql" if "postgres" in type(saver).__module__ else "sqlite"
    return CheckReport(engine, ""), LedgerCodec(saver.serde, strict=False)


def _latest_of(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


def check_database(saver: Any, *, full: bool = False) -> CheckReport:
    """Run the check on a sync durable saver (see the module docstring)."""
    started = time.perf_counter()
    report, codec = _start(saver)
    steps = _steps(report, codec, full)
    result: Any = None
    try:
        while True:
            op = steps.send(result)
            if isinstance(op, _Latest):
                try:
                    saver.get_tuple(_latest_of(op.thread_id))
                    result = None
                except LedgerDamaged as exc:
                    result = damage_of(exc)
            elif op.may_fail:
                try:
                    result = saver._query(op.sql, op.params)
                except Exception as exc:  # noqa: BLE001 - the engine's finding, reported
                    result = _Failed(exc)
            else:
                result = saver._query(op.sql, op.params)
    except StopIteration:
        pass
    report.seconds = time.perf_counter() - started
    return report


async def acheck_database(saver: Any, *, full: bool = False) -> CheckReport:
    """Run the check on an async durable saver (see the module docstring)."""
    started = time.perf_counter()
    report, codec = _start(saver)
    steps = _steps(report, codec, full)
    result: Any = None
    try:
        while True:
            op = steps.send(result)
            if isinstance(op, _Latest):
                try:
                    await saver.aget_tuple(_latest_of(op.thread_id))
                    result = None
                except LedgerDamaged as exc:
                    result = damage_of(exc)
            elif op.may_fail:
                try:
                    result = await saver._aquery(op.sql, op.params)
                except Exception as exc:  # noqa: BLE001 - the engine's finding, reported
                    result = _Failed(exc)
            else:
                result = await saver._aquery(op.sql, op.params)
    except StopIteration:
        pass
    report.seconds = time.perf_counter() - started
    return report
