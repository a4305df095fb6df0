"""`sync_by_default(graph)`: a compiled graph whose runs are durable without saying so.

The guard sends nothing unless the step that requested an effect is durably
checkpointed, so every run needs `durability="sync"`; forgetting it fails at the first
guarded call, after the model has already answered. LangGraph reads a run's default
durability from the graph's config when a run passes none, so the graph can carry it:

    graph = sync_by_default(builder.compile(checkpointer=saver))
    graph.invoke(inputs, config)            # durability="sync"
    graph.invoke(inputs, config, durability="async")   # still refused by the guard

LangGraph gives no hook that runs before the first node, so a run that does ask for
another durability still learns it at its first guarded call (nothing sent).
"""

from __future__ import annotations

from typing import Any, TypeVar

from graph_durable._langgraph import CONFIG_KEY_DURABILITY

__all__ = ["sync_by_default"]

G = TypeVar("G")


def sync_by_default(graph: G) -> G:
    """A copy of the compiled `graph` whose runs default to `durability="sync"`.

    The copy is the same kind of object (a compiled `Pregel`): `get_state`, streaming,
    subgraphs and `review` work on it as on the original. Runs that pass `durability=`
    keep what they pass.
    """
    with_config: Any = getattr(graph, "with_config", None)
    if with_config is None:
        raise TypeError(f"sync_by_default takes a compiled graph, got {type(graph).__name__}")
    return with_config(configurable={CONFIG_KEY_DURABILITY: "sync"})  # type: ignore[no-any-return]
