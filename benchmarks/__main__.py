"""`python -m benchmarks [name ...]`: run every benchmark in `MODULES`, or the ones named."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from benchmarks._runner import run_modules

__all__ = ["MODULES", "main"]

MODULES: tuple[str, ...] = ("turn_overhead",)
"""Benchmark modules of this package, in the order `python -m benchmarks` runs them."""


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run the chosen benchmarks."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Run graph_durable benchmarks; results are appended to "
        "benchmarks/results.md.",
    )
    parser.add_argument(
        "names",
        nargs="*",
        metavar="name",
        help=f"benchmarks to run (default: all of {', '.join(MODULES)})",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in MODULES]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from "
                     f"{', '.join(MODULES)}")
    run_modules(args.names or list(MODULES))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
