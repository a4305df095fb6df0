"""Scenarios whose guarded tools node sits inside a subgraph.

`build_subgraph_charge_agent` is the charge agent of `scenarios.forks` (model -> guarded
tools -> model, one `charge` tool writing to a `FakeProvider`) compiled as a subgraph and
added as the node `payments` of a parent graph (or of a `billing` subgraph of the
parent, with `depth=2`). A run that names a checkpoint id of the parent (resuming with
`get_state().config`, time travel, an `update_state` fork) is a fork: LangGraph gives
the subgraph task a new id, so the subgraph starts over and its model answers anew.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import aiosqlite
from langchain_core.messages import HumanMessage
from langgraph.graph import START, MessagesState, StateGraph

from graph_durable.checkpointers.sqlite import AsyncDurableSqliteSaver
from graph_durable.checkpointers.sqlite import DurableSqliteSaver
from graph_durable.testing.scenarios.effects import EffectsAgent
from graph_durable.testing.scenarios.forks import assemble_charge_agent

__all__ = ["assemble_subgraph_charge_agent", "build_subgraph_charge_agent",
           "build_subgraph_charge_agent_async"]


def _wrapped(name: str, graph: Any) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node(name, graph)
    builder.add_edge(START, name)
    return builder


def assemble_subgraph_charge_agent(saver: Any, provider_dir: str, mode: str, *,
                                   depth: int = 1, fresh_ids: bool = False) -> EffectsAgent:
    """The charge agent as a subgraph `depth` levels below the graph compiled on `saver`.

    `fresh_ids`: the model gives its tool calls new ids each time it is asked (as a real
    model does), so a restarted subgraph asks for the same call under another id.
    """
    inner = assemble_charge_agent(None, provider_dir, mode, fresh_ids=fresh_ids)
    graph = inner.graph
    if depth == 2:
        graph = _wrapped("payments", graph).compile()
    parent = _wrapped("billing" if depth == 2 else "payments", graph)
    return EffectsAgent(graph=parent.compile(checkpointer=saver), saver=saver,
                        providers=inner.providers,
                        inputs={"messages": [HumanMessage("Charge Ana 5 EUR.")]})


def build_subgraph_charge_agent(db_path: str, provider_dir: str, mode: str = "blind",
                                depth: int = 1, fresh_ids: bool = False) -> EffectsAgent:
    """`assemble_subgraph_charge_agent` on a `DurableSqliteSaver` at `db_path`."""
    saver = DurableSqliteSaver(sqlite3.connect(db_path, check_same_thread=False))
    return assemble_subgraph_charge_agent(saver, provider_dir, mode, depth=depth,
                                          fresh_ids=fresh_ids)


async def build_subgraph_charge_agent_async(db_path: str, provider_dir: str,
                                            mode: str = "blind", depth: int = 1,
                                            fresh_ids: bool = False) -> EffectsAgent:
    """`build_subgraph_charge_agent` on an `AsyncDurableSqliteSaver` (close `saver.conn`
    after)."""
    saver = AsyncDurableSqliteSaver(aiosqlite.connect(db_path))
    return assemble_subgraph_charge_agent(saver, provider_dir, mode, depth=depth,
                                          fresh_ids=fresh_ids)
