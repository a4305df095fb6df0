"""Forks keep their source's keys: re-running a thread from a named checkpoint never re-sends.

A run that names a checkpoint id (resuming with the config `get_state` returns, time
travel through `get_state_history`, continuing an `update_state` fork) re-runs the same
requested call, so it must get the same idempotency key, and the ledger must replay the
receipt (or pause as `effect_unknown`) instead of sending again. A genuinely new call,
a new AIMessage that reuses a tool_call_id and args, is a new effect.

Every assertion is on the provider's side: how many effects it applied, which keys it saw.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from graph_durable import AsyncDurableSqliteSaver, DurableSqliteSaver
from graph_durable.testing import FakeProvider, FaultPlan
from graph_durable.testing.crash.child import run_child
from graph_durable.testing.scenarios.forks import (
    CHARGE_CALL_ID,
    assemble_charge_agent,
    build_charge_agent,
    run_fork_child,
)

CHARGE = "graph_durable.testing.scenarios.forks:build_charge_agent"
THREAD = {"configurable": {"thread_id": "t"}}


def charge_kwargs(tmp_path: Path, mode: str) -> dict[str, Any]:
    return {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path),
            "mode": mode}


def charge_provider(tmp_path: Path, mode: str) -> FakeProvider:
    return FakeProvider(str(tmp_path / "charge.sqlite"), mode, name="charge")  # type: ignore[arg-type]


def provider_report(provider: FakeProvider) -> str:
    return f"provider applied {provider.count()} effect(s); requests {provider.requests()}"


def keys_seen(provider: FakeProvider) -> set[str]:
    return {request["key"] for request in provider.requests()}


def before_tools(graph: Any, config: dict[str, Any]) -> Any:
    """The (latest) checkpoint whose next step runs the tools."""
    return next(s for s in graph.get_state_history(config) if s.next == ("tools",))


def tool_answers(messages: list[Any]) -> list[ToolMessage]:
    return [m for m in messages if isinstance(m, ToolMessage)]


# -- 1. SIGKILL after the effect, resume with the config get_state returns ---------------


@pytest.mark.crash
def test_blind_resume_at_named_checkpoint_pauses_instead_of_resending(tmp_path: Path) -> None:
    kwargs = charge_kwargs(tmp_path, "blind")
    provider = charge_provider(tmp_path, "blind")

    crashed = run_child(CHARGE, kwargs, thread_id="t",
                        fault=FaultPlan("after_effect", tool="charge"))
    assert crashed.killed
    assert provider.count() == 1  # applied, receipt not durable

    resumed = run_fork_child(CHARGE, kwargs, thread_id="t", action="resume_at_checkpoint")
    assert not resumed.killed, resumed.stderr[-2000:]
    assert provider.count() == 1, f"second send on resume: {provider_report(provider)}"
    [question] = resumed.interrupts
    assert question["type"] == "effect_unknown"
    assert question["tool_call_id"] == CHARGE_CALL_ID
    assert len(provider.requests()) == 1


@pytest.mark.crash
def test_idempotent_resume_at_named_checkpoint_resends_under_the_same_key(
    tmp_path: Path,
) -> None:
    kwargs = charge_kwargs(tmp_path, "dedupe")
    provider = charge_provider(tmp_path, "dedupe")

    assert run_child(CHARGE, kwargs, thread_id="t",
                     fault=FaultPlan("after_effect", tool="charge")).killed
    assert provider.count() == 1

    resumed = run_fork_child(CHARGE, kwargs, thread_id="t", action="resume_at_checkpoint")
    assert resumed.done, resumed.summary
    assert provider.count() == 1, f"second effect on resume: {provider_report(provider)}"
    assert len(keys_seen(provider)) == 1, f"new key on resume: {provider_report(provider)}"
    [answer] = [m for m in resumed.summary["messages"] if m["type"] == "tool"]
    assert answer["tool_call_id"] == CHARGE_CALL_ID
    assert json.loads(answer["content"])["id"] == "charge-1"


# -- 2. Time travel to the checkpoint before the tools ------------------------------------


def test_time_travel_replays_the_receipt(tmp_path: Path) -> None:
    agent = build_charge_agent(**charge_kwargs(tmp_path, "blind"))
    provider = agent.providers["charge"]
    agent.graph.invoke(agent.inputs, THREAD, durability="sync")
    assert provider.count() == 1 and not agent.graph.get_state(THREAD).next

    past = before_tools(agent.graph, THREAD)
    agent.graph.invoke(None, past.config, durability="sync")

    assert provider.count() == 1, f"time travel re-sent: {provider_report(provider)}"
    state = agent.graph.get_state(THREAD)
    assert not state.next and not state.interrupts
    [answer] = tool_answers(state.values["messages"])
    assert answer.tool_call_id == CHARGE_CALL_ID
    assert json.loads(answer.content)["id"] == "charge-1"


# -- 3. update_state fork of the checkpoint before the tools ------------------------------


@pytest.mark.parametrize("update", ["none", "unchanged"])
def test_update_state_fork_keeps_the_key(tmp_path: Path, update: str) -> None:
    agent = build_charge_agent(**charge_kwargs(tmp_path, "dedupe"))
    provider = agent.providers["charge"]
    agent.graph.invoke(agent.inputs, THREAD, durability="sync")
    assert provider.count() == 1

    past = before_tools(agent.graph, THREAD)
    if update == "none":
        fork = agent.graph.update_state(past.config, None)
    else:
        requesting = past.values["messages"][-1]
        assert isinstance(requesting, AIMessage) and requesting.tool_calls
        fork = agent.graph.update_state(past.config, {"messages": [requesting]},
                                        as_node="agent")
    assert agent.graph.get_state(fork).next == ("tools",)
    agent.graph.invoke(None, fork, durability="sync")

    assert provider.count() == 1, f"fork applied again: {provider_report(provider)}"
    assert len(keys_seen(provider)) == 1, f"fork sent a new key: {provider_report(provider)}"
    state = agent.graph.get_state(THREAD)
    assert not state.next
    [answer] = tool_answers(state.values["messages"])
    assert answer.tool_call_id == CHARGE_CALL_ID
    assert json.loads(answer.content)["id"] == "charge-1"


# -- 4. A new AIMessage reusing the tool_call_id and args is a new effect ------------------


@pytest.mark.parametrize("mode", ["blind", "dedupe"])
def test_same_tool_call_id_in_a_new_turn_is_a_new_effect(tmp_path: Path, mode: str) -> None:
    agent = build_charge_agent(**charge_kwargs(tmp_path, mode))
    provider = agent.providers["charge"]
    agent.graph.invoke(agent.inputs, THREAD, durability="sync")
    assert provider.count() == 1

    agent.graph.invoke({"messages": [HumanMessage("Charge her again.")]}, THREAD,
                       durability="sync")

    assert provider.count() == 2, provider_report(provider)
    assert len(keys_seen(provider)) == 2
    state = agent.graph.get_state(THREAD)
    assert not state.next and not state.interrupts
    requests = [m for m in state.values["messages"] if isinstance(m, AIMessage) and m.tool_calls]
    assert len(requests) == 2 and requests[0].id != requests[1].id
    assert [c["id"] for m in requests for c in m.tool_calls] == [CHARGE_CALL_ID] * 2
    answers = tool_answers(state.values["messages"])
    assert [json.loads(m.content)["id"] for m in answers] == ["charge-1", "charge-2"]
    assert state.values["messages"][-1].content == "Charged again."


# -- 5. Time travel under ainvoke with the async saver --------------------------------------


async def test_async_time_travel_replays_the_receipt(tmp_path: Path) -> None:
    async with AsyncDurableSqliteSaver.from_conn_string(str(tmp_path / "agent.sqlite")) as saver:
        agent = assemble_charge_agent(saver, str(tmp_path), "blind")
        provider = agent.providers["charge"]
        await agent.graph.ainvoke(agent.inputs, THREAD, durability="sync")
        assert provider.count() == 1

        past = None
        async for snapshot in agent.graph.aget_state_history(THREAD):
            if snapshot.next == ("tools",):
                past = snapshot
                break
        assert past is not None
        await agent.graph.ainvoke(None, past.config, durability="sync")

        assert provider.count() == 1, f"async time travel re-sent: {provider_report(provider)}"
        state = await agent.graph.aget_state(THREAD)
        assert not state.next and not state.interrupts
        [answer] = tool_answers(state.values["messages"])
        assert answer.tool_call_id == CHARGE_CALL_ID
        assert json.loads(answer.content)["id"] == "charge-1"


# -- 6. SIGKILL with the call on its way, then the thread is copied ----------------------


@pytest.mark.crash
def test_a_copy_of_a_thread_killed_mid_call_pauses_and_the_call_is_sent_once(
        tmp_path: Path) -> None:
    """Killed after its intent was durable, before the charge went out, thread `t` is
    copied. Each of the two then holds the intent open, and neither can tell whether the
    other's attempt is out: a lookup that finds nothing proves nothing while one may be.
    So each pauses instead of sending; a human's retry in one sends the call, and the
    other's retry finds it by lookup."""
    kwargs = charge_kwargs(tmp_path, "lookup")
    provider = charge_provider(tmp_path, "lookup")
    crashed = run_child(CHARGE, kwargs, thread_id="t",
                        fault=FaultPlan("after_intent", tool="charge"))
    assert crashed.killed and provider.count() == 0
    with closing(sqlite3.connect(kwargs["db_path"])) as conn:
        DurableSqliteSaver(conn).copy_thread("t", "fork")
    for thread in ("fork", "t"):
        paused = run_child(CHARGE, kwargs, thread_id=thread, action="resume")
        [question] = paused.interrupts
        assert question["type"] == "effect_unknown", paused.stderr[-2000:]
        assert "of the same family has this call" in question["error"]
        assert provider.count() == 0, provider_report(provider)
    retry = {CHARGE_CALL_ID: {"type": "retry"}}
    sent = run_child(CHARGE, kwargs, thread_id="t", action="review", resume=retry)
    assert sent.done, sent.stderr[-2000:]
    assert provider.count() == 1
    found = run_child(CHARGE, kwargs, thread_id="fork", action="review", resume=retry)
    assert found.done, found.stderr[-2000:]
    assert provider.count() == 1 and len(provider.requests()) == 1, provider_report(provider)
