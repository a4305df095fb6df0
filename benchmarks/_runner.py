"""Shared helpers for the benchmarks: timing, medians, machine info, the results file.

A benchmark compares a *stock* and a *guarded* variant of the same workload. It builds
one zero-argument callable per variant, lets `measure_interleaved` time them in
alternation (A B A B ...), wraps the medians in `Comparison`s, then calls `report`,
which prints a table and appends one markdown row per comparison to `results.md`.
"""

from __future__ import annotations

import gc
import importlib
import importlib.metadata
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

__all__ = [
    "RESULTS_PATH",
    "Comparison",
    "MachineInfo",
    "append_results",
    "machine_info",
    "measure_interleaved",
    "median_ms",
    "package_version",
    "print_table",
    "report",
    "run_modules",
    "time_per_call",
]

RESULTS_PATH = Path(__file__).with_name("results.md")

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


def machine_info() -> MachineInfo:
    """Describe this machine, interpreter and the versions under test."""
    return MachineInfo(
        date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        machine=platform.platform(),
        cpus=os.cpu_count() or 0,
        python=platform.python_version(),
        langgraph=package_version("langgraph"),
        graph_durable=package_version("graph-durable"),
    )


# -- results ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """Median per-turn time of the stock and guarded variants of one scenario."""

    scenario: str
    stock_ms: float
    guarded_ms: float
    target: float | None = None
    """Ratio guarded/stock the scenario should stay at or below (reported, not asserted)."""
    stock_samples_ms: Sequence[float] = field(default=(), compare=False)
    guarded_samples_ms: Sequence[float] = field(default=(), compare=False)

    @property
    def ratio(self) -> float:
        """Guarded time over stock time."""
        return self.guarded_ms / self.stock_ms

    @property
    def verdict(self) -> str:
        """`PASS`, `ABOVE TARGET`, or `-` when the scenario has no target."""
        if self.target is None:
            return "-"
        return "PASS" if self.ratio <= self.target else "ABOVE TARGET"


def _spread(samples_ms: Sequence[float]) -> str:
    if not samples_ms:
        return ""
    return f"[{min(samples_ms):.2f}..{max(samples_ms):.2f}]"


def print_table(title: str, comparisons: Sequence[Comparison], info: MachineInfo) -> None:
    """Print the comparisons as an aligned table, with the machine they ran on."""
    print()
    print(title)
    print(
        f"{info.machine} | {info.cpus} cpus | python {info.python} | "
        f"langgraph {info.langgraph} | graph_durable {info.graph_durable}"
    )
    header = (
        f"{'scenario':<24} {'stock ms':>9} {'guarded ms':>10} {'ratio':>6} "
        f"{'target':>6}  verdict"
    )
    print(header)
    print("-" * len(header))
    for c in comparisons:
        target = "-" if c.target is None else f"{c.target:.2f}"
        print(
            f"{c.scenario:<24} {c.stock_ms:>9.2f} {c.guarded_ms:>10.2f} {c.ratio:>6.3f} "
            f"{target:>6}  {c.verdict}"
        )
    for c in comparisons:
        if c.stock_samples_ms and len(c.stock_samples_ms) == len(c.guarded_samples_ms):
            ratios = [g / s for s, g in zip(c.stock_samples_ms, c.guarded_samples_ms)]
            print(
                f"  {c.scenario}: stock min..max {_spread(c.stock_samples_ms)} ms, "
                f"guarded min..max {_spread(c.guarded_samples_ms)} ms, "
                f"ratio per repetition {_spread(ratios)}"
            )


def append_results(
    comparisons: Sequence[Comparison], info: MachineInfo, path: Path = RESULTS_PATH
) -> None:
    """Append one markdown row per comparison to `path` (created with a header if new)."""
    rows = [
        f"| {info.date} | {info.machine} | {info.cpus} | {info.python} | {info.langgraph} "
        f"| {info.graph_durable} | {c.scenario} | {c.stock_ms:.2f} | {c.guarded_ms:.2f} "
        f"| {c.ratio:.3f} |\n"
        for c in comparisons
    ]
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", encoding="utf-8") as out:
        if new:
            out.write(_RESULTS_HEADER)
        out.writelines(rows)


def report(title: str, comparisons: Sequence[Comparison]) -> MachineInfo:
    """Print the table and append the rows to `results.md`; return the machine info."""
    info = machine_info()
    print_table(title, comparisons, info)
    append_results(comparisons, info)
    print(f"appended {len(comparisons)} row(s) to {RESULTS_PATH}")
    return info


# -- running modules -------------------------------------------------------------------


def run_modules(names: Sequence[str]) -> dict[str, list[Comparison]]:
    """Import `benchmarks.<name>` for each name and call its `main()`."""
    results: dict[str, list[Comparison]] = {}
    for name in names:
        module = importlib.import_module(f"benchmarks.{name}")
        print(f"== {name} ==", flush=True)
        started = time.perf_counter()
        results[name] = module.main()
        print(f"== {name}: {time.perf_counter() - started:.1f} s ==", flush=True)
    sys.stdout.flush()
    return results
