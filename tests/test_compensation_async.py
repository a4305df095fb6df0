"""`acompensate`, `acancel` and `Review.acompensate` from async code, on every durable
saver: on the async savers they run on the saver's own running loop, where the sync
`compensate` and `cancel` refuse. Checked on the providers' side, as in
`test_compensation.py`; the crash proof is in `test_compensation_crash.py`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import StructuredTool

from graph_durable import (
    Compensation,
    Effect,
    EffectStatus,
    InvalidDecision,
    ThreadCancelled,
    acancel,
    acompensate,
    areview,
    cancel,
    compensate,
    current_effect,
)
from graph_durable.testing.models import ScriptedChatModel
from graph_durable.testing.providers import FakeProvider
from graph_durable.testing.scenarios.effects import react_graph
from graph_durable.testing.scenarios.saga import SAGA_THREAD, assemble_saga_agent, saga_providers
from tests.test_compensation import unknown_charge_graph

S = EffectStatus
CONFIG = {"configurable": {"thread_id": SAGA_THREAD}}


@pytest.fixture
async def saver(amake_saver: Callable[..., Any]) -> Any:
    return await amake_saver()


def on_its_loop(saver: Any) -> bool:
    """Whether `saver` is an async saver whose event loop is this one."""
    return getattr(saver, "loop", None) is asyncio.get_running_loop()


async def saga(saver: Any, tmp_path: Path, refund_mode: str = "dedupe") -> Any:
    """The saga agent on `saver`, run to its end: a charge and a ticket, both applied."""
    agent = assemble_saga_agent(saver, saga_providers(str(tmp_path), refund_mode, "lookup"))
    await agent.graph.ainvoke(agent.inputs, CONFIG, durability="sync")
    assert agent.providers["charges"].count() == 1 and agent.providers["tickets"].count() == 1
    return agent


async def test_acompensate_undoes_one_applied_effect_once_on_the_savers_loop(
        saver: Any, tmp_path: Path) -> None:
    agent = await saga(saver, tmp_path)
    if on_its_loop(saver):
        with pytest.raises(asyncio.InvalidStateError, match="await the `a`-prefixed"):
            compensate(agent.graph, saver, SAGA_THREAD, "call_charge")
    record = await acompensate(agent.graph, saver, SAGA_THREAD, "call_charge", reviewer="ana")
    assert record.status is S.COMPENSATED
    refunds = agent.providers["refunds"]
    assert refunds.count() == 1 and refunds.effects()[0]["payload"] == {"charge": "charge-1"}
    with pytest.raises(InvalidDecision, match="compensated already. Nothing was changed"):
        await acompensate(agent.graph, saver, SAGA_THREAD, "call_charge")
    assert refunds.count() == 1 and agent.providers["closures"].count() == 0
    undo = next(r for r in await saver.aeffects(SAGA_THREAD) if r.tool == "refund")
    # The refund was sent under its own key, seen by the compensation as current_effect().
    assert refunds.count(undo.key) == 1
    [intent] = [e for e in await saver.aevents(SAGA_THREAD, undo.key) if e.kind == "intent"]
    assert intent.data["decision"] == {"type": "compensate", "reviewer": "ana"}


async def test_acancel_undoes_newest_first_and_the_thread_never_runs_again(
        saver: Any, tmp_path: Path) -> None:
    agent = await saga(saver, tmp_path)
    if on_its_loop(saver):
        with pytest.raises(asyncio.InvalidStateError, match="await the `a`-prefixed"):
            cancel(agent.graph, saver, SAGA_THREAD, owner="ops")
    report = await acancel(agent.graph, saver, SAGA_THREAD, owner="ops")
    assert report.outcome == "cancelled"
    assert [r.tool for r in report.compensated] == ["open_ticket", "charge"]
    undone = [e.data["by"] for e in await saver.aevents(SAGA_THREAD) if e.kind == "compensated"]
    assert undone == ["close_ticket", "refund"]
    assert await saver.acancelled_by(SAGA_THREAD) == "ops"
    with pytest.raises(ThreadCancelled, match="was cancelled by 'ops'"):
        await agent.graph.ainvoke({"messages": [HumanMessage("again")]}, CONFIG,
                                  durability="sync")
    again = await acancel(agent.graph, saver, SAGA_THREAD, owner="ops-2")  # nothing twice
    assert [r.tool for r in again.compensated] == ["open_ticket", "charge"]
    assert agent.providers["refunds"].count() == 1 and agent.providers["closures"].count() == 1


async def test_acancel_awaits_an_async_compensation_and_an_async_lookup(
        saver: Any, tmp_path: Path) -> None:
    """What the sync `cancel` cannot call: an async undo, and an async lookup that finds
    the charge whose call raised."""
    charges = FakeProvider(str(tmp_path / "charges.sqlite"), "lookup", name="charge")
    refunds = FakeProvider(str(tmp_path / "refunds.sqlite"), "dedupe", name="refund")

    def charge(cents: int) -> dict[str, Any]:
        charges.apply(current_effect().key, {"cents": cents})
        raise ConnectionError("connection reset after the charge landed")

    async def find(key: str) -> Any:
        return charges.find(key)

    async def refund(record: Any, receipt: Any) -> dict[str, Any]:
        return refunds.apply(current_effect().key, {"charge": receipt["id"]})

    policy = Effect(compensate=Compensation(refund, effect=Effect(idempotent=True)))
    model = ScriptedChatModel(script=[
        AIMessage(content="", tool_calls=[{"name": "charge", "id": "c1", "args": {"cents": 5}}]),
        AIMessage(content="done")])
    tool = StructuredTool.from_function(charge, name="charge", description="Charge.")
    graph = react_graph(model, [tool], {"charge": policy}, saver)
    await graph.ainvoke({"messages": [HumanMessage("pay")]}, CONFIG, durability="sync")
    [record] = await saver.aeffects(SAGA_THREAD)
    assert record.status is S.UNKNOWN and charges.count() == 1
    report = await acancel(graph, saver, SAGA_THREAD,
                           effects={"charge": Effect(lookup=find, compensate=policy.compensation)})
    assert [r.tool_call_id for r in report.compensated] == ["c1"]
    assert refunds.count() == 1
    assert refunds.effects()[0]["payload"] == {"charge": charges.effects()[0]["receipt"]["id"]}


async def test_review_acompensates_a_pending_unknown_effect_and_the_thread_goes_on(
        saver: Any, tmp_path: Path) -> None:
    refunds = FakeProvider(str(tmp_path / "refunds.sqlite"), "dedupe", name="refund")
    graph = unknown_charge_graph(saver, refunds)
    await graph.ainvoke({"messages": [HumanMessage("pay")]}, CONFIG, durability="sync")
    pending = await areview(graph, CONFIG)
    assert [(i.tool_call_id, i.kind) for i in pending.pending] == [("c1", "unknown")]
    if on_its_loop(saver):
        with pytest.raises(asyncio.InvalidStateError, match="await the `a`-prefixed"):
            pending.compensate("c1", receipt={"id": "charge-7"})
    await pending.acompensate("c1", receipt={"id": "charge-7"}, reviewer="ana")
    assert pending.pending == [] and [i.tool_call_id for i in pending.settled] == ["c1"]
    await pending.aresume()
    assert refunds.count() == 1 and (await areview(graph, CONFIG)).pending == []
    [record, _] = await saver.aeffects(SAGA_THREAD)
    assert record.status is S.COMPENSATED
    messages = (await graph.aget_state(CONFIG)).values["messages"]
    assert "Applied, then undone by refund" in messages[-2].content
    assert messages[-1].content == "done"
