"""SQLite under concurrency: 8 agents driven at once on one SQLite file, guarded vs stock.

The turn is the 1-tool-call turn of `benchmarks.turn_overhead` (model -> tools -> model,
`durability="sync"`), every turn on a thread_id of its own, never used before. Each
variant has its own SQLite file, one saver on one connection, and one compiled graph
that all 8 agents share:

- threads: `PARALLEL` (8) Python threads each run `BENCH_PARALLEL_TURNS` (default 40)
  turns with `invoke`; stock is `ToolNode` + `SqliteSaver`, guarded `EffectGuardNode`
  (the tool `Effect(idempotent=True)`) + `DurableSqliteSaver`, both on one
  `sqlite3` connection opened with `check_same_thread=False`.
- asyncio tasks: `PARALLEL` tasks on one event loop each run as many turns with
  `ainvoke` (async model node, async tool); stock is `AsyncSqliteSaver`, guarded
  `AsyncDurableSqliteSaver`, both on one aiosqlite connection.

Each variant gets one checked turn and an untimed warm-up run of `WARMUP_TURNS` turns
per agent. Then `REPETITIONS` runs per variant alternate (A B, B A, ...); a run is timed
from releasing the 8 agents until the last has finished, and its outputs are checked
afterwards (untimed; a sample of guarded threads must hold its one applied effect).
Reported: the median over the runs of the wall time per turn (run time / turns of all
agents). The target is on throughput, guarded/stock turns per second >= 0.85; the
harness's ratio is measured/baseline with a target to stay at or below, so the row holds
wall time per turn and its target is the same condition, guarded/stock time <= 1 / 0.85.
Turns per second of both variants and their ratio are printed under the table and kept
in `latest.json` (`details`).

Run: `python -m benchmarks sqlite_workers` (or `python -m benchmarks.sqlite_workers`).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver

from benchmarks._parallel import (
    PARALLEL,
    REPETITIONS,
    TURNS_PER_THREAD,
    measure_parallel,
    run_tasks,
    run_threads,
)
from benchmarks._runner import Comparison, report, run_main
from benchmarks.turn_overhead import (
    Agent,
    AsyncAgent,
    _guarded_node,
    _stock_node,
    build_async_guarded,
    build_async_stock,
    build_sqlite,
)
from graph_durable import DurableSqliteSaver

__all__ = [
    "PARALLEL",
    "REPETITIONS",
    "TARGET_THROUGHPUT",
    "TURNS_PER_THREAD",
    "main",
    "measure_parallel",
]

TARGET_THROUGHPUT = 0.85
"""The project's target: guarded/stock turns per second at least this."""


def _build_threads(name: str, db_path: str) -> Agent:
    if name == "guarded":
        return build_sqlite(name, db_path, 1, DurableSqliteSaver, _guarded_node())
    return build_sqlite(name, db_path, 1, SqliteSaver, _stock_node())

def _run_tasks(agent: Agent, tag: str, turns: int) -> float:
    """`run_tasks` on the agent's own event loop."""
    assert isinstance(agent, AsyncAgent) and agent.loop is not None
    return run_tasks(agent, tag, turns, agent.loop.run_until_complete)


def _details() -> dict[str, Any]:
    return {"agents": PARALLEL, "turns_per_agent": TURNS_PER_THREAD}


def main() -> list[Comparison]:
    """Run both scenarios, print the table and append the rows to `results.md`."""
    comparisons: list[Comparison] = []
    with tempfile.TemporaryDirectory(prefix="graph-durable-bench-") as workdir:
        print(f"{PARALLEL} Python threads on one SQLite file, {REPETITIONS} x "
              f"{PARALLEL} x {TURNS_PER_THREAD} turns per variant", flush=True)
        agents = {name: _build_threads(name, os.path.join(workdir, f"{name}-threads.sqlite"))
                  for name in ("stock", "guarded")}
        comparisons.append(measure_parallel(
            agents, run_threads,
            f"sqlite, {PARALLEL} threads on one file: wall time per turn, 1 tool call",
            target_throughput=TARGET_THROUGHPUT, details=_details()))
        print(f"{PARALLEL} asyncio tasks on one SQLite file, {REPETITIONS} x "
              f"{PARALLEL} x {TURNS_PER_THREAD} turns per variant", flush=True)
        loop = asyncio.new_event_loop()
        try:
            agents = {
                "stock": build_async_stock(os.path.join(workdir, "stock-tasks.sqlite"), 1,
                                           loop),
                "guarded": build_async_guarded(
                    os.path.join(workdir, "guarded-tasks.sqlite"), 1, loop),
            }
            comparisons.append(measure_parallel(
                agents, _run_tasks,
                f"sqlite, {PARALLEL} asyncio tasks on one file: wall time per turn, "
                "1 tool call", target_throughput=TARGET_THROUGHPUT, details=_details()))
        finally:
            loop.close()
    report("SQLite under concurrency: 8 agents at once on one file, guarded "
           "(EffectGuardNode + DurableSqliteSaver / AsyncDurableSqliteSaver) vs stock "
           "(ToolNode + SqliteSaver / AsyncSqliteSaver), durability='sync'", comparisons,
           benchmark="sqlite_workers")
    return comparisons


if __name__ == "__main__":
    raise SystemExit(run_main(main))
