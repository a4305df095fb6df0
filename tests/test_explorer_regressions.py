"""Bugs the randomized explorer (`graph_durable.testing.explorer`) found, each pinned
by name. The seeds that found them are in the docstrings; replay one with
`python -m graph_durable.testing.explorer --seed N --episodes 1 --paths all`.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.types import Command

from graph_durable import (
    DurableSqliteSaver,
    Effect,
    EffectStatus,
    current_effect,
    recover,
    review,
    thread_status,
)
from graph_durable.testing import FakeProvider, FaultPlan, InjectedCrash, arm, disarm
from tests.nodes.test_guard import CONFIG, build, call


@pytest.fixture(autouse=True)
def _disarm():
    yield
    disarm()


def _setup(tmp_path: Path, effects: dict[str, Effect], *faults: str):
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "blind")
    provider.script_faults(*faults)
    saver = DurableSqliteSaver(sqlite3.connect(tmp_path / "a.sqlite", check_same_thread=False))

    @tool
    def charge(cents: int) -> str:
        """Charge."""
        return f"charged {provider.apply(current_effect().key, {'cents': cents})['id']}"

    graph = build(saver, [charge], effects, call("charge", {"cents": 5}))
    return provider, saver, graph


def test_decided_before_a_crash_is_orphaned_not_waiting_and_recover_finishes_it(tmp_path) -> None:
    """Seeds 1000 and 1033: a worker killed after journaling a decision left a thread that
    `recover` judged `waiting` (the checkpoint still holds the interrupt) and that
    `review` listed as pending, where a new answer would be ignored."""
    provider, saver, graph = _setup(tmp_path, {"charge": Effect(approval=True)})
    graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    arm(FaultPlan("after_decision", action="raise"))
    with pytest.raises(InjectedCrash):
        graph.invoke(Command(resume={"type": "approve"}), CONFIG, durability="sync")
    disarm()
    assert review(graph, CONFIG).pending == []
    status = thread_status(saver, "t")
    assert status.status == "orphaned" and "journaled" in status.reason
    [outcome] = recover(graph, saver, owner="sweeper")
    assert outcome.outcome == "resumed" and outcome.status == "done"
    assert provider.count() == 1
    assert saver.effects("t")[0].status is EffectStatus.APPLIED


def test_a_question_asked_in_a_fork_is_answered_in_the_fork(tmp_path) -> None:
    """Seeds 1012 and 1020: after an `update_state` fork the tools step runs as a new
    task; the question it asked was still filed under the old task, so answering it
    asked the same again, forever."""
    provider, saver, graph = _setup(tmp_path, {"charge": Effect(approval=True)})
    graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    before_tools = next(s for s in graph.get_state_history(CONFIG) if s.next == ("tools",))
    fork = graph.update_state(before_tools.config, None)
    result = graph.invoke(None, fork, durability="sync")
    [question] = result["__interrupt__"]
    assert question.value["tool_call_id"] == "c1"
    result = graph.invoke(Command(resume={"type": "approve"}), CONFIG, durability="sync")
    assert "__interrupt__" not in result
    assert result["messages"][-1].content == "done"
    assert provider.count() == 1


def test_two_different_calls_under_one_tool_call_id_are_answered_by_key(tmp_path) -> None:
    """Seeds 1021, 2000s: a model that gave two different calls of one message the same
    tool_call_id left two questions no answer keyed by tool_call_id could tell apart."""
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "blind")
    saver = DurableSqliteSaver(sqlite3.connect(tmp_path / "a.sqlite", check_same_thread=False))

    @tool
    def charge(cents: int) -> str:
        """Charge."""
        return f"charged {provider.apply(current_effect().key, {'cents': cents})['id']}"

    graph = build(saver, [charge], {"charge": Effect(approval=True)},
                  call("charge", {"cents": 5}, "dup"), call("charge", {"cents": 7}, "dup"))
    graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    r = review(graph, CONFIG)
    assert [i.tool_call_id for i in r.pending] == ["dup", "dup"]
    with pytest.raises(Exception, match="effect key"):
        r.approve("dup")
    five, seven = sorted(r.pending, key=lambda i: i.args["cents"])
    result = r.approve(five.key).reject(seven.key, "too much").resume()
    assert result["messages"][-1].content == "done"
    assert provider.count() == 1
    assert sorted((rec.args["cents"], rec.status.value) for rec in saver.effects("t")) == [
        (5, "applied"), (7, "rejected")]


def test_a_call_approved_in_a_copy_and_in_its_source_is_sent_once(tmp_path) -> None:
    """Seeds 14004, 14085 (`copy_both`): a copy taken while a blind call awaited approval;
    approving it in both threads sent it twice."""
    provider, saver, graph = _setup(tmp_path, {"charge": Effect(approval=True)})
    graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    saver.copy_thread("t", "fork")
    fork = {"configurable": {"thread_id": "fork"}}
    for config in (fork, CONFIG):
        result = graph.invoke(Command(resume={"type": "approve"}), config, durability="sync")
        assert result["messages"][-1].content == "done"
        assert result["messages"][2].content == "charged effect-1"
    assert provider.count() == 1 and len(provider.requests()) == 1
    receipt = [e for e in saver.events("t") if e.kind == "receipt"][0]
    assert receipt.data == {"source": "family", "thread": "fork", "status": "applied"}


def test_a_thread_killed_right_after_its_input_checkpoint_is_orphaned(tmp_path) -> None:
    """Seeds 14017, 14143 (`recover_misjudged`): the input checkpoint has no next node
    but `__start__`, and the thread was judged done; `recover` never resumed it."""
    provider, saver, graph = _setup(tmp_path, {})
    arm(FaultPlan("after_put", action="raise"))
    with pytest.raises(InjectedCrash):
        graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    disarm()
    status = thread_status(saver, "t")
    assert status.status == "orphaned" and status.next == ("__start__",)
    [outcome] = recover(graph, saver, owner="sweeper")
    assert outcome.status == "done" and provider.count() == 1


def test_an_answered_step_whose_checkpoint_was_lost_is_orphaned(tmp_path) -> None:
    """Seeds 12051, 14034 (`recover_misjudged`): the resumed step wrote its results, the
    worker died before the next checkpoint, and the old interrupt (here a tool's own
    question) made the thread look `waiting`."""
    from langgraph.types import interrupt

    provider = FakeProvider(str(tmp_path / "p.sqlite"), "blind")
    saver = DurableSqliteSaver(sqlite3.connect(tmp_path / "a.sqlite", check_same_thread=False))

    @tool
    def charge(cents: int) -> str:
        """Charge once the customer confirms."""
        interrupt("confirm?")
        return f"charged {provider.apply(current_effect().key, {'cents': cents})['id']}"

    graph = build(saver, [charge], {}, call("charge", {"cents": 5}))
    graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    assert thread_status(saver, "t").status == "waiting"
    arm(FaultPlan("before_put", action="raise"))
    with pytest.raises(InjectedCrash):
        graph.invoke(Command(resume="yes"), CONFIG, durability="sync")
    disarm()
    assert thread_status(saver, "t").status == "orphaned"
    [outcome] = recover(graph, saver, owner="sweeper")
    assert outcome.status == "done" and provider.count() == 1


def test_a_retry_in_a_copy_of_a_thread_that_crashed_in_flight_is_sent(tmp_path) -> None:
    """Seed 30066: the source still held the call in flight, so every `retry` in the copy
    was turned back into the same question."""
    provider, saver, graph = _setup(tmp_path, {})
    arm(FaultPlan("after_intent", action="raise"))
    with pytest.raises(InjectedCrash):
        graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    disarm()
    saver.copy_thread("t", "fork")
    fork = {"configurable": {"thread_id": "fork"}}
    [question] = graph.invoke(None, fork, durability="sync")["__interrupt__"]
    assert question.value["type"] == "effect_unknown"
    result = graph.invoke(Command(resume={"type": "retry"}), fork, durability="sync")
    assert result["messages"][-1].content == "done" and provider.count() == 1


def test_an_edit_in_the_source_of_a_copy_that_sent_the_call_sends_nothing(tmp_path) -> None:
    """Seed 30188: the copy approved and sent the call; an edit of the same call in the
    source sent it again under the edited arguments."""
    provider, saver, graph = _setup(tmp_path, {"charge": Effect(approval=True)})
    graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    saver.copy_thread("t", "fork")
    fork = {"configurable": {"thread_id": "fork"}}
    graph.invoke(Command(resume={"type": "approve"}), fork, durability="sync")
    edit = {"type": "edit", "edited_action": {"name": "charge", "args": {"cents": 9}}}
    result = graph.invoke(Command(resume=edit), CONFIG, durability="sync")
    assert result["messages"][2].content == "charged effect-1"
    assert provider.count() == 1


@pytest.mark.parametrize("answer", [{"type": "reject", "message": "no"},
                                    {"type": "respond", "message": "done by hand"}])
def test_a_rejection_in_the_source_of_a_copy_that_sent_the_call_says_what_happened(
        tmp_path, answer) -> None:
    """Seed 100060 (`copy_both`): the copy approved and sent the call; rejecting it in
    the source recorded `rejected` (not sent) while the provider had applied it. The
    rejection comes too late: the source records the family's receipt, and the model
    sees the effect, not a "Rejected" that is no longer true."""
    provider, saver, graph = _setup(tmp_path, {"charge": Effect(approval=True)})
    graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    saver.copy_thread("t", "fork")
    fork = {"configurable": {"thread_id": "fork"}}
    graph.invoke(Command(resume={"type": "approve"}), fork, durability="sync")
    result = graph.invoke(Command(resume=answer), CONFIG, durability="sync")
    assert result["messages"][2].content == "charged effect-1"
    assert provider.count() == 1
    [record] = saver.effects("t")
    assert record.status is EffectStatus.APPLIED
    kinds = [(e.kind, e.data.get("source")) for e in saver.events("t", record.key)]
    assert ("decision", None) in kinds and kinds[-1] == ("receipt", "family")


def test_a_question_asked_anew_by_a_run_that_died_is_not_the_saved_one(tmp_path) -> None:
    """Seed 30204: an approved call became `unknown` in a run killed before it raised its
    interrupt; the saved approval question was taken for the new one (`needs_human`),
    and `recover` never re-ran the step to ask it."""
    import time as clock

    provider = FakeProvider(str(tmp_path / "p.sqlite"), "blind")
    saver = DurableSqliteSaver(sqlite3.connect(tmp_path / "a.sqlite", check_same_thread=False))

    @tool
    def charge(cents: int) -> str:
        """Charge, slowly: past its timeout."""
        clock.sleep(0.6)
        return f"charged {provider.apply(current_effect().key, {'cents': cents})['id']}"

    @tool
    def book(room: str) -> str:
        """Book, once the charge has timed out."""
        clock.sleep(0.5)
        return f"booked {provider.apply(current_effect().key, {'room': room})['id']}"

    graph = build(saver, [charge, book], {"charge": Effect(approval=True, timeout=0.3),
                                          "book": Effect(approval=True)},
                  call("charge", {"cents": 5}, "c1"), call("book", {"room": "A"}, "c2"))
    graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    both = review(graph, CONFIG).approve("c1").approve("c2").command()
    arm(FaultPlan("after_receipt", action="raise"))
    with pytest.raises(InjectedCrash):
        graph.invoke(both, CONFIG, durability="sync")
    disarm()
    assert saver.effect(review_key(saver, "c1"), "t").status is EffectStatus.UNKNOWN
    assert thread_status(saver, "t").status == "orphaned"
    assert review(graph, CONFIG).pending == []
    [outcome] = recover(graph, saver, owner="sweeper")
    assert outcome.status == "needs_human"
    [item] = review(graph, CONFIG).pending
    assert (item.tool_call_id, item.kind) == ("c1", "unknown")


def review_key(saver: DurableSqliteSaver, tool_call_id: str) -> str:
    return next(r.key for r in saver.effects("t") if r.tool_call_id == tool_call_id)


def test_an_approval_in_the_source_of_a_copy_that_sent_an_edit_sends_nothing(tmp_path) -> None:
    """Seed 40694: the copy sent the call as a reviewer edited it; approving the call as
    asked in the source sent it a second time."""
    provider, saver, graph = _setup(tmp_path, {"charge": Effect(approval=True)})
    graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    saver.copy_thread("t", "fork")
    fork = {"configurable": {"thread_id": "fork"}}
    edit = {"type": "edit", "edited_action": {"name": "charge", "args": {"cents": 9}}}
    graph.invoke(Command(resume=edit), fork, durability="sync")
    result = graph.invoke(Command(resume={"type": "approve"}), CONFIG, durability="sync")
    assert result["messages"][-1].content == "done"
    assert provider.count() == 1
    assert "charged effect-1" in result["messages"][2].content


def test_a_call_edited_in_a_copy_is_asked_again_not_replayed_empty_in_the_source(
        tmp_path) -> None:
    """Seeds 40272, 40415: the source took over the copy's `skipped` record of an edited
    call, had no result to replay, and answered the call with `None`."""
    provider, saver, graph = _setup(tmp_path, {"charge": Effect(approval=True)})
    crash_before_intent = FaultPlan("before_intent", action="raise")
    arm(crash_before_intent)
    with pytest.raises(InjectedCrash):
        graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    disarm()
    saver.copy_thread("t", "fork")
    fork = {"configurable": {"thread_id": "fork"}}
    graph.invoke(None, fork, durability="sync")
    edit = {"type": "edit", "edited_action": {"name": "charge", "args": {"cents": 9}}}
    graph.invoke(Command(resume=edit), fork, durability="sync")
    [question] = graph.invoke(None, CONFIG, durability="sync")["__interrupt__"]
    assert question.value["tool_call_id"] == "c1"
    result = graph.invoke(Command(resume={"type": "approve"}), CONFIG, durability="sync")
    assert result["messages"][-1].content == "done" and provider.count() == 1


def test_the_same_edit_made_again_on_a_replayed_question_is_not_an_error(tmp_path) -> None:
    """Seed 40151: an edit whose edited call the thread's history already held raised
    `IllegalTransition` (the edited intent existed)."""
    provider, saver, graph = _setup(tmp_path, {"charge": Effect(approval=True)})
    graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    edit = {"type": "edit", "edited_action": {"name": "charge", "args": {"cents": 9}}}
    graph.invoke(Command(resume=edit), CONFIG, durability="sync")
    [original] = [r for r in saver.effects("t") if r.args == {"cents": 5}]
    with sqlite3.connect(tmp_path / "a.sqlite") as conn:  # the question asked once more
        conn.execute("UPDATE effects SET status = 'awaiting_approval', decision = ?, asked = 0 "
                     "WHERE key = ?", ('{"type": "edit", "edited_action": {"name": "charge", '
                                       '"args": {"cents": 9}}}', original.key))
    result = graph.invoke(None, before_tools_config(graph), durability="sync")
    assert result["messages"][-1].content == "done"
    assert provider.count() == 1


def before_tools_config(graph):
    return next(s for s in graph.get_state_history(CONFIG) if s.next == ("tools",)).config


def test_a_call_a_copy_skipped_with_an_unknown_outcome_is_unknown_in_the_source(
        tmp_path) -> None:
    """Seed 132: the copy sent the call first, lost the answer and skipped it; the
    source claimed the key afresh and sent the call again."""
    provider, saver, graph = _setup(tmp_path, {}, "lost")
    arm(FaultPlan("before_intent", action="raise"))
    with pytest.raises(InjectedCrash):
        graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    disarm()
    saver.copy_thread("t", "fork")
    fork = {"configurable": {"thread_id": "fork"}}
    [question] = graph.invoke(None, fork, durability="sync")["__interrupt__"]
    assert question.value["type"] == "effect_unknown" and provider.count() == 1
    graph.invoke(Command(resume={"type": "skip", "message": "leave it"}), fork,
                 durability="sync")
    [question] = graph.invoke(None, CONFIG, durability="sync")["__interrupt__"]
    assert question.value["type"] == "effect_unknown"
    assert provider.count() == 1


def test_an_approval_in_the_source_after_the_copy_skipped_the_unknown_send(tmp_path) -> None:
    """Seed 50184: both threads held the journaled approval; the copy sent the call, lost
    the answer and skipped it; the source then sent it again."""
    provider, saver, graph = _setup(tmp_path, {"charge": Effect(approval=True)}, "lost")
    graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    arm(FaultPlan("after_decision", action="raise"))
    with pytest.raises(InjectedCrash):
        graph.invoke(Command(resume={"type": "approve"}), CONFIG, durability="sync")
    disarm()
    saver.copy_thread("t", "fork")
    fork = {"configurable": {"thread_id": "fork"}}
    [question] = graph.invoke(None, fork, durability="sync")["__interrupt__"]
    assert question.value["type"] == "effect_unknown" and provider.count() == 1
    graph.invoke(Command(resume={"type": "skip"}), fork, durability="sync")
    [question] = graph.invoke(None, CONFIG, durability="sync")["__interrupt__"]
    assert question.value["type"] == "effect_unknown"
    assert provider.count() == 1


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_run_from_a_checkpoint_id_on_a_thread_leased_elsewhere_is_refused_at_once(
        tmp_path, flavour) -> None:
    """Seeds 40307, 40972, 50881: a worker killed under a lease; a run from
    `get_state().config` (or time travel) before that lease expired had its fork
    checkpoint refused by the fence in LangGraph's background save, waited 5 s for it,
    and raised a misleading `DurabilityError`. It is `LeaseLost`, at once, and nothing
    is sent."""
    import asyncio
    import time

    from graph_durable import LeaseLost

    provider, saver, graph = _setup(tmp_path, {"charge": Effect()})
    arm(FaultPlan("before_intent", action="raise"))
    with pytest.raises(InjectedCrash):
        graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    disarm()
    saver.acquire_lease("t", "dead-worker", ttl=30.0)
    snapshot = graph.get_state(CONFIG)
    assert snapshot.next == ("tools",) and not snapshot.interrupts
    started = time.monotonic()
    with pytest.raises(LeaseLost, match="dead-worker"):
        if flavour == "sync":
            graph.invoke(None, snapshot.config, durability="sync")
        else:
            asyncio.run(graph.ainvoke(None, snapshot.config, durability="sync"))
    assert time.monotonic() - started < 2.0
    assert provider.count() == 0
    assert saver.effects("t") == []


def test_a_refused_answer_then_a_worker_killed_after_the_step_wrote_is_orphaned(
        tmp_path) -> None:
    """Seed 50470: a refused (malformed) answer left an `__error__` write on the tools
    task; the valid answer's run wrote the step's results and was killed before the next
    checkpoint. `thread_status` read the stale error as `failed`, so `recover()` never
    resumed the thread."""
    from graph_durable import InvalidDecision

    provider, saver, graph = _setup(tmp_path, {"charge": Effect(approval=True)})
    graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    with pytest.raises(InvalidDecision):
        graph.invoke(Command(resume={"type": "edit"}), CONFIG, durability="sync")
    latest = saver.get_tuple(CONFIG)
    [task_id] = {w[0] for w in latest.pending_writes if w[1] == "__error__"}
    # What the valid answer's run saves before it is killed: the step's results, as
    # LangGraph writes them for the task (here without the effect, which is asked anew).
    saver.put_writes(latest.config, [("branch:to:agent", None)], task_id)
    writes = [w[1] for w in saver.get_tuple(CONFIG).pending_writes]
    assert "__error__" in writes and "branch:to:agent" in writes
    status = thread_status(saver, "t")
    assert status.status == "orphaned", status
    [outcome] = recover(graph, saver, owner="sweeper")
    assert outcome.outcome == "resumed" and outcome.status == "done"
    assert graph.get_state(CONFIG).next == ()


def test_a_call_answered_in_place_in_a_copy_is_asked_anew_in_its_source(tmp_path) -> None:
    """Seeds 100695 and 100995 (`copy_both`): the copy answered the call in place of the
    tool (nothing sent); its source then asked anew, was approved and sent it. That is the
    design (a call rejected or answered in one thread of a family is asked anew in the
    others), sent once; the explorer's check had read the copy's answer as "never send"."""
    from graph_durable.testing.explorer import explore

    provider, saver, graph = _setup(tmp_path, {"charge": Effect(approval=True)})
    graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    saver.copy_thread("t", "fork")
    fork = {"configurable": {"thread_id": "fork"}}
    graph.invoke(Command(resume={"type": "respond", "message": "done by hand"}), fork,
                 durability="sync")
    assert provider.count() == 0 and saver.effects("fork")[0].status is EffectStatus.REJECTED
    assert [i.tool_call_id for i in review(graph, CONFIG).pending], "asked anew in the source"
    graph.invoke(Command(resume={"type": "approve"}), CONFIG, durability="sync")
    assert provider.count() == 1
    assert saver.effects("t")[0].status is EffectStatus.APPLIED

    for seed in (100695, 100995):
        report = explore(1, seed, workers=1, directory=str(tmp_path / f"seed-{seed}"),
                         shrink_failures=False)
        assert report.ok, report.render()
