"""The operators' entry points from async code, on every durable saver: `athread_status`,
`arecover`, `afind_orphans`, `aresolve_orphan`, and a `Review` from `areview` refusing a
decision. On the async savers they run on the saver's own running loop, where the sync
functions raise `InvalidStateError`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from graph_durable import (
    Effect,
    EffectStatus,
    InvalidDecision,
    afind_orphans,
    arecover,
    aresolve_orphan,
    areview,
    athread_status,
    find_orphans,
    thread_status,
)
from graph_durable.testing import FakeProvider, FaultPlan, InjectedCrash, arm, disarm
from tests.fakes import apay_tool
from tests.nodes.test_guard_async import build, run
from tests.test_orphans import agent

S = EffectStatus
CONFIG = {"configurable": {"thread_id": "t"}}


@pytest.fixture
async def saver(amake_saver: Callable[..., Any]) -> Any:
    return await amake_saver()


def on_its_loop(saver: Any) -> bool:
    return getattr(saver, "loop", None) is asyncio.get_running_loop()


async def test_a_review_from_areview_refuses_a_decision_for_a_call_not_pending(
        saver: Any, tmp_path: Path) -> None:
    """The refusal is `InvalidDecision`, not a sync read of the saver on its loop."""
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "dedupe")
    graph = build(saver, [apay_tool(provider)], {"pay": Effect(idempotent=True, approval=True)},
                  {"name": "pay", "args": {"cents": 5}, "id": "c1"})
    await run(graph)
    pending = await areview(graph, CONFIG)
    with pytest.raises(InvalidDecision, match="No pending decision for tool call 'c9'"):
        pending.approve("c9")
    pending.approve("c1", reviewer="ana")
    await pending.aresume()
    assert provider.count() == 1


async def test_athread_status_and_arecover_resume_a_crashed_thread_once(
        saver: Any, tmp_path: Path) -> None:
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "lookup")
    graph = build(saver, [apay_tool(provider)], {"pay": Effect(lookup=provider.find)},
                  {"name": "pay", "args": {"cents": 5}, "id": "c1"})
    arm(FaultPlan("after_effect", action="raise"))  # the worker dies after the payment
    try:
        with pytest.raises(InjectedCrash):
            await run(graph)
    finally:
        disarm()
    if on_its_loop(saver):
        with pytest.raises(asyncio.InvalidStateError, match="Synchronous calls"):
            thread_status(saver, "t")
    assert (await athread_status(saver, "t")).status == "orphaned"
    [outcome] = await arecover(graph, saver, owner="sweeper")
    assert (outcome.thread_id, outcome.outcome, outcome.status) == ("t", "resumed", "done")
    assert provider.count() == 1  # looked up, not paid again
    assert (await graph.aget_state(CONFIG)).values["messages"][-1].content == "done"
    assert await arecover(graph, saver, owner="sweeper") == []


async def test_an_orphan_areview_lists_is_settled_by_aresolve_orphan(
        saver: Any, tmp_path: Path) -> None:
    provider = FakeProvider(str(tmp_path / "mail.sqlite"), "lookup", name="mail")
    policy = Effect(lookup=provider.find)
    graph = agent(provider, policy).compile(checkpointer=saver)
    await graph.ainvoke({"messages": [HumanMessage("go")]},
                        {**CONFIG, "metadata": {"run_id": "r1"}}, durability="sync")
    arm(FaultPlan("after_effect", action="raise"))  # the call landed, then the run died
    try:
        with pytest.raises(InjectedCrash):
            await graph.ainvoke({"messages": [HumanMessage("again")]},
                                {**CONFIG, "metadata": {"run_id": "r2"}}, durability="sync")
    finally:
        disarm()
    await saver.adelete_for_runs(["r2"])  # the server rolled the run back
    if on_its_loop(saver):
        with pytest.raises(asyncio.InvalidStateError, match="await the `a`-prefixed"):
            find_orphans(saver, "t")
    [orphan] = (await areview(graph, CONFIG)).orphans
    assert [o.key for o in await afind_orphans(saver, "t")] == [orphan.key]
    record = await aresolve_orphan(saver, "t", orphan.tool_call_id, effects={"send": policy},
                                   reviewer="ana")
    assert record.status is S.APPLIED and record.receipt == provider.find(orphan.key)
    assert provider.count(orphan.key) == 1 and provider.count() == 2
    assert await afind_orphans(saver, "t") == []
    assert (await athread_status(saver, "t")).status == "done"
