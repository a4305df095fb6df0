"""A write tool that asks its own question with LangGraph's `interrupt()`.

The tool's interrupt surfaces with its own value, its answer reaches the tool, the
effect is sent once, and the journal tells "paused inside the tool" from "crashed in
flight".
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.types import Command, interrupt

from graph_durable import DurableSqliteSaver, Effect, EffectStatus, current_effect
from graph_durable.testing import FakeProvider, FaultPlan, InjectedCrash, arm, disarm
from tests.nodes.test_guard import CONFIG, build, call, run


@pytest.fixture
def saver(tmp_path: Path) -> DurableSqliteSaver:
    return DurableSqliteSaver(sqlite3.connect(tmp_path / "a.sqlite", check_same_thread=False))


@pytest.fixture(autouse=True)
def _disarm():
    yield
    disarm()


def confirming_charge(provider: FakeProvider):
    @tool
    def charge(cents: int) -> str:
        """Charge after the customer confirms."""
        answer = interrupt({"question": f"charge {cents} cents?"})
        if answer != "yes":
            return "customer declined"
        return f"charged {provider.apply(current_effect().key, {'cents': cents})['id']}"

    return charge


def test_the_tools_own_question_surfaces_and_its_answer_reaches_the_tool(saver, tmp_path) -> None:
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "blind")
    graph = build(saver, [confirming_charge(provider)], {}, call("charge", {"cents": 5}))
    result = run(graph)
    [question] = result["__interrupt__"]
    assert question.value == {"question": "charge 5 cents?"}
    [record] = saver.effects("t")
    assert record.status is EffectStatus.IN_FLIGHT and provider.count() == 0
    kinds = [e.kind for e in saver.events("t")]
    assert kinds == ["intent", "paused"]  # paused inside the tool, not crashed in flight

    # A plain re-run asks the same question again; nothing is sent, nothing is unknown.
    again = run(graph, None)
    assert again["__interrupt__"][0].value == {"question": "charge 5 cents?"}
    assert provider.count() == 0

    result = graph.invoke(Command(resume="yes"), CONFIG, durability="sync")
    assert result["messages"][-1].content == "done"
    assert result["messages"][2].content == "charged effect-1"
    assert provider.count() == 1
    assert saver.effects("t")[0].status is EffectStatus.APPLIED


def test_a_crash_after_the_resumed_tool_sent_is_reconciled_not_resent(saver, tmp_path) -> None:
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "blind")
    graph = build(saver, [confirming_charge(provider)], {}, call("charge", {"cents": 5}))
    run(graph)
    arm(FaultPlan("after_effect", action="raise"))
    with pytest.raises(InjectedCrash):
        graph.invoke(Command(resume="yes"), CONFIG, durability="sync")
    disarm()
    result = run(graph, None)
    [question] = result["__interrupt__"]
    assert question.value["type"] == "effect_unknown"  # never a silent second send
    assert provider.count() == 1


def test_a_tool_question_beside_an_approval_in_the_same_step(saver, tmp_path) -> None:
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "blind")
    mail = FakeProvider(str(tmp_path / "m.sqlite"), "blind", name="mail")

    @tool
    def send(to: str) -> str:
        """Send a mail."""
        return f"sent {mail.apply(current_effect().key, {'to': to})['id']}"

    graph = build(saver, [confirming_charge(provider), send], {"send": Effect(approval=True)},
                  call("charge", {"cents": 5}, "c1"), call("send", {"to": "ana"}, "c2"))
    result = run(graph)
    [question] = result["__interrupt__"]
    assert question.value == {"question": "charge 5 cents?"}  # one question at a time
    result = graph.invoke(Command(resume="yes"), CONFIG, durability="sync")
    [approval] = result["__interrupt__"]
    assert approval.value["tool_call_id"] == "c2"
    result = graph.invoke(Command(resume={"c2": {"type": "approve"}}), CONFIG,
                          durability="sync")
    assert result["messages"][-1].content == "done"
    assert provider.count() == 1 and mail.count() == 1


async def test_async_tool_question_and_an_approval_beside_it(tmp_path) -> None:
    from graph_durable import AsyncDurableSqliteSaver
    from tests.nodes import test_guard_async as agraph

    provider = FakeProvider(str(tmp_path / "p.sqlite"), "blind")
    mail = FakeProvider(str(tmp_path / "m.sqlite"), "blind", name="mail")

    @tool
    async def charge(cents: int) -> str:
        """Charge after the customer confirms."""
        if interrupt({"question": f"charge {cents} cents?"}) != "yes":
            return "customer declined"
        return f"charged {provider.apply(current_effect().key, {'cents': cents})['id']}"

    @tool
    async def send(to: str) -> str:
        """Send a mail."""
        return f"sent {mail.apply(current_effect().key, {'to': to})['id']}"

    async with AsyncDurableSqliteSaver.from_conn_string(str(tmp_path / "a.sqlite")) as saver:
        graph = agraph.build(saver, [charge, send], {"send": Effect(approval=True)},
                             call("charge", {"cents": 5}, "c1"), call("send", {"to": "a"}, "c2"))
        result = await agraph.run(graph)
        assert result["__interrupt__"][0].value == {"question": "charge 5 cents?"}
        result = await agraph.run(graph, Command(resume="yes"))
        assert result["__interrupt__"][0].value["tool_call_id"] == "c2"
        result = await agraph.run(graph, Command(resume={"type": "approve"}))
        assert result["messages"][-1].content == "done"
        assert [e.kind for e in await saver.aevents("t", (await saver.aeffects("t"))[0].key)
                ][:2] == ["intent", "paused"]
    assert provider.count() == 1 and mail.count() == 1
