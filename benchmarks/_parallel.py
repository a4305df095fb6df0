"""What the concurrency benchmarks share (`sqlite_workers`, `postgres_workers`): many
agents' turns run at once, in Python threads or asyncio tasks, each finished turn checked,
and stock and guarded runs alternated and compared by throughput."""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage

from benchmarks._runner import Comparison, Timing
from benchmarks.turn_overhead import Agent, _check

__all__ = [
    "PARALLEL",
    "REPETITIONS",
    "TIMING",
    "TURNS_PER_THREAD",
    "WARMUP_TURNS",
    "check_outputs",
    "measure_parallel",
    "run_tasks",
    "run_threads",
]

PARALLEL = 8
"""Agents running turns at once (Python threads or asyncio tasks), and the size of the
connection pool they share where there is one."""

TURNS_PER_THREAD = int(os.environ.get("BENCH_PARALLEL_TURNS", "40"))
"""Turns each agent runs in one timed run (`BENCH_PARALLEL_TURNS`)."""

WARMUP_TURNS = 3
"""Turns per agent of the untimed warm-up run of each variant."""

REPETITIONS = 5
"""Timed runs per variant (odd, so the median is one run); the median is reported."""

TIMING = Timing(REPETITIONS, TURNS_PER_THREAD, WARMUP_TURNS)
"""The timing of a parallel comparison: `turns` is per agent, `warmup` too."""


def check_outputs(agent: Any, outputs: dict[str, dict[str, Any]], expected: int) -> None:
    """Every turn of a run ended with one successful tool message and the final answer;
    for the guarded variant, a sample of threads has its one effect applied."""
    if len(outputs) != expected:
        raise RuntimeError(f"{agent.name}: {len(outputs)} turns finished, expected {expected}")
    for thread_id, out in outputs.items():
        messages = out["messages"]
        tools = [m for m in messages if isinstance(m, ToolMessage)]
        if (len(tools) != 1 or tools[0].status != "success"
                or not isinstance(messages[-1], AIMessage) or messages[-1].tool_calls):
            raise RuntimeError(f"{agent.name}: turn on {thread_id} is not as expected: "
                               f"{messages!r}")
    if agent.name == "guarded":
        for thread_id in list(outputs)[:: max(1, expected // 16)]:
            applied = agent.applied(thread_id)
            if applied != 1:
                raise RuntimeError(f"guarded: {thread_id} has {applied} applied "
                                   f"effects, expected 1")


def run_threads(agent: Agent, tag: str, turns: int, parallel: int = PARALLEL) -> float:
    """Run `turns` turns in each of `parallel` Python threads at once; the wall seconds.

    Thread ids are `{tag}-w{i}-{n}`: a tag of its own makes every run's threads new.
    The clock starts when every thread is ready, and the outputs are checked after.
    """
    barrier = threading.Barrier(parallel + 1)
    outputs: dict[str, dict[str, Any]] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        ids = [f"{tag}-w{i}-{n}" for n in range(turns)]
        mine: dict[str, dict[str, Any]] = {}
        barrier.wait()
        try:
            for thread_id in ids:
                mine[thread_id] = agent.graph.invoke(
                    agent.inputs, {"configurable": {"thread_id": thread_id}},
                    durability="sync")
        except BaseException as exc:  # reported by the caller
            errors.append(exc)
        outputs.update(mine)

    threads = [threading.Thread(target=work, args=(i,), name=f"{tag}-w{i}")
               for i in range(parallel)]
    for thread in threads:
        thread.start()
    gc.collect()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{agent.name}: a turn failed in run {tag}") from errors[0]
    check_outputs(agent, outputs, parallel * turns)
    return elapsed


def run_tasks(agent: Any, tag: str, turns: int,
              run_on_loop: Callable[[Coroutine[Any, Any, float]], float]) -> float:
    """`run_threads` with `PARALLEL` asyncio tasks on the agent's event loop (on which
    `run_on_loop` runs a coroutine to its end); the wall seconds."""
    outputs: dict[str, dict[str, Any]] = {}

    async def run_all() -> float:
        go = asyncio.Event()

        async def work(i: int) -> None:
            await go.wait()
            for n in range(turns):
                thread_id = f"{tag}-w{i}-{n}"
                outputs[thread_id] = await agent.graph.ainvoke(
                    agent.inputs, {"configurable": {"thread_id": thread_id}},
                    durability="sync")

        tasks = [asyncio.create_task(work(i)) for i in range(PARALLEL)]
        await asyncio.sleep(0)  # every task is waiting for `go`
        gc.collect()
        start = time.perf_counter()
        go.set()
        await asyncio.gather(*tasks)
        return time.perf_counter() - start

    try:
        elapsed = run_on_loop(run_all())
    except BaseException as exc:
        raise RuntimeError(f"{agent.name}: a turn failed in run {tag}") from exc
    check_outputs(agent, outputs, PARALLEL * turns)
    return elapsed


def measure_parallel(
    agents: dict[str, Any],
    run: Callable[[Any, str, int], float],
    scenario: str,
    *,
    target_throughput: float,
    details: dict[str, Any],
    timing: Timing = TIMING,
) -> Comparison:
    """Time `PARALLEL` agents' turns at once (`run(agent, tag, turns)` gives a run's wall
    seconds), stock and guarded runs alternating, then close the agents; the comparison
    holds the ms per turn, its note and `details` the throughputs against
    `target_throughput` (guarded/stock turns per second at least this)."""
    total = PARALLEL * timing.turns
    samples: dict[str, list[float]] = {name: [] for name in agents}
    try:
        for agent in agents.values():
            _check(agent, 1)
        for name, agent in agents.items():
            run(agent, f"{name}-warmup", timing.warmup)
        for rep in range(timing.repetitions):
            names = list(agents) if rep % 2 == 0 else list(reversed(agents))
            for name in names:
                samples[name].append(run(agents[name], f"{name}-r{rep}", timing.turns))
            if timing.progress is not None:
                timing.progress(f"  rep {rep + 1}/{timing.repetitions}: " + ", ".join(
                    f"{name} {total / samples[name][-1]:.0f} turns/s "
                    f"({samples[name][-1] / total * 1000:.2f} ms/turn)" for name in agents))
    finally:
        for agent in agents.values():
            agent.close()
    per_turn = {name: [s / total * 1000 for s in runs] for name, runs in samples.items()}
    rate = {name: total / statistics.median(runs) for name, runs in samples.items()}
    throughput_ratio = rate["guarded"] / rate["stock"]
    verdict = "PASS" if throughput_ratio >= target_throughput else "BELOW TARGET"
    return Comparison.of_samples(
        scenario, per_turn["stock"], per_turn["guarded"],
        target=round(1 / target_throughput, 2),
        note=(f"throughput: stock {rate['stock']:.1f} turns/s, guarded "
              f"{rate['guarded']:.1f} turns/s, guarded/stock {throughput_ratio:.3f} "
              f"(target >= {target_throughput:.2f}: {verdict}); {total} turns per run"),
        details={"turns_per_s": rate, "throughput_ratio": throughput_ratio,
                 "throughput_target": target_throughput, **details, "run_s": samples},
    )
