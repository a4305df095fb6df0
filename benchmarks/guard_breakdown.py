"""Where the guard's time goes: its CPU per guarded call, part by part.

The turn of `benchmarks.turn_overhead` (model -> tools -> model on a fresh thread, a
scripted model, 1 or 5 calls of one idempotent tool, `durability="sync"`), on sync SQLite:
stock (`ToolNode` + `SqliteSaver`) against guarded (`EffectGuardNode` +
`DurableSqliteSaver`). Six measurements, each printed as a table:

1. **Totals.** Stock and guarded turns interleaved one by one (`REPETITIONS` x `TURNS`
   each, after a warm-up), timing each turn's wall time and the process's CPU time
   (`time.process_time`: every thread). Medians over the repetitions, the ratio
   guarded / stock, and what the guard adds per guarded call (wall and CPU).
2. **Parts.** The guarded turn again, with a timer around each of the guard's functions
   named in `PARTS` (patched in place, wherever a module holds them): per-thread CPU
   (`time.thread_time_ns`) and wall time, *exclusive* of the other timed functions they
   call, so the parts add up. The tool's own run (the `execute` the guard is handed) is
   timed apart and left out. The saver's checkpoint and pending-write puts, which stock
   makes too, are timed on both sides. A name that no longer resolves is listed, not
   fatal: the table then shows what is left.
3. **Profile.** cProfile over every thread (one profiler per thread, clocked by thread
   CPU time), stock and guarded: the guard's functions by cumulative time per turn, and
   own time by package, stock against guarded. Profiled times are inflated by the
   profiler (about 2x for Python code); compare them with each other, not with (1).
4. **SQLite statements.** `sqlite3`'s trace callback on each side's connection: the
   statements per turn by kind, and `COMMIT`s per turn.
5. **Function calls.** A profile hook on every thread counts the calls (Python and C)
   per turn, stock and guarded, each charged to the innermost graph_durable frame on
   its stack: a count, the same from run to run, where times vary by a tenth.
6. **PostgreSQL statements.** The same turn on a throwaway server
   (`graph_durable.testing.postgres.PostgresServer`; skipped without one): statements
   (`Execute` and `Query` messages of libpq's protocol trace) and round trips per turn on
   the saver's connection, and commits that wrote (transaction ids the server assigned
   while the turns ran, read from another connection).

Only the totals go to `results.md` and `latest.json` (the parts, the profile and the
counts ride along in `latest.json`'s details).

Run: `python -m benchmarks guard_breakdown` (or `python -m benchmarks.guard_breakdown`);
`BENCH_TURNS` and `BENCH_WARMUP` set the turns as for `turn_overhead`.

The flame graph of `docs/concepts/performance.md` is drawn by
`python -m benchmarks.guard_breakdown flame [SECONDS] [OUT.svg]`: py-spy (see
`benchmarks/requirements.txt`) samples every thread of a child process that runs guarded
5-call turns for SECONDS (default 20), and writes the SVG (default
`docs/assets/guard-flame.svg`), its file names made relative to the package roots.
"""

from __future__ import annotations

import cProfile
import functools
import gc
import importlib
import os
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._runner import (
    ROOT,
    BenchmarkSkipped,
    Comparison,
    Timing,
    missing_packages,
    report,
)
from benchmarks.turn_overhead import Agent, _check, build_guarded, build_stock

__all__ = [
    "FLAME_PATH",
    "PARTS",
    "REPETITIONS",
    "SCENARIOS",
    "TURNS",
    "WARMUP",
    "Overhead",
    "PartTimers",
    "Totals",
    "count_postgres",
    "count_sqlite",
    "flame",
    "main",
    "measure_parts",
    "measure_totals",
    "profile_turns",
]

SCENARIOS: dict[int, float] = {1: 1.10, 5: 1.15}
"""Tool calls per turn -> target ratio guarded/stock (as `turn_overhead`)."""

REPETITIONS = 7
"""Timed repetitions of the totals; the median repetition is reported."""

TURNS = int(os.environ.get("BENCH_TURNS", "100"))
"""Turns per variant in one repetition of the totals, and turns timed part by part."""

WARMUP = int(os.environ.get("BENCH_WARMUP", "10"))
"""Untimed turns per variant before anything is timed."""

PROFILED_TURNS = 60
"""Turns of each variant under cProfile."""

COUNTED_TURNS = 20
"""Turns of each variant whose statements are counted."""

FLAME_PATH = ROOT / "docs" / "assets" / "guard-flame.svg"
"""Where `flame` writes the flame graph by default."""

_GD = "graph_durable."
_SQLITE = "graph_durable.checkpointers.sqlite"

PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("keying and canonical JSON (args encoded, key hashed)", (
        "graph_durable.ledger:encode_args",
        "graph_durable.ledger:key_of_encoded",
        "graph_durable.ledger:derive_key",
        "graph_durable.ledger:canonical_json",
    )),
    ("call context: Task, anchor, requested args, CallContext", (
        "graph_durable.nodes.task:Task.__init__",
        "graph_durable.nodes.anchor:call_anchor",
        "graph_durable.nodes.anchor:requested_args",
        "graph_durable.nodes.anchor:requests_of",
        "graph_durable.nodes.call_keys:ToolCallKeys.requests",
        "graph_durable.nodes.call_keys:ToolCallKeys.step_context",
        "graph_durable.nodes.call_keys:ToolCallKeys.context",
        "graph_durable.nodes.write_keys:WriteKeys.context",
        "graph_durable.nodes.call_context:CallContext.__post_init__",
        "graph_durable.nodes.call_keys:ToolCallKeys.fork_root",
        "graph_durable.nodes.restarts:restart_root",
        "graph_durable.nodes.task:Task.holds_answers",
    )),
    ("the step's reads: keying, requesting checkpoint stored", (
        "graph_durable.checkpointers._reads:SyncLedgerReads.keying",
        "graph_durable.checkpointers._reads:SyncLedgerReads.checkpoint_exists",
    )),
    ("claim: intents built, rows and journal planned", (
        "graph_durable.nodes.protocol:_intent",
        "graph_durable.checkpointers._base:DurableSaverMixin._plan_intent",
        "graph_durable.checkpointers._sql:plan_intent",
        "graph_durable.checkpointers._sql:plan_inherit",
    )),
    ("claim: transaction, statements and its commit", (
        f"{_SQLITE}.saver:DurableSqliteSaver.claim_many",
        f"{_SQLITE}._txn:SqliteTransactions._apply_one_txn",
        f"{_SQLITE}._txn:SqliteTransactions._apply_txn",
        "graph_durable.checkpointers._base:claims_of",
    )),
    ("protocol: generator steps, operations dispatched", (
        "graph_durable.nodes.operations:performed",
        "graph_durable.nodes.operations:next_op",
        "graph_durable.nodes.operations:saver_call",
        "graph_durable.nodes.sync_driver:perform",
        "graph_durable.nodes.sync_driver:SyncDriver._perform",
        "graph_durable.nodes.sync_driver:SyncDriver._performed",
        "graph_durable.nodes.core:GuardBase._starting",
        "graph_durable.nodes.core:GuardBase._driven",
        "graph_durable.nodes.core:_claim",
        "graph_durable.nodes.operations:observe_op",
        "graph_durable.nodes.call_context:CallContext.unredacted",
        "graph_durable.policy:Effect.needs_approval",
    )),
    ("interrupt ids and schemas (args checked against the tool's schema)", (
        "graph_durable.nodes.outcomes:refused_args",
        "graph_durable.nodes.interrupts:interrupt_id_for",
        "graph_durable.nodes.interrupts:with_schema",
        "graph_durable.nodes.interrupts:raise_interrupts",
        "graph_durable.nodes.interrupts:withdrawal",
    )),
    ("request rebuild and hand-off to the tool (key, effect context)", (
        "graph_durable.nodes.core:GuardBase._tool_request",
        "graph_durable.nodes.core:GuardBase._as_sent",
        "graph_durable.nodes.core:GuardBase._effect_context",
        "graph_durable.nodes.key_delivery:with_key",
        "graph_durable.nodes.key_delivery:report_unread_key",
        "graph_durable.nodes.sync_driver:SyncDriver._call_tool",
        "graph_durable.nodes.core:GuardBase._outcome",
        "graph_durable.nodes.outcomes:classify",
        "graph_durable.nodes.outcomes:call_with_timeout",
        "graph_durable.nodes.middleware:EffectGuardMiddleware.wrap_tool_call",
        "graph_durable.nodes.middleware:_tools_of",
    )),
    ("receipt: built, deferred, written with the step (result serialised, journal)", (
        "graph_durable.nodes.results:receipt_of",
        "graph_durable.nodes.results:rebuilt_by_lookup",
        "graph_durable.nodes.call_context:CallContext.message",
        "graph_durable.nodes.call_context:CallContext.transition",
        f"{_SQLITE}.saver:DurableSqliteSaver.apply",
        "graph_durable.checkpointers._base:DurableSaverMixin._defer",
        "graph_durable.checkpointers._base:DurableSaverMixin._take_deferred",
        "graph_durable.checkpointers._base:DurableSaverMixin._deferred_committed",
        f"{_SQLITE}._txn:SqliteTransactions._flush_deferred_txn",
        f"{_SQLITE}._txn:SqliteTransactions._apply_deferred_txn",
        "graph_durable.checkpointers._base:DurableSaverMixin._plan_update",
        "graph_durable.checkpointers._base:DurableSaverMixin._transition_columns",
        "graph_durable.checkpointers._base:DurableSaverMixin._transition_event",
    )),
    ("lease and fence checks (per call and per write)", (
        "graph_durable.nodes.task:check_lease",
        "graph_durable.leases:active_lease",
        "graph_durable.nodes.core:GuardBase._still_running",
        f"{_SQLITE}._txn:SqliteTransactions._check_write_txn",
        "graph_durable.checkpointers._base:DurableSaverMixin._check_fence",
        "graph_durable.checkpointers._base:DurableSaverMixin._needs_flow_check",
        "graph_durable.checkpointers._base:DurableSaverMixin._flow_statements",
        "graph_durable.checkpointers._base:actor_of",
    )),
    ("run-once and task bookkeeping (claim plan, decisions, wrapper)", (
        "graph_durable.nodes.node:EffectGuardNode._calls_of",
        "graph_durable.nodes.node:_TaskState.take_started",
        "graph_durable.nodes.sync_driver:SyncDriver.run",
        "graph_durable.nodes.sync_driver:SyncDriver.claim_step",
        "graph_durable.nodes.sync_driver:SyncDriver.resolve_decisions",
        "graph_durable.nodes.task:task_with_resume",
        "graph_durable.nodes.run_once:RunOnce.lead",
        "graph_durable.nodes.run_once:RunOnce.settle",
        "graph_durable.nodes.core:GuardBase._reconcilable_calls",
        "graph_durable.nodes.core:GuardBase._checkpoint_stored",
        "graph_durable.nodes.core:GuardBase._claiming",
        "graph_durable.nodes.core:GuardBase._resolving",
        "graph_durable.nodes.core:GuardBase.policy_for",
        "graph_durable.nodes.core:GuardBase._writes",
    )),
    ("telemetry: the call observed and its outcome reported", (
        "graph_durable.nodes.core:GuardBase._observing",
        "graph_durable.nodes.core:GuardBase._call_info",
        "graph_durable.nodes.observing:call_info",
        "graph_durable.nodes.observing:observed_outcome",
        "graph_durable.nodes.observing:traced",
        "graph_durable.nodes.observing:with_metadata",
        "graph_durable.telemetry.spans:observe_lazily",
        "graph_durable.telemetry.emit:quiet",
        "graph_durable.telemetry.spans:ObservedCall.__enter__",
        "graph_durable.telemetry.spans:ObservedCall.__exit__",
        "graph_durable.telemetry.spans:QuietCall.__enter__",
        "graph_durable.telemetry.spans:QuietCall.__exit__",
        "graph_durable.telemetry.spans:ProviderSpan.__enter__",
        "graph_durable.telemetry.spans:ProviderSpan.__exit__",
        "graph_durable.telemetry.emit:report",
        "graph_durable.telemetry.model:policy_label",
    )),
)
"""The guard's parts: a label and the functions (`module:qualname`) timed for it."""

_SAVER_PUTS = "saver: checkpoint and pending-write puts (stock makes them too)"
_STOCK_PUTS = ("langgraph.checkpoint.sqlite:SqliteSaver.put",
               "langgraph.checkpoint.sqlite:SqliteSaver.put_writes")
_DURABLE_PUTS = ("graph_durable.checkpointers._twins:FencedPuts.put",
                 "graph_durable.checkpointers._twins:FencedPuts.put_writes")
_TOOL = "the tool's run (ToolNode's execute: stock work, left out)"
_RUN = "graph_durable.nodes.sync_driver:SyncDriver.run"
"""Handed the tool's `execute` (its third positional argument, after self and request)."""


def _tool_calls(n_calls: int) -> str:
    return f"{n_calls} tool call{'s' if n_calls > 1 else ''}"


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _print_rows(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """An aligned table: the first column left-aligned, the others right-aligned."""
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(row, widths)))

    print(line(cells[0]))
    print("-" * len(line(cells[0])))
    for row in cells[1:]:
        print(line(row))


@contextmanager
def _agents(workdir: str, n_calls: int, tag: str) -> Iterator[tuple[Agent, Agent]]:
    """A stock and a guarded agent (`turn_overhead`'s), checked, warmed up, closed on exit."""
    stock = build_stock(os.path.join(workdir, f"stock-{n_calls}-{tag}.sqlite"), n_calls)
    guarded = build_guarded(os.path.join(workdir, f"guarded-{n_calls}-{tag}.sqlite"), n_calls)
    try:
        _check(stock, n_calls)
        _check(guarded, n_calls)
        for _ in range(WARMUP):
            stock.turn()
            guarded.turn()
        yield stock, guarded
    finally:
        stock.close()
        guarded.close()


# -- 1. totals ----------------------------------------------------------------------------


@dataclass
class Totals:
    """Wall and CPU time per turn, stock and guarded, per repetition (seconds)."""

    n_calls: int
    wall: dict[str, list[float]] = field(default_factory=lambda: {"stock": [], "guarded": []})
    cpu: dict[str, list[float]] = field(default_factory=lambda: {"stock": [], "guarded": []})

    def median_ms(self, clock: str, side: str) -> float:
        return _median(getattr(self, clock)[side]) * 1000

    def added_us_per_call(self, clock: str) -> float:
        """Guarded minus stock, medians, per guarded call, in microseconds."""
        return ((self.median_ms(clock, "guarded") - self.median_ms(clock, "stock"))
                * 1000 / self.n_calls)

    def ratios(self, clock: str) -> list[float]:
        samples = getattr(self, clock)
        return [g / s for s, g in zip(samples["stock"], samples["guarded"])]

    def comparison(self, target: float | None) -> Comparison:
        stock, guarded = ([s * 1000 for s in self.wall[side]] for side in ("stock", "guarded"))
        return Comparison.of_samples(
            f"breakdown turn, {_tool_calls(self.n_calls)}", stock, guarded, target=target,
            note=(f"CPU per turn stock {self.median_ms('cpu', 'stock'):.2f} ms, guarded "
                  f"{self.median_ms('cpu', 'guarded'):.2f} ms; added per guarded call "
                  f"{self.added_us_per_call('wall'):.0f} us wall, "
                  f"{self.added_us_per_call('cpu'):.0f} us CPU"),
            details={"cpu_stock_ms": [s * 1000 for s in self.cpu["stock"]],
                     "cpu_guarded_ms": [s * 1000 for s in self.cpu["guarded"]],
                     "added_us_per_call_wall": self.added_us_per_call("wall"),
                     "added_us_per_call_cpu": self.added_us_per_call("cpu")})


def measure_totals(stock: Agent, guarded: Agent, n_calls: int,
                   timing: Timing | None = None) -> Totals:
    """Time stock and guarded turns interleaved turn by turn (A B, B A, ...): wall and
    process CPU time of each turn; one sample per side and repetition (its mean)."""
    timing = timing or Timing(REPETITIONS, TURNS, 0)
    totals = Totals(n_calls)
    cases = {"stock": stock.turn, "guarded": guarded.turn}
    names = list(cases)
    wall_clock, cpu_clock = time.perf_counter, time.process_time
    for rep in range(timing.repetitions):
        wall = dict.fromkeys(names, 0.0)
        cpu = dict.fromkeys(names, 0.0)
        gc.collect()
        for round_ in range(timing.turns):
            for name in names if round_ % 2 == 0 else reversed(names):
                w0, c0 = wall_clock(), cpu_clock()
                cases[name]()
                cpu[name] += cpu_clock() - c0
                wall[name] += wall_clock() - w0
        for name in names:
            totals.wall[name].append(wall[name] / timing.turns)
            totals.cpu[name].append(cpu[name] / timing.turns)
        if timing.progress is not None:
            timing.progress(
                f"  rep {rep + 1}/{timing.repetitions}: " + ", ".join(
                    f"{name} {totals.wall[name][-1] * 1000:.2f} ms "
                    f"(CPU {totals.cpu[name][-1] * 1000:.2f})" for name in names))
    return totals


def _print_totals(all_totals: Sequence[Totals]) -> None:
    print()
    print("Totals per turn, ms (medians of the repetitions; ratio = guarded / stock of the "
          "medians, its spread min..max per repetition; added = guarded minus stock per "
          "guarded call, us)")
    rows = []
    for t in all_totals:
        for clock in ("wall", "cpu"):
            ratios = t.ratios(clock)
            rows.append((
                f"{_tool_calls(t.n_calls)}, {clock}",
                f"{t.median_ms(clock, 'stock'):.2f}", f"{t.median_ms(clock, 'guarded'):.2f}",
                f"{t.median_ms(clock, 'guarded') / t.median_ms(clock, 'stock'):.3f}",
                f"{min(ratios):.3f}..{max(ratios):.3f}",
                f"{t.added_us_per_call(clock):.0f}"))
    _print_rows(("scenario", "stock ms", "guarded ms", "ratio", "ratio spread",
                 "added us/call"), rows)


# -- 2. parts -----------------------------------------------------------------------------


def _resolve(spec: str) -> tuple[Any, str, Any] | None:
    """`(owner, attribute, function)` of `module:qualname`, or None if it does not resolve."""
    module_name, _, qualname = spec.partition(":")
    try:
        owner: Any = importlib.import_module(module_name)
    except ImportError:
        return None
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    if isinstance(owner, type):
        if name not in vars(owner):
            return None
        return owner, name, vars(owner)[name]
    function = getattr(owner, name, None)
    return None if function is None else (owner, name, function)


class PartTimers:
    """Timers patched around functions: per thread, each call's thread CPU and wall time,
    exclusive of the timed calls it makes (so that the labels add up).

    Use as a context manager; `install(label, specs)` patches, the exit restores. A
    module-level function is patched in every loaded module of its package that holds it
    (`from x import f` copies the reference).
    """

    def __init__(self) -> None:
        self.cpu_ns: Counter[str] = Counter()
        self.wall_ns: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.child_calls: Counter[str] = Counter()
        """Timed calls made by each label's calls (each costs its caller some overhead)."""
        self.missing: list[str] = []
        self._local = threading.local()
        self._undo: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> PartTimers:
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()

    def reset(self) -> None:
        self.cpu_ns.clear()
        self.wall_ns.clear()
        self.calls.clear()
        self.child_calls.clear()

    def timed(self, label: str, function: Callable[..., Any],
              arg_labels: Mapping[int, str] | None = None) -> Callable[..., Any]:
        """`function` timed under `label`; positional args at `arg_labels`' indexes are
        callables timed under their own labels."""
        local, cpu_ns, wall_ns = self._local, self.cpu_ns, self.wall_ns
        calls, child_calls = self.calls, self.child_calls
        thread_ns, wall_clock = time.thread_time_ns, time.perf_counter_ns
        wrap_args = dict(arg_labels or {})

        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if wrap_args:
                args = tuple(self.timed(wrap_args[i], arg) if i in wrap_args else arg
                             for i, arg in enumerate(args))
            stack = getattr(local, "stack", None)
            if stack is None:
                stack = local.stack = []
            children = [0, 0, 0]
            stack.append(children)
            c0, w0 = thread_ns(), wall_clock()
            try:
                return function(*args, **kwargs)
            finally:
                cpu, wall = thread_ns() - c0, wall_clock() - w0
                stack.pop()
                cpu_ns[label] += cpu - children[0]
                wall_ns[label] += wall - children[1]
                calls[label] += 1
                child_calls[label] += children[2]
                if stack:
                    parent = stack[-1]
                    parent[0] += cpu
                    parent[1] += wall
                    parent[2] += 1

        timed.__wrapped_by_timers__ = True  # type: ignore[attr-defined]
        return timed

    def corrected_us(self, label: str, overhead: Overhead, turns: int) -> tuple[float, float]:
        """`(CPU, wall)` of `label` per turn in microseconds, the timers' own cost taken
        out (`overhead`: per timed call, in the call's own time and in its caller's)."""
        own, caller = self.calls[label], self.child_calls[label]
        cpu = self.cpu_ns[label] - own * overhead.own_cpu_ns - caller * overhead.caller_cpu_ns
        wall = (self.wall_ns[label] - own * overhead.own_wall_ns
                - caller * overhead.caller_wall_ns)
        return max(cpu, 0.0) / turns / 1000, max(wall, 0.0) / turns / 1000

    def _patch(self, owner: Any, name: str, value: Any) -> None:
        self._undo.append((owner, name, getattr(owner, name) if not isinstance(owner, type)
                           else vars(owner)[name]))
        setattr(owner, name, value)

    def install(self, label: str, specs: Sequence[str],
                arg_labels: Mapping[str, Mapping[int, str]] | None = None) -> None:
        """Time each function of `specs` (`module:qualname`) under `label`."""
        for spec in specs:
            found = _resolve(spec)
            if found is None:
                self.missing.append(spec)
                continue
            owner, name, function = found
            if isinstance(owner, type):
                raw = function
                kind = type(raw)
                inner = raw.__func__ if isinstance(raw, staticmethod | classmethod) else raw
                wrapped = self.timed(label, inner, (arg_labels or {}).get(spec))
                self._patch(owner, name, kind(wrapped) if kind in (staticmethod, classmethod)
                            else wrapped)
                continue
            wrapped = self.timed(label, function, (arg_labels or {}).get(spec))
            package = owner.__name__.split(".")[0]
            for module_name, module in list(sys.modules.items()):
                if module is None or module_name.split(".")[0] != package:
                    continue
                for attr, value in list(vars(module).items()):
                    if value is function:
                        self._patch(module, attr, wrapped)


@dataclass(frozen=True)
class Overhead:
    """What one timed call adds to the times `PartTimers` records, in nanoseconds: to
    its own label's (`own_*`), and to its caller's (`caller_*`)."""

    own_cpu_ns: float
    own_wall_ns: float
    caller_cpu_ns: float
    caller_wall_ns: float

    @classmethod
    def calibrate(cls, calls: int = 20000, rounds: int = 5) -> Overhead:
        """Time an empty function called by a timed caller; the medians of `rounds`."""
        def leaf() -> None:
            return None

        def caller(inner: Callable[[], None]) -> None:
            for _ in range(calls):
                inner()

        samples = []
        for _ in range(rounds):
            with PartTimers() as timers:
                timed_leaf = timers.timed("leaf", leaf)
                timers.timed("bare", caller)(leaf)
                timers.timed("caller", caller)(timed_leaf)
            samples.append((
                timers.cpu_ns["leaf"] / calls, timers.wall_ns["leaf"] / calls,
                (timers.cpu_ns["caller"] - timers.cpu_ns["bare"]) / calls,
                (timers.wall_ns["caller"] - timers.wall_ns["bare"]) / calls))
        return cls(*(max(_median([s[i] for s in samples]), 0.0) for i in range(4)))


def measure_parts(stock: Agent, guarded: Agent, turns: int) -> dict[str, Any]:
    """Per-turn exclusive CPU and wall time of each part (`PARTS`) of `turns` guarded
    turns, and of the saver's puts on both sides (turns interleaved)."""
    with PartTimers() as timers:
        for label, specs in PARTS:
            timers.install(label, specs, {_RUN: {2: _TOOL}})
        timers.install(_SAVER_PUTS, _DURABLE_PUTS)
        stock_timers = PartTimers()
        with stock_timers:
            stock_timers.install(_SAVER_PUTS, _STOCK_PUTS)
            for _ in range(3):
                stock.turn()
                guarded.turn()
            timers.reset()
            stock_timers.reset()
            c_stock = c_guarded = 0.0
            for _ in range(turns):
                c0 = time.process_time()
                guarded.turn()
                c1 = time.process_time()
                stock.turn()
                c_guarded += c1 - c0
                c_stock += time.process_time() - c1
    overhead = Overhead.calibrate()
    per_turn = {label: (*timers.corrected_us(label, overhead, turns),
                        timers.calls[label] / turns)
                for label in timers.calls}
    timed_calls = sum(timers.calls.values()) + sum(stock_timers.calls.values())
    return {
        "parts": per_turn,
        "stock_puts": (*stock_timers.corrected_us(_SAVER_PUTS, overhead, turns),
                       stock_timers.calls[_SAVER_PUTS] / turns),
        "overhead_ns": asdict(overhead),
        "timer_overhead_us_per_turn": timed_calls / turns * (
            overhead.own_cpu_ns + overhead.caller_cpu_ns) / 1000,
        "cpu_us_per_turn": {"stock": c_stock / turns * 1e6, "guarded": c_guarded / turns * 1e6},
        "missing": sorted(set(timers.missing)),
    }


def _print_parts(n_calls: int, parts: Mapping[str, Any], totals: Totals | None) -> None:
    print()
    print(f"Parts of a guarded turn, {_tool_calls(n_calls)} (exclusive times, us; "
          "thread CPU and wall)")
    per_turn = parts["parts"]
    rows = []
    guard_cpu = guard_wall = 0.0
    for label, _ in PARTS:
        cpu, wall, calls = per_turn.get(label, (0.0, 0.0, 0.0))
        guard_cpu += cpu
        guard_wall += wall
        rows.append((label, f"{calls:.0f}", f"{cpu:.0f}", f"{cpu / n_calls:.0f}", f"{wall:.0f}"))
    rows.append(("sum of the guard's parts", "", f"{guard_cpu:.0f}",
                 f"{guard_cpu / n_calls:.0f}", f"{guard_wall:.0f}"))
    puts_cpu, puts_wall, puts_calls = per_turn.get(_SAVER_PUTS, (0.0, 0.0, 0.0))
    stock_cpu, stock_wall, stock_calls = parts["stock_puts"]
    rows.append((f"{_SAVER_PUTS}: durable", f"{puts_calls:.0f}", f"{puts_cpu:.0f}", "",
                 f"{puts_wall:.0f}"))
    rows.append((f"{_SAVER_PUTS}: stock", f"{stock_calls:.0f}", f"{stock_cpu:.0f}", "",
                 f"{stock_wall:.0f}"))
    rows.append(("  durable minus stock", "", f"{puts_cpu - stock_cpu:.0f}",
                 f"{(puts_cpu - stock_cpu) / n_calls:.0f}", f"{puts_wall - stock_wall:.0f}"))
    tool_cpu, tool_wall, tool_calls = per_turn.get(_TOOL, (0.0, 0.0, 0.0))
    rows.append((_TOOL, f"{tool_calls:.0f}", f"{tool_cpu:.0f}", "", f"{tool_wall:.0f}"))
    cpu = parts["cpu_us_per_turn"]
    added = cpu["guarded"] - cpu["stock"]
    rows.append(("process CPU per turn, guarded minus stock (timers on)", "",
                 f"{added:.0f}", f"{added / n_calls:.0f}", ""))
    own = parts["timer_overhead_us_per_turn"]
    rows.append(("  of which the timers' own cost (calibrated, taken out above)", "",
                 f"{own:.0f}", f"{own / n_calls:.0f}", ""))
    if totals is not None:
        clean = totals.added_us_per_call("cpu") * n_calls
        rows.append(("same, without timers (totals above)", "", f"{clean:.0f}",
                     f"{clean / n_calls:.0f}", ""))
    _print_rows(("part", "calls/turn", "CPU us/turn", "CPU us/call", "wall us/turn"), rows)
    if parts["missing"]:
        print("  not found (renamed or moved? their time falls to their callers): "
              + ", ".join(parts["missing"]))


# -- 3. profile ---------------------------------------------------------------------------


class _ThreadProfiles:
    """One cProfile profiler per thread (the running one, and each thread started while
    it is on), clocked by the thread's CPU time; `stats()` merges them."""

    def __init__(self) -> None:
        self._profiles: list[cProfile.Profile] = []
        self._lock = threading.Lock()

    def _new(self) -> cProfile.Profile:
        profile = cProfile.Profile(time.thread_time)
        with self._lock:
            self._profiles.append(profile)
        return profile

    @contextmanager
    def running(self) -> Iterator[_ThreadProfiles]:
        main = self._new()
        previous = threading.getprofile() if hasattr(threading, "getprofile") else None
        threading.setprofile(self._bootstrap_all)
        main.enable()
        try:
            yield self
        finally:
            main.disable()
            threading.setprofile(previous)  # type: ignore[arg-type]

    def _bootstrap_all(self, *_: Any) -> None:
        # The first profile event of a new thread: hand the thread to its own profiler.
        sys.setprofile(None)
        self._new().enable()

    def stats(self) -> pstats.Stats:
        with self._lock:
            profiles = list(self._profiles)
        merged: pstats.Stats | None = None
        for profile in profiles:
            profile.create_stats()
            if not profile.stats:  # type: ignore[attr-defined]
                continue
            if merged is None:
                merged = pstats.Stats(profile)
            else:
                merged.add(profile)
        assert merged is not None
        return merged


def _package_of(func: tuple[str, int, str]) -> str:
    """`graph_durable.nodes`, `langgraph`, `langchain_core`, `sqlite3 (C)`, ...: who owns
    a profiled function."""
    filename, _, name = func
    if filename == "~":
        match = re.search(r"of '_?([A-Za-z0-9]+)[.']", name)
        return f"{match.group(1)} (C)" if match else "builtins (C)"
    path = filename.replace(os.sep, "/")
    match = re.search(r"/(graph_durable)/([A-Za-z_]+)", path)
    if match:
        sub = match.group(2)
        return f"graph_durable.{sub}" if not sub.endswith("py") else "graph_durable"
    match = re.search(r"(?:site-packages|dist-packages)/([A-Za-z_0-9]+)", path)
    if match:
        return match.group(1)
    match = re.search(r"/lib/python3\.\d+/([A-Za-z_0-9]+)", path)
    if match:
        return f"stdlib {match.group(1).removesuffix('.py')}"
    if "/benchmarks/" in path:
        return "benchmarks"
    return "other"


def _short(func: tuple[str, int, str]) -> str:
    filename, line, name = func
    path = filename.replace(os.sep, "/")
    match = re.search(r"/(graph_durable/.*)$", path)
    where = match.group(1) if match else os.path.basename(path)
    return f"{where}:{line}:{name}"


def profile_turns(agent: Agent, turns: int) -> pstats.Stats:
    """cProfile over every thread while `agent` runs `turns` turns."""
    profiles = _ThreadProfiles()
    with profiles.running():
        for _ in range(turns):
            agent.turn()
    return profiles.stats()


def _by_package(stats: pstats.Stats) -> Counter[str]:
    own: Counter[str] = Counter()
    for func, (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        own[_package_of(func)] += tottime
    return own


def _print_profile(n_calls: int, stock: pstats.Stats, guarded: pstats.Stats, turns: int,
                   top: int = 25) -> dict[str, Any]:
    print()
    print(f"cProfile, {_tool_calls(n_calls)}: graph_durable's functions by cumulative thread "
          f"CPU (us per turn, profiled, over {turns} turns)")
    rows = []
    gd_items = [(func, data) for func, data in guarded.stats.items()  # type: ignore[attr-defined]
                if "/graph_durable/" in func[0].replace(os.sep, "/")]
    gd_items.sort(key=lambda item: item[1][3], reverse=True)
    for func, (_, ncalls, tottime, cumtime, _) in gd_items[:top]:
        rows.append((_short(func), f"{ncalls / turns:.1f}", f"{tottime / turns * 1e6:.0f}",
                     f"{cumtime / turns * 1e6:.0f}"))
    _print_rows(("function", "calls/turn", "own us/turn", "cumulative us/turn"), rows)
    own_top = sorted(gd_items, key=lambda item: item[1][2], reverse=True)[:top]
    print()
    print(f"cProfile, {_tool_calls(n_calls)}: graph_durable's functions by own time")
    _print_rows(("function", "calls/turn", "own us/turn", "cumulative us/turn"), [
        (_short(func), f"{nc / turns:.1f}", f"{tt / turns * 1e6:.0f}", f"{ct / turns * 1e6:.0f}")
        for func, (_, nc, tt, ct, _) in own_top])
    s_own, g_own = _by_package(stock), _by_package(guarded)
    print()
    print(f"cProfile, {_tool_calls(n_calls)}: own thread CPU by package, us per turn "
          "(profiled)")
    packages = sorted(set(s_own) | set(g_own), key=lambda p: g_own[p] - s_own[p], reverse=True)
    rows = [(p, f"{s_own[p] / turns * 1e6:.0f}", f"{g_own[p] / turns * 1e6:.0f}",
             f"{(g_own[p] - s_own[p]) / turns * 1e6:+.0f}") for p in packages
            if abs(g_own[p] - s_own[p]) / turns * 1e6 >= 5 or g_own[p] / turns * 1e6 >= 50]
    rows.append(("total", f"{sum(s_own.values()) / turns * 1e6:.0f}",
                 f"{sum(g_own.values()) / turns * 1e6:.0f}",
                 f"{(sum(g_own.values()) - sum(s_own.values())) / turns * 1e6:+.0f}"))
    _print_rows(("package", "stock", "guarded", "difference"), rows)
    return {"top_cumulative": [(_short(f), d[1] / turns, d[2] / turns * 1e6, d[3] / turns * 1e6)
                               for f, d in gd_items[:top]],
            "by_package_us": {p: (s_own[p] / turns * 1e6, g_own[p] / turns * 1e6)
                              for p in packages}}


# -- 4. and 5. statements ---------------------------------------------------------------


def _kind(statement: str) -> str:
    word = statement.lstrip().split(None, 1)[0].upper() if statement.strip() else ""
    return {"INSERT": "write", "UPDATE": "write", "DELETE": "write", "REPLACE": "write",
            "SELECT": "read", "WITH": "read"}.get(word, word.lower())


def count_sqlite(agent: Agent, turns: int = COUNTED_TURNS) -> dict[str, float]:
    """Statements per turn on `agent`'s sqlite3 connection, by kind (`read`, `write`,
    `begin`, `commit`, ...), with `total`."""
    counts: Counter[str] = Counter()
    lock = threading.Lock()

    def seen(statement: str) -> None:
        with lock:
            counts[_kind(statement)] += 1

    agent.conn.set_trace_callback(seen)  # type: ignore[attr-defined]
    try:
        for _ in range(turns):
            agent.turn()
    finally:
        agent.conn.set_trace_callback(None)  # type: ignore[attr-defined]
    per_turn = {kind: n / turns for kind, n in counts.items()}
    per_turn["total"] = sum(counts.values()) / turns
    return per_turn


_GD_DIR = os.sep + "graph_durable" + os.sep


def count_calls(agent: Agent, turns: int = COUNTED_TURNS) -> dict[str, float]:
    """Function calls per turn, every thread (a profile hook counts each Python and C
    call): `total`, and each graph_durable module's share, a call being charged to the
    innermost graph_durable frame on its stack (`outside` when there is none, as for
    every call of a stock turn). Unlike time, the count is the same from run to run,
    so a cut of a few calls per guarded call shows."""
    counts: Counter[str] = Counter()

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event != "call" and event != "c_call":
            return
        while frame is not None:
            filename = frame.f_code.co_filename
            if _GD_DIR in filename:
                counts[filename.rsplit(_GD_DIR, 1)[1]] += 1
                return
            frame = frame.f_back
        counts["outside"] += 1

    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        for _ in range(turns):
            agent.turn()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    per_turn = {module: n / turns for module, n in counts.items()}
    per_turn["total"] = sum(counts.values()) / turns
    return per_turn


def _print_call_counts(counts: Mapping[int, Mapping[str, Mapping[str, float]]]) -> None:
    print()
    print("Function calls per turn (profile hook, every thread; a call is charged to the "
          "innermost graph_durable frame; the tool's own run is charged to the guard's "
          "frame that runs it)")
    rows = []
    for n_calls, sides in counts.items():
        stock, guarded = sides["stock"]["total"], sides["guarded"]["total"]
        rows.append((_tool_calls(n_calls), f"{stock:.0f}", f"{guarded:.0f}",
                     f"{guarded - stock:.0f}", f"{(guarded - stock) / n_calls:.0f}"))
    _print_rows(("turn", "stock", "guarded", "added", "added per call"), rows)
    last = max(counts)
    guarded = counts[last]["guarded"]
    modules = sorted((m for m in guarded if m not in ("total", "outside")
                      and not m.startswith("testing" + os.sep)),  # the scripted model
                     key=lambda m: -guarded[m])[:15]
    print()
    print(f"  {_tool_calls(last)}, guarded: calls per turn by graph_durable module "
          "(the 15 most)")
    _print_rows(("module", "calls/turn"), [(m, f"{guarded[m]:.0f}") for m in modules])


def _print_sqlite_counts(counts: Mapping[int, Mapping[str, Mapping[str, float]]]) -> None:
    print()
    print("SQLite statements per turn (sqlite3 trace callback on the saver's connection)")
    kinds = sorted({k for sides in counts.values() for side in sides.values() for k in side}
                   - {"total"}) + ["total"]
    rows = []
    for n_calls, sides in counts.items():
        for side in ("stock", "guarded"):
            rows.append((f"{_tool_calls(n_calls)}, {side}",
                         *(f"{sides[side].get(k, 0):.1f}" for k in kinds)))
    _print_rows(("turn", *kinds), rows)


def _postgres_available() -> str | None:
    """Why PostgreSQL cannot be counted here, or None."""
    missing = missing_packages("psycopg", "langgraph.checkpoint.postgres")
    if missing:
        return f"{', '.join(missing)} not installed (pip install 'graph-durable[postgres]')"
    from graph_durable.testing.postgres import find_postgres_bin

    if find_postgres_bin() is None:
        return "no PostgreSQL server binaries (initdb, pg_ctl, postgres) found"
    return None


def _next_xid(admin: Any) -> int:
    row = admin.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()
    return int(row[0])


def count_postgres(n_calls_list: Sequence[int], turns: int = COUNTED_TURNS
                   ) -> dict[int, dict[str, dict[str, float]]]:
    """Statements, round trips and commits that wrote, per turn, stock and guarded, on
    a throwaway PostgreSQL server."""
    import psycopg

    from benchmarks.turn_overhead_postgres import _postgres_server
    from benchmarks.turn_overhead_postgres import build_guarded as pg_guarded
    from benchmarks.turn_overhead_postgres import build_stock as pg_stock
    from graph_durable.testing.pg_trace import round_trips

    results: dict[int, dict[str, dict[str, float]]] = {}
    with _postgres_server() as server, psycopg.connect(server.conninfo,
                                                        autocommit=True) as admin:
        for n_calls in n_calls_list:
            results[n_calls] = {}
            for side, build in (("stock", pg_stock), ("guarded", pg_guarded)):
                agent = build(server.create_database(f"count_{side}_{n_calls}"), n_calls)
                try:
                    _check(agent, n_calls)
                    agent.turn()
                    statements = trips = 0
                    before = _next_xid(admin)
                    for _ in range(turns):
                        with round_trips(agent.conn) as seen:
                            agent.turn()
                        trips += seen.count
                        statements += sum(kind in ("Execute", "Query")
                                          for sent in seen.sent for kind in sent)
                    xids = _next_xid(admin) - before
                finally:
                    agent.close()
                results[n_calls][side] = {"statements": statements / turns,
                                          "round trips": trips / turns,
                                          "commits that wrote": xids / turns}
    return results


def _print_postgres_counts(counts: Mapping[int, Mapping[str, Mapping[str, float]]]) -> None:
    print()
    print("PostgreSQL per turn (libpq protocol trace of the saver's connection; commits that "
          "wrote = transaction ids assigned by the server)")
    rows = []
    for n_calls, sides in counts.items():
        for side in ("stock", "guarded"):
            c = sides[side]
            rows.append((f"{_tool_calls(n_calls)}, {side}", f"{c['statements']:.1f}",
                         f"{c['round trips']:.1f}", f"{c['commits that wrote']:.1f}"))
    _print_rows(("turn", "statements", "round trips", "commits that wrote"), rows)


# -- main ---------------------------------------------------------------------------------


def main() -> list[Comparison]:
    """Run the six measurements for 1 and 5 calls; print them; report the totals."""
    comparisons: list[Comparison] = []
    sqlite_counts: dict[int, dict[str, dict[str, float]]] = {}
    call_counts: dict[int, dict[str, dict[str, float]]] = {}
    print(f"{WARMUP} warm-up turns per variant; totals: {REPETITIONS} x {TURNS} turns per "
          f"variant, interleaved; parts: {TURNS} turns; cProfile: {PROFILED_TURNS} turns; "
          f"statements: {COUNTED_TURNS} turns", flush=True)
    with tempfile.TemporaryDirectory(prefix="graph-durable-breakdown-") as workdir:
        all_totals = []
        for n_calls, target in SCENARIOS.items():
            print(f"{_tool_calls(n_calls)} per turn", flush=True)
            with _agents(workdir, n_calls, "totals") as (stock, guarded):
                totals = measure_totals(stock, guarded, n_calls)
                all_totals.append(totals)
                parts = measure_parts(stock, guarded, TURNS)
                stock_profile = profile_turns(stock, PROFILED_TURNS)
                guarded_profile = profile_turns(guarded, PROFILED_TURNS)
                sqlite_counts[n_calls] = {"stock": count_sqlite(stock),
                                          "guarded": count_sqlite(guarded)}
                call_counts[n_calls] = {"stock": count_calls(stock),
                                        "guarded": count_calls(guarded)}
            _print_parts(n_calls, parts, totals)
            profile = _print_profile(n_calls, stock_profile, guarded_profile, PROFILED_TURNS)
            comparison = totals.comparison(target)
            comparison.details.update({  # type: ignore[attr-defined]
                "parts_us_per_turn": parts["parts"], "stock_puts_us_per_turn":
                parts["stock_puts"], "profile": profile,
                "sqlite_statements": sqlite_counts[n_calls],
                "calls_per_turn": call_counts[n_calls]})
            comparisons.append(comparison)
        _print_totals(all_totals)
        _print_sqlite_counts(sqlite_counts)
        _print_call_counts(call_counts)
    why = _postgres_available()
    if why is None:
        try:
            pg_counts = count_postgres(list(SCENARIOS))
        except BenchmarkSkipped as exc:
            print(f"PostgreSQL counts skipped: {exc}")
        else:
            _print_postgres_counts(pg_counts)
            for comparison, n_calls in zip(comparisons, SCENARIOS):
                comparison.details["postgres"] = pg_counts[n_calls]  # type: ignore[index]
    else:
        print(f"PostgreSQL counts skipped: {why}")
    report("guard breakdown: guarded (EffectGuardNode + DurableSqliteSaver) vs stock "
           "(ToolNode + SqliteSaver), durability='sync'", comparisons,
           benchmark="guard_breakdown")
    return comparisons


# -- the flame graph ----------------------------------------------------------------------


def _loop(seconds: float, n_calls: int = 5) -> None:
    """Run guarded turns with `n_calls` calls for `seconds` (what `flame` samples)."""
    with tempfile.TemporaryDirectory(prefix="graph-durable-flame-") as workdir:
        guarded = build_guarded(os.path.join(workdir, "guarded.sqlite"), n_calls)
        try:
            _check(guarded, n_calls)
            for _ in range(WARMUP):
                guarded.turn()
            turns, deadline = 0, time.monotonic() + seconds
            while time.monotonic() < deadline:
                guarded.turn()
                turns += 1
        finally:
            guarded.close()
    print(f"{turns} guarded turns of {n_calls} calls in {seconds:.0f} s", flush=True)


_PATH_PREFIX = re.compile(r"(?:/[^\s\"'<>()]*?/)?(?:site-packages|dist-packages|lib/python3\.\d+)/")


def _relative_paths(svg: str) -> str:
    """`svg` with every file name made relative to its package root (no machine paths)."""
    svg = svg.replace(str(ROOT) + os.sep, "")
    return _PATH_PREFIX.sub("", svg)


def flame(seconds: float = 20.0, out: Path = FLAME_PATH, rate: int = 250) -> Path:
    """Sample a child running guarded 5-call turns with py-spy; write the flame graph SVG."""
    spy = shutil.which("py-spy") or (
        str(Path(sys.executable).with_name("py-spy"))
        if Path(sys.executable).with_name("py-spy").exists() else None)
    if spy is None:
        raise BenchmarkSkipped("py-spy not installed: pip install -r benchmarks/requirements.txt")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="graph-durable-flame-") as workdir:
        raw = Path(workdir) / "flame.svg"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        subprocess.run(
            [spy, "record", "--rate", str(rate), "--function", "--format", "flamegraph",
             "--output", str(raw),
             "--", sys.executable, "-m", "benchmarks.guard_breakdown", "loop", str(seconds)],
            cwd=ROOT, env=env, check=True)
        out.write_text(_relative_paths(raw.read_text(encoding="utf-8")), encoding="utf-8")
    return out


def _cli(argv: Sequence[str]) -> int:
    if argv[:1] == ["loop"]:
        _loop(float(argv[1]) if len(argv) > 1 else 20.0)
        return 0
    if argv[:1] == ["flame"]:
        try:
            path = flame(float(argv[1]) if len(argv) > 1 else 20.0,
                         Path(argv[2]) if len(argv) > 2 else FLAME_PATH)
        except BenchmarkSkipped as exc:
            print(f"SKIPPED: {exc}")
            return 0
        print(f"wrote {path}")
        return 0
    try:
        main()
    except BenchmarkSkipped as exc:
        print(f"SKIPPED: {exc}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_cli(sys.argv[1:]))
