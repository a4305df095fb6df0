"""`python -m benchmarks [name ...]`: run every benchmark in `MODULES`, or the ones named.

`python -m benchmarks plot` draws `benchmarks/overhead.png` from `benchmarks/latest.json`
(the latest run of each benchmark); a full run draws it at the end too. A benchmark
whose package is missing (see `benchmarks/requirements.txt`) is skipped with a message.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from benchmarks._runner import BenchmarkSkipped, run_modules

__all__ = ["COMMANDS", "MODULES", "main"]

MODULES: tuple[str, ...] = (
    "turn_overhead",
    "tool_dispatch",
    "guard_breakdown",
    "telemetry_overhead",
    "turn_overhead_postgres",
    "postgres_workers",
    "sqlite_workers",
    "dbos_step",
    "recovery",
    "ledger_scale",
    "fault_points",
    "crash_matrix",
    "memory",
)
"""Benchmark modules of this package, in the order `python -m benchmarks` runs them."""

COMMANDS: tuple[str, ...] = ("plot",)
"""Names that are not benchmarks: `plot` draws benchmarks/overhead.png."""


def _plot() -> None:
    from benchmarks import plot

    try:
        print(f"wrote {plot.plot()}")
    except BenchmarkSkipped as exc:
        print(f"SKIPPED plot: {exc}")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run the chosen benchmarks."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Run graph_durable benchmarks; results are appended to "
        "benchmarks/results.md and the latest run of each is kept in "
        "benchmarks/latest.json. `plot` draws benchmarks/overhead.png from it.",
    )
    parser.add_argument(
        "names",
        nargs="*",
        metavar="name",
        help=f"benchmarks to run (default: all of {', '.join(MODULES)}, then plot), "
        "or `plot`",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in (*MODULES, *COMMANDS)]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from "
                     f"{', '.join((*MODULES, *COMMANDS))}")
    names = [name for name in args.names if name in MODULES]
    if names or not args.names:
        run_modules(names or list(MODULES))
    if "plot" in args.names or not args.names:
        _plot()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
