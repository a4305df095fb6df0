"""`guarded`: writes from custom nodes and `@task`s go through the ledger, in-process.

The crash behaviour (real SIGKILLs) is in tests/test_crash_guarded_writes.py; here, the
front end's own rules: where it may be called, which functions it takes, how approvals,
rejections and failures reach the node, and how keys tell writes apart.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command

from graph_durable import (
    DurableSqliteSaver,
    Effect,
    EffectStatus,
    GraphDurableError,
    NotApplied,
    current_effect,
    guarded,
)
from graph_durable.testing import FakeProvider, FaultPlan, InjectedCrash, arm, disarm

CONFIG = {"configurable": {"thread_id": "t"}}


class State(TypedDict, total=False):
    amounts: list[int]
    receipts: list[Any]
    error: str


@pytest.fixture
def saver(tmp_path: Path) -> Any:
    saver = DurableSqliteSaver(sqlite3.connect(tmp_path / "agent.sqlite",
                                               check_same_thread=False))
    yield saver
    saver.conn.close()


@pytest.fixture
def provider(tmp_path: Path, request: pytest.FixtureRequest) -> FakeProvider:
    return FakeProvider(str(tmp_path / "pay.sqlite"), "blind", name="pay")


def one_node_graph(saver: Any, node: Any) -> Any:
    builder = StateGraph(State)
    builder.add_node("pay", node)
    builder.add_edge(START, "pay")
    builder.add_edge("pay", END)
    return builder.compile(checkpointer=saver)


def test_a_guarded_write_outside_a_run_is_refused(provider: FakeProvider) -> None:
    @guarded(name="pay_outside")
    def pay(cents: int) -> Any:
        return provider.apply("k", {"cents": cents})

    with pytest.raises(GraphDurableError, match="outside a LangGraph run"):
        pay(5)
    assert provider.count() == 0


def test_functions_whose_arguments_cannot_be_named_are_refused() -> None:
    with pytest.raises(TypeError, match="named parameters"):
        guarded(name="pay_varargs")(lambda *cents: cents)


def test_two_writes_under_one_name_are_refused() -> None:
    def first(cents: int) -> int:
        return cents

    def second(cents: int) -> int:
        return cents

    guarded(name="pay_twice_named")(first)
    with pytest.raises(GraphDurableError, match="name=..."):
        guarded(name="pay_twice_named")(second)


def test_each_write_of_a_node_gets_its_own_key_and_a_rerun_replays_them(
        saver: Any, provider: FakeProvider) -> None:
    @guarded(Effect(), name="pay_each")
    def pay(cents: int) -> Any:
        return provider.apply(current_effect().key, {"cents": cents})

    def node(state: State) -> dict[str, Any]:
        return {"receipts": [pay(cents) for cents in state["amounts"]]}

    graph = one_node_graph(saver, node)
    out = graph.invoke({"amounts": [5, 5, 7]}, CONFIG, durability="sync")
    assert provider.count() == 3  # the same amount twice is two writes
    assert len({r["key"] for r in out["receipts"]}) == 3
    records = saver.effects("t")
    assert [r.tool_call_id.rpartition("@")[0] for r in records] == [
        "pay_each#0", "pay_each#1", "pay_each#2"]
    assert len({r.tool_call_id.rpartition("@")[2] for r in records}) == 1  # one place
    assert {r.status for r in records} == {EffectStatus.APPLIED}


def test_an_approval_pauses_the_node_and_a_rejection_raises_not_applied(
        saver: Any, provider: FakeProvider) -> None:
    @guarded(Effect(approval=True), name="pay_approved")
    def pay(cents: int) -> Any:
        return provider.apply(current_effect().key, {"cents": cents})

    def node(state: State) -> dict[str, Any]:
        receipts = []
        for cents in state["amounts"]:
            try:
                receipts.append(pay(cents))
            except NotApplied as refused:
                receipts.append(str(refused))
        return {"receipts": receipts}

    graph = one_node_graph(saver, node)
    graph.invoke({"amounts": [5, 9]}, CONFIG, durability="sync")
    [first] = graph.get_state(CONFIG).interrupts
    assert first.value["type"] == "tool_approval" and first.value["args"] == {"cents": 5}
    graph.invoke(Command(resume={first.id: {"type": "approve"}}), CONFIG, durability="sync")
    [second] = graph.get_state(CONFIG).interrupts
    assert second.value["args"] == {"cents": 9}
    out = graph.invoke(Command(resume={second.id: {"type": "reject", "message": "too much"}}),
                       CONFIG, durability="sync")
    assert provider.count() == 1
    assert out["receipts"][0]["cents"] == 5
    assert "too much" in out["receipts"][1]
    assert [r.status for r in saver.effects("t")] == [EffectStatus.APPLIED,
                                                       EffectStatus.REJECTED]


def test_not_applied_reaches_the_caller_and_is_recorded_failed(
        saver: Any, provider: FakeProvider) -> None:
    @guarded(name="pay_refused")
    def pay(cents: int) -> Any:
        raise NotApplied("card declined")

    def node(state: State) -> dict[str, Any]:
        try:
            pay(5)
        except NotApplied as refused:
            return {"error": str(refused)}
        return {}

    out = one_node_graph(saver, node).invoke({"amounts": []}, CONFIG, durability="sync")
    assert "card declined" in out["error"]
    assert [r.status for r in saver.effects("t")] == [EffectStatus.FAILED]


def test_a_read_only_function_runs_without_the_ledger(saver: Any) -> None:
    @guarded(Effect(read_only=True), name="quote")
    def quote(cents: int) -> int:
        return cents * 2

    out = one_node_graph(saver, lambda s: {"receipts": [quote(4)]}).invoke(
        {"amounts": []}, CONFIG, durability="sync")
    assert out["receipts"] == [8]
    assert saver.effects("t") == []


async def test_async_writes_under_the_functional_api(saver: Any,
                                                     provider: FakeProvider) -> None:
    @guarded(Effect(lookup=provider.find), name="apay")
    async def pay(cents: int) -> Any:
        return provider.apply(current_effect().key, {"cents": cents})

    @task
    async def charge(cents: int) -> Any:
        return await pay(cents)

    @entrypoint(checkpointer=saver)
    async def flow(amounts: list[int]) -> list[Any]:
        return [await charge(cents) for cents in amounts]

    out = await flow.ainvoke([3, 3], CONFIG, durability="sync")
    assert provider.count() == 2 and len({r["key"] for r in out}) == 2
    assert {r.status for r in await saver.aeffects("t")} == {EffectStatus.APPLIED}


def test_a_write_without_a_durable_step_is_refused(saver: Any, provider: FakeProvider) -> None:
    @guarded(name="pay_not_durable")
    def pay(cents: int) -> Any:
        return provider.apply(current_effect().key, {"cents": cents})

    graph = one_node_graph(saver, lambda s: {"receipts": [pay(1)]})
    with pytest.raises(GraphDurableError, match='durability="sync"'):
        graph.invoke({"amounts": []}, CONFIG)
    assert provider.count() == 0


class _SlowForkSaves:
    """Delays the save of a fork checkpoint, as a busy PostgreSQL pool does: LangGraph
    saves the checkpoint a run from a checkpoint id starts from in the background, while
    the run's first step already runs."""

    def __init__(self, saver: Any) -> None:
        self.put, self.aput = saver.put, saver.aput

        def put(config: Any, checkpoint: Any, metadata: Any, versions: Any) -> Any:
            if metadata.get("source") == "fork":
                time.sleep(0.3)
            return self.put(config, checkpoint, metadata, versions)

        async def aput(config: Any, checkpoint: Any, metadata: Any, versions: Any) -> Any:
            if metadata.get("source") == "fork":
                await asyncio.sleep(0.3)
            return await self.aput(config, checkpoint, metadata, versions)

        saver.put, saver.aput = put, aput


@pytest.mark.parametrize("is_async", [False, True])
async def test_a_run_from_a_checkpoint_saved_late_keeps_the_write_key(
        tmp_path: Path, is_async: bool) -> None:
    """Found on AsyncDurablePostgresSaver: killed after the write, the thread run from
    `get_state().config` wrote again under a new key. The run's fork checkpoint was still
    being saved when the write read it to find where the fork came from."""
    from graph_durable.checkpointers.sqlite import AsyncDurableSqliteSaver

    provider = FakeProvider(str(tmp_path / "pay.sqlite"), "lookup", name="pay")

    def apply(cents: int) -> Any:
        return provider.apply(current_effect().key, {"cents": cents})

    if is_async:
        import aiosqlite

        saver: Any = AsyncDurableSqliteSaver(await aiosqlite.connect(tmp_path / "a.sqlite"))

        @guarded(Effect(lookup=provider.find), name="pay_forked_async")
        async def pay(cents: int) -> Any:
            return apply(cents)

        async def node(state: State) -> dict[str, Any]:
            return {"receipts": [await pay(5)]}
    else:
        saver = DurableSqliteSaver(sqlite3.connect(tmp_path / "a.sqlite",
                                                   check_same_thread=False))

        @guarded(Effect(lookup=provider.find), name="pay_forked")
        def pay(cents: int) -> Any:
            return apply(cents)

        def node(state: State) -> dict[str, Any]:
            return {"receipts": [pay(5)]}

    graph = one_node_graph(saver, node)
    _SlowForkSaves(saver)
    arm(FaultPlan("after_effect", tool=pay.name, action="raise"))
    try:
        with pytest.raises(InjectedCrash):
            if is_async:
                await graph.ainvoke({"amounts": [5]}, CONFIG, durability="sync")
            else:
                graph.invoke({"amounts": [5]}, CONFIG, durability="sync")
    finally:
        disarm()
    if is_async:
        latest = (await graph.aget_state(CONFIG)).config
        out = await graph.ainvoke(None, latest, durability="sync")
        await saver.conn.close()
    else:
        out = graph.invoke(None, graph.get_state(CONFIG).config, durability="sync")
        saver.conn.close()
    assert provider.count() == 1, f"sent again: {provider.requests()}"
    assert out["receipts"][0]["key"] == provider.effects()[0]["key"]


def _plan_then_pay(saver: Any, provider: FakeProvider, name: str, **compile: Any) -> Any:
    """plan (the amounts) -> pay (a guarded write per amount, to a blind provider)."""

    @guarded(Effect(), name=name)
    def pay(cents: int) -> Any:
        return provider.apply(current_effect().key, {"cents": cents})

    def plan(state: State) -> dict[str, Any]:
        return {"amounts": state["amounts"], "error": "planned"}

    def pay_node(state: State) -> dict[str, Any]:
        return {"receipts": [pay(cents) for cents in state["amounts"]]}

    builder = StateGraph(State)
    builder.add_node("plan", plan)
    builder.add_node("pay", pay_node)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "pay")
    builder.add_edge("pay", END)
    return builder.compile(checkpointer=saver, **compile)


COPY = {"configurable": {"thread_id": "c"}}


def _stop_at(graph: Any, point: str, inputs: Any, occurrence: int = 1) -> None:
    """Run thread t with `inputs` until fault point `point` raises (its `occurrence`)."""
    arm(FaultPlan(point, occurrence=occurrence, action="raise"))
    try:
        with pytest.raises(InjectedCrash):
            graph.invoke(inputs, CONFIG, durability="sync")
    finally:
        disarm()


def _copied_in_the_window(graph: Any, saver: Any) -> None:
    """Run t until plan's writes are saved and pay's step is not (its checkpoint's save
    raises), then copy t to c."""
    _stop_at(graph, "before_put", {"amounts": [5, 7]}, occurrence=3)
    saver.copy_thread("t", "c")


def test_a_step_made_again_by_a_copy_and_its_source_writes_once_in_the_family(
        saver: Any, provider: FakeProvider) -> None:
    """A run stopped after plan's writes were saved, before pay's step was
    checkpointed (`before_put` raised); the thread copied: each thread makes pay's step
    again under its own checkpoint id, from the same saved writes, so each write is sent
    once in the family and the other thread replays its receipt. (Killed for real in
    `tests/test_explorer_regressions.py`, seeds 981478 and after.)"""
    graph = _plan_then_pay(saver, provider, "pay_after_copy")
    _copied_in_the_window(graph, saver)
    [planned] = graph.get_state(CONFIG).tasks
    assert planned.name == "plan" and planned.result is not None  # saved, step not made
    first = graph.invoke(None, CONFIG, durability="sync")
    copy = graph.invoke(None, COPY, durability="sync")
    assert provider.count() == 2
    assert first["receipts"] == copy["receipts"]
    assert [r.status for r in saver.effects("c")] == [EffectStatus.APPLIED] * 2


def test_a_copy_made_before_the_step_was_planned_writes_in_each_thread(
        saver: Any, provider: FakeProvider) -> None:
    """A thread paused before plan ran, then copied: each thread plans after the copy
    (alike, here), so pay's step is each thread's own request and each sends its
    writes; the family shares only what was decided before the copy."""
    graph = _plan_then_pay(saver, provider, "pay_planned_twice", interrupt_before=["plan"])
    graph.invoke({"amounts": [5, 7]}, CONFIG, durability="sync")
    assert graph.get_state(CONFIG).next == ("plan",)
    saver.copy_thread("t", "c")
    first = graph.invoke(None, CONFIG, durability="sync")
    copy = graph.invoke(None, COPY, durability="sync")
    assert provider.count() == 4
    assert {r["key"] for r in first["receipts"]}.isdisjoint(
        r["key"] for r in copy["receipts"])


def test_a_write_keyed_by_its_steps_own_id_before_keeps_that_key(
        saver: Any, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker of an earlier release (here: the step anchor not asked) resumed a copied
    thread and keyed pay's writes by the step's own checkpoint id, sent the first and
    stopped before its receipt; this release, resuming the thread, keeps that key: the
    write is not sent again under the step's anchor (the blind provider's answer is lost,
    so a person decides)."""
    from graph_durable.nodes.write_keys import WriteKeys

    graph = _plan_then_pay(saver, provider, "pay_kept_key")
    _copied_in_the_window(graph, saver)

    def earlier_release(self: Any, thread_id: str, origin: str, parent: str) -> Any:
        return None
        yield  # a generator, as the method it stands for

    with monkeypatch.context() as patched:
        patched.setattr(WriteKeys, "_step_anchor", earlier_release)
        _stop_at(graph, "after_effect", None)
    [sent] = saver.effects("t")
    assert provider.count() == 1
    graph.invoke(None, CONFIG, durability="sync")
    assert provider.count() == 1
    assert saver.effect(sent.key, "t").status is EffectStatus.UNKNOWN
    assert graph.get_state(CONFIG).interrupts  # asked, not sent again


def test_a_thread_copied_before_the_plan_that_plans_alike_later_writes_itself(
        saver: Any, provider: FakeProvider) -> None:
    """Paused before plan, copied to c; then the source planned, was stopped before
    pay's step, and was copied to d. The source and d share pay's writes (decided
    before d's copy); c, which planned alike only after its own copy, sends its own."""
    graph = _plan_then_pay(saver, provider, "pay_alike_later", interrupt_before=["plan"])
    graph.invoke({"amounts": [5, 7]}, CONFIG, durability="sync")
    saver.copy_thread("t", "c")
    _stop_at(graph, "before_put", None)
    saver.copy_thread("t", "d")
    for thread_id in ("t", "d", "c"):
        graph.invoke(None, {"configurable": {"thread_id": thread_id}}, durability="sync")
    assert provider.count() == 4  # two writes for t and d together, two for c


def test_a_prune_after_a_step_was_anchored_changes_no_key(
        saver: Any, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the window's copy the source paid (its step anchored to the copy point),
    then an `update_state` of that step, and a prune that deleted the step's checkpoint
    and the point: the fork follows its link to a checkpoint that is gone, whose parent
    nothing tells any more. A new process still finds the step's recorded anchor, so the
    fork replays the receipts instead of paying again."""
    from graph_durable.nodes import writes
    from graph_durable.nodes.write_keys import WriteKeys

    graph = _plan_then_pay(saver, provider, "pay_pruned")
    _copied_in_the_window(graph, saver)
    graph.invoke(None, CONFIG, durability="sync")
    assert provider.count() == 2
    paid_from = next(s for s in graph.get_state_history(CONFIG) if s.next == ("pay",))
    graph.update_state(paid_from.config, {"error": "updated"}, as_node="plan")
    saver.prune(["t"])
    monkeypatch.setattr(writes._GUARD, "keys", WriteKeys())  # a new process: nothing known
    graph.invoke(None, CONFIG, durability="sync")
    graph.invoke(None, COPY, durability="sync")
    assert provider.count() == 2
