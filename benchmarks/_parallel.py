"""Drivers the concurrency benchmarks share: many agent threads run at once in Python
threads, and each finished turn checked (`sqlite_workers`, `postgres_workers`)."""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage

from benchmarks.turn_overhead import Agent

__all__ = ["check_outputs", "run_threads"]


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
            applied = agent.saver.effects(thread_id, status="applied")
            if len(applied) != 1:
                raise RuntimeError(f"guarded: {thread_id} has {len(applied)} applied "
                                   f"effects, expected 1")


def run_threads(agent: Agent, tag: str, turns: int, parallel: int) -> float:
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
