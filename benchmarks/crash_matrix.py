"""What the fault-injection kit costs: the demo's crash matrices, single points and pairs.

Workload: `crash_matrix("graph_durable.demo.ticket:build_ticket_agent")` with its
default modes (tickets `lookup`, email `dedupe`) and `workers=2`, as the docs'
figures are measured: every fault point the fault-free run reaches (34), then with
`pairs=True` every pair (about 620 runs: a crash at a point, then a crash at each point
the first resuming process reaches). Each run is real child processes SIGKILLed at
their points and resumed, and a comparison of the provider's side, the ledger and the
final state with the fault-free run; every report must be ok.

Timed: the wall time of each `crash_matrix` call, `REPETITIONS` times each, the two
kinds alternating, and the CPU time its processes used (this one and every child: fork
servers and the runs they forked). Reported per matrix: the median wall time against
the target (10 s for the points, 60 s for the pairs, on 2 cores), and the median CPU
time over 2 cores against the same target: the wall time the sweep would take at the
least if it had both cores to itself. On a machine that other work keeps busy the two
differ (the sweep gets a share of the cores); the second does not depend on that load.

Run: `python -m benchmarks crash_matrix` (or `python -m benchmarks.crash_matrix`).
"""

from __future__ import annotations

import os
import statistics
import time

from benchmarks._runner import Comparison, report, run_main
from graph_durable.testing.crash.matrix import crash_matrix

__all__ = ["CORES", "REPETITIONS", "SCENARIO", "TARGETS", "WORKERS", "main"]

SCENARIO = "graph_durable.demo.ticket:build_ticket_agent"
REPETITIONS = int(os.environ.get("BENCH_CRASH_MATRIX_REPETITIONS", "3"))
WORKERS = 2
CORES = 2
TARGETS = {"points": 10.0, "pairs": 60.0}
"""Seconds each matrix should take at most on 2 cores."""


def _sweep(pairs: bool) -> tuple[float, float, int]:
    """One matrix: wall seconds, CPU seconds of this process and its children, rows."""
    before, started = os.times(), time.perf_counter()
    matrix = crash_matrix(SCENARIO, workers=WORKERS, pairs=pairs, progress=False)
    wall, after = time.perf_counter() - started, os.times()
    if not matrix.ok:
        raise RuntimeError(f"the demo's crash matrix failed:\n{matrix.failures()}")
    cpu = sum(getattr(after, f) - getattr(before, f)
              for f in ("user", "system", "children_user", "children_system"))
    return wall, cpu, len(matrix.rows)


def main() -> list[Comparison]:
    """Time both matrices, alternating, `REPETITIONS` times; report medians vs targets."""
    walls: dict[str, list[float]] = {"points": [], "pairs": []}
    cpus: dict[str, list[float]] = {"points": [], "pairs": []}
    rows: dict[str, int] = {}
    for rep in range(REPETITIONS):
        for kind in ("points", "pairs"):
            wall, cpu, rows[kind] = _sweep(kind == "pairs")
            walls[kind].append(wall)
            cpus[kind].append(cpu)
            print(f"  rep {rep + 1}/{REPETITIONS}: {kind} {rows[kind]} runs in {wall:.1f} s "
                  f"({cpu:.1f} s of CPU)", flush=True)
    comparisons = []
    for kind, what in (("points", "every point"), ("pairs", "every point and pair")):
        median = statistics.median(walls[kind])
        cpu = statistics.median(cpus[kind])
        scenario = f"demo ticket agent, {what}, workers={WORKERS}"
        details = {"walls_s": walls[kind], "cpu_s": cpus[kind], "runs": rows[kind],
                   "workers": WORKERS}
        comparisons.append(Comparison(
            scenario=f"{scenario}: wall time of the matrix",
            stock_ms=TARGETS[kind], guarded_ms=median, target=1.0,
            labels=("target", "median"), unit="s", guarded_samples_ms=walls[kind],
            note=(f"{rows[kind]} runs (last repetition); wall "
                  f"{', '.join(f'{w:.1f}' for w in walls[kind])} s; "
                  f"{cpu / median:.2f} cores busy on average"),
            details=details))
        comparisons.append(Comparison(
            scenario=f"{scenario}: CPU time of its processes / {CORES} cores",
            stock_ms=TARGETS[kind], guarded_ms=cpu / CORES, target=1.0,
            labels=("target", "median"), unit="s",
            guarded_samples_ms=[c / CORES for c in cpus[kind]],
            note=(f"CPU {', '.join(f'{c:.1f}' for c in cpus[kind])} s; "
                  f"{cpu / rows[kind] * 1000:.0f} ms per run"),
            details=details))
    report(f"crash_matrix on {SCENARIO} (default modes), workers={WORKERS}",
           comparisons, benchmark="crash_matrix")
    return comparisons


if __name__ == "__main__":
    raise SystemExit(run_main(main))
