"""Orphaned intents: open effects no pending task of their thread will run again.

A guarded call inside a subgraph whose parent is resumed from a named checkpoint is left
`in_flight` by the first run (the subgraph restarts under new task ids), and a call whose
run was rolled back leaves an intent no checkpoint schedules. Both must be listed, keep
their thread from reading `done`, and be reconciled (a lookup, or a human's `applied` /
`skip`), journaled. A thread whose worker crashed mid-call is not an orphan: resuming it
runs the call's task again, which reconciles the call itself.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph

from graph_durable import (
    DurableSqliteSaver,
    Effect,
    EffectGuardNode,
    EffectStatus,
    InvalidDecision,
    LeaseHeld,
    current_effect,
    find_orphans,
    inbox,
    record_decisions,
    recover,
    resolve_orphan,
    review,
    thread_status,
)
from graph_durable.faults import FaultPlan, InjectedCrash, arm, disarm
from graph_durable.testing import FakeProvider
from graph_durable.testing.models import ScriptedChatModel
from tests.test_review_subgraphs import Parent

S = EffectStatus
THREAD = "t"
CONFIG = {"configurable": {"thread_id": THREAD}}


@pytest.fixture
def saver(tmp_path: Path) -> DurableSqliteSaver:
    return DurableSqliteSaver(sqlite3.connect(tmp_path / "a.sqlite", check_same_thread=False))


def mail(tmp_path: Path, mode: str = "blind") -> FakeProvider:
    return FakeProvider(str(tmp_path / f"mail-{mode}.sqlite"), mode, name="mail")


def agent(provider: FakeProvider, policy: Effect, to: str = "ana") -> StateGraph:
    """A model that emails `to` once (asked anew each time the graph starts afresh)."""
    ask = AIMessage(content="", tool_calls=[{"name": "send", "args": {"to": to}, "id": "c0"}])
    model = ScriptedChatModel(script=[ask, AIMessage(content="done")] * 3)

    @tool
    def send(to: str) -> str:
        """Send an email."""
        return json.dumps(provider.apply(current_effect().key, {"to": to}))

    def think(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def route(state: dict[str, Any]) -> str:
        return "tools" if state["messages"][-1].tool_calls else END

    builder = StateGraph(Parent)
    builder.add_node("agent", think)
    builder.add_node("tools", EffectGuardNode([send], effects={"send": policy}))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder


def nested(provider: FakeProvider, policy: Effect, to: str = "ana") -> StateGraph:
    """A parent whose only node is the guarded agent, as a subgraph."""
    builder = StateGraph(Parent)
    builder.add_node("child", agent(provider, policy, to).compile())
    builder.add_edge(START, "child")
    return builder


def crash_after_the_effect(graph: Any, config: dict[str, Any] = CONFIG) -> None:
    """Run until the call reached the provider, then die before its receipt."""
    arm(FaultPlan("after_effect", action="raise"))
    try:
        with pytest.raises(InjectedCrash):
            graph.invoke({"messages": [HumanMessage("go")]}, config, durability="sync")
    finally:
        disarm()


def restarted_subgraph_orphan(saver: DurableSqliteSaver, provider: FakeProvider,
                              policy: Effect) -> Any:
    """The first run's call `in_flight`; the parent resumed from its named checkpoint,
    which restarts the subgraph, and its model, asked again, now asks for another call
    (an email to bo): a new request, under another key, and the first one is left open
    with no task to reconcile it."""
    crash_after_the_effect(nested(provider, policy).compile(checkpointer=saver))
    graph = nested(provider, policy, to="bo").compile(checkpointer=saver)
    graph.invoke(None, graph.get_state(CONFIG).config, durability="sync")
    return graph


def test_a_thread_crashed_mid_call_is_resumable_not_an_orphan(saver, tmp_path) -> None:
    provider = mail(tmp_path, "lookup")
    for graph, thread in ((agent(provider, Effect(lookup=provider.find)), "flat"),
                          (nested(provider, Effect(lookup=provider.find)), "nested")):
        config = {"configurable": {"thread_id": thread}}
        compiled = graph.compile(checkpointer=saver)
        crash_after_the_effect(compiled, config)
        [record] = saver.effects(thread)
        assert record.status is S.IN_FLIGHT
        assert find_orphans(saver, thread) == []
        assert thread_status(saver, thread).status == "orphaned"  # resume it
        assert [i for i in inbox(saver, thread) if i.kind == "orphan"] == []
        compiled.invoke(None, config, durability="sync")  # its task looks the call up
        assert saver.effects(thread)[0].status is S.APPLIED
        assert thread_status(saver, thread).status == "done"
    assert provider.count() == 2  # one email per thread


def test_an_intent_left_by_a_restarted_subgraph_is_an_orphan_until_a_human_settles_it(
        saver, tmp_path) -> None:
    provider = mail(tmp_path)
    graph = restarted_subgraph_orphan(saver, provider, Effect())
    old, new = saver.effects(THREAD)
    assert (old.status, new.status) == (S.IN_FLIGHT, S.APPLIED)
    [orphan] = find_orphans(saver, THREAD)
    assert (orphan.key, orphan.status) == (old.key, "in_flight")
    assert "restarted" in orphan.reason or "no step 'child'" in orphan.reason
    status = thread_status(saver, THREAD)
    assert status.status == "needs_human" and "orphaned intents ['c0']" in status.reason
    [item] = inbox(saver)
    assert (item.kind, item.key, item.allowed_decisions) == ("orphan", old.key, ("applied", "skip"))
    pending = review(graph, CONFIG)
    assert pending.pending == [] and [o.key for o in pending.orphans] == [old.key]
    from graph_durable.operators.notebook import inbox as notebook_inbox

    box = notebook_inbox(graph, saver)
    assert list(box.threads) == [THREAD] and "Orphaned intents" in box._repr_html_()

    with pytest.raises(InvalidDecision, match="no pending task would send a retry"):
        record_decisions(saver, THREAD, {old.key: {"type": "retry"}})
    with pytest.raises(InvalidDecision, match="has no lookup"):
        resolve_orphan(saver, THREAD, "c0")  # blind: only a human can tell
    assert saver.effect(old.key, THREAD).status is S.IN_FLIGHT

    [sent, _] = provider.effects()
    [record] = record_decisions(saver, THREAD, {"c0": {"type": "applied",
                                                       "receipt": sent["receipt"]}},
                                reviewer="ana")
    assert record.status is S.APPLIED and record.receipt == sent["receipt"]
    kinds = [(e.kind, e.data.get("decision")) for e in saver.events(THREAD, old.key)]
    assert kinds[-3:] == [("unknown", None),
                          ("decision", {"type": "applied", "receipt": sent["receipt"],
                                        "reviewer": "ana"}),
                          ("receipt", "applied")]
    assert find_orphans(saver, THREAD) == []
    assert thread_status(saver, THREAD).status == "done"


def rolled_back_call(saver: Any, provider: FakeProvider, point: str) -> str:
    """A thread that ran to its end (run r1); then run r2, killed at `point` of its call
    and rolled back as the Agent Server's `rollback` strategy does: its checkpoints are
    deleted (`delete_for_runs`), its intent stays. Returns the intent's key."""
    graph = agent(provider, Effect(lookup=provider.find)).compile(checkpointer=saver)
    graph.invoke({"messages": [HumanMessage("go")]},
                 {**CONFIG, "metadata": {"run_id": "r1"}}, durability="sync")
    arm(FaultPlan(point, action="raise"))
    try:
        with pytest.raises(InjectedCrash):
            graph.invoke({"messages": [HumanMessage("again")]},
                         {**CONFIG, "metadata": {"run_id": "r2"}}, durability="sync")
    finally:
        disarm()
    [record] = [r for r in saver.effects(THREAD) if r.status is S.IN_FLIGHT]
    assert find_orphans(saver, THREAD) == []  # not yet: resuming r2 would reconcile it
    saver.delete_for_runs(["r2"])
    return record.key


def test_an_intent_of_a_rolled_back_run_is_an_orphan_and_its_lookup_settles_it(
        saver, tmp_path) -> None:
    provider = mail(tmp_path, "lookup")
    key = rolled_back_call(saver, provider, "after_intent")  # killed before sending
    [orphan] = find_orphans(saver, THREAD)
    assert orphan.key == key and "no step 'tools'" in orphan.reason
    assert thread_status(saver, THREAD).status == "needs_human"

    # Certainly absent at the provider: closed as not applied, the journal says why.
    record = resolve_orphan(saver, THREAD, key, effects={"send": Effect(lookup=provider.find)})
    assert record.status is S.SKIPPED
    [resolved] = [e for e in saver.events(THREAD, key) if e.kind == "resolved"]
    assert "a lookup found no effect" in resolved.data["reason"]
    assert thread_status(saver, THREAD).status == "done"
    assert provider.count() == 1  # nothing sent for the orphan


def test_a_lookup_that_finds_the_orphan_applies_its_receipt(saver, tmp_path) -> None:
    provider = mail(tmp_path, "lookup")
    key = rolled_back_call(saver, provider, "after_effect")  # the call did land
    record = resolve_orphan(saver, THREAD, key, effects={"send": Effect(lookup=provider.find)})
    assert record.status is S.APPLIED and record.receipt == provider.find(key)
    assert provider.count(key) == 1 and provider.count() == 2


def test_recover_looks_a_rolled_back_runs_orphan_up(saver, tmp_path) -> None:
    provider = mail(tmp_path, "lookup")
    key = rolled_back_call(saver, provider, "after_effect")
    graph = agent(provider, Effect(lookup=provider.find)).compile(checkpointer=saver)
    [outcome] = recover(graph, saver, owner="sweeper")
    assert (outcome.outcome, outcome.reconciled, outcome.orphans) == ("reconciled", ("c0",), ())
    record = saver.effect(key, THREAD)
    assert record.status is S.APPLIED and record.receipt == provider.find(key)
    [receipt] = [e for e in saver.events(THREAD, key) if e.kind == "receipt"]
    assert receipt.data["source"] == "lookup" and receipt.owner == "sweeper"
    assert thread_status(saver, THREAD).status == "done"
    assert provider.count() == 2  # one per run: nothing sent again


def test_recover_lists_an_orphan_no_lookup_settles(saver, tmp_path) -> None:
    provider = mail(tmp_path, "lookup")
    key = rolled_back_call(saver, provider, "after_intent")
    blind = agent(provider, Effect()).compile(checkpointer=saver)
    [outcome] = recover(blind, saver, owner="sweeper")
    assert (outcome.outcome, outcome.orphans, outcome.status) == ("needs_human", ("c0",),
                                                                  "needs_human")
    assert saver.effect(key, THREAD).status is S.IN_FLIGHT


def test_an_orphan_of_a_thread_held_by_a_worker_is_not_touched(saver, tmp_path) -> None:
    provider = mail(tmp_path, "lookup")
    key = rolled_back_call(saver, provider, "after_intent")
    with saver.lease(THREAD, "worker-1"):
        assert thread_status(saver, THREAD).status == "running"
        with pytest.raises(LeaseHeld):
            resolve_orphan(saver, THREAD, key, {"type": "skip"})
    assert saver.effect(key, THREAD).status is S.IN_FLIGHT


def test_the_cli_lists_an_orphan_and_resolves_it_without_a_graph(saver, tmp_path, capsys
                                                                ) -> None:
    from graph_durable.cli import main

    provider = mail(tmp_path, "lookup")
    key = rolled_back_call(saver, provider, "after_intent")
    db = str(tmp_path / "a.sqlite")
    assert main(["pending", "--db", db, "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["kind"], row["tool_call_id"], row["status"]) == ("orphan", "c0", "in_flight")
    assert main(["pending", "--db", db]) == 0
    assert "orphan" in capsys.readouterr().out
    assert main(["resolve", THREAD, "c0", "--retry", "--db", db]) == 2
    assert "no pending task would send a retry" in capsys.readouterr().err
    assert main(["resolve", THREAD, "c0", "--skip", "-m", "checked: not sent", "--db", db,
                 "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["status"] == "done"
    assert saver.effect(key, THREAD).status is S.SKIPPED
    [decision] = [e for e in saver.events(THREAD, key) if e.kind == "decision"]
    assert decision.data["decision"] == {"type": "skip", "message": "checked: not sent"}
    assert main(["pending", "--db", db, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


# -- killed for real: a child process SIGKILLed mid-call, resumed by another ----------------

NESTED = "graph_durable.testing.scenarios.forks:build_nested_charge_agent"


@pytest.mark.crash
def test_a_subgraph_call_killed_mid_call_is_resumable_and_a_named_resume_leaves_no_orphan(
        tmp_path: Path) -> None:
    """SIGKILLed after the charge reached the provider, inside the subgraph: resuming the
    thread as it stands runs the call's task again, so it is not an orphan. Resuming the
    parent from its named checkpoint restarts the subgraph (under new task ids); its model
    asks for the same call again, which takes the first call's key and is reconciled by
    lookup, so no intent is left to nobody."""
    from graph_durable.testing import FaultPlan as Plan
    from graph_durable.testing.crash.child import run_child
    from graph_durable.testing.scenarios.forks import run_fork_child

    kwargs = {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path),
              "mode": "lookup"}
    provider = FakeProvider(str(tmp_path / "charge.sqlite"), "lookup", name="charge")
    assert run_child(NESTED, kwargs, thread_id=THREAD,
                     fault=Plan("after_effect", tool="charge")).killed
    assert provider.count() == 1
    with DurableSqliteSaver.from_conn_string(kwargs["db_path"]) as saver:
        [record] = saver.effects(THREAD)
        assert record.status is S.IN_FLIGHT and record.checkpoint_ns.startswith("child:")
        assert find_orphans(saver) == []
        assert thread_status(saver, THREAD).status == "orphaned"  # resume it

    resumed = run_fork_child(NESTED, kwargs, thread_id=THREAD, action="resume_at_checkpoint")
    assert resumed.done, resumed.stderr[-2000:]
    with DurableSqliteSaver.from_conn_string(kwargs["db_path"]) as saver:
        first = saver.effect(record.key, THREAD)
        assert first.status is S.APPLIED and first.receipt == provider.find(record.key)
        assert [r.key for r in saver.effects(THREAD)] == [record.key]
        assert find_orphans(saver) == [] and thread_status(saver, THREAD).status == "done"
    assert provider.count() == 1


def test_on_postgres_an_orphan_is_found_and_a_humans_word_settles_it(tmp_path,
                                                                     postgres_conninfo) -> None:
    """The same reads and the same journaled batch (three transitions of one effect in one
    transaction) on the PostgreSQL saver."""
    psycopg = pytest.importorskip("psycopg")
    from graph_durable.checkpointers.postgres import DurablePostgresSaver

    saver = DurablePostgresSaver(psycopg.connect(postgres_conninfo, autocommit=True))
    saver.setup()
    provider = mail(tmp_path, "lookup")
    key = rolled_back_call(saver, provider, "after_effect")
    [orphan] = find_orphans(saver)
    assert orphan.key == key and thread_status(saver, THREAD).status == "needs_human"
    [sent] = [e for e in provider.effects() if e["key"] == key]
    record = resolve_orphan(saver, THREAD, key, {"type": "applied", "receipt": sent["receipt"]},
                            reviewer="ana")
    assert record.status is S.APPLIED and record.receipt == sent["receipt"]
    assert [e.kind for e in saver.events(THREAD, key)][-3:] == ["unknown", "decision", "receipt"]
    assert find_orphans(saver) == [] and thread_status(saver, THREAD).status == "done"


def test_a_failed_step_is_reported_by_its_cause_not_a_cancellation() -> None:
    """When a task raises, LangGraph cancels its step's other tasks; their
    `CancelledError`s, saved after the cause, say nothing of why the step failed."""
    import asyncio
    import concurrent.futures

    from graph_durable.operators.recovery import step_error

    cause = ValueError("refused")
    assert step_error([cause, asyncio.CancelledError()]) is cause
    assert step_error([concurrent.futures.CancelledError(), cause,
                       asyncio.CancelledError()]) is cause
    only = asyncio.CancelledError()
    assert step_error([only]) is only
    assert step_error([cause, KeyError("later")]).args == ("later",)  # the last cause
    # LangGraph saves an error write as the error's repr.
    assert step_error(["MiddlewareOrderError('...')", "CancelledError()"]) == (
        "MiddlewareOrderError('...')")
