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
import gc
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver

from benchmarks._parallel import check_outputs, run_threads
from benchmarks._runner import Comparison, report, run_main
from benchmarks.turn_overhead import (
    Agent,
    AsyncAgent,
    _check,
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

PARALLEL = 8
"""Agents (Python threads, or asyncio tasks) running turns at once."""

TURNS_PER_THREAD = int(os.environ.get("BENCH_PARALLEL_TURNS", "40"))
"""Turns each agent runs in one timed run (`BENCH_PARALLEL_TURNS`)."""

WARMUP_TURNS = 3
"""Turns per agent of the untimed warm-up run of each variant."""

REPETITIONS = 5
"""Timed runs per variant (odd, so the median is one run); the median is reported."""

TARGET_THROUGHPUT = 0.85
"""The project's target: guarded/stock turns per second at least this."""


def _build_threads(name: str, db_path: str) -> Agent:
    if name == "guarded":
        return build_sqlite(name, db_path, 1, DurableSqliteSaver, _guarded_node())
    return build_sqlite(name, db_path, 1, SqliteSaver, _stock_node())

def _run_threads(agent: Agent, tag: str, turns: int) -> float:
    """Run `turns` turns in each of `PARALLEL` Python threads at once; the wall seconds."""
    return run_threads(agent, tag, turns, PARALLEL)


def _run_tasks(agent: Agent, tag: str, turns: int) -> float:
    """Run `turns` turns in each of `PARALLEL` asyncio tasks at once; the wall seconds."""
    assert isinstance(agent, AsyncAgent) and agent.loop is not None
    outputs: dict[str, dict[str, Any]] = {}

    async def work(i: int) -> None:
        for n in range(turns):
            thread_id = f"{tag}-w{i}-{n}"
            outputs[thread_id] = await agent.graph.ainvoke(
                agent.inputs, {"configurable": {"thread_id": thread_id}}, durability="sync")

    async def run_all() -> float:
        start = time.perf_counter()
        await asyncio.gather(*(work(i) for i in range(PARALLEL)))
        return time.perf_counter() - start

    gc.collect()
    elapsed = agent.loop.run_until_complete(run_all())
    check_outputs(agent, outputs, PARALLEL * turns)
    return elapsed


def measure_parallel(
    agents: dict[str, Agent],
    run: Callable[[Agent, str, int], float],
    scenario: str,
    *,
    repetitions: int = REPETITIONS,
    turns: int = TURNS_PER_THREAD,
    warmup: int = WARMUP_TURNS,
    progress: Callable[[str], None] | None = print,
) -> Comparison:
    """Time `PARALLEL` agents of turns at once, stock and guarded runs alternating."""
    total = PARALLEL * turns
    samples: dict[str, list[float]] = {name: [] for name in agents}
    try:
        for agent in agents.values():
            _check(agent, 1)
        for name, agent in agents.items():
            run(agent, f"{name}-warmup", warmup)
        for rep in range(repetitions):
            names = list(agents) if rep % 2 == 0 else list(reversed(agents))
            for name in names:
                samples[name].append(run(agents[name], f"{name}-r{rep}", turns))
            if progress is not None:
                progress(f"  rep {rep + 1}/{repetitions}: " + ", ".join(
                    f"{name} {total / samples[name][-1]:.0f} turns/s "
                    f"({samples[name][-1] / total * 1000:.2f} ms/turn)" for name in agents))
    finally:
        for agent in agents.values():
            agent.close()
    per_turn = {name: [s / total * 1000 for s in runs] for name, runs in samples.items()}
    rate = {name: total / statistics.median(runs) for name, runs in samples.items()}
    throughput_ratio = rate["guarded"] / rate["stock"]
    verdict = "PASS" if throughput_ratio >= TARGET_THROUGHPUT else "BELOW TARGET"
    return Comparison(
        scenario=scenario,
        stock_ms=statistics.median(per_turn["stock"]),
        guarded_ms=statistics.median(per_turn["guarded"]),
        target=round(1 / TARGET_THROUGHPUT, 2),
        stock_samples_ms=per_turn["stock"],
        guarded_samples_ms=per_turn["guarded"],
        note=(f"throughput: stock {rate['stock']:.1f} turns/s, guarded "
              f"{rate['guarded']:.1f} turns/s, guarded/stock {throughput_ratio:.3f} "
              f"(target >= {TARGET_THROUGHPUT:.2f}: {verdict}); {total} turns per run"),
        details={"turns_per_s": rate, "throughput_ratio": throughput_ratio,
                 "throughput_target": TARGET_THROUGHPUT, "agents": PARALLEL,
                 "turns_per_agent": turns, "run_s": samples},
    )


def main() -> list[Comparison]:
    """Run both scenarios, print the table and append the rows to `results.md`."""
    comparisons: list[Comparison] = []
    with tempfile.TemporaryDirectory(prefix="graph-durable-bench-") as workdir:
        print(f"{PARALLEL} Python threads on one SQLite file, {REPETITIONS} x "
              f"{PARALLEL} x {TURNS_PER_THREAD} turns per variant", flush=True)
        agents = {name: _build_threads(name, os.path.join(workdir, f"{name}-threads.sqlite"))
                  for name in ("stock", "guarded")}
        comparisons.append(measure_parallel(
            agents, _run_threads,
            f"sqlite, {PARALLEL} threads on one file: wall time per turn, 1 tool call"))
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
                "1 tool call"))
        finally:
            loop.close()
    report("SQLite under concurrency: 8 agents at once on one file, guarded "
           "(EffectGuardNode + DurableSqliteSaver / AsyncDurableSqliteSaver) vs stock "
           "(ToolNode + SqliteSaver / AsyncSqliteSaver), durability='sync'", comparisons,
           benchmark="sqlite_workers")
    return comparisons


if __name__ == "__main__":
    raise SystemExit(run_main(main))
