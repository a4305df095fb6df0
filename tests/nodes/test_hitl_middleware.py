"""The guard next to LangChain's `HumanInTheLoopMiddleware` in `create_agent`.

The right order lists `HumanInTheLoopMiddleware` first (outer): the guard then sees the
call as the reviewer decided it, so an edit is keyed and recorded as sent. Listed the
other way, a per-call approval would be answered inside the guard; the guard refuses that
before anything is sent, and the thread goes on once the order is fixed. Batched HITL
asks before any tool runs, so either order works there.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.types import Command

from graph_durable import (
    DurableSqliteSaver,
    Effect,
    EffectGuardMiddleware,
    EffectStatus,
    GraphDurableError,
    current_effect,
)
from graph_durable.testing import FakeProvider
from graph_durable.testing.models import ScriptedChatModel

CONFIG = {"configurable": {"thread_id": "t"}}


@pytest.fixture
def provider(tmp_path: Path) -> FakeProvider:
    return FakeProvider(str(tmp_path / "payments.sqlite"), "blind", name="payments")


@pytest.fixture
def saver(tmp_path: Path) -> DurableSqliteSaver:
    return DurableSqliteSaver(sqlite3.connect(tmp_path / "a.sqlite", check_same_thread=False))


def agent(saver: DurableSqliteSaver, provider: FakeProvider, *, hitl_first: bool,
          mode: str = "per_call") -> Any:
    @tool
    def charge(cents: int) -> str:
        """Charge the customer."""
        return f"charged {provider.apply(current_effect().key, {'cents': cents})['id']}"

    model = ScriptedChatModel(script=[
        AIMessage(content="", tool_calls=[{"name": "charge", "args": {"cents": 5}, "id": "c1"}]),
        AIMessage(content="done")])
    guard = EffectGuardMiddleware({"charge": Effect()})  # blind: no dedupe, no lookup
    hitl = HumanInTheLoopMiddleware({"charge": True}, interrupt_mode=mode)  # type: ignore[arg-type]
    middleware = [hitl, guard] if hitl_first else [guard, hitl]
    return create_agent(model, tools=[charge], middleware=middleware, checkpointer=saver)


def ask(graph: Any) -> Any:
    [question] = graph.invoke({"messages": [HumanMessage("go")]}, CONFIG,
                              durability="sync")["__interrupt__"]
    return question


def answer(mode: str, decision: dict[str, Any]) -> Any:
    return decision if mode == "per_call" else {"decisions": [decision]}


@pytest.mark.parametrize("mode", ["per_call", "batched"])
def test_approved_through_hitl_is_sent_once(saver, provider, mode) -> None:
    graph = agent(saver, provider, hitl_first=True, mode=mode)
    question = ask(graph)
    assert provider.count() == 0
    result = graph.invoke(Command(resume={question.id: answer(mode, {"type": "approve"})}),
                          CONFIG, durability="sync")
    assert result["messages"][-1].content == "done"
    assert provider.count() == 1
    [record] = saver.effects("t")
    assert (record.status, record.attempts) == (EffectStatus.APPLIED, 1)


@pytest.mark.parametrize("mode", ["per_call", "batched"])
def test_an_edit_through_hitl_is_keyed_and_recorded_as_sent(saver, provider, mode) -> None:
    graph = agent(saver, provider, hitl_first=True, mode=mode)
    question = ask(graph)
    edit = {"type": "edit", "edited_action": {"name": "charge", "args": {"cents": 7}}}
    graph.invoke(Command(resume={question.id: answer(mode, edit)}), CONFIG, durability="sync")
    [sent] = provider.effects()
    [record] = saver.effects("t")
    assert sent["payload"] == {"cents": 7} == record.args and sent["key"] == record.key


@pytest.mark.parametrize("mode", ["per_call", "batched"])
def test_rejected_through_hitl_sends_nothing(saver, provider, mode) -> None:
    graph = agent(saver, provider, hitl_first=True, mode=mode)
    question = ask(graph)
    graph.invoke(Command(resume={question.id: answer(mode, {"type": "reject", "message": "no"})}),
                 CONFIG, durability="sync")
    assert provider.count() == 0 and saver.effects("t") == []


def test_batched_hitl_after_the_guard_works_too(saver, provider) -> None:
    graph = agent(saver, provider, hitl_first=False, mode="batched")
    question = ask(graph)
    graph.invoke(Command(resume={question.id: {"decisions": [{"type": "approve"}]}}), CONFIG,
                 durability="sync")
    assert provider.count() == 1


def test_per_call_hitl_inside_the_guard_is_refused_and_the_fixed_order_goes_on(
        saver, provider) -> None:
    wrong = agent(saver, provider, hitl_first=False)
    with pytest.raises(GraphDurableError, match="List HumanInTheLoopMiddleware before"):
        wrong.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    assert provider.count() == 0
    fixed = agent(saver, provider, hitl_first=True)
    [question] = fixed.invoke(None, CONFIG, durability="sync")["__interrupt__"]
    assert question.value["type"] == "tool_approval" and "key" not in question.value
    result = fixed.invoke(Command(resume={question.id: {"type": "approve"}}), CONFIG,
                          durability="sync")
    assert result["messages"][-1].content == "done"
    assert provider.count() == 1
    [record] = saver.effects("t")
    assert (record.status, record.attempts) == (EffectStatus.APPLIED, 1)
