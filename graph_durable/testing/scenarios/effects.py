"""Ready-made scenarios for crash tests: agents whose every write hits a `FakeProvider`.

`build_effects_agent` builds a ReAct-style graph (model -> EffectGuardNode -> model)
from a script of turns, each turn a list of tool calls. Each tool `name(item)` writes to
its own provider `name` (file `<provider_dir>/<name>.sqlite`) in the mode given, and the
policy follows the provider's contract: `dedupe` -> idempotent, `lookup` -> lookup by
key, `blind` -> neither. All arguments are JSON, so a child process can rebuild the
agent with `graph_durable.testing.crash.child.run_child`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

import aiosqlite
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import StructuredTool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from graph_durable.checkpointers.sqlite import AsyncDurableSqliteSaver
from graph_durable.nodes import EffectGuardNode, current_effect
from graph_durable.policy import Effect
from graph_durable.testing.models import ScriptedChatModel
from graph_durable.testing.providers import FakeProvider
from graph_durable.testing.savers import SaverSpec, aopen_saver, open_saver

__all__ = [
    "AgentOptions",
    "EffectsAgent",
    "build_effects_agent",
    "build_effects_agent_async",
    "policy_for_mode",
    "react_graph",
    "script_of",
]


@dataclass
class EffectsAgent:
    """A compiled scenario graph with its saver, providers and input."""

    graph: Any
    saver: Any
    providers: dict[str, FakeProvider]
    inputs: dict[str, Any]


def policy_for_mode(provider: FakeProvider, *, approval: bool = False) -> Effect:
    """The policy a provider's contract allows."""
    if provider.mode == "dedupe":
        return Effect(idempotent=True, approval=approval)
    if provider.mode == "lookup":
        return Effect(lookup=provider.find, approval=approval)
    return Effect(approval=approval)


def script_of(turns: list[list[list[str]]]) -> list[AIMessage]:
    """AIMessages for turns of `[tool, item]` calls, then a closing answer."""
    script = [
        AIMessage(content="", tool_calls=[
            {"name": tool, "args": {"item": item}, "id": f"call_{t}_{i}"}
            for i, (tool, item) in enumerate(calls)
        ])
        for t, calls in enumerate(turns)
    ]
    return [*script, AIMessage(content="All done.")]


def react_graph(model: Any, tools: list[Any], effects: dict[str, Effect], saver: Any, *,
                tools_node: Callable[[list[Any]], Any] | None = None) -> Any:
    """A ReAct-style graph, model -> `EffectGuardNode(tools, effects)` -> model, compiled
    on `saver` (a sync model node); `tools_node(tools)` builds another tools node (a
    stock `ToolNode`, which takes no `effects`)."""
    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", tools_node(tools) if tools_node is not None
                     else EffectGuardNode(tools, effects=effects))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


def _write_tool(provider: FakeProvider, delay: float) -> StructuredTool:
    def write(item: str) -> dict[str, Any]:
        if delay:
            time.sleep(delay)
        effect = current_effect()
        return provider.apply(effect.key, {"item": item}, fencing_token=effect.fencing_token)

    async def awrite(item: str) -> dict[str, Any]:
        if delay:
            await asyncio.sleep(delay)
        effect = current_effect()
        return provider.apply(effect.key, {"item": item}, fencing_token=effect.fencing_token)

    return StructuredTool.from_function(
        write, coroutine=awrite, name=provider.name,
        description=f"Write one item to {provider.name}.",
    )


class AgentOptions(TypedDict, total=False):
    """What a scenario agent's tools do beyond writing to their providers."""

    delays: dict[str, float]
    """Seconds a tool sleeps before calling its provider, by tool name."""
    approvals: list[str]
    """Tools that need a human's approval before sending."""
    fencing: list[str]
    """Tools whose provider rejects stale fencing tokens."""


def build_effects_agent(
    db_path: str,
    provider_dir: str,
    turns: list[list[list[str]]],
    modes: dict[str, str],
    flow_version: str | None = None,
    compatible_flow_versions: list[str] | None = None,
    saver: SaverSpec | None = None,
    **options: Unpack[AgentOptions],
) -> EffectsAgent:
    """Build the scenario agent on a `DurableSqliteSaver` (or the saver `saver` names).

    Args:
        db_path: The agent's SQLite database (checkpoints and ledger).
        provider_dir: Folder of the providers' own databases.
        turns: Per model turn, the `[tool, item]` calls of its AIMessage.
        modes: Provider mode per tool name (`dedupe`, `lookup`, `blind`).
        flow_version, compatible_flow_versions: As for `DurableSqliteSaver`.
        saver: Another durable saver to run on (`graph_durable.testing.savers`), for
            sync use; `db_path` is then unused.
        **options: `delays`, `approvals`, `fencing` (`AgentOptions`).
    """
    durable = open_saver(saver, db_path, flow_version=flow_version,
                         compatible_flow_versions=compatible_flow_versions or ())
    return _assemble(durable, provider_dir, turns, modes, options)


async def build_effects_agent_async(
    db_path: str,
    provider_dir: str,
    turns: list[list[list[str]]],
    modes: dict[str, str],
    saver: SaverSpec | None = None,
    **options: Unpack[AgentOptions],
) -> EffectsAgent:
    """`build_effects_agent` on an `AsyncDurableSqliteSaver` (or the async saver `saver`
    names), for `ainvoke` (same args)."""
    durable = (AsyncDurableSqliteSaver(aiosqlite.connect(db_path)) if saver is None
               else await aopen_saver(saver, db_path))
    return _assemble(durable, provider_dir, turns, modes, options)


def _assemble(
    saver: Any,
    provider_dir: str,
    turns: list[list[list[str]]],
    modes: dict[str, str],
    options: AgentOptions,
) -> EffectsAgent:
    os.makedirs(provider_dir, exist_ok=True)
    providers = {
        name: FakeProvider(os.path.join(provider_dir, f"{name}.sqlite"), mode,  # type: ignore[arg-type]
                           name=name, fencing=name in (options.get("fencing") or ()))
        for name, mode in modes.items()
    }
    delays = options.get("delays") or {}
    approvals = options.get("approvals") or ()
    tools = [_write_tool(p, delays.get(name, 0.0)) for name, p in providers.items()]
    effects = {
        name: policy_for_mode(p, approval=name in approvals) for name, p in providers.items()
    }
    model = ScriptedChatModel(script=script_of(turns))
    return EffectsAgent(
        graph=react_graph(model, tools, effects, saver),
        saver=saver,
        providers=providers,
        inputs={"messages": [HumanMessage("Go.")]},
    )
