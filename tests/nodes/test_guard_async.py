"""EffectGuardNode under ainvoke on every durable saver, with async tools and lookups."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command

from graph_durable import (
    DurabilityError,
    Effect,
    EffectGuardNode,
    InvalidDecision,
    current_effect,
)
from graph_durable.testing import FakeProvider, FaultPlan, InjectedCrash, arm, disarm
from graph_durable.testing.models import ScriptedChatModel

CONFIG = {"configurable": {"thread_id": "t"}}
NEW = object()


def build(saver: Any, tools: list, effects: dict[str, Effect], *calls: dict[str, Any]):
    script = [AIMessage(content="", tool_calls=list(calls)), AIMessage(content="done")]
    model = ScriptedChatModel(script=script)

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", EffectGuardNode(tools, effects=effects))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


async def run(graph: Any, value: Any = NEW) -> dict[str, Any]:
    value = {"messages": [HumanMessage("go")]} if value is NEW else value
    return await graph.ainvoke(value, CONFIG, durability="sync")


@pytest.fixture
async def saver(amake_saver: Callable[..., Any]) -> Any:
    """Every async guard test runs on every durable saver (`saver_backend`)."""
    return await amake_saver()


@pytest.fixture(autouse=True)
def _disarm():
    yield
    disarm()


def call(name: str, args: dict[str, Any], call_id: str = "c1") -> dict[str, Any]:
    return {"name": name, "args": args, "id": call_id}


async def test_async_tool_applied_then_replayed_after_a_crash(saver, tmp_path) -> None:
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "blind", name="p")

    @tool
    async def send(to: str) -> dict:
        """Send."""
        return provider.apply(current_effect().key, {"to": to})

    graph = build(saver, [send], {}, call("send", {"to": "x"}))
    arm(FaultPlan("after_receipt", action="raise"))
    with pytest.raises(InjectedCrash):
        await run(graph)
    disarm()
    result = await run(graph, None)
    assert result["messages"][-1].content == "done"
    assert provider.count() == 1 and len(provider.requests()) == 1
    assert [r.status.value for r in await saver.aeffects("t")] == ["applied"]


async def test_async_step_claims_every_intent_before_any_call_is_sent(saver, amake_saver) -> None:
    seen: list[set[str]] = []

    @tool
    async def send(to: str) -> str:
        """Send."""
        # Another connection's view: what a process started after a crash would find.
        other = await amake_saver()
        seen.append({r.tool_call_id for r in await other.aeffects("t", status="in_flight")})
        return f"sent to {to}"

    calls = [call("send", {"to": to}, f"c{i}") for i, to in enumerate("xyz")]
    result = await run(build(saver, [send], {"send": Effect(idempotent=True)}, *calls))
    assert [m.content for m in result["messages"][2:5]] == ["sent to x", "sent to y", "sent to z"]
    assert seen == [{"c0", "c1", "c2"}] * 3
    assert [r.status.value for r in await saver.aeffects("t")] == ["applied"] * 3


@pytest.mark.parametrize("lookup", ["async", "sync"])
async def test_async_lookup_recovers_an_in_flight_effect(saver, tmp_path, lookup) -> None:
    """A sync lookup (a blocking HTTP or database call) runs on a worker thread: on the
    event loop it would stall every other run, and the Agent Server refuses it."""
    import asyncio

    provider = FakeProvider(str(tmp_path / "p.sqlite"), "lookup", name="p")
    on_loop: list[bool] = []

    def sync_find(key: str) -> dict | None:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return provider.find(key)

    async def async_find(key: str) -> dict | None:
        return provider.find(key)

    find = async_find if lookup == "async" else sync_find

    @tool
    async def send(to: str) -> dict:
        """Send."""
        return provider.apply(current_effect().key, {"to": to})

    graph = build(saver, [send], {"send": Effect(lookup=find)}, call("send", {"to": "x"}))
    arm(FaultPlan("after_effect", action="raise"))
    with pytest.raises(InjectedCrash):
        await run(graph)
    disarm()
    assert [r.status.value for r in await saver.aeffects("t")] == ["in_flight"]
    result = await run(graph, None)
    assert result["messages"][-1].content == "done"
    assert provider.count() == 1
    sources = [e.data.get("source") for e in await saver.aevents("t") if e.kind == "receipt"]
    assert sources == ["lookup"]
    assert on_loop == ([] if lookup == "async" else [False])


async def test_async_unknown_then_invalid_then_valid_decision(saver) -> None:
    calls: list[str] = []

    @tool
    async def send(to: str) -> str:
        """Send."""
        calls.append(current_effect().key)
        raise ConnectionError("lost")

    graph = build(saver, [send], {}, call("send", {"to": "x"}))
    first = await run(graph)
    assert first["__interrupt__"][0].value["type"] == "effect_unknown"
    events_before = await saver.aevents("t")
    with pytest.raises(InvalidDecision):
        await run(graph, Command(resume={"type": "approve"}))
    assert await saver.aevents("t") == events_before
    result = await run(graph, Command(resume={"type": "applied", "receipt": {"ok": 1}}))
    assert result["messages"][-1].content == "done"
    assert len(calls) == 1


async def test_async_durability_barrier(saver) -> None:
    @tool
    async def send(to: str) -> str:
        """Send."""
        raise AssertionError("must not be called")

    graph = build(saver, [send], {}, call("send", {"to": "x"}))
    with pytest.raises(DurabilityError):
        await graph.ainvoke({"messages": [HumanMessage("go")]}, CONFIG, durability="async")
    assert await saver.aeffects() == []


async def test_async_timeout_is_unknown(saver) -> None:
    import asyncio

    @tool
    async def send(to: str) -> str:
        """Send."""
        await asyncio.sleep(2)
        return "late"

    graph = build(saver, [send], {"send": Effect(timeout=0.1)}, call("send", {"to": "x"}))
    result = await run(graph)
    assert "timeout" in result["__interrupt__"][0].value["error"]


async def test_a_run_cancelled_with_the_call_on_its_way_pauses_instead_of_sending_again(
        saver: Any, tmp_path: Any) -> None:
    """The Agent Server cancels a run (multitask `interrupt` or `rollback`, or a client
    gone with `on_disconnect="cancel"`) while its call is on its way: the request left,
    and the provider applies it a moment later. The next run must not take a lookup that
    finds nothing yet for the truth and send it again: it asks a human, whose retry then
    finds the effect."""
    import asyncio
    import threading
    import time

    provider = FakeProvider(str(tmp_path / "p.sqlite"), "lookup")
    started, land = asyncio.Event(), threading.Event()

    def apply_when_told(key: str) -> None:
        assert land.wait(30)
        provider.apply(key, {})

    @tool
    async def charge(cents: int) -> str:
        """Charge; the first request is applied by the provider after its caller is gone."""
        effect = current_effect()
        if effect.attempt > 1:
            provider.apply(effect.key, {})
            return "charged again"
        started.set()
        await asyncio.shield(asyncio.to_thread(apply_when_told, effect.key))
        return "charged"

    graph = build(saver, [charge], {"charge": Effect(lookup=provider.find)},
                  {"name": "charge", "args": {"cents": 5}, "id": "c1"})
    running = asyncio.create_task(run(graph))
    await asyncio.wait_for(started.wait(), 30)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    result = await run(graph, None)
    land.set()
    assert "__interrupt__" in result, f"sent again: {provider.count()} applied"
    [question] = result["__interrupt__"]
    assert question.value["type"] == "effect_unknown"
    assert "cancelled while the call was in flight" in question.value["error"]
    deadline = time.monotonic() + 30
    while provider.count() == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    result = await run(graph, Command(resume={"type": "retry"}))
    assert result["messages"][-1].content == "done"
    assert provider.count() == 1 and len(provider.requests()) == 1


async def test_async_step_in_a_copy_claims_under_its_sources_keys(saver, tmp_path) -> None:
    """Under `ainvoke` too, a step whose predicted keying (the saver has read a thread
    keyed by its own id) does not fit its thread, a copy, is claimed again under the
    copy's real keying: the source's receipt is replayed, nothing is sent again."""
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "dedupe", name="p")

    @tool
    async def pay(cents: int) -> str:
        """Pay."""
        provider.apply(current_effect().key, {"cents": cents})
        return f"paid {cents}"

    graph = build(saver, [pay], {"pay": Effect(idempotent=True)}, call("pay", {"cents": 5}))
    await run(graph)
    assert provider.count() == 1
    before_tools = [state async for state in graph.aget_state_history(CONFIG)
                    if state.next == ("tools",)][-1]
    await saver.acopy_thread("t", "copy")
    result = await graph.ainvoke(
        None, {"configurable": {**before_tools.config["configurable"], "thread_id": "copy"}},
        durability="sync")
    assert result["messages"][-1].content == "done"
    assert provider.count() == 1
    [copied] = [effect for effect in await saver.aeffects("copy") if effect.tool == "pay"]
    [source] = [effect for effect in await saver.aeffects("t") if effect.tool == "pay"]
    assert copied.key == source.key and copied.status.value == "applied"
