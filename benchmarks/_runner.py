"""Shared helpers for the benchmarks: timing, medians, machine info, the results file.

A benchmark compares a *stock* and a *guarded* variant of the same workload. It builds
one zero-argument callable per variant, lets `measure_interleaved` time them in
alternation (A B A B ...), wraps the medians in `Comparison`s, then calls `report`,
which prints a table and appends one markdown row per comparison to `results.md`.

Not every benchmark is stock vs guarded: a `Comparison` names its two sides
(`labels`, e.g. DBOS step vs ledger effect, or 10 vs 10,000 earlier turns) and its
`unit` (ms, bytes, MB). `report(..., benchmark=name)` also records the results in
`latest.json`, which `python -m benchmarks plot` draws. A benchmark that needs a package
which is not installed calls `require(...)`, and `run_modules` skips it with a message.
"""

from __future__ import annotations

import gc
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = [
    "LATEST_PATH",
    "REQUIREMENTS_PATH",
    "RESULTS_PATH",
    "BenchmarkSkipped",
    "Comparison",
    "MachineInfo",
    "Timing",
    "append_results",
    "commit_latency_ms",
    "missing_packages",
    "record_latest",
    "require",
    "run_main",
    "spawn_child",
    "machine_info",
    "measure_interleaved",
    "median_ms",
    "package_version",
    "print_table",
    "report",
    "run_modules",
    "time_per_call",
]

ROOT = Path(__file__).resolve().parents[1]
"""The repository's root, where a child benchmark process starts."""
RESULTS_PATH = Path(__file__).with_name("results.md")
LATEST_PATH = Path(__file__).with_name("latest.json")
REQUIREMENTS_PATH = Path(__file__).with_name("requirements.txt")

_RESULTS_HEADER = (
    "# Benchmark results\n"
    "\n"
    "Appended by `python -m benchmarks`; one row per scenario and run. Times are the\n"
    "median over repetitions of the mean time per turn, in milliseconds.\n"
    "\n"
    "| date | machine | cpus | python | langgraph | graph_durable | scenario "
    "| stock ms | guarded ms | ratio |\n"
    "|---|---|---|---|---|---|---|---:|---:|---:|\n"
)

# Every benchmark's rows, whatever it measures: each side is named in its cell, with
# its unit. Appended after the first table (whose rows are kept as they were).
_TABLE_HEADER = (
    "| date | machine | cpus | python | langgraph | graph_durable | context "
    "| benchmark | scenario | baseline | measured | ratio | target | verdict |\n"
)
_RESULTS_SECTION = (
    "\n"
    "## All benchmarks\n"
    "\n"
    "One row per scenario and run. `baseline` and `measured` name the two sides compared\n"
    "and their unit (medians over repetitions unless the scenario says otherwise);\n"
    "`ratio` is measured / baseline, and `target` is the ratio it should stay at or\n"
    "below (printed and recorded, not asserted). `context` has the versions not in a\n"
    "column of their own and `commit`, the median time of one durable SQLite commit\n"
    "(WAL, synchronous=FULL) measured when the row was written: the disk's fsync\n"
    "latency, which decides most of these numbers and varies with other load.\n"
    "\n"
    + _TABLE_HEADER
    + "|---|---|---|---|---|---|---|---|---|---:|---:|---:|---:|---|\n"
)


# -- timing ----------------------------------------------------------------------------


def time_per_call(fn: Callable[[], object], n: int) -> float:
    """Seconds per call of `fn`, averaged over `n` back-to-back calls.

    A full garbage collection runs first, outside the timed region, so that one block
    does not pay for the garbage of the block before it.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    gc.collect()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def median_ms(samples_s: Iterable[float]) -> float:
    """The median of samples given in seconds, in milliseconds."""
    values = list(samples_s)
    if not values:
        raise ValueError("no samples")
    return statistics.median(values) * 1000.0


def measure_interleaved(
    cases: Mapping[str, Callable[[], object]],
    *,
    repetitions: int,
    turns: int,
    warmup: int,
    progress: Callable[[str], None] | None = None,
) -> dict[str, list[float]]:
    """Time the cases in alternation; return `{case: [seconds per call, per repetition]}`.

    Every case is first called `warmup` times (untimed, alternating). Then each of the
    `repetitions` runs `turns` rounds; a round calls every case once, in alternating
    order (A B, B A, A B, ...), timing each call on its own. A repetition's sample is a
    case's mean time per call over its rounds. Interleaving call by call, rather than
    block by block, makes slow drift of the machine (fsync latency of a shared disk,
    other processes, thermal) hit all cases alike.
    """
    if turns < 1:
        raise ValueError(f"turns must be >= 1, got {turns}")
    names = list(cases)
    for _ in range(warmup):
        for name in names:
            cases[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    clock = time.perf_counter
    for rep in range(repetitions):
        totals = dict.fromkeys(names, 0.0)
        gc.collect()
        for round_ in range(turns):
            for name in names if round_ % 2 == 0 else reversed(names):
                fn = cases[name]
                start = clock()
                fn()
                totals[name] += clock() - start
        for name in names:
            samples[name].append(totals[name] / turns)
        if progress is not None:
            done = ", ".join(f"{name} {samples[name][-1] * 1000:.2f} ms" for name in names)
            progress(f"  rep {rep + 1}/{repetitions}: {done}")
    return samples


@dataclass(frozen=True)
class Timing:
    """How a comparison is timed (`measure_interleaved`): warm-up calls, then repetitions
    of rounds, reported through `progress` (None: silent)."""

    repetitions: int
    turns: int
    warmup: int
    progress: Callable[[str], None] | None = print

    def interleave(self, cases: Mapping[str, Callable[[], object]]) -> dict[str, list[float]]:
        """`measure_interleaved(cases)` with these settings."""
        return measure_interleaved(cases, repetitions=self.repetitions, turns=self.turns,
                                   warmup=self.warmup, progress=self.progress)


# -- what ran where --------------------------------------------------------------------


def package_version(distribution: str) -> str:
    """The installed version of `distribution`, or `"?"` if it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "?"


@dataclass(frozen=True)
class MachineInfo:
    """Where and with what a benchmark ran."""

    date: str
    machine: str
    cpus: int
    python: str
    langgraph: str
    graph_durable: str
    sqlite: str = sqlite3.sqlite_version
    extra: Mapping[str, str] = field(default_factory=dict)
    """Versions of other packages a benchmark compares against (e.g. `dbos`)."""
    commit_ms: float | None = None
    """Median durable SQLite commit time when the info was taken (see `commit_latency_ms`)."""

    @property
    def other_versions(self) -> str:
        """`sqlite 3.x, dbos 3.y, commit 0.31 ms`: versions without a column, disk latency."""
        parts = [f"{name} {version}" for name, version in
                 {"sqlite": self.sqlite, **self.extra}.items()]
        if self.commit_ms is not None:
            parts.append(f"commit {self.commit_ms:.2f} ms")
        return ", ".join(parts)


def commit_latency_ms(commits: int = 25) -> float:
    """Median time of one durable commit to a SQLite file (WAL, synchronous=FULL), in ms.

    One small INSERT per commit, in a temporary file beside the other benchmark files:
    what one fsync costs on this disk right now. Other processes writing to the same
    disk (a test suite, another benchmark) raise it, and with it every durable number.
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix="graph-durable-probe-") as workdir:
        conn = sqlite3.connect(os.path.join(workdir, "probe.sqlite"), isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("CREATE TABLE t (x INTEGER)")
            samples = []
            for i in range(commits):
                start = time.perf_counter()
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("INSERT INTO t VALUES (?)", (i,))
                conn.execute("COMMIT")
                samples.append(time.perf_counter() - start)
        finally:
            conn.close()
    return median_ms(samples)


def machine_info(extra: Mapping[str, str] | None = None, *, probe: bool = True) -> MachineInfo:
    """Describe this machine, interpreter and the versions under test.

    With `probe`, the disk's durable commit latency is measured now (~25 commits).
    """
    return MachineInfo(
        date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        machine=platform.platform(),
        cpus=os.cpu_count() or 0,
        python=platform.python_version(),
        langgraph=package_version("langgraph"),
        graph_durable=package_version("graph-durable"),
        extra=dict(extra or {}),
        commit_ms=commit_latency_ms() if probe else None,
    )


# -- optional packages -----------------------------------------------------------------


class BenchmarkSkipped(Exception):
    """Raised by a benchmark that cannot run here; the message says why and what to do."""


def missing_packages(*modules: str) -> list[str]:
    """The modules of `modules` that cannot be imported here."""
    return [name for name in modules if importlib.util.find_spec(name) is None]


def require(*modules: str, why: str = "") -> None:
    """Raise `BenchmarkSkipped` unless every module of `modules` is importable."""
    missing = missing_packages(*modules)
    if missing:
        raise BenchmarkSkipped(
            f"{'package' if len(missing) == 1 else 'packages'} {', '.join(missing)} not "
            f"installed{f' ({why})' if why else ''}. Install the benchmarks' requirements "
            f"into this environment with `{sys.executable} -m pip install -r "
            f"{REQUIREMENTS_PATH}` (or `make bench`, which does)"
        )


# -- results ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """Two measured sides of one scenario: a baseline and what is measured against it.

    The field names come from the first benchmark (stock vs guarded turn, in ms); other
    benchmarks name their sides with `labels` and their unit with `unit`.
    """

    scenario: str
    stock_ms: float
    """The baseline's value (in `unit`)."""
    guarded_ms: float
    """The measured side's value (in `unit`)."""
    target: float | None = None
    """Ratio measured/baseline the scenario should stay at or below (reported, not asserted)."""
    stock_samples_ms: Sequence[float] = field(default=(), compare=False)
    guarded_samples_ms: Sequence[float] = field(default=(), compare=False)
    labels: tuple[str, str] = ("stock", "guarded")
    """Names of the baseline and the measured side."""
    unit: str = "ms"
    verdict_text: str | None = None
    """A verdict computed by the benchmark itself (e.g. `BELOW NOISE`), overriding the target's."""
    note: str = ""
    """One line printed under the table (not written to results.md)."""
    details: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """Anything else worth keeping in `latest.json` (per-phase times, sizes, ...)."""

    @classmethod
    def of_samples(cls, scenario: str, stock_samples_ms: Sequence[float],
                   guarded_samples_ms: Sequence[float], **fields: Any) -> Comparison:
        """The comparison of two sides' samples by their medians (other fields as given)."""
        return cls(scenario=scenario, stock_ms=statistics.median(stock_samples_ms),
                   guarded_ms=statistics.median(guarded_samples_ms),
                   stock_samples_ms=stock_samples_ms, guarded_samples_ms=guarded_samples_ms,
                   **fields)

    @property
    def ratio(self) -> float:
        """Measured over baseline (guarded time over stock time)."""
        return self.guarded_ms / self.stock_ms

    @property
    def verdict(self) -> str:
        """`PASS`, `ABOVE TARGET`, the benchmark's own verdict, or `-` with no target."""
        if self.verdict_text is not None:
            return self.verdict_text
        if self.target is None:
            return "-"
        return "PASS" if self.ratio <= self.target else "ABOVE TARGET"

    def side(self, which: int) -> str:
        """`stock 7.30 ms`: one side's label, value and unit."""
        value = (self.stock_ms, self.guarded_ms)[which]
        return f"{self.labels[which]} {_fmt(value)} {self.unit}"

    def as_json(self) -> dict[str, Any]:
        """Plain data for `latest.json`."""
        return {
            "scenario": self.scenario,
            "labels": list(self.labels),
            "unit": self.unit,
            "baseline": self.stock_ms,
            "measured": self.guarded_ms,
            "ratio": self.ratio,
            "target": self.target,
            "verdict": self.verdict,
            "baseline_samples": list(self.stock_samples_ms),
            "measured_samples": list(self.guarded_samples_ms),
            "details": dict(self.details),
        }


def _fmt(value: float) -> str:
    """A value with as many decimals as its size deserves."""
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 0.1:
        return f"{value:.2f}"
    return f"{value:.4f}"


def _spread(samples_ms: Sequence[float]) -> str:
    if not samples_ms:
        return ""
    return f"[{_fmt(min(samples_ms))}..{_fmt(max(samples_ms))}]"


def print_table(title: str, comparisons: Sequence[Comparison], info: MachineInfo) -> None:
    """Print the comparisons as an aligned table, with the machine they ran on."""
    print()
    print(title)
    print(
        f"{info.machine} | {info.cpus} cpus | python {info.python} | "
        f"langgraph {info.langgraph} | graph_durable {info.graph_durable} | "
        f"{info.other_versions}"
    )
    width = max([len("scenario"), *(len(c.scenario) for c in comparisons)])
    base_w = max([len("baseline"), *(len(c.side(0)) for c in comparisons)])
    meas_w = max([len("measured"), *(len(c.side(1)) for c in comparisons)])
    header = (
        f"{'scenario':<{width}}  {'baseline':>{base_w}}  {'measured':>{meas_w}}  "
        f"{'ratio':>6}  {'target':>6}  verdict"
    )
    print(header)
    print("-" * len(header))
    for c in comparisons:
        target = "-" if c.target is None else f"{c.target:.2f}"
        print(
            f"{c.scenario:<{width}}  {c.side(0):>{base_w}}  {c.side(1):>{meas_w}}  "
            f"{c.ratio:>6.3f}  {target:>6}  {c.verdict}"
        )
    for c in comparisons:
        if c.stock_samples_ms and len(c.stock_samples_ms) == len(c.guarded_samples_ms):
            ratios = [g / s for s, g in zip(c.stock_samples_ms, c.guarded_samples_ms)]
            print(
                f"  {c.scenario}: {c.labels[0]} min..max {_spread(c.stock_samples_ms)} "
                f"{c.unit}, {c.labels[1]} min..max {_spread(c.guarded_samples_ms)} {c.unit}, "
                f"ratio per repetition {_spread(ratios)}"
            )
        if c.note:
            print(f"  {c.scenario}: {c.note}")


def append_results(
    comparisons: Sequence[Comparison],
    info: MachineInfo,
    path: Path = RESULTS_PATH,
    *,
    benchmark: str = "",
) -> None:
    """Append one markdown row per comparison to the table `## All benchmarks` of `path`.

    The table is added (after any rows of the first table, which are kept) when the file
    does not have it yet, and the file is created with its header when new.
    """
    rows = [
        f"| {info.date} | {info.machine} | {info.cpus} | {info.python} | {info.langgraph} "
        f"| {info.graph_durable} | {info.other_versions} | {benchmark or '-'} "
        f"| {c.scenario} | {c.side(0)} | {c.side(1)} | {c.ratio:.3f} "
        f"| {'-' if c.target is None else f'{c.target:.2f}'} | {c.verdict} |\n"
        for c in comparisons
    ]
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    with path.open("a", encoding="utf-8") as out:
        if not text:
            out.write(_RESULTS_HEADER)
        if _TABLE_HEADER not in text:
            out.write(_RESULTS_SECTION)
        elif not text.endswith("\n"):
            out.write("\n")
        out.writelines(rows)


def record_latest(
    benchmark: str,
    title: str,
    comparisons: Sequence[Comparison],
    info: MachineInfo,
    path: Path = LATEST_PATH,
) -> None:
    """Store this run of `benchmark` in `latest.json` (other benchmarks' entries are kept)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except ValueError:
        data = {}
    data[benchmark] = {
        "title": title,
        "machine": {**asdict(info), "extra": dict(info.extra)},
        "comparisons": [c.as_json() for c in comparisons],
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)


def report(
    title: str,
    comparisons: Sequence[Comparison],
    *,
    benchmark: str = "",
    extra_versions: Mapping[str, str] | None = None,
) -> MachineInfo:
    """Print the table, append the rows to `results.md` and record them in `latest.json`.

    `extra_versions` names the versions of other packages compared against (e.g. dbos).
    Returns the machine info.
    """
    info = machine_info(extra_versions)
    print_table(title, comparisons, info)
    append_results(comparisons, info, benchmark=benchmark)
    print(f"appended {len(comparisons)} row(s) to {RESULTS_PATH}")
    if benchmark:
        record_latest(benchmark, title, comparisons, info)
        print(f"recorded {benchmark} in {LATEST_PATH}")
    return info


# -- running modules -------------------------------------------------------------------


def run_modules(names: Sequence[str]) -> dict[str, list[Comparison]]:
    """Import `benchmarks.<name>` for each name and call its `main()`.

    A benchmark that raises `BenchmarkSkipped` (a package it needs is missing, or what
    it compares against cannot be set up here) is reported as skipped, and the others
    still run. Skipped benchmarks are listed again at the end.
    """
    results: dict[str, list[Comparison]] = {}
    skipped: dict[str, str] = {}
    for name in names:
        print(f"== {name} ==", flush=True)
        started = time.perf_counter()
        try:
            module = importlib.import_module(f"benchmarks.{name}")
            results[name] = module.main()
        except BenchmarkSkipped as exc:
            skipped[name] = str(exc)
            print(f"SKIPPED {name}: {exc}", flush=True)
        print(f"== {name}: {time.perf_counter() - started:.1f} s ==", flush=True)
    if skipped:
        print()
        for name, why in skipped.items():
            print(f"SKIPPED {name}: {why}")
    sys.stdout.flush()
    return results


def spawn_child(module: str, spec: Mapping[str, Any], *, env: Mapping[str, str],
                stderr: Any = subprocess.PIPE) -> subprocess.Popen[str]:
    """Start `python -m module child SPEC` from the repository root (with the root on
    `PYTHONPATH` besides `env`'s), its output read as text."""
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                               env.get("PYTHONPATH")]))}
    return subprocess.Popen(
        [sys.executable, "-m", module, "child", json.dumps(spec)],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=stderr, text=True,
    )


def run_main(main: Callable[[], object],
             child: Callable[[dict[str, Any]], None] | None = None) -> int:
    """Run one benchmark's `main()` as a script: a skip is printed, exit status 0. With
    `child`, the command line `child SPEC` (`spawn_child`) runs `child(SPEC)` instead."""
    if child is not None and len(sys.argv) == 3 and sys.argv[1] == "child":
        child(json.loads(sys.argv[2]))
        return 0
    try:
        main()
    except BenchmarkSkipped as exc:
        print(f"SKIPPED: {exc}", flush=True)
    return 0
