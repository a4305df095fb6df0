"""How much of a turn is `ToolNode`'s dispatch, and what the guard costs on equal dispatch.

LangGraph's `ToolNode` runs a step's sync tool calls on a thread pool that it creates
for the step and shuts down after it (`langchain_core`'s `get_executor_for_config`):
every tools step starts, then joins, one thread per call. `EffectGuardNode` is a
`ToolNode`, so both sides of `turn_overhead` pay that. This benchmark measures it, on the
turn and the SQLite savers of `turn_overhead` (`build_stock`, `build_guarded`), by
handing the step one pool made once and reused (`ContextThreadPoolExecutor`, which
copies each call's context as the per-step pool does):

- `stock, reused pool` against stock: what the per-step pool costs a stock turn;
- `guarded, reused pool` against stock: what `turn_overhead` would report if only
  `EffectGuardNode` reused its pool (it does not: see below);
- `guarded, reused pool` against `stock, reused pool`: the guard's own overhead when
  both sides dispatch alike, which is what a reused pool leaves of `turn_overhead`'s gap.

The pool is swapped in for the timed turn only, by replacing the executor factory that
`langgraph.prebuilt.tool_node` calls, and put back at the end; nothing in the library
changes. A pool kept across steps changes what tools see (their thread-local state
outlives the step, a tool that runs a graph inside the pool must not wait on the same
pool), so the library keeps LangGraph's dispatch; the rows say what that choice costs.

Run: `python -m benchmarks tool_dispatch` (or `python -m benchmarks.tool_dispatch`).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from langchain_core.runnables.config import ContextThreadPoolExecutor
from langgraph.prebuilt import tool_node

from benchmarks._runner import Comparison, Timing, report
from benchmarks.turn_overhead import (
    SCENARIOS,
    TIMING,
    Agent,
    _announce,
    _tool_calls,
    build_guarded,
    build_stock,
    compare,
)

__all__ = ["REUSED_POOL_WORKERS", "main", "measure_dispatch", "reused_pool"]

REUSED_POOL_WORKERS = 8
"""Threads of the reused pool: more than the calls of any scenario."""


class _Dispatch:
    """`tool_node`'s executor factory, answering with one reused pool while `reuse` is set."""

    def __init__(self, pool: ContextThreadPoolExecutor) -> None:
        self.pool = pool
        self.reuse = False
        self.factory = tool_node.get_executor_for_config

    @contextmanager
    def _reused(self) -> Iterator[ContextThreadPoolExecutor]:
        yield self.pool

    def __call__(self, config: Any) -> Any:
        return self._reused() if self.reuse else self.factory(config)

    def on_reused_pool(self, agent: Agent) -> Agent:
        """`agent`, whose turns dispatch their tool calls on the reused pool."""
        run = agent.turn

        def turn() -> dict[str, Any]:
            self.reuse = True
            try:
                return run()
            finally:
                self.reuse = False

        agent.turn = turn  # type: ignore[method-assign]
        return agent


@contextmanager
def reused_pool() -> Iterator[_Dispatch]:
    """Install `_Dispatch` as `tool_node`'s executor factory; restore it on exit."""
    with ContextThreadPoolExecutor(max_workers=REUSED_POOL_WORKERS) as pool:
        dispatch = _Dispatch(pool)
        tool_node.get_executor_for_config = dispatch  # type: ignore[assignment]
        try:
            yield dispatch
        finally:
            tool_node.get_executor_for_config = dispatch.factory


def measure_dispatch(
    workdir: str,
    n_calls: int,
    dispatch: _Dispatch,
    *,
    timing: Timing = TIMING,
) -> list[Comparison]:
    """The three comparisons of the module docstring for `n_calls` tool calls a turn."""
    def stock(tag: str) -> Agent:
        return build_stock(os.path.join(workdir, f"dispatch-{n_calls}-stock-{tag}.sqlite"),
                           n_calls)

    def guarded(tag: str) -> Agent:
        return build_guarded(
            os.path.join(workdir, f"dispatch-{n_calls}-guarded-{tag}.sqlite"), n_calls)

    reused = dispatch.on_reused_pool
    sides: list[tuple[tuple[str, str], Callable[[], Agent], Callable[[], Agent]]] = [
        (("stock", "stock, reused pool"), lambda: stock("a"), lambda: reused(stock("b"))),
        (("stock", "guarded, reused pool"), lambda: stock("c"), lambda: reused(guarded("c"))),
        (("stock, reused pool", "guarded, reused pool"),
         lambda: reused(stock("d")), lambda: reused(guarded("d"))),
    ]
    comparisons = []
    for labels, baseline, measured in sides:
        comparison = compare(
            baseline(), measured(), n_calls,
            scenario=f"turn, {_tool_calls(n_calls)}, {labels[1]} vs {labels[0]}",
            target=None, timing=timing)
        comparisons.append(dataclasses.replace(comparison, labels=labels))
    return comparisons


def main() -> list[Comparison]:
    """Run every scenario, print the table and append the rows to `results.md`."""
    comparisons: list[Comparison] = []
    with tempfile.TemporaryDirectory(prefix="graph-durable-bench-") as workdir, \
            reused_pool() as dispatch:
        for n_calls in SCENARIOS:
            _announce(n_calls)
            comparisons.extend(measure_dispatch(workdir, n_calls, dispatch))
    report("tool dispatch: LangGraph ToolNode's per-step thread pool against one reused "
           "pool, stock (ToolNode + SqliteSaver) and guarded (EffectGuardNode + "
           "DurableSqliteSaver), durability='sync'", comparisons, benchmark="tool_dispatch")
    return comparisons


if __name__ == "__main__":
    main()
