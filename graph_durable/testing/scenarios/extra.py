"""More scenarios for crash sweeps: LangChain's `create_agent` guarded by the middleware,
a stock `ToolNode` with no guard at all, and a tool that makes two provider writes
under sub-keys of its one key (`build_two_writes_agent`).

`build_effects_agent` (in `scenarios`) dispatches every call of a step in one
`ToolNode` task. `create_agent` dispatches one `Send` per tool call, so each call is its
own task, with its own checkpoint namespace, pending writes and interrupt. A sweep over
both shows the guard holds under either dispatch. `build_stock_agent` is the control: a
sweep must find its duplicates. Arguments are JSON, as for every scenario factory (see
`graph_durable.testing.crash`).
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import StructuredTool
from langgraph.prebuilt import ToolNode

from graph_durable.checkpointers.sqlite import DurableSqliteSaver
from graph_durable.faults import fault_point
from graph_durable.nodes import current_effect
from graph_durable.policy import Effect
from graph_durable.testing.models import ScriptedChatModel
from graph_durable.testing.providers import FakeProvider
from graph_durable.testing.scenarios.effects import (
    EffectsAgent,
    policy_for_mode,
    react_graph,
    script_of,
)

__all__ = ["BETWEEN_WRITES", "build_create_agent", "build_stock_agent",
           "build_two_writes_agent"]


def _provider_tool(provider: FakeProvider) -> StructuredTool:
    def write(item: str) -> dict[str, Any]:
        return provider.apply(current_effect().key, {"item": item})

    return StructuredTool.from_function(
        write, name=provider.name, description=f"Write one item to {provider.name}."
    )


def build_create_agent(
    db_path: str,
    provider_dir: str,
    turns: list[list[list[str]]],
    modes: dict[str, str],
    approvals: list[str] | None = None,
) -> EffectsAgent:
    """A `create_agent` agent whose tools write to `FakeProvider`s through the middleware.

    Args:
        db_path: The agent's SQLite database (checkpoints and ledger).
        provider_dir: Folder of the providers' own databases (`<tool>.sqlite`).
        turns: Per model turn, the `[tool, item]` calls of its AIMessage.
        modes: Provider mode per tool name (`dedupe`, `lookup`, `blind`).
        approvals: Tools that need a human's approval before sending.
    """
    # langchain is the optional `agents` extra: import it only for this scenario.
    from langchain.agents import create_agent

    from graph_durable.nodes.middleware import EffectGuardMiddleware

    os.makedirs(provider_dir, exist_ok=True)
    providers = {
        name: FakeProvider(os.path.join(provider_dir, f"{name}.sqlite"),
                           mode, name=name)  # type: ignore[arg-type]
        for name, mode in modes.items()
    }
    approvals = approvals or []
    effects = {
        name: policy_for_mode(p, approval=name in approvals) for name, p in providers.items()
    }
    saver = DurableSqliteSaver(sqlite3.connect(db_path, check_same_thread=False))
    graph = create_agent(
        ScriptedChatModel(script=script_of(turns)),
        tools=[_provider_tool(p) for p in providers.values()],
        middleware=[EffectGuardMiddleware(effects)],
        checkpointer=saver,
    )
    return EffectsAgent(graph=graph, saver=saver, providers=providers,
                        inputs={"messages": [HumanMessage("Go.")]})


def build_stock_agent(db_path: str, provider_dir: str,
                      turns: list[list[list[str]]]) -> EffectsAgent:
    """model -> LangGraph's stock `ToolNode` -> model on a durable saver, no guard: each
    tool writes `item` to a blind `FakeProvider` under the key `item`, so a tools step
    that runs again after a crash applies its effects again.

    Args:
        db_path: The agent's SQLite database (checkpoints, and a ledger nothing uses).
        provider_dir: Folder of the providers' own databases (`<tool>.sqlite`).
        turns: Per model turn, the `[tool, item]` calls of its AIMessage.
    """
    os.makedirs(provider_dir, exist_ok=True)
    names = sorted({tool for calls in turns for tool, _ in calls})
    providers = {name: FakeProvider(os.path.join(provider_dir, f"{name}.sqlite"), "blind",
                                    name=name) for name in names}

    def stock_tool(provider: FakeProvider) -> StructuredTool:
        def write(item: str) -> dict[str, Any]:
            return provider.apply(item, {"item": item})

        return StructuredTool.from_function(
            write, name=provider.name, description=f"Write one item to {provider.name}.")

    saver = DurableSqliteSaver(sqlite3.connect(db_path, check_same_thread=False))
    graph = react_graph(ScriptedChatModel(script=script_of(turns)),
                        [stock_tool(p) for p in providers.values()], {}, saver,
                        tools_node=ToolNode)
    return EffectsAgent(graph=graph, saver=saver, providers=providers,
                        inputs={"messages": [HumanMessage("Go.")]})


BETWEEN_WRITES = "pay_and_notify:charged"
"""The `tool` of the `after_effect` fault point `build_two_writes_agent`'s tool reaches
between its two writes (`FaultPlan("after_effect", tool=BETWEEN_WRITES)` kills there)."""


def build_two_writes_agent(db_path: str, provider_dir: str) -> EffectsAgent:
    """model -> `EffectGuardNode` -> model, one call of `pay_and_notify`, a tool that makes
    two writes to one deduping `FakeProvider` (`<provider_dir>/payments.sqlite`): a
    charge under `current_effect().subkey("charge")`, then a receipt email under
    `subkey("receipt")`, with a fault point between them (`BETWEEN_WRITES`).

    Args:
        db_path: The agent's SQLite database (checkpoints and ledger).
        provider_dir: Folder of the provider's database.
    """
    os.makedirs(provider_dir, exist_ok=True)
    provider = FakeProvider(os.path.join(provider_dir, "payments.sqlite"), "dedupe",
                            name="payments")

    def pay_and_notify(customer: str, cents: int) -> dict[str, Any]:
        effect = current_effect()
        charge = provider.apply(effect.subkey("charge"), {"customer": customer,
                                                          "cents": cents}, operation="charge")
        fault_point("after_effect", tool=BETWEEN_WRITES)
        email = provider.apply(effect.subkey("receipt"), {"to": customer,
                                                          "charge": charge["id"]},
                               operation="receipt")
        return {"charge": charge["id"], "email": email["id"]}

    tool = StructuredTool.from_function(
        pay_and_notify, description="Charge a customer and email them the receipt.")
    saver = DurableSqliteSaver(sqlite3.connect(db_path, check_same_thread=False))
    model = ScriptedChatModel(script=[
        AIMessage(content="", tool_calls=[{"name": "pay_and_notify", "id": "call_pay",
                                           "args": {"customer": "ana", "cents": 500}}]),
        AIMessage(content="Charged and emailed.")])
    graph = react_graph(model, [tool],
                        {"pay_and_notify": Effect(idempotent=True)}, saver)
    return EffectsAgent(graph=graph, saver=saver, providers={"payments": provider},
                        inputs={"messages": [HumanMessage("Charge Ana 5 euros.")]})
