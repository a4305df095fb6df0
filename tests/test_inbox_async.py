"""`ainbox` and `arecord_decisions` from async code, on every durable saver: on the async
savers they run on the saver's own running loop, where the sync `inbox` refuses."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from graph_durable import (
    Effect,
    InvalidDecision,
    ainbox,
    arecord_decisions,
    inbox,
)
from graph_durable.testing import FakeProvider
from tests.fakes import apay_tool
from tests.nodes.test_guard_async import build, run

CONFIG = {"configurable": {"thread_id": "t"}}


@pytest.fixture
async def saver(amake_saver: Callable[..., Any]) -> Any:
    return await amake_saver()


def payment_needing_approval(saver: Any, tmp_path: Any) -> tuple[FakeProvider, Any]:
    """A graph on `saver` whose one call `c1`, an idempotent async `pay` of 5 cents,
    needs approval; and its (deduping) provider."""
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "dedupe")
    return provider, build(saver, [apay_tool(provider)],
                           {"pay": Effect(idempotent=True, approval=True)},
                           {"name": "pay", "args": {"cents": 5}, "id": "c1"})


async def test_a_pending_approval_is_listed_decided_and_sent_once_from_async_code(
        saver: Any, tmp_path: Any) -> None:
    provider, graph = payment_needing_approval(saver, tmp_path)
    result = await run(graph)
    assert result["__interrupt__"] and provider.count() == 0
    [item] = await ainbox(saver)
    assert (item.thread_id, item.tool_call_id, item.kind) == ("t", "c1", "approval")
    assert [i.key for i in await ainbox(saver, "t")] == [item.key]
    if getattr(saver, "loop", None) is asyncio.get_running_loop():
        with pytest.raises(asyncio.InvalidStateError, match="await the `a`-prefixed"):
            inbox(saver)  # the sync call on the saver's own loop cannot work
    with pytest.raises(InvalidDecision, match="Nothing was recorded"):
        await arecord_decisions(saver, "t", {"c9": {"type": "approve"}})
    [record] = await arecord_decisions(saver, "t", {"c1": {"type": "approve"}},
                                       reviewer="ana")
    assert record.decision["type"] == "approve" and not record.asked
    assert await ainbox(saver) == []
    result = await run(graph, None)
    assert result["messages"][-1].content == "done"
    assert provider.count() == 1


async def test_the_notebook_inbox_lists_decides_and_resumes_from_async_code(
        saver: Any, tmp_path: Any) -> None:
    """The widget's async path (`graph_durable.operators.notebook.ainbox`), on every async saver:
    read on the saver's own loop, an approval clicked, the Resume click awaited as a
    task; the payment is sent once."""
    pytest.importorskip("ipywidgets")
    from graph_durable.operators import notebook

    provider, graph = payment_needing_approval(saver, tmp_path)
    assert (await run(graph))["__interrupt__"]
    if getattr(saver, "loop", None) is asyncio.get_running_loop():
        with pytest.raises(asyncio.InvalidStateError, match="await the `a`-prefixed"):
            notebook.inbox(graph, saver)
    box = await notebook.ainbox(graph, saver, reviewer="ana")
    assert list(box.threads) == ["t"] and provider.count() == 0
    box.call("t", "c1").buttons["approve"].click()
    thread = box.thread("t")
    thread.resume_button.click()
    await asyncio.gather(*thread.view.tasks)
    assert thread.result.value == "resumed; the agent's last message: <i>done</i>"
    [record] = await saver.aeffects("t")
    assert record.status.value == "applied"
    decisions = [e.data["decision"] for e in await saver.aevents("t") if e.kind == "decision"]
    assert [(d["type"], d["reviewer"]) for d in decisions] == [("approve", "ana")]
    assert provider.count() == 1 and not (await box.arefresh()).threads
