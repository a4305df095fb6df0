"""`review()` answers questions asked inside subgraphs.

A parent graph whose node is a compiled subgraph (compiled without a checkpointer, so it
inherits the parent's durable saver) asks from a task whose namespace is like
`child:<task_id>|tools:<task_id>`. LangGraph resumes it with `Command(resume={interrupt_id:
value})` given to the parent; `review(parent, config)` must list the question with that id
and build that command.
"""

from __future__ import annotations

import operator
import sqlite3
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from graph_durable import (
    AsyncDurableSqliteSaver,
    DurableSqliteSaver,
    Effect,
    EffectGuardNode,
    InvalidDecision,
    review,
)

# Kept apart, after `review`: importing `areview` first loads its module
# (`graph_durable.operators.review`), which once shadowed the function of the same name.
from graph_durable import areview  # noqa: I001
from graph_durable.nodes.interrupts import interrupt_id_for
from graph_durable.testing import FakeProvider
from graph_durable.testing.models import ScriptedChatModel
from tests.fakes import send_tool
from tests.nodes.test_guard import CONFIG


class Parent(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    kid: Annotated[list[AnyMessage], add_messages]
    trail: Annotated[list[str], operator.add]


@pytest.fixture
def saver(tmp_path: Path) -> DurableSqliteSaver:
    return DurableSqliteSaver(sqlite3.connect(tmp_path / "a.sqlite", check_same_thread=False))


@pytest.fixture
async def asaver(tmp_path: Path):
    async with AsyncDurableSqliteSaver.from_conn_string(str(tmp_path / "a.sqlite")) as saver:
        yield saver


@pytest.fixture
def provider(tmp_path: Path) -> FakeProvider:
    return FakeProvider(str(tmp_path / "mail.sqlite"), "blind", name="mail")


def agent(provider: FakeProvider, *targets: str, key: str = "messages", prefix: str = "c",
          run_async: bool = False) -> StateGraph:
    """A model + guarded `tools` loop over `state[key]`; the model asks to email `targets`."""
    calls = [{"name": "send", "args": {"to": t}, "id": f"{prefix}{i}"}
             for i, t in enumerate(targets)]
    model = ScriptedChatModel(script=[AIMessage(content="", tool_calls=calls),
                                      AIMessage(content=f"done {key}")])

    def think(state: dict[str, Any]) -> dict[str, Any]:
        return {key: [model.invoke(state[key])]}

    async def athink(state: dict[str, Any]) -> dict[str, Any]:
        return {key: [await model.ainvoke(state[key])]}

    def route(state: dict[str, Any]) -> str:
        return "tools" if state[key][-1].tool_calls else END

    builder = StateGraph(Parent)
    builder.add_node("agent", athink if run_async else think)
    builder.add_node("tools", EffectGuardNode(
        [send_tool(provider)], effects={"send": Effect(approval=True, description="email")},
        messages_key=key))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder


def parent_of(*children: tuple[str, StateGraph]) -> StateGraph:
    """A parent whose nodes are the compiled children (no checkpointer: they inherit)."""
    builder = StateGraph(Parent)
    for name, child in children:
        builder.add_node(name, child.compile())
        builder.add_edge(START, name)
    return builder


def start(graph: Any, **inputs: Any) -> dict[str, Any]:
    inputs = inputs or {"messages": [HumanMessage("go")]}
    return graph.invoke(inputs, CONFIG, durability="sync")


def tools_ns(graph: Any, child: str) -> str:
    """Namespace of the `tools` task inside the pending `child` subgraph task."""
    state = graph.get_state(CONFIG, subgraphs=True)
    [task] = [t for t in state.tasks if t.name == child]
    [inner] = [t for t in task.state.tasks if t.name == "tools"]
    return f"{child}:{task.id}|tools:{inner.id}"


def tool_messages(messages: list[AnyMessage]) -> dict[str, Any]:
    return {m.tool_call_id: m for m in messages if m.type == "tool"}


def assert_done(graph: Any) -> None:
    state = graph.get_state(CONFIG)
    assert state.next == () and state.interrupts == ()
    assert review(graph, CONFIG).pending == []


def test_approval_in_a_subgraph_is_listed_and_sent_once(saver, provider) -> None:
    graph = parent_of(("child", agent(provider, "ana"))).compile(checkpointer=saver)
    [question] = start(graph)["__interrupt__"]
    pending = review(graph, CONFIG)
    [item] = pending.pending
    assert (item.kind, item.tool_call_id, item.tool, item.args) == (
        "approval", "c0", "send", {"to": "ana"})
    assert item.interrupt_id == question.id == interrupt_id_for(tools_ns(graph, "child"), item.key)
    assert item.key == question.value["key"] and provider.count() == 0

    result = pending.approve("c0", reviewer="lee").resume()
    assert tool_messages(result["messages"])["c0"].content == "sent mail-1 to ana"
    assert result["messages"][-1].content == "done messages"
    assert provider.count() == 1
    assert_done(graph)
    [record] = saver.effects("t")
    assert record.status == "applied"


def test_reject_in_a_subgraph_sends_nothing(saver, provider) -> None:
    graph = parent_of(("child", agent(provider, "ana"))).compile(checkpointer=saver)
    start(graph)
    result = review(graph, CONFIG).reject("c0", "wrong customer").resume()
    message = tool_messages(result["messages"])["c0"]
    assert message.status == "error" and "wrong customer" in message.content
    assert result["messages"][-1].content == "done messages"
    assert provider.count() == 0
    assert saver.effects("t")[0].status == "rejected"
    assert_done(graph)


def test_one_interrupt_asking_about_several_calls_in_a_nested_subgraph(saver, provider) -> None:
    inner = agent(provider, "a", "b", "c")
    middle = parent_of(("inner", inner))
    graph = parent_of(("middle", middle)).compile(checkpointer=saver)
    start(graph)
    pending = review(graph, CONFIG)
    assert sorted(i.tool_call_id for i in pending.pending) == ["c0", "c1", "c2"]
    assert len({i.interrupt_id for i in pending.pending}) == 3  # one interrupt per call
    pending.approve("c0").reject("c1", "not b")
    partial = pending.resume()  # c2 was not decided: it stays pending
    assert [i.value["tool_call_id"] for i in partial["__interrupt__"]] == ["c2"]
    assert [e["payload"]["to"] for e in provider.effects()] == ["a"]
    result = review(graph, CONFIG).approve("c2").resume()
    assert sorted(e["payload"]["to"] for e in provider.effects()) == ["a", "c"]
    assert "not b" in tool_messages(result["messages"])["c1"].content
    assert_done(graph)


def test_unknown_outcome_in_a_subgraph_after_approval(saver, provider) -> None:
    provider.script_faults("lost")  # applied, then the connection drops: outcome unknown
    graph = parent_of(("child", agent(provider, "ana"))).compile(checkpointer=saver)
    start(graph)
    review(graph, CONFIG).approve("c0").resume()
    [item] = review(graph, CONFIG).pending
    assert item.kind == "unknown" and item.attempts == 1 and "lost" in (item.error or "")
    result = review(graph, CONFIG).mark_applied("c0", {"id": "mail-1"}).resume()
    assert result["messages"][-1].content == "done messages"
    assert provider.count() == 1
    assert_done(graph)


def test_questions_pending_in_the_parent_and_in_a_subgraph(saver, provider) -> None:
    # Step 1: the parent's agent asks to email dad; `wait` lets the child start in step 2,
    # so the parent's `tools` and the child's `tools` both ask in the same step.
    builder = agent(provider, "dad", prefix="d")
    builder.add_node("wait", lambda state: {"trail": ["waited"]})
    builder.add_node("child", agent(provider, "kid", key="kid", prefix="k").compile())
    builder.add_edge(START, "wait")
    builder.add_edge("wait", "child")
    graph = builder.compile(checkpointer=saver)
    result = start(graph, messages=[HumanMessage("go")], kid=[HumanMessage("go")])
    assert sorted(i.value["tool_call_id"] for i in result["__interrupt__"]) == ["d0", "k0"]

    pending = review(graph, CONFIG)
    by_call = {i.tool_call_id: i for i in pending.pending}
    assert sorted(by_call) == ["d0", "k0"]
    assert by_call["k0"].interrupt_id == interrupt_id_for(tools_ns(graph, "child"),
                                                          by_call["k0"].key)
    assert by_call["d0"].interrupt_id != by_call["k0"].interrupt_id

    # Answer the subgraph's question only: the parent's stays pending.
    pending.approve("k0").resume()
    assert [i.tool_call_id for i in review(graph, CONFIG).pending] == ["d0"]
    assert [e["payload"]["to"] for e in provider.effects()] == ["kid"]

    result = review(graph, CONFIG).approve("d0").resume()
    assert sorted(e["payload"]["to"] for e in provider.effects()) == ["dad", "kid"]
    assert result["messages"][-1].content == "done messages"
    assert result["kid"][-1].content == "done kid"
    assert_done(graph)


def test_same_tool_call_id_in_two_subgraphs_needs_the_interrupt_id(saver, provider) -> None:
    # Each subgraph keeps its own conversation, so tool_call_ids repeat across them.
    graph = parent_of(("a", agent(provider, "x", key="messages")),
                      ("b", agent(provider, "y", key="kid"))).compile(checkpointer=saver)
    start(graph, messages=[HumanMessage("go")], kid=[HumanMessage("go")])
    pending = review(graph, CONFIG)
    by_to = {i.args["to"]: i for i in pending.pending}
    assert sorted(by_to) == ["x", "y"] and {i.tool_call_id for i in pending.pending} == {"c0"}
    with pytest.raises(InvalidDecision, match="interrupt_id"):
        pending.approve("c0")
    assert pending.decisions == {}
    page = pending._repr_html_()
    assert "interrupt_id" in page and by_to["y"].interrupt_id in page
    pending.approve("c0", interrupt_id=by_to["x"].interrupt_id)
    pending.reject("c0", "not y", interrupt_id=by_to["y"].interrupt_id)
    result = pending.resume()
    assert [e["payload"]["to"] for e in provider.effects()] == ["x"]
    assert "not y" in tool_messages(result["kid"])["c0"].content
    assert_done(graph)


@pytest.mark.parametrize("decision", ["approve", "reject"])
async def test_async_subgraph_review(asaver, provider, decision) -> None:
    graph = parent_of(("child", agent(provider, "ana", run_async=True))).compile(
        checkpointer=asaver)
    first = await graph.ainvoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    [question] = first["__interrupt__"]
    pending = await areview(graph, CONFIG)
    [item] = pending.pending
    assert (item.tool_call_id, item.interrupt_id) == ("c0", question.id)
    if decision == "approve":
        pending.approve("c0")
    else:
        pending.reject("c0", "no")
    result = await pending.aresume()
    assert result["messages"][-1].content == "done messages"
    assert provider.count() == (1 if decision == "approve" else 0)
    state = await graph.aget_state(CONFIG)
    assert state.next == () and state.interrupts == ()
    assert (await areview(graph, CONFIG)).pending == []


async def test_async_review_refuses_a_call_no_longer_pending_on_the_event_loop(
        asaver, provider) -> None:
    """Seed 10410: a decision for a call `areview` no longer lists was refused by reading
    the journal synchronously, which the async saver refuses on its own event loop
    (asyncio.InvalidStateError). It is `InvalidDecision`, naming when and by whom."""
    graph = parent_of(("child", agent(provider, "ana", run_async=True))).compile(
        checkpointer=asaver)
    await graph.ainvoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    first = await areview(graph, CONFIG)
    await first.approve("c0", reviewer="ana").aresume()
    events = len(await asaver.aevents("t"))
    again = await areview(graph, CONFIG)
    with pytest.raises(InvalidDecision, match=r"decided at .* UTC by ana \(approve\)"):
        again.approve("c0", reviewer="lee")
    with pytest.raises(InvalidDecision, match=r"'c9'.*pending: \[\]"):
        again.reject("c9", "no such call")
    assert len(await asaver.aevents("t")) == events and provider.count() == 1
