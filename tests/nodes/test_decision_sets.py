"""A set of answers with one invalid answer runs none of the set, however the calls run,
and whatever middleware sits around the guard.

`create_agent` runs each tool call as a task of its own, and so does each branch of a
`Send`: LangGraph hands every task the whole resume map. Each task checks every answer
the map addresses to the guard's questions of the thread before it takes its own, so the
task that holds a valid answer refuses the set too. The refusal is an `InvalidDecision`
that is also LangGraph's control-flow signal (`GraphBubbleUp`), so a `ToolRetryMiddleware`
or `ToolErrorMiddleware` listed before the guard (the safe order) lets it through instead
of answering the call with an error message.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import ToolErrorMiddleware, ToolRetryMiddleware
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.types import Command

from graph_durable import (
    AsyncDurableSqliteSaver,
    DurableSqliteSaver,
    Effect,
    EffectGuardMiddleware,
    EffectStatus,
    InvalidDecision,
    current_effect,
)
from graph_durable.testing import FakeProvider
from graph_durable.testing.models import ScriptedChatModel

CONFIG = {"configurable": {"thread_id": "t"}}
APPROVE = {"type": "approve"}
MALFORMED = [
    {"type": "bogus"},
    {"type": "retry"},
    {"type": "edit"},
    {"type": "reject", "message": 5},
    {"type": "edit", "edited_action": {"name": "nope", "args": {}}},
    {"type": "edit", "edited_action": {"name": "charge", "args": {"cents": "five"}}},
    {"type": "respond"},
]


@pytest.fixture
def provider(tmp_path: Path) -> FakeProvider:
    return FakeProvider(str(tmp_path / "payments.sqlite"), "blind", name="payments")


def agent(saver: Any, provider: FakeProvider, *, outer: tuple[Any, ...] = (),
          calls: int = 2) -> Any:
    """An agent whose model asks for `calls` charges (and, with three, an email) at once,
    each needing approval; `outer` middleware is listed before the guard."""

    @tool
    def charge(cents: int) -> str:
        """Charge the customer."""
        return f"charged {provider.apply(current_effect().key, {'cents': cents})['id']}"

    @tool
    def email(to: str) -> str:
        """Email the customer."""
        return f"sent {provider.apply(current_effect().key, {'to': to})['id']}"

    asked = [{"name": "charge", "args": {"cents": 5 + i}, "id": f"c{i}"}
             for i in range(min(calls, 2))]
    if calls > 2:
        asked.append({"name": "email", "args": {"to": "ana"}, "id": "e1"})
    model = ScriptedChatModel(script=[AIMessage(content="", tool_calls=asked),
                                      AIMessage(content="done")])
    guard = EffectGuardMiddleware({"charge": Effect(approval=True),
                                   "email": Effect(approval=True)})
    return create_agent(model, tools=[charge, email], middleware=[*outer, guard],
                        checkpointer=saver)


def sqlite_saver(tmp_path: Path) -> DurableSqliteSaver:
    return DurableSqliteSaver(sqlite3.connect(tmp_path / "a.sqlite", check_same_thread=False))


def start(graph: Any) -> list[Any]:
    result = graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    return sorted(result["__interrupt__"], key=lambda i: i.value["tool_call_id"])


def assert_nothing_taken(saver: Any, provider: FakeProvider, graph: Any, calls: int) -> None:
    """Nothing sent, nothing decided, every call still asked about."""
    assert provider.count() == 0, provider.requests()
    records = saver.effects("t")
    assert len(records) == calls
    assert all(r.status is EffectStatus.AWAITING_APPROVAL and r.asked for r in records)
    assert not [e for e in saver.events("t") if e.kind == "decision"]
    assert len(graph.get_state(CONFIG).interrupts) == calls


@pytest.mark.parametrize("bad", [0, 1])
@pytest.mark.parametrize("malformed", MALFORMED)
def test_one_malformed_answer_in_a_set_runs_none_of_it(tmp_path, provider, bad,
                                                       malformed) -> None:
    """Whichever call holds the malformed answer (whichever task runs first), the other
    call's approval is not recorded and its charge not sent; the corrected set runs."""
    saver = sqlite_saver(tmp_path)
    graph = agent(saver, provider)
    questions = start(graph)
    answers = {q.id: malformed if i == bad else APPROVE for i, q in enumerate(questions)}
    with pytest.raises(InvalidDecision) as refused:
        graph.invoke(Command(resume=answers), CONFIG, durability="sync")
    assert_nothing_taken(saver, provider, graph, 2)
    bad_call = questions[bad].value["tool_call_id"]
    assert (refused.value.thread_id, refused.value.tool_call_id) == ("t", bad_call)
    message = str(refused.value)
    assert f"tool call {bad_call!r}" in message and "thread 't'" in message
    assert "A valid decision for it is one of {'type': 'approve'}" in message
    assert "Nothing was recorded, nor any other answer given with it" in message

    result = graph.invoke(Command(resume={q.id: APPROVE for q in questions}), CONFIG,
                          durability="sync")
    assert result["messages"][-1].content == "done"
    assert provider.count() == 2


def test_an_edit_off_another_tools_schema_runs_none_of_the_set(tmp_path, provider) -> None:
    """The email task checks the charge's edit against the charge tool's own schema."""
    saver = sqlite_saver(tmp_path)
    graph = agent(saver, provider, calls=3)
    questions = start(graph)
    assert [q.value["name"] for q in questions] == ["charge", "charge", "email"]
    bad_edit = {"type": "edit", "edited_action": {"name": "charge", "args": {"cents": "x"}}}
    answers = {questions[0].id: bad_edit, questions[1].id: APPROVE, questions[2].id: APPROVE}
    with pytest.raises(InvalidDecision, match="response_schema"):
        graph.invoke(Command(resume=answers), CONFIG, durability="sync")
    assert_nothing_taken(saver, provider, graph, 3)


def test_an_async_set_with_one_malformed_answer_runs_none_of_it(tmp_path, provider) -> None:
    async def main() -> None:
        async with AsyncDurableSqliteSaver.from_conn_string(str(tmp_path / "a.sqlite")) as saver:
            graph = agent(saver, provider)
            result = await graph.ainvoke({"messages": [HumanMessage("go")]}, CONFIG,
                                         durability="sync")
            first, second = sorted(result["__interrupt__"],
                                   key=lambda i: i.value["tool_call_id"])
            with pytest.raises(InvalidDecision, match="'c1'"):
                await graph.ainvoke(Command(resume={first.id: APPROVE,
                                                    second.id: {"type": "bogus"}}),
                                    CONFIG, durability="sync")
            assert provider.count() == 0
            records = await saver.aeffects("t")
            assert all(r.status is EffectStatus.AWAITING_APPROVAL for r in records)
            assert not [e for e in await saver.aevents("t") if e.kind == "decision"]
            await graph.ainvoke(Command(resume={first.id: APPROVE, second.id: APPROVE}),
                                CONFIG, durability="sync")
            assert provider.count() == 2

    asyncio.run(main())


def _on_error(exc: Exception, request: Any) -> str:
    return f"failed: {exc}"


OUTER = {
    "retry_default": lambda: ToolRetryMiddleware(),
    "retry_continue": lambda: ToolRetryMiddleware(max_retries=1, initial_delay=0,
                                                  on_failure="continue"),
    "retry_error": lambda: ToolRetryMiddleware(max_retries=1, initial_delay=0,
                                               on_failure="error"),
    "retry_every_exception": lambda: ToolRetryMiddleware(max_retries=1, initial_delay=0,
                                                         retry_on=(Exception,),
                                                         on_failure=lambda exc: "failed"),
    "tool_error": lambda: ToolErrorMiddleware(on_error=_on_error),
}


@pytest.mark.parametrize("outer", sorted(OUTER))
def test_a_middleware_listed_before_the_guard_lets_the_refusal_through(
        tmp_path, provider, outer) -> None:
    """Not answered with an error ToolMessage: refused, the call still pending, and
    answered validly it is sent once."""
    saver = sqlite_saver(tmp_path)
    graph = agent(saver, provider, outer=(OUTER[outer](),), calls=1)
    [question] = start(graph)
    with pytest.raises(InvalidDecision, match="'c0'"):
        graph.invoke(Command(resume={question.id: {"type": "retry"}}), CONFIG,
                     durability="sync")
    assert_nothing_taken(saver, provider, graph, 1)
    assert not [m for m in graph.get_state(CONFIG).values["messages"] if m.type == "tool"]
    result = graph.invoke(Command(resume={question.id: APPROVE}), CONFIG, durability="sync")
    assert result["messages"][-1].content == "done"
    assert provider.count() == 1


@pytest.mark.parametrize("outer", ["retry_default", "tool_error"])
def test_an_async_middleware_listed_before_the_guard_lets_the_refusal_through(
        tmp_path, provider, outer) -> None:
    async def main() -> None:
        async with AsyncDurableSqliteSaver.from_conn_string(str(tmp_path / "a.sqlite")) as saver:
            graph = agent(saver, provider, outer=(OUTER[outer](),))
            result = await graph.ainvoke({"messages": [HumanMessage("go")]}, CONFIG,
                                         durability="sync")
            first, second = result["__interrupt__"]
            with pytest.raises(InvalidDecision):
                await graph.ainvoke(Command(resume={first.id: APPROVE,
                                                    second.id: {"type": "applied"}}),
                                    CONFIG, durability="sync")
            assert provider.count() == 0
            state = await graph.aget_state(CONFIG)
            assert len(state.interrupts) == 2
            assert not [m for m in state.values["messages"] if m.type == "tool"]

    asyncio.run(main())


@pytest.mark.parametrize("concurrency", [1, None])
def test_an_answer_taken_in_the_run_is_not_checked_against_the_question_asked_after_it(
        tmp_path, provider, concurrency) -> None:
    """Seed 253: the first task takes its approval, sends the charge, loses the answer
    and asks about the unknown outcome under the same interrupt id; the task that runs
    after it in the same run checks that approval as taken, not against the new
    question, and sends its own charge."""
    provider.script_faults("lost")  # the first charge is applied, its answer lost
    saver = sqlite_saver(tmp_path)
    graph = agent(saver, provider)
    questions = start(graph)
    config = {**CONFIG, "max_concurrency": concurrency} if concurrency else CONFIG
    result = graph.invoke(Command(resume={q.id: APPROVE for q in questions}), config,
                          durability="sync")
    [again] = result["__interrupt__"]
    assert again.value["type"] == "effect_unknown" and again.id in {q.id for q in questions}
    assert provider.count() == 2
    statuses = sorted(r.status.value for r in saver.effects("t"))
    assert statuses == ["applied", "unknown"]


def test_the_same_resume_map_resumed_again_with_an_answer_added_is_checked_anew(
        tmp_path, provider) -> None:
    """A notebook that gathers answers in one dict and resumes with it each time: the
    first run takes c0's approval, sends its charge, loses the answer and asks about the
    unknown outcome under the same interrupt id; c1's approval added to the same dict is a
    new run, whose map still holds an approval for a question that now takes `applied`,
    `retry` or `skip`. The set is refused and nothing of it recorded, as with a copy of
    the dict (the map's identity alone took the second run for the first)."""
    provider.script_faults("lost")
    saver = sqlite_saver(tmp_path)
    graph = agent(saver, provider)
    first, second = start(graph)
    answers = {first.id: APPROVE}
    result = graph.invoke(Command(resume=answers), CONFIG, durability="sync")
    assert {i.value["type"] for i in result["__interrupt__"]} == {"effect_unknown",
                                                                  "tool_approval"}
    assert provider.count() == 1
    before = len(saver.events("t"))
    answers[second.id] = APPROVE
    with pytest.raises(InvalidDecision, match="'c0'"):
        graph.invoke(Command(resume=answers), CONFIG, durability="sync")
    assert provider.count() == 1
    assert saver.events("t")[before:] == []


def test_one_call_answered_twice_under_two_names_is_refused(tmp_path, provider) -> None:
    """A call named by its tool_call_id and by its effect key in one map, answered
    differently: which answer counts cannot be told, so the value is refused (the last
    one silently won)."""
    saver = sqlite_saver(tmp_path)
    graph = agent(saver, provider, calls=1)
    [asked] = start(graph)
    call_id, key = asked.value["tool_call_id"], asked.value["key"]
    with pytest.raises(InvalidDecision, match="answered twice"):
        graph.invoke(Command(resume={call_id: {"type": "reject"}, key: APPROVE}),
                     CONFIG, durability="sync")
    assert_nothing_taken(saver, provider, graph, 1)
    # The same answer under both names is one answer.
    graph.invoke(Command(resume={call_id: APPROVE, key: APPROVE}), CONFIG, durability="sync")
    assert provider.count() == 1
