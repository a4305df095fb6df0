"""Requesting messages without ids: a later request never gets an earlier one's receipt.

A key is anchored to the id of the AIMessage that asked for the call. A state without
`add_messages` keeps messages as they come, so a hand-built AIMessage has no id; its
position does not tell it apart from a later request that repeats it (a bounded history
puts each turn's request at the same index; every `Send` payload starts at index 0). The
guard refuses such a request before anything is claimed or sent, and the fix it names
(ids on the messages) then charges every turn.

Each test runs on every durable saver, with a policy whose calls are claimed ahead of the
step and with one whose calls claim on their own, synchronously and under `ainvoke`.
"""

from __future__ import annotations

import operator
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from graph_durable import Effect, EffectGuardNode
from graph_durable.errors import UnkeyableToolCall
from graph_durable.testing import FakeProvider
from tests.fakes import charge_tool

POLICIES = {"claimed_ahead": {"charge": Effect(idempotent=True)}, "on_its_own": {}}


@pytest.fixture(params=sorted(POLICIES))
def policy(request: pytest.FixtureRequest) -> dict[str, Effect]:
    return POLICIES[request.param]


@pytest.fixture
def provider(tmp_path: Path) -> FakeProvider:
    return FakeProvider(str(tmp_path / "p.sqlite"), "blind", name="charge")


def config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def request(cents: int, call_id: str, with_id: bool) -> AIMessage:
    """What a scripted model asks every turn: the same tool_call_id, the same args."""
    message = AIMessage(content="", tool_calls=[
        {"name": "charge", "args": {"cents": cents}, "id": call_id}])
    if with_id:
        message.id = f"ai-{uuid.uuid4()}"
    return message


# -- a history that keeps the last two messages ----------------------------------------------


def keep_last_two(left: list[AnyMessage], right: Any) -> list[AnyMessage]:
    return [*left, *(right if isinstance(right, list) else [right])][-2:]


class Bounded(TypedDict):
    messages: Annotated[list[AnyMessage], keep_last_two]


def bounded_graph(saver: Any, provider: FakeProvider, policy: dict[str, Effect],
                  with_ids: bool) -> Any:
    """Each turn: a human asks, the model asks for `charge(5)` as `call_1`, the tool
    answers, the model says it is done. With two messages kept, every turn's request
    sits at index 1."""

    def agent(state: Bounded) -> dict[str, Any]:
        last = state["messages"][-1]
        if isinstance(last, ToolMessage):
            return {"messages": [AIMessage(content=f"told the customer: {last.content}")]}
        return {"messages": [request(5, "call_1", with_ids)]}

    def route(state: Bounded) -> str:
        return "tools" if getattr(state["messages"][-1], "tool_calls", None) else END

    builder = StateGraph(Bounded)
    builder.add_node("agent", agent)
    builder.add_node("tools", EffectGuardNode([charge_tool(provider)], effects=policy))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


# -- a fan-out whose Send payloads carry hand-built AIMessages --------------------------------


class Fan(TypedDict):
    messages: Annotated[list[AnyMessage], operator.add]


def fan_out_graph(saver: Any, provider: FakeProvider, policy: dict[str, Effect],
                  with_ids: bool) -> Any:
    """Each turn sends two payloads to the tools, `call_0` charging 5 and `call_1`
    charging 7, each the only message of its payload (index 0)."""

    def fan_out(state: Fan) -> list[Send]:
        return [Send("tools", {"messages": [request(cents, f"call_{n}", with_ids)]})
                for n, cents in enumerate((5, 7))]

    builder = StateGraph(Fan)
    builder.add_node("dispatch", lambda state: {})
    builder.add_node("tools", EffectGuardNode([charge_tool(provider)], effects=policy))
    builder.add_edge(START, "dispatch")
    builder.add_conditional_edges("dispatch", fan_out, ["tools"])
    builder.add_edge("tools", END)
    return builder.compile(checkpointer=saver)


# -- the checks, sync and async ---------------------------------------------------------------

TURNS = 2


def turn(n: int) -> dict[str, Any]:
    return {"messages": [HumanMessage(f"turn {n}: charge the customer")]}


def assert_refused(info: pytest.ExceptionInfo[UnkeyableToolCall], thread: str,
                   call_ids: set[str], effects: list[Any], provider: FakeProvider) -> None:
    error = info.value
    assert error.thread_id == thread and error.tool_call_id in call_ids
    text = str(error)
    assert repr(thread) in text and repr(error.tool_call_id) in text
    assert "has no id" in text and "nothing was sent" in text
    assert "add_messages" in text and "AIMessage(id=...)" in text
    assert provider.requests() == [] and effects == []


def assert_every_turn_charged(effects: list[Any], provider: FakeProvider, per_turn: int
                              ) -> None:
    assert provider.count() == TURNS * per_turn
    assert len(provider.requests()) == TURNS * per_turn
    assert len(effects) == TURNS * per_turn and len({e.key for e in effects}) == len(effects)
    assert {e.status.value for e in effects} == {"applied"}


def run_turns(graph: Any, thread: str) -> None:
    for n in range(TURNS):
        graph.invoke(turn(n), config(thread), durability="sync")


async def arun_turns(graph: Any, thread: str) -> None:
    for n in range(TURNS):
        await graph.ainvoke(turn(n), config(thread), durability="sync")


SCENARIOS: dict[str, tuple[Callable[..., Any], set[str], int]] = {
    "bounded_history": (bounded_graph, {"call_1"}, 1),
    "send_fan_out": (fan_out_graph, {"call_0", "call_1"}, 2),
}


@pytest.fixture(params=sorted(SCENARIOS))
def scenario(request: pytest.FixtureRequest) -> tuple[Callable[..., Any], set[str], int]:
    return SCENARIOS[request.param]


def test_a_request_without_an_id_is_refused_before_anything_is_sent(
        make_saver, provider, policy, scenario) -> None:
    """Keyed by position, the second turn's charge was never sent: the model was told
    the first turn's receipt. Refused, nothing is claimed or sent, on every resume path;
    with ids on the messages both turns are charged."""
    build, call_ids, per_turn = scenario
    saver = make_saver()
    graph = build(saver, provider, policy, with_ids=False)
    with pytest.raises(UnkeyableToolCall) as info:
        run_turns(graph, "t")
    assert_refused(info, "t", call_ids, saver.effects("t"), provider)
    for resume_at in (config("t"), graph.get_state(config("t")).config):
        with pytest.raises(UnkeyableToolCall) as info:
            graph.invoke(None, resume_at, durability="sync")
        assert_refused(info, "t", call_ids, saver.effects("t"), provider)

    run_turns(build(saver, provider, policy, with_ids=True), "fixed")
    assert_every_turn_charged(saver.effects("fixed"), provider, per_turn)


async def test_a_request_without_an_id_is_refused_before_anything_is_sent_async(
        amake_saver, provider, policy, scenario) -> None:
    build, call_ids, per_turn = scenario
    saver = await amake_saver()
    graph = build(saver, provider, policy, with_ids=False)
    with pytest.raises(UnkeyableToolCall) as info:
        await arun_turns(graph, "t")
    assert_refused(info, "t", call_ids, await saver.aeffects("t"), provider)
    for resume_at in (config("t"), (await graph.aget_state(config("t"))).config):
        with pytest.raises(UnkeyableToolCall) as info:
            await graph.ainvoke(None, resume_at, durability="sync")
        assert_refused(info, "t", call_ids, await saver.aeffects("t"), provider)

    await arun_turns(build(saver, provider, policy, with_ids=True), "fixed")
    assert_every_turn_charged(await saver.aeffects("fixed"), provider, per_turn)


def test_a_refused_thread_goes_on_once_its_request_has_an_id(make_saver, provider,
                                                              policy) -> None:
    """The fix the error names, applied to the thread it stopped: the request written
    again with an id is charged once, and the next turn (with ids) is charged too."""
    saver = make_saver()
    graph = bounded_graph(saver, provider, policy, with_ids=False)
    with pytest.raises(UnkeyableToolCall):
        graph.invoke(turn(0), config("t"), durability="sync")
    stopped = graph.get_state(config("t")).values["messages"][-1]
    assert stopped.tool_calls and stopped.id is None
    graph.update_state(config("t"), {"messages": [stopped.model_copy(update={"id": "ai-0"})]},
                       as_node="agent")
    result = graph.invoke(None, config("t"), durability="sync")
    assert result["messages"][-1].content == "told the customer: charged charge-1"
    bounded_graph(saver, provider, policy, with_ids=True).invoke(
        turn(1), config("t"), durability="sync")
    assert provider.count() == 2 and len(saver.effects("t")) == 2


def test_a_steps_requests_are_found_as_each_call_finds_its_own() -> None:
    """`requests_of` reads the messages once for a step's calls, and finds for each
    what `request_of` finds for it alone: the last AIMessage holding its id, with every
    call of that message under the id, or nothing."""
    from graph_durable.nodes.anchor import request_of, requests_of

    def call(call_id: str, name: str = "charge", **args: Any) -> dict[str, Any]:
        return {"id": call_id, "name": name, "args": args, "type": "tool_call"}

    older = AIMessage("", id="m1", tool_calls=[call("a", cents=1), call("b", cents=2)])
    newer = AIMessage("", id="m2", tool_calls=[call("a", cents=3), call("c", cents=4),
                                               call("c", name="refund", cents=5)])
    messages = [HumanMessage("hi", id="h"), older,
                ToolMessage("ok", tool_call_id="a", id="t"), newer, HumanMessage("more")]
    ids = ["a", "b", "c", "missing", None]
    for state in (messages, {"messages": messages}, {"history": messages}):
        key = "history" if isinstance(state, dict) and "history" in state else "messages"
        found = requests_of(state, ids, key)
        assert list(found) == ids
        for call_id in ids:
            assert found[call_id] == request_of(state, call_id, key)
        assert found["a"] == (newer, [newer.tool_calls[0]])
        assert found["b"] == (older, [older.tool_calls[1]])
        assert found["c"] == (newer, newer.tool_calls[1:])
        assert found["missing"] is None and found[None] is None
    assert requests_of({"messages": "not a list"}, ["a"]) == {"a": None}
