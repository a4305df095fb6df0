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


# -- review(), the inbox and the CLI read HumanInTheLoopMiddleware's questions ----------


DECISIONS = {
    "approve": (lambda r: r.approve("c1", reviewer="ana"), {"cents": 5}, "done"),
    "edit": (lambda r: r.edit("c1", {"cents": 7}, reviewer="ana"), {"cents": 7}, "done"),
    "reject": (lambda r: r.reject("c1", "not now", reviewer="ana"), None, "done"),
    "respond": (lambda r: r.respond("c1", "charged by hand", reviewer="ana"), None, "done"),
}


@pytest.mark.parametrize("mode", ["per_call", "batched"])
@pytest.mark.parametrize("kind", list(DECISIONS))
def test_review_lists_and_answers_a_question_of_hitl(saver, provider, mode, kind) -> None:
    from graph_durable import review

    graph = agent(saver, provider, hitl_first=True, mode=mode)
    question = ask(graph)
    pending = review(graph, CONFIG)
    [item] = pending.pending
    assert (item.kind, item.tool_call_id, item.tool, item.args, item.key) == (
        "approval", "c1", "charge", {"cents": 5}, "")
    assert item.interrupt_id == question.id
    assert set(item.allowed_decisions) == {"approve", "edit", "reject", "respond"}
    decide, sent, last = DECISIONS[kind]
    result = decide(pending).resume()
    assert result["messages"][-1].content == last
    assert [e["payload"] for e in provider.effects()] == ([sent] if sent else [])
    assert review(graph, CONFIG).pending == []


def test_a_batched_question_of_hitl_is_answered_whole(saver, provider) -> None:
    from graph_durable import InvalidDecision, review

    @tool
    def charge(cents: int) -> str:
        """Charge the customer."""
        return f"charged {provider.apply(current_effect().key, {'cents': cents})['id']}"

    model = ScriptedChatModel(script=[
        AIMessage(content="", tool_calls=[{"name": "charge", "args": {"cents": n}, "id": f"c{n}"}
                                          for n in (1, 2)]),
        AIMessage(content="done")])
    graph = create_agent(model, tools=[charge], checkpointer=saver, middleware=[
        HumanInTheLoopMiddleware({"charge": True}), EffectGuardMiddleware({"charge": Effect()})])
    graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    pending = review(graph, CONFIG)
    assert [(i.tool_call_id, i.args, i.position) for i in pending.pending] == [
        ("c1", {"cents": 1}, 0), ("c2", {"cents": 2}, 1)]
    pending.reject("c2", "twice is too much")
    with pytest.raises(InvalidDecision, match=r"decide \['c1'\] too"):
        pending.command()
    assert pending.approve("c1").command().resume == {
        pending.pending[0].interrupt_id: {"decisions": [
            {"type": "approve"}, {"type": "reject", "message": "twice is too much"}]}}
    assert pending.resume()["messages"][-1].content == "done"
    assert [e["payload"] for e in provider.effects()] == [{"cents": 1}]


@pytest.mark.parametrize("mode", ["per_call", "batched"])
def test_the_inbox_lists_a_question_of_hitl_and_sends_its_answer_to_the_graph(
        saver, provider, mode) -> None:
    from graph_durable import InvalidDecision
    from graph_durable.operators.inbox import inbox, record_decisions

    graph = agent(saver, provider, hitl_first=True, mode=mode)
    question = ask(graph)
    [item] = inbox(saver, "t")
    assert (item.tool_call_id, item.kind, item.tool, item.args, item.key, item.status) == (
        "c1", "approval", "charge", {"cents": 5}, "", "awaiting_approval")
    assert item.interrupt_id == question.id and item.asked_at > 0
    with pytest.raises(InvalidDecision, match="HumanInTheLoopMiddleware, which reads its answer"):
        record_decisions(saver, "t", {"c1": {"type": "approve"}})
    assert saver.effects("t") == [] and provider.count() == 0


async def test_areview_lists_a_question_of_hitl(tmp_path, provider) -> None:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver  # noqa: F401 - the extra

    from graph_durable import AsyncDurableSqliteSaver, areview

    async with AsyncDurableSqliteSaver.from_conn_string(str(tmp_path / "b.sqlite")) as saver:
        graph = agent(saver, provider, hitl_first=True)
        [question] = (await graph.ainvoke({"messages": [HumanMessage("go")]}, CONFIG,
                                          durability="sync"))["__interrupt__"]
        pending = await areview(graph, CONFIG)
        assert [(i.tool_call_id, i.key, i.interrupt_id) for i in pending.pending] == [
            ("c1", "", question.id)]
        result = await pending.approve("c1").aresume()
    assert result["messages"][-1].content == "done" and provider.count() == 1


def test_review_names_a_question_of_hitl_by_its_interrupt_id(saver, provider) -> None:
    from graph_durable import review

    graph = agent(saver, provider, hitl_first=True)
    question = ask(graph)
    command = review(graph, CONFIG).approve(question.id).command()
    assert command.resume == {question.id: {"type": "approve"}}
    assert graph.invoke(command, CONFIG, durability="sync")["messages"][-1].content == "done"
    assert provider.count() == 1
