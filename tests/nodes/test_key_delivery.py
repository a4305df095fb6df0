"""The key reaches tools whose code is not the user's (`Effect(key_arg=...)`), the model
never sees that argument, and a deduplication promise the provider would never hear of
is refused before anything is sent (`nodes.key_delivery`)."""

from __future__ import annotations

import sqlite3
import warnings
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from graph_durable import DurableSqliteSaver, Effect, EffectGuardMiddleware, EffectGuardNode
from graph_durable.errors import UndeliveredKey
from graph_durable.nodes.key_delivery import UnreadKeyWarning, key_like_arguments
from graph_durable.testing import FakeProvider
from graph_durable.testing.models import ScriptedChatModel

CONFIG = {"configurable": {"thread_id": "t"}}
CALL = {"name": "charge", "args": {"customer": "ana", "cents": 500}, "id": "c1"}


@pytest.fixture
def provider(tmp_path: Path) -> FakeProvider:
    return FakeProvider(str(tmp_path / "payments.sqlite"), "dedupe")


@pytest.fixture
def saver(tmp_path: Path) -> DurableSqliteSaver:
    return DurableSqliteSaver(sqlite3.connect(str(tmp_path / "agent.sqlite"),
                                              check_same_thread=False))


def charge_tool(provider: FakeProvider, received: list[Any]) -> Any:
    """A tool the user does not own: it takes the key as an argument, like an MCP
    payments server's `charge`, and never reads `current_effect()`."""

    @tool
    def charge(customer: str, cents: int, idempotency_key: str | None = None) -> str:
        """Charge a customer."""
        received.append(idempotency_key)
        return provider.apply(idempotency_key or f"no-key-{len(received)}",
                              {"customer": customer, "cents": cents})["id"]

    return charge


def model() -> ScriptedChatModel:
    return ScriptedChatModel(script=[AIMessage(content="", tool_calls=[CALL]),
                                     AIMessage(content="done")])


def _properties(bound: list[dict[str, Any]], name: str) -> set[str]:
    [schema] = [t["function"] for t in bound if t["function"]["name"] == name]
    return set(schema["parameters"]["properties"])


def test_create_agent_fills_the_named_argument_and_hides_it_from_the_model(
    saver: DurableSqliteSaver, provider: FakeProvider
) -> None:
    received: list[Any] = []
    llm = model()
    agent = create_agent(llm, tools=[charge_tool(provider, received)], checkpointer=saver,
                         middleware=[EffectGuardMiddleware(
                             {"charge": Effect(idempotent=True, key_arg="idempotency_key")})])
    agent.invoke({"messages": [HumanMessage("charge ana")]}, CONFIG, durability="sync")
    [record] = saver.effects("t")
    assert received == [record.key] and provider.count(record.key) == 1
    assert record.args == CALL["args"]  # the ledger keeps what the model asked
    assert _properties(llm.bound_tools, "charge") == {"customer", "cents"}


def test_a_tool_node_fills_it_and_its_model_tools_hide_it(
    saver: DurableSqliteSaver, provider: FakeProvider
) -> None:
    received: list[Any] = []
    node = EffectGuardNode([charge_tool(provider, received)],
                           effects={"charge": Effect(idempotent=True, key_arg="idempotency_key")})
    llm = model().bind_tools(node.model_tools)
    assert _properties(llm.bound_tools, "charge") == {"customer", "cents"}
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {"messages": [llm.invoke(state["messages"])]})
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    graph = builder.compile(checkpointer=saver)
    graph.invoke({"messages": [HumanMessage("charge ana")]}, CONFIG, durability="sync")
    [record] = saver.effects("t")
    assert received == [record.key] and record.status.value == "applied"


def test_an_idempotent_tool_whose_key_argument_is_not_named_is_refused_before_sending(
    saver: DurableSqliteSaver, provider: FakeProvider
) -> None:
    received: list[Any] = []
    agent = create_agent(model(), tools=[charge_tool(provider, received)], checkpointer=saver,
                         middleware=[EffectGuardMiddleware({"charge": Effect(idempotent=True)})])
    with pytest.raises(UndeliveredKey, match="key_arg='idempotency_key'") as refused:
        agent.invoke({"messages": [HumanMessage("charge ana")]}, CONFIG, durability="sync")
    assert refused.value.tool == "charge"
    assert received == [] and provider.count() == 0 and saver.effects("t") == []

    with pytest.raises(UndeliveredKey, match="charge"):
        EffectGuardNode([charge_tool(provider, received)],
                        effects={"charge": Effect(lookup=provider.find)})
    with pytest.raises(UndeliveredKey, match="does not have"):
        EffectGuardNode([charge_tool(provider, received)],
                        effects={"charge": Effect(idempotent=True, key_arg="request_key")})
    # A blind tool promises nothing about its key: nothing to refuse.
    EffectGuardNode([charge_tool(provider, received)], effects={"charge": Effect()})


def test_key_like_arguments_are_told_by_name() -> None:
    @tool
    def transfer(amount: int, clientToken: str = "", dedupe_id: str = "") -> str:  # noqa: N803
        """Move money."""
        return "ok"

    assert key_like_arguments(transfer) == ["clientToken", "dedupe_id"]


def test_a_local_idempotent_tool_that_never_reads_its_key_is_reported_by_name(
    saver: DurableSqliteSaver, provider: FakeProvider
) -> None:
    @tool
    def charge(customer: str, cents: int) -> str:
        """Charge a customer, forgetting the key."""
        return provider.apply(f"{customer}-{cents}", {"cents": cents})["id"]

    agent = create_agent(model(), tools=[charge], checkpointer=saver,
                         middleware=[EffectGuardMiddleware({"charge": Effect(idempotent=True)})])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        agent.invoke({"messages": [HumanMessage("charge ana")]}, CONFIG, durability="sync")
    [warning] = [w for w in caught if issubclass(w.category, UnreadKeyWarning)]
    assert "'charge'" in str(warning.message) and "key_arg" in str(warning.message)
