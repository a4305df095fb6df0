"""Bugs the randomized explorer (`graph_durable.testing.explorer`) found, each pinned
by name. The seeds that found them are in the docstrings; replay one with
`python -m graph_durable.testing.explorer --seed N --episodes 1 --paths all`.
"""

from __future__ import annotations

import re

import sqlite3
from pathlib import Path
from typing import Any

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
from tests.fakes import charge_tool
from tests.nodes.test_guard import CONFIG, build, call


@pytest.fixture(autouse=True)
def _disarm():
    yield
    disarm()


def _setup(tmp_path: Path, effects: dict[str, Effect], *faults: str):
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "blind")
    provider.script_faults(*faults)
    saver = DurableSqliteSaver(sqlite3.connect(tmp_path / "a.sqlite", check_same_thread=False))
    graph = build(saver, [charge_tool(provider)], effects, call("charge", {"cents": 5}))
    return provider, saver, graph


def _copied(graph, saver, crash: str | None = None, value=None) -> dict:
    """Run thread `t` (on `value`, by default its first message), crashing in this process
    at fault point `crash` if given; then copy `t` to `fork`. Returns the fork's config."""
    value = {"messages": [HumanMessage("go")]} if value is None else value
    if crash is None:
        graph.invoke(value, CONFIG, durability="sync")
    else:
        arm(FaultPlan(crash, action="raise"))
        with pytest.raises(InjectedCrash):
            graph.invoke(value, CONFIG, durability="sync")
        disarm()
    saver.copy_thread("t", "fork")
    return {"configurable": {"thread_id": "fork"}}


def _copied_while_asking(tmp_path: Path):
    """`_setup` of a charge that needs approval, run until it asks, then `_copied`.
    Returns the provider, saver, graph and the fork's config."""
    provider, saver, graph = _setup(tmp_path, {"charge": Effect(approval=True)})
    return provider, saver, graph, _copied(graph, saver)


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
    provider, saver, graph, fork = _copied_while_asking(tmp_path)
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
    fork = _copied(graph, saver, crash="after_intent")
    [question] = graph.invoke(None, fork, durability="sync")["__interrupt__"]
    assert question.value["type"] == "effect_unknown"
    result = graph.invoke(Command(resume={"type": "retry"}), fork, durability="sync")
    assert result["messages"][-1].content == "done" and provider.count() == 1


def test_an_edit_in_the_source_of_a_copy_that_sent_the_call_sends_nothing(tmp_path) -> None:
    """Seed 30188: the copy approved and sent the call; an edit of the same call in the
    source sent it again under the edited arguments."""
    provider, saver, graph, fork = _copied_while_asking(tmp_path)
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
    provider, saver, graph, fork = _copied_while_asking(tmp_path)
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
    provider, saver, graph, fork = _copied_while_asking(tmp_path)
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
    fork = _copied(graph, saver, crash="before_intent")
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
    fork = _copied(graph, saver, crash="before_intent")
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
    fork = _copied(graph, saver, crash="after_decision",
                   value=Command(resume={"type": "approve"}))
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


def test_a_fork_checkpoint_refused_under_a_lease_that_expired_since_is_lease_lost(
        tmp_path) -> None:
    """Seed 922343: the fence refused the fork checkpoint LangGraph saves in the
    background (a dead worker's lease), and that lease expired before the guard looked
    at it; the guard waited 5 s for the checkpoint and raised a misleading
    `DurabilityError`. The saver keeps what its fence refused: `LeaseLost`, at once."""
    import time

    from graph_durable import LeaseLost

    provider, saver, graph = _setup(tmp_path, {"charge": Effect()})
    arm(FaultPlan("before_intent", action="raise"))
    with pytest.raises(InjectedCrash):
        graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    disarm()
    saver.acquire_lease("t", "dead-worker", ttl=30.0)
    snapshot = graph.get_state(CONFIG)
    saver.live_leases = lambda: {}  # as read once the dead worker's lease has expired
    started = time.monotonic()
    with pytest.raises(LeaseLost, match="dead-worker"):
        graph.invoke(None, snapshot.config, durability="sync")
    assert time.monotonic() - started < 2.0
    assert provider.count() == 0 and saver.effects("t") == []


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
    # A refusal is now LangGraph's control-flow signal, which leaves no `__error__`
    # write; the one an earlier release left (or a task that failed) is written here.
    assert "__error__" not in [w[1] for w in latest.pending_writes]
    [task] = graph.get_state(CONFIG).tasks
    task_id = task.id
    saver.put_writes(latest.config, [("__error__", InvalidDecision("refused"))], task_id)
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

    provider, saver, graph, fork = _copied_while_asking(tmp_path)
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


# -- everyday shapes: subgraphs, create_agent middleware, tools that answer their own way --

def _tool(mode: str = "blind", policy: str = "blind", **more):
    return {"approval": False, "mode": mode, "policy": policy, "retries": 0, "timeout": None,
            **more}


def _replay(tmp_path, episode, paths: str = "stable"):
    from graph_durable.testing.explorer import replay

    return replay(episode, paths=paths, directory=str(tmp_path / "episode"))


def _shapes():
    from graph_durable.testing.explorer.model import Call, Crash, Episode, Resume

    charge = [[Call("charge", "c1", "x00")]]
    lost = [[Call("charge", "c1", "x00", 0, ["lost"])]]
    approvals = [[Call("charge", f"c{i}", f"x0{i}") for i in range(4)]]
    return {
        # Seeds 341, 363: ToolRetryMiddleware listed after the guard re-sent a lost
        # charge. It is refused (MiddlewareOrderError) before anything is sent twice; put
        # in the safe order, the thread asks about the charge in flight.
        "retry_middleware_after_the_guard": Episode(
            0, {"charge": _tool()}, lost, topology="create_agent", stack="tool_retry_inside"),
        # Requesting messages without ids under a trimming reducer: refused
        # (UnkeyableToolCall) before anything is sent.
        "idless_messages": Episode(0, {"charge": _tool()}, charge, history="idless"),
        # Seed 3182: the same, met by recover() after a crash: the thread it resumed was
        # refused and is `failed`, which is right, not a misjudged status.
        "idless_messages_recovered": Episode(
            0, {"search": {"mode": "read", "policy": "read_only"}, "ticket": _tool()},
            [[Call("search", "call_0_0", "x00")], [Call("ticket", "call_1_3", "x13")]],
            crashes=[Crash("after_put_writes", None, 5, 0, Resume("recover"))],
            history="idless"),
        # A trimming reducer and reused tool_call_ids, killed after the second charge.
        "trimmed_history": Episode(
            0, {"charge": _tool()}, [[Call("charge", "c1", f"x{t}0")] for t in range(3)],
            history="trimmed", crashes=[Crash("after_effect", "charge", 2, 0, Resume())]),
        # Seed 523: a Command tool whose answer was found by lookup (no Command then):
        # the explorer's graph waited for a goto that never came.
        "command_found_by_lookup": Episode(
            0, {"charge": _tool("lookup", "lookup", timeout=0.1, result="command"),
                "audit": _tool("lookup", "lookup")},
            [[Call("charge", "c1", "x14", 0, ["slow"])]]),
        # Seeds 409, 425: a Command tool in a trimmed history (the follow-up's own message
        # needs an id there).
        "command_in_trimmed_history": Episode(
            0, {"charge": _tool("lookup", "lookup", result="command"), "audit": _tool()},
            charge, history="trimmed",
            crashes=[Crash("after_receipt", "charge", 1, 0, Resume())]),
        # Seed 215: a non-JSON result reconciled by lookup is the lookup's receipt.
        "non_json_found_by_lookup": Episode(
            0, {"charge": _tool("lookup", "lookup", result="non_json")}, lost,
            topology="subgraph_send"),
        "artifact_replayed": Episode(
            0, {"charge": _tool("lookup", "lookup", result="artifact")}, charge,
            crashes=[Crash("after_receipt", "charge", 1, 0, Resume())]),
        # Seed 327: a copy of a thread whose tools sit two subgraphs down, and its source,
        # each asked their model for the second turn: two requests, one charge each.
        "copy_both_nested": Episode(
            0, {"charge": _tool("lookup", "lookup")},
            [[Call("charge", "call_1_1", "x11")], [Call("charge", "call_2_1", "x21")]],
            crashes=[Crash("after_receipt", "charge", 1, 0, Resume("copy_both"))],
            topology="subgraph_nested"),
        # Seeds 301, 412, 430: the other Send branch may go on with a decision it holds;
        # a set with one malformed answer runs none of it.
        "malformed_in_a_send_branch": Episode(
            0, {"charge": _tool(approval=True)}, charge, topology="subgraph_send",
            reviewer={"seed": 1, "malformed": True}),
        # Seed 2072: the other branch, run again unanswered, settled its call by lookup
        # meanwhile; only the calls still pending are answered next.
        "malformed_while_a_branch_settles": Episode(
            0, {"email": _tool("dedupe", "lookup", timeout=0.1)},
            [[Call("email", "call_1_0", "x10", 0, ["slow"])]], topology="subgraph_send",
            reviewer={"seed": 398728897, "malformed": True}),
        # Seeds 4115, 4219: a call answered by a person in a restarted subgraph whose
        # model asks under new tool_call_ids: its record is the earlier run's, under the
        # earlier id (the explorer looked it up by id).
        "respond_under_a_new_call_id": Episode(
            0, {"charge": _tool(approval=True)},
            [[Call("charge", "call_1_0", "x10")],
             [Call("charge", f"call_2_{i}", f"x2{i}") for i in (1, 3, 4)]],
            after=Resume("time_travel", 3), topology="subgraph_send", fresh_ids=True,
            reviewer={"seed": 1710634694, "edit_unchanged": True}),
        # Seed 10214: one tool_call_id pending in both Send branches, one of them decided
        # before a crash: the other is named by its key, not by the id both share.
        "one_call_id_in_two_branches": Episode(
            0, {"crm": _tool("lookup", "blind", approval=True, timeout=1.0,
                             errors="tool_exception")},
            [[Call("crm", "call_0_0", "x00")]],
            crashes=[Crash("after_intent", "crm", 1, 0, Resume("recover", 6))],
            topology="subgraph_send", sealed=True,
            reviewer={"seed": 1874449336, "malformed": True}),
        # Guarded writes outside ToolNode (`guarded_node`, `functional`): a looked-up
        # charge and an approved email in one turn, a lost charge in the next, killed
        # after the first charge; then two charges killed after the second, resumed
        # from get_state().config, and the finished thread run again by time travel.
        **{f"{topology}_{flavour}_{n}": Episode(
            0, {"charge": _tool("lookup", "lookup"), "email": _tool(approval=True)},
            turns, crashes=[crash], after=after, topology=topology, flavour=flavour,
            reviewer={"seed": 3})
           for topology in ("guarded_node", "functional") for flavour in ("sync", "async")
           for n, (turns, crash, after) in enumerate([
               ([[Call("charge", "c1", "x00"), Call("email", "c2", "x01")],
                 [Call("charge", "c3", "x10", 0, ["lost"])]],
                Crash("after_effect", "charge", 1, 0, Resume()), None),
               ([[Call("charge", "c1", "x00"), Call("charge", "c2", "x01")]],
                Crash("after_effect", "charge", 2, 0, Resume("checkpoint_config")),
                Resume("time_travel", 1))])},
        # Seed 537: the same for create_agent, one task per call.
        "malformed_in_create_agent": Episode(
            0, {"charge": _tool(approval=True)}, approvals, topology="create_agent",
            reviewer={"seed": 1, "malformed": True}),
    }


@pytest.mark.crash
@pytest.mark.parametrize("name", ["retry_middleware_after_the_guard", "idless_messages",
                                  "idless_messages_recovered",
                                  "trimmed_history", "command_found_by_lookup",
                                  "command_in_trimmed_history", "non_json_found_by_lookup",
                                  "artifact_replayed", "copy_both_nested",
                                  "malformed_in_a_send_branch", "malformed_while_a_branch_settles",
                                  "malformed_in_create_agent", "respond_under_a_new_call_id",
                                  "one_call_id_in_two_branches",
                                  *(f"{topology}_{flavour}_{n}"
                                    for topology in ("guarded_node", "functional")
                                    for flavour in ("sync", "async") for n in (0, 1))])
def test_everyday_shapes_keep_every_invariant(tmp_path, name) -> None:
    """Episodes of the explorer's shape classes that failed (the explorer's own false
    alarms, or refusals it did not know yet), pinned as episodes."""
    result = _replay(tmp_path, _shapes()[name])
    assert result.ok, result.problems
    if name.startswith("malformed"):
        assert result.malformed >= 1, result.log
    if name.startswith(("guarded_node", "functional")):
        assert result.crashes == 1 and result.pauses >= name.endswith("_0"), result.log
    if name in ("retry_middleware_after_the_guard", "idless_messages",
                "idless_messages_recovered"):
        assert any("refused as documented" in line for line in result.log), result.log


@pytest.mark.crash
@pytest.mark.parametrize("errors", ["tool_exception", "error_message", "validation"])
def test_a_tool_that_reports_a_lost_answer_itself_is_not_failed(tmp_path, errors) -> None:
    """Seeds 216, 218: a tool that catches the provider's lost answer and reports it
    (ToolException with handle_tool_error=True, an error ToolMessage, a ValidationError
    raised in its body) was recorded `failed` though the charge was applied. It is an
    unknown outcome: the reviewer finds the charge at the provider."""
    from graph_durable.testing.explorer.model import Call, Episode

    episode = Episode(0, {"charge": _tool(errors=errors)},
                      [[Call("charge", "c1", "x00", 0, ["lost"])]])
    result = _replay(tmp_path, episode)
    assert result.ok, result.problems
    assert result.pauses == 1 and result.log[0].endswith("pending=['c1']"), result.log


@pytest.mark.parametrize("depth", [1, 2])
def test_a_subgraph_run_twice_from_one_parent_checkpoint_charges_once(tmp_path, depth) -> None:
    """Seeds 335 and 439 (`subgraph_refork`): killed before its charge, the thread was
    resumed from `get_state().config` (a fork: the subgraph restarts and charges);
    running again from that same parent checkpoint (time travel, an update_state fork)
    restarted the subgraph again, whose model asked for the same charge, sent again."""
    from graph_durable.testing.scenarios.subgraphs import build_subgraph_charge_agent

    agent = build_subgraph_charge_agent(str(tmp_path / "a.sqlite"), str(tmp_path), "blind",
                                        depth=depth)
    charges = FakeProvider(str(tmp_path / "charge.sqlite"), "blind", name="charge")
    arm(FaultPlan("before_intent", tool="charge", action="raise"))
    with pytest.raises(InjectedCrash):
        agent.graph.invoke(agent.inputs, CONFIG, durability="sync")
    disarm()
    first = agent.graph.get_state(CONFIG)
    assert agent.graph.invoke(None, first.config, durability="sync")["messages"][-1].content \
        == "Charged."
    assert charges.count() == 1
    agent.graph.invoke(None, first.config, durability="sync")
    assert charges.count() == 1, charges.requests()


def test_a_malformed_answer_is_refused_under_a_retry_middleware_listed_first(tmp_path) -> None:
    """Seed 219 (`retry_swallows_refusal`): with `ToolRetryMiddleware` before
    `EffectGuardMiddleware` (the safe order), a malformed decision was not refused: the
    retry middleware caught the guard's `InvalidDecision`, answered the call with an
    error ToolMessage, and the thread went on, the call never sent nor asked again."""
    from graph_durable import InvalidDecision
    from graph_durable.testing.explorer.scenario import build_explorer_agent

    agent = build_explorer_agent(str(tmp_path / "a.sqlite"), str(tmp_path / "p"),
                                 {"charge": _tool(approval=True)},
                                 [[{"tool": "charge", "id": "c1", "item": "x00", "n": 0}]],
                                 topology="create_agent", stack="tool_retry_outside")
    agent.graph.invoke(agent.inputs, CONFIG, durability="sync")
    with pytest.raises(InvalidDecision):
        agent.graph.invoke(Command(resume={"type": "retry"}), CONFIG, durability="sync")


def test_one_malformed_answer_runs_none_of_a_create_agent_set(tmp_path) -> None:
    """Seed 537 (`malformed_across_tasks`): create_agent runs each call as a task of its
    own; a set of answers with one malformed raised `InvalidDecision`, but the other
    call's approval was recorded and its charge sent (docs, approvals: one invalid answer in a
    set runs none of the set)."""
    from graph_durable import InvalidDecision
    from graph_durable.testing.explorer.scenario import build_explorer_agent

    agent = build_explorer_agent(str(tmp_path / "a.sqlite"), str(tmp_path / "p"),
                                 {"charge": _tool(approval=True)},
                                 [[{"tool": "charge", "id": f"c{i}", "item": f"x0{i}", "n": 0}
                                   for i in range(2)]], topology="create_agent")
    result = agent.graph.invoke(agent.inputs, CONFIG, durability="sync")
    first, second = result["__interrupt__"]
    with pytest.raises(InvalidDecision):
        agent.graph.invoke(Command(resume={first.id: {"type": "bogus"},
                                           second.id: {"type": "approve"}}),
                           CONFIG, durability="sync")
    assert agent.providers["charge"].count() == 0
    assert all(r.status is EffectStatus.AWAITING_APPROVAL for r in agent.saver.effects("t"))


def _two_tasks_agent(tmp_path, topology: str, build: Any = None):
    """Two calls needing approval, each asked in a task of its own: create_agent's two
    calls, or one call in each of two `Send` branches of a subgraph."""
    from graph_durable.testing.explorer.scenario import build_explorer_agent

    calls = 2 if topology == "create_agent" else 1
    return (build or build_explorer_agent)(
        str(tmp_path / "a.sqlite"), str(tmp_path / "p"), {"charge": _tool(approval=True)},
        [[{"tool": "charge", "id": f"c{i}", "item": f"x0{i}", "n": 0} for i in range(calls)]],
        topology=topology)


@pytest.mark.parametrize("topology", ["create_agent", "subgraph_send"])
@pytest.mark.parametrize("bad", [0, 1])
def test_one_malformed_answer_runs_none_of_a_set_across_tasks(tmp_path, topology,
                                                              bad) -> None:
    """Seeds 301, 412, 430 (`Send` branches) and 537 (create_agent): whichever task holds
    the malformed answer, and whichever runs first, none of the set is recorded or sent;
    the corrected set then runs each call once."""
    from graph_durable import InvalidDecision

    agent = _two_tasks_agent(tmp_path, topology)
    questions = agent.graph.invoke(agent.inputs, CONFIG, durability="sync")["__interrupt__"]
    assert len(questions) == 2
    answers = {q.id: {"type": "bogus"} if i == bad else {"type": "approve"}
               for i, q in enumerate(questions)}
    with pytest.raises(InvalidDecision) as refused:
        agent.graph.invoke(Command(resume=answers), CONFIG, durability="sync")
    assert refused.value.thread_id == "t"
    assert refused.value.tool_call_id == questions[bad].value["tool_call_id"]
    assert agent.providers["charge"].count() == 0
    records = agent.saver.effects("t")
    assert all(r.status is EffectStatus.AWAITING_APPROVAL and r.asked for r in records)
    assert not [e for e in agent.saver.events("t") if e.kind == "decision"]
    assert {i.id for i in agent.graph.get_state(CONFIG, subgraphs=True).interrupts} \
        == {q.id for q in questions}
    agent.graph.invoke(Command(resume={q.id: {"type": "approve"} for q in questions}),
                       CONFIG, durability="sync")
    assert agent.providers["charge"].count() == 2


@pytest.mark.parametrize("topology", ["create_agent", "subgraph_send"])
def test_one_malformed_answer_runs_none_of_an_async_set_across_tasks(tmp_path,
                                                                     topology) -> None:
    """The same on the async path."""
    import asyncio

    from graph_durable import InvalidDecision
    from graph_durable.testing.explorer.scenario import build_explorer_agent_async

    async def main() -> None:
        agent = await _two_tasks_agent(tmp_path, topology, build_explorer_agent_async)
        try:
            await decide(agent)
        finally:
            await agent.saver.conn.close()  # aiosqlite's thread would outlive the test

    async def decide(agent: Any) -> None:
        result = await agent.graph.ainvoke(agent.inputs, CONFIG, durability="sync")
        first, second = result["__interrupt__"]
        with pytest.raises(InvalidDecision):
            await agent.graph.ainvoke(Command(resume={first.id: {"type": "approve"},
                                                      second.id: {"type": "reject",
                                                                  "message": 5}}),
                                      CONFIG, durability="sync")
        assert agent.providers["charge"].count() == 0
        records = await agent.saver.aeffects("t")
        assert all(r.status is EffectStatus.AWAITING_APPROVAL for r in records)
        await agent.graph.ainvoke(Command(resume={first.id: {"type": "approve"},
                                                  second.id: {"type": "approve"}}),
                                  CONFIG, durability="sync")
        assert agent.providers["charge"].count() == 2

    asyncio.run(main())


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="LangGraph's: a run again "
                   "from a fork restores one Send branch's subgraph, not both")
def test_langgraph_restores_both_send_branches_when_a_fork_is_run_again() -> None:
    """`send_refork` (seed 4192), with LangGraph's own in-memory saver and no guard: the
    parent sends two branches into one subgraph; each is killed (an exception) after its
    first node, twice: in a first run, then in a run from `get_state().config` (a fork).
    Run again from that fork, one branch starts over from the checkpoint before the fork,
    but the other (`ReplayState` counts a subgraph by node name, not by task) loads its
    latest checkpoint and gets its input again on top: its first node runs twice, and an
    agent's pending tools step there is dropped, its calls never answered."""
    import operator
    from typing import Annotated, TypedDict

    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, StateGraph
    from langgraph.types import Send

    killed = [True]
    State = TypedDict("State", {"log": Annotated[list[str], operator.add]})  # noqa: UP013

    def second(state: dict[str, list[str]]) -> dict[str, list[str]]:
        if killed[0]:
            raise RuntimeError("killed")
        return {"log": ["second"]}

    sub = StateGraph(State)
    sub.add_node("first", lambda state: {"log": ["first"]})
    sub.add_node("second", second)
    sub.add_edge(START, "first")
    sub.add_edge("first", "second")
    parent = StateGraph(State)
    parent.add_node("payments", sub.compile())
    parent.add_conditional_edges(
        START, lambda state: [Send("payments", {"log": [f"in{b}"]}) for b in (0, 1)],
        ["payments"])
    graph = parent.compile(checkpointer=InMemorySaver())
    for graph_input, config in (({"log": []}, CONFIG), (None, None)):
        with pytest.raises(RuntimeError, match="killed"):
            graph.invoke(graph_input, config or graph.get_state(CONFIG).config,
                         durability="sync")
    killed[0] = False
    fork = graph.get_state(CONFIG).config
    log = graph.invoke(None, fork, durability="sync")["log"]
    assert sorted(log) == ["first", "first", "in0", "in1", "second", "second"], log


@pytest.mark.crash
@pytest.mark.xfail(strict=True, raises=AssertionError, reason="LangGraph's `send_refork`")
def test_a_send_branch_run_again_from_a_fork_answers_its_calls(tmp_path) -> None:
    """Seed 4192 (`send_refork`): two `Send` branches into the subgraph, killed before a
    checkpoint write, run from `get_state().config`, killed before an intent, then run
    by time travel from the fork the second run made: one branch finished with its
    calls unanswered (the test above, in the guard's graph). Both branches restore
    their checkpoint when they happen to look it up at once: the episode runs three
    times."""
    from graph_durable.testing.explorer.model import Call, Crash, Episode, Resume

    episode = Episode(
        0, {"ticket": _tool("dedupe", "idempotent"), "email": _tool()},
        [[Call("ticket", "call_0_0", "x00"), Call("email", "call_0_1", "x01")]],
        crashes=[Crash("before_put_writes", None, 2, 0, Resume("checkpoint_config", 1)),
                 Crash("before_intent", "ticket", 1, 0, Resume("time_travel", 7))],
        topology="subgraph_send", sequential=False)
    for attempt in range(3):
        result = _replay(tmp_path / str(attempt), episode, paths="stable,send_refork")
        assert result.ok, result.problems


def _hitl_agent(tmp_path):
    from graph_durable.testing.explorer.scenario import build_explorer_agent

    return build_explorer_agent(str(tmp_path / "a.sqlite"), str(tmp_path / "p"),
                                {"charge": _tool(approval=True)},
                                [[{"tool": "charge", "id": "c1", "item": "x00", "n": 0}]],
                                topology="create_agent", stack="hitl_before_guard")


def test_review_reads_a_thread_paused_by_human_in_the_loop_before_the_guard(tmp_path) -> None:
    """`hitl_review`: with a per-call `HumanInTheLoopMiddleware` listed before the guard
    (the order the docs recommend), `review(graph, config)` raised `KeyError('key')`."""
    agent = _hitl_agent(tmp_path)
    agent.graph.invoke(agent.inputs, CONFIG, durability="sync")
    result = review(agent.graph, CONFIG).approve("c1").resume()
    assert result["messages"][-1].content == "All done."
    assert agent.providers["charge"].count() == 1


def test_a_call_approved_through_human_in_the_loop_and_crashed_is_not_asked_again(
        tmp_path) -> None:
    """Seeds 1013, 1028 (`hitl_asked_again`): a call approved through a per-call
    `HumanInTheLoopMiddleware` listed before the guard, killed after the charge, was
    asked about again on resume; answered with an edit this time, it was charged a
    second time (the first charge, as first asked, had been applied)."""
    agent = _hitl_agent(tmp_path)
    [question] = agent.graph.invoke(agent.inputs, CONFIG, durability="sync")["__interrupt__"]
    arm(FaultPlan("after_effect", tool="charge", action="raise"))
    with pytest.raises(InjectedCrash):
        agent.graph.invoke(Command(resume={question.id: {"type": "approve"}}), CONFIG,
                           durability="sync")
    disarm()
    assert agent.providers["charge"].count() == 1
    result = agent.graph.invoke(None, CONFIG, durability="sync")
    for question in result.get("__interrupt__", []):
        edit = {"type": "edit", "edited_action": {"name": "charge",
                                                  "args": {"item": "x00", "n": 1}}}
        agent.graph.invoke(Command(resume={question.id: edit}), CONFIG, durability="sync")
    assert agent.providers["charge"].count() == 1


@pytest.mark.crash
def test_an_order_fixed_after_a_crash_asks_the_guard_question_anew(tmp_path) -> None:
    """Seed 3891 (`hitl_after_guard`): two charges under `[EffectGuardMiddleware,
    HumanInTheLoopMiddleware]`, killed after the first intent; resumed, the guard asked
    about the first (effect_unknown) and the second was refused (MiddlewareOrderError).
    With the order fixed, HumanInTheLoopMiddleware asked about both; approving them
    raised InvalidDecision: the guard read the approval as the answer to its own
    question about the first charge."""
    from graph_durable.testing.explorer.model import Call, Crash, Episode, Resume

    episode = Episode(
        0, {"charge": _tool(approval="odd")},
        [[Call("charge", "call_0_0", "x00"), Call("charge", "call_0_4", "x04")]],
        crashes=[Crash("after_intent", "charge", 1, 0, Resume())],
        topology="create_agent", stack="hitl_after_guard", reviewer={"seed": 662236681})
    result = _replay(tmp_path, episode, paths="stable,hitl_after_guard")
    assert result.ok, result.problems


@pytest.mark.crash
def test_a_restarted_subgraph_answers_the_call_under_its_new_id(tmp_path) -> None:
    """Seed 4157 (`fresh_call_ids`): a model that gives new tool_call_ids each time it
    is asked, two subgraphs down; after a crash after the charge, a run from
    `get_state().config` and a copy, the source finished with the charge's receipt
    answering the earlier run's tool_call_id, and the call its model asked last left
    without an answer."""
    from graph_durable.testing.explorer.model import Call, Crash, Episode, Resume

    episode = Episode(
        0, {"charge": _tool()}, [[Call("charge", "call_1_0", "x10")]],
        crashes=[Crash("after_effect", "charge", 1, 0, Resume("checkpoint_config")),
                 Crash("before_put", None, 2, 0, Resume("copy_both"))],
        topology="subgraph_nested", fresh_ids=True, sealed=True,
        reviewer={"seed": 1604332116})
    result = _replay(tmp_path, episode, paths="stable,fresh_call_ids")
    assert result.ok, result.problems


@pytest.mark.crash
def test_a_question_about_a_restarted_subgraphs_call_names_its_new_id(tmp_path) -> None:
    """`fresh_call_ids`: a blind charge in a subgraph, killed after the charge and run
    from `get_state().config`; the restarted model asks again under a new tool_call_id,
    and the question about the charge in flight named the earlier run's id (the
    explorer's QUESTION check: no model message of the thread asks for it now)."""
    from graph_durable.testing.explorer.model import Call, Crash, Episode, Resume

    episode = Episode(
        0, {"charge": _tool()}, [[Call("charge", "call_1_0", "x10")]],
        crashes=[Crash("after_effect", "charge", 1, 0, Resume("checkpoint_config"))],
        topology="subgraph", fresh_ids=True)
    result = _replay(tmp_path, episode)
    assert result.ok, result.problems
    assert result.pauses == 1


@pytest.mark.crash
def test_a_question_of_the_guard_is_not_answered_by_human_in_the_loop(tmp_path) -> None:
    """Seed 277 (`hitl_before_guard`): a charge past its timeout (effect_unknown, asked
    by the guard) beside another charge needing approval, killed before the second's
    intent; resumed, HumanInTheLoopMiddleware asked about the first charge again, and
    approving it raised InvalidDecision: the guard read the approval as the answer to
    its own question."""
    from graph_durable.testing.explorer.model import Call, Crash, Episode, Resume

    episode = Episode(
        0, {"charge": _tool(approval="odd", timeout=0.1)},
        [[Call("charge", "call_0_2", "x03", 0, ["slow"]), Call("charge", "call_0_4", "x04")]],
        crashes=[Crash("before_intent", "charge", 2, 1, Resume())],
        topology="create_agent", stack="hitl_before_guard",
        reviewer={"seed": 1145061483, "malformed": True})
    result = _replay(tmp_path, episode, paths="stable,hitl_before_guard")
    assert result.ok, result.problems


@pytest.mark.crash
def test_a_saved_question_asked_anew_after_two_crashes_is_not_answered(tmp_path, monkeypatch
                                                                       ) -> None:
    """Seed 10410 (async, `recover`): approved, the first email was killed after its
    intent; `recover` found it `unknown`, asked anew, and was killed before that question
    was saved; the next `recover` passed the thread by (the dead worker's lease). The
    explorer answered the saved approval question, one `review` (rightly) no longer
    lists: resuming asks the new one. It waits for the lease and recovers instead."""
    from graph_durable.testing.explorer.model import Call, Crash, Episode, Resume

    episode = Episode(
        0, {"crm": _tool(approval="odd"), "email": _tool(approval=True, result="non_json")},
        [[Call("crm", "call_0_1", "x01"), Call("email", "call_0_2", "x02"),
          Call("email", "call_0_4", "x04")]],
        crashes=[Crash("after_intent", "email", 1, 0, Resume("recover", 1)),
                 Crash("after_receipt", "email", 1, 0, Resume("recover", 6))],
        flavour="async", reviewer={"seed": 2112498389})
    # The path under test needs `recover` to start while the killed worker's lease
    # holds: a lease longer than the explorer's 0.4 s, for a machine under load.
    from graph_durable.testing.explorer import driver

    monkeypatch.setattr(driver, "LEASE_TTL", 3.0)
    # Which of the two parallel emails reaches a fault point first is up to the event
    # loop's thread hops (aiosqlite), so the episode may take another path under load:
    # every run must be right, and one of three must take this path.
    logs = []
    for attempt in range(3):
        result = _replay(tmp_path / str(attempt), episode)
        assert result.ok, result.problems
        logs.append(result.log)
        if any("passed t by" in line for line in result.log):
            assert result.log[-1].startswith("decide on t:"), result.log
            break
    else:
        pytest.fail(f"no run took the path under test: {logs}")


@pytest.mark.crash
def test_a_subgraph_restarted_twice_in_one_namespace_sends_each_call_once(tmp_path) -> None:
    """Seed 7073 (`subgraph_send`): killed before the first step was done, the thread
    was forked by `update_state`; that run's first `Send` branch sent its email and was
    killed after the charge's intent. Run from `get_state().config` (the update, still
    the thread's latest checkpoint, so LangGraph writes no fork and the branch's task
    keeps its namespace), the branch restarted in the same namespace, its earlier run
    was taken for its own, and the email was sent a second time under a new key."""
    from graph_durable.testing.explorer.model import Call, Crash, Episode, Resume

    episode = Episode(
        7073, {"audit": _tool(),
               "charge": _tool("lookup", errors="validation", result="non_json", retries=2),
               "email": _tool(result="command", timeout=1.0),
               "search": {"mode": "read", "policy": "read_only"}},
        [[Call("email", "call_1_1", "x11"), Call("charge", "call_1_3", "x13")]],
        crashes=[Crash("after_put", None, 2, 0, Resume("update_state", 7)),
                 Crash("after_intent", "charge", 1, 0, Resume("checkpoint_config", 7))],
        topology="subgraph_send", sealed=True,
        reviewer={"seed": 26461428, "malformed": True, "raw": True})
    result = _replay(tmp_path, episode)
    assert not [p for p in result.problems if p.startswith("DUPLICATE")], result.problems
    assert result.ok, result.problems
    assert result.log[2].startswith("checkpoint_config on t:"), result.log


@pytest.mark.crash
def test_a_call_answered_in_place_in_a_copy_then_sent_and_skipped_in_its_source(
        tmp_path) -> None:
    """Seeds 10442 and 10469 (`subgraph_send`, `copy_both`): killed before the first
    intent, after the Send branches' subgraphs had asked; the copy answered a call in
    place (nothing sent from it, `rejected`); its source asked anew, as designed, and its
    approval sent the call under the key the family shares; the answer was lost, so
    `unknown`, and the reviewer skipped it. The provider holds the key the copy's record
    calls rejected: the source sent it. The explorer's check had excused that only when
    the source's record ended `applied`."""
    from graph_durable.testing.explorer.model import Call, Crash, Episode, Resume
    from graph_durable.testing.explorer.scenario import explorer_saver

    episode = Episode(
        0, {"charge": _tool(approval=True)},
        [[Call("charge", "call_0_0", "x00", 0, ["lost"]), Call("charge", "call_0_1", "x01")]],
        crashes=[Crash("before_intent", "charge", 1, 0, Resume("copy_both"))],
        topology="subgraph_send", sealed=True,
        reviewer={"seed": 349631168, "edit_unchanged": True})
    result = _replay(tmp_path, episode)
    assert result.ok, result.problems
    with explorer_saver(str(tmp_path / "episode" / "agent.sqlite"), True) as saver:
        copy = {r.key: r for r in saver.effects("t-copy1")}
        source = {r.key: r for r in saver.effects("t")}
    [key] = [k for k, r in copy.items() if r.status is EffectStatus.REJECTED
             and k in source and source[k].status is not EffectStatus.REJECTED]
    assert (copy[key].attempts, source[key].status, source[key].attempts) == (
        0, EffectStatus.SKIPPED, 1)
    charges = FakeProvider(str(tmp_path / "episode" / "providers" / "charge.sqlite"), "blind",
                           name="charge")
    assert [e["key"] for e in charges.effects()].count(key) == 1


@pytest.mark.crash
def test_a_question_saved_by_a_task_but_not_its_entrypoint_is_asked_by_recover(
        tmp_path) -> None:
    """Seed 7056 (`functional_hidden_question`): a worker killed after a functional-API
    `@task` saved its question and before its `@entrypoint` saved it. `get_state()` lists
    no interrupt, so there is nothing to answer; `thread_status` said the thread waited
    for a person, and `recover()` passed it by: no one was ever asked. It now tells the
    question only the task saved (by the path saved with its writes) and calls the
    thread orphaned: `recover()` resumes it and the question is asked again."""
    from graph_durable.testing.crash.child import run_child
    from graph_durable.testing.scenarios.writes import build_write_graph

    kwargs = {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path),
              "mode": "blind", "shape": "functional", "approval": True}
    crashed = run_child("graph_durable.testing.scenarios.writes:build_write_graph", kwargs,
                        thread_id="t", fault=FaultPlan("after_put_writes", occurrence=1))
    assert crashed.killed
    agent = build_write_graph(**kwargs)
    assert agent.graph.get_state(CONFIG).interrupts == ()  # the question was not shown
    recover(agent.graph, agent.saver, "worker-2")
    questions = agent.graph.get_state(CONFIG).interrupts
    agent.saver.conn.close()
    assert [q.value["type"] for q in questions] == ["tool_approval"], "no one was asked"


@pytest.mark.crash
def test_the_explorer_recovers_a_functional_question_its_entrypoint_never_saved(
        tmp_path) -> None:
    """Seed 7056's situation as an explorer episode (the seed draws another one since):
    a functional-API agent's approval, killed at the second saved write (the `@task`'s
    question, before its `@entrypoint`'s), recovered. `recover()` resumes the thread and
    the question is answered; it used to pass the thread by (`STATUS ... waiting`)."""
    from graph_durable.testing.explorer.model import Call, Crash, Episode, Resume

    episode = Episode(
        0, {"charge": {"approval": True, "mode": "blind", "policy": "blind", "retries": 0,
                       "timeout": None}},
        [[Call("charge", "call_0_0", "x00")]],
        crashes=[Crash("after_put_writes", None, 2, 0, Resume("recover"))],
        topology="functional")
    result = _replay(tmp_path, episode)
    assert result.ok, result.problems
    assert result.log[0] == "start on t: SIGKILL at after_put_writes #2"
    assert re.fullmatch(r"recover on t: next=\['workflow'\] pending=\['charge#0@[0-9a-f]{6}'\]",
                        result.log[1]), result.log[1]


@pytest.mark.crash
def test_a_stale_approval_in_a_send_branch_is_not_answered_after_recover(tmp_path) -> None:
    """Seed 106 (two `Send` branches, `recover`): in one branch an approval edit sent the
    first email, which timed out (`unknown`, asked anew); the worker was killed after the
    second email's receipt, before the new question was saved. The explorer answered the
    saved approval question of the first email, which the guard (rightly) refused as
    decided: resuming asks whether it was sent. As for seed 10410, only the questions
    `review` lists are answered."""
    from graph_durable.testing.explorer.model import Call, Crash, Episode, Resume

    episode = Episode(
        0, {"charge": _tool(), "email": _tool(approval="odd", retries=1, timeout=0.1)},
        [[Call("charge", "call_0_0", "x00", 0, ["hang"])],
         [Call("email", "call_1_1", "x11", 0, ["slow"]), Call("email", "call_1_3", "x13")]],
        crashes=[Crash("after_receipt", "email", 1, 1, Resume("recover", 1))],
        topology="subgraph_send", reviewer={"seed": 946044306, "edit_unchanged": True})
    result = _replay(tmp_path, episode)
    assert result.ok, result.problems
    assert any(line.startswith("recover on t:") for line in result.log), result.log


SHARED_ID_EDITED_ON_A_FORK = (
    '{"after":{"pick":0,"via":"update_state"},"crashes":[],"flavour":"sync",'
    '"fresh_ids":false,"history":"","leased":false,"reviewer":{"edit_unchanged":false,'
    '"malformed":true,"raw":false,"seed":1145061483},"sealed":false,"seed":277,'
    '"sequential":true,"stack":"hitl_before_guard","tools":{"charge":{"approval":"odd",'
    '"mode":"blind","policy":"blind","result":"receipt","retries":0,"timeout":0.1}},'
    '"topology":"create_agent","turns":[[{"faults":[],"id":"call_0_1","item":"x01","n":0,'
    '"tool":"charge"},{"faults":[],"id":"call_0_2","item":"x02","n":0,"tool":"charge"},'
    '{"faults":["slow"],"id":"call_0_2","item":"x03","n":0,"tool":"charge"},'
    '{"faults":[],"id":"call_0_4","item":"x04","n":0,"tool":"charge"}]]}')


@pytest.mark.crash
def test_an_edit_of_a_call_under_a_shared_tool_call_id_is_refused_not_sent_again(
        tmp_path) -> None:
    """Seed 277 (`duplicate_call_id` under `hitl_before_guard`): one AIMessage asks
    `charge(x02)` and `charge(x03)` under one tool_call_id; a per-call
    `HumanInTheLoopMiddleware` before the guard asks about each. Approved, x02 is
    charged; on an `update_state` fork the question is asked again and answered with an
    edit. The edited call could be either requested call, so it was keyed by its new
    args and charged x02 a second time. It is refused (`UnkeyableToolCall`) before
    anything is sent."""
    from graph_durable.testing.explorer.model import Episode

    result = _replay(tmp_path, Episode.from_json(SHARED_ID_EDITED_ON_A_FORK))
    assert result.ok, result.problems
    assert any("refused as documented: UnkeyableToolCall" in line for line in result.log)
    charges = FakeProvider(str(tmp_path / "episode" / "providers" / "charge.sqlite"), "blind",
                           name="charge")
    assert [e["operation"] for e in charges.effects()].count("x02") == 1


def test_an_edited_call_under_an_id_two_calls_of_its_message_share_is_refused() -> None:
    """Calls under one tool_call_id are told apart by their args: changed args under a
    shared id could belong to either call, so they have no requested call's key."""
    from langchain_core.messages import AIMessage

    from graph_durable.errors import UnkeyableToolCall
    from graph_durable.nodes.anchor import requested_args

    asked = AIMessage(content="", id="m1", tool_calls=[
        {"name": "charge", "args": {"item": "x02"}, "id": "c2"},
        {"name": "charge", "args": {"item": "x03"}, "id": "c2"},
        {"name": "charge", "args": {"item": "x04"}, "id": "c4"}])
    state = {"messages": [asked]}
    assert requested_args(state, {"name": "charge", "args": {"item": "x03"}, "id": "c2"}) is None
    assert requested_args(state, {"name": "charge", "args": {"item": "y"}, "id": "c4"}) == {
        "item": "x04"}
    with pytest.raises(UnkeyableToolCall, match="thread 't'.*'c2'|'c2'.*thread 't'"):
        requested_args(state, {"name": "charge", "args": {"item": "y"}, "id": "c2"},
                       thread_id="t")


SHARED_ID_ACROSS_TOOLS_EDITED_ON_A_FORK = (
    '{"after":{"pick":4,"via":"update_state"},"backend":"sqlite","crashes":[],'
    '"flavour":"sync","fresh_ids":false,"history":"","leased":false,"reviewer":'
    '{"edit_unchanged":false,"malformed":false,"raw":false,"seed":1097998648},'
    '"sealed":false,"seed":1033101,"sequential":true,"stack":"hitl_before_guard","tools":'
    '{"charge":{"approval":true,"errors":"raise","mode":"lookup","policy":"blind",'
    '"result":"receipt","retries":0,"timeout":null},"crm":{"approval":true,"mode":"lookup",'
    '"policy":"blind","retries":0,"timeout":null},"email":{"approval":false,'
    '"errors":"validation","mode":"blind","policy":"blind","retries":0,"timeout":null},'
    '"ticket":{"approval":false,"errors":"tool_exception","mode":"blind","policy":"blind",'
    '"result":"non_json","retries":1,"timeout":null}},"topology":"create_agent","turns":'
    '[[{"faults":[],"id":"call_0_2","item":"x02","n":0,"tool":"crm"},{"faults":[],'
    '"id":"call_0_2","item":"x04","n":0,"tool":"charge"}]]}')


@pytest.mark.crash
def test_an_edit_of_a_call_whose_id_a_call_to_another_tool_shares_is_not_sent_again(
        tmp_path) -> None:
    """Seed 1033101 (`duplicate_call_id` under `hitl_before_guard`): one AIMessage asks
    `crm(x02)` and `charge(x04)` under one tool_call_id; a per-call
    `HumanInTheLoopMiddleware` before the guard asks about each. Charged as asked, then
    on an `update_state` fork asked again and answered with an edit: the edited charge was
    keyed by its new args (the requested call was looked for among every call under the
    id, and two were found), and x04 was charged a second time. The one charge under the
    id is the requested call: the edit reaches its effect, which is replayed."""
    from graph_durable.testing.explorer.model import Episode

    result = _replay(tmp_path, Episode.from_json(SHARED_ID_ACROSS_TOOLS_EDITED_ON_A_FORK))
    assert result.ok, result.problems
    charges = FakeProvider(str(tmp_path / "episode" / "providers" / "charge.sqlite"), "lookup",
                           name="charge")
    assert [e["operation"] for e in charges.effects()].count("x04") == 1


def test_an_edited_call_is_the_one_call_to_its_tool_under_a_shared_id() -> None:
    """Calls to other tools under the same tool_call_id do not make an edited call
    ambiguous: its requested args are those of the one call to its tool."""
    from langchain_core.messages import AIMessage

    from graph_durable.nodes.anchor import requested_args

    asked = AIMessage(content="", id="m1", tool_calls=[
        {"name": "crm", "args": {"item": "x02"}, "id": "c2"},
        {"name": "charge", "args": {"item": "x04"}, "id": "c2"}])
    state = {"messages": [asked]}
    assert requested_args(state, {"name": "charge", "args": {"item": "x04"}, "id": "c2"}) is None
    assert requested_args(state, {"name": "charge", "args": {"item": "y"}, "id": "c2"}) == {
        "item": "x04"}
    # Args equal to another tool's call under the id are still changed args.
    assert requested_args(state, {"name": "charge", "args": {"item": "x02"}, "id": "c2"}) == {
        "item": "x04"}
    assert requested_args(state, {"name": "email", "args": {"item": "y"}, "id": "c2"}) is None


def test_an_edit_equal_in_python_but_keyed_apart_is_the_requested_call() -> None:
    """`10` sent for a requested `10.0` (a JSON client's edit), or `True` for `1`, compares
    equal in Python but encodes apart: such a call is changed, keyed as requested."""
    from langchain_core.messages import AIMessage

    from graph_durable.nodes.anchor import requested_args

    asked = AIMessage(content="", id="m1", tool_calls=[
        {"name": "charge", "args": {"amount": 10.0, "now": 1}, "id": "c1"}])
    state = {"messages": [asked]}
    assert requested_args(state, {"name": "charge", "args": {"amount": 10.0, "now": 1},
                                  "id": "c1"}) is None
    assert requested_args(state, {"name": "charge", "args": {"amount": 10, "now": 1},
                                  "id": "c1"}) == {"amount": 10.0, "now": 1}
    assert requested_args(state, {"name": "charge", "args": {"amount": 10.0, "now": True},
                                  "id": "c1"}) == {"amount": 10.0, "now": 1}


def test_an_edit_to_the_same_amount_as_an_int_on_a_fork_is_not_charged_again(
        tmp_path) -> None:
    """A per-call `HumanInTheLoopMiddleware` before the guard; the model asks
    `charge(amount=10.0)`, approved and charged. On an `update_state` fork the question
    is asked again and answered with an edit to `amount=10` (as a JSON client sends
    10.0): the call was taken for the unchanged one (`10 == 10.0`) and keyed by the args
    it is sent with, which encode apart, so it was charged a second time. It is the
    requested call: its effect is replayed."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import HumanInTheLoopMiddleware
    from langchain_core.messages import AIMessage

    from graph_durable import EffectGuardMiddleware, current_effect
    from graph_durable.testing.models import ScriptedChatModel

    provider = FakeProvider(str(tmp_path / "pay.sqlite"), "blind", name="pay")

    @tool
    def charge(amount: float) -> str:
        """Charge the customer."""
        return f"charged {provider.apply(current_effect().key, {'amount': amount})['id']}"

    saver = DurableSqliteSaver(sqlite3.connect(str(tmp_path / "a.sqlite"),
                                               check_same_thread=False))
    model = ScriptedChatModel(script=[
        AIMessage(content="", id="ai-1",
                  tool_calls=[{"name": "charge", "args": {"amount": 10.0}, "id": "c1"}]),
        AIMessage(content="done")])
    graph = create_agent(model, tools=[charge], checkpointer=saver, middleware=[
        HumanInTheLoopMiddleware({"charge": True}, interrupt_mode="per_call"),
        EffectGuardMiddleware({"charge": Effect()})])
    config = {"configurable": {"thread_id": "t"}}
    [asked] = graph.invoke({"messages": [HumanMessage("go")]}, config,
                           durability="sync")["__interrupt__"]
    graph.invoke(Command(resume={asked.id: {"type": "approve"}}), config, durability="sync")
    assert provider.count() == 1

    [step] = [s for s in graph.get_state_history(config) if s.next == ("tools",)]
    fork = graph.update_state(step.config, {"messages": [step.values["messages"][-1]]},
                              as_node="model")
    [again] = graph.invoke(None, fork, durability="sync")["__interrupt__"]
    graph.invoke(Command(resume={again.id: {"type": "edit", "edited_action": {
        "name": "charge", "args": {"amount": 10}}}}), config, durability="sync")
    assert provider.count() == 1
    assert [r.status.value for r in saver.effects("t")] == ["applied"]


def test_an_effect_keyed_by_changed_args_under_a_shared_id_is_adopted() -> None:
    """A ledger written by a release that keyed such an edited call by its changed args:
    the call takes that effect's key (resumed across the upgrade, it is not sent again);
    without one, it keeps the requested call's key. A call whose id no other call shares
    was keyed by the requested call before too: nothing is looked up for it."""
    from langchain_core.messages import AIMessage

    from graph_durable._langgraph import CONFIG_KEY_CHECKPOINTER, CONFIG_KEY_DURABILITY
    from graph_durable.ledger import EffectStatus, Keying, trusted_record
    from graph_durable.nodes.call_keys import ToolCallKeys
    from graph_durable.nodes.operations import performed
    from graph_durable.nodes.task import Task
    from graph_durable.policy import Effect

    saver = DurableSqliteSaver(sqlite3.connect(":memory:", check_same_thread=False))
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": "tools:1",
                               CONFIG_KEY_CHECKPOINTER: saver, CONFIG_KEY_DURABILITY: "sync"}}
    edited = {"name": "charge", "args": {"item": "y"}, "id": "c2"}
    shared = {"messages": [AIMessage(content="", id="m1", tool_calls=[
        {"name": "crm", "args": {"item": "x02"}, "id": "c2"},
        {"name": "charge", "args": {"item": "x04"}, "id": "c2"}])]}
    alone = {"messages": [AIMessage(content="", id="m1", tool_calls=[
        {"name": "charge", "args": {"item": "x04"}, "id": "c2"}])]}

    def keyed(state: dict, recorded: dict) -> tuple[str, list[Any]]:
        asked: list[Any] = []

        def read(op):
            asked.append(op.args[0])
            return recorded.get(op.args[0])

        ctx = performed(ToolCallKeys().step_context(Task(config, edited), edited, state,
                                                    Effect(), Keying("t", False)), read)
        return ctx.key, asked

    requested_key, asked = keyed(shared, {})
    assert len(asked) == 1 and asked[0] != requested_key  # the old key, not found
    old_key = asked[0]
    record = trusted_record(key=old_key, thread_id="t", checkpoint_ns="tools:1",
                            tool_call_id="c2", tool="charge", args={"item": "y"},
                            status=EffectStatus.APPLIED, created_at=1.0, updated_at=1.0)
    assert keyed(shared, {old_key: record}) == (old_key, [old_key])
    assert keyed(alone, {old_key: record}) == (requested_key, [])

    # A thread keyed before keys were anchored (legacy): those releases keyed a changed
    # call by the args it was sent with, at the task's namespace, without a secret.
    from graph_durable.ledger import encode_args, key_of_encoded

    legacy_sent = key_of_encoded("t", "tools:1", "c2", "charge",
                                 encode_args(edited["args"], thread_id="t", tool_call_id="c2",
                                             tool="charge"))
    for state in (shared, alone):
        ctx = performed(
            ToolCallKeys().step_context(Task(config, edited), edited, state, Effect(),
                                        Keying("t", True)),
            lambda op: record if op.args[0] == legacy_sent else None)
        assert ctx.key == old_key  # the record found under the legacy key


@pytest.mark.crash
def test_a_raw_reviewer_names_a_functional_agents_questions_by_interrupt_id(tmp_path) -> None:
    """Seeds 103, 176, 212: a functional-API agent's `@task`s each save a question;
    `get_state()` showed one, and the explorer's raw reviewer resumed with a bare value,
    which LangGraph refuses while several interrupts are pending (`RuntimeError`)."""
    from graph_durable.testing.explorer.model import Episode

    episode = Episode.from_json(
        '{"after":null,"crashes":[],"flavour":"sync","fresh_ids":false,"history":"",'
        '"leased":false,"reviewer":{"edit_unchanged":false,"malformed":false,"raw":true,'
        '"seed":409284033},"sealed":false,"seed":103,"sequential":false,"stack":"",'
        '"tools":{"email":{"approval":true,"mode":"lookup","policy":"blind","retries":0,'
        '"timeout":null},"ticket":{"approval":true,"lookup_faults":null,"mode":"lookup",'
        '"policy":"lookup","retries":0,"timeout":null}},"topology":"functional","turns":'
        '[[{"faults":[],"id":"call_2_0","item":"x20","n":0,"tool":"email"},'
        '{"faults":[],"id":"call_2_1","item":"x21","n":0,"tool":"ticket"}]]}')
    result = _replay(tmp_path, episode)
    assert result.ok, result.problems


SEED_731088 = (
    '{"after":null,"crashes":[],"flavour":"sync","fresh_ids":false,"history":"",'
    '"leased":false,"reviewer":{"edit_unchanged":true,"malformed":true,"raw":false,'
    '"seed":173816426},"sealed":false,"seed":731088,"sequential":true,"stack":"",'
    '"tools":{"charge":{"approval":"odd","mode":"dedupe","policy":"lookup","retries":2,'
    '"timeout":null},"crm":{"approval":true,"mode":"blind","policy":"blind","retries":0,'
    '"timeout":0.1},"email":{"approval":"odd","errors":"error_message","mode":"blind",'
    '"policy":"blind","retries":2,"timeout":null},"ticket":{"approval":true,"mode":"lookup",'
    '"policy":"lookup","retries":0,"timeout":null}},"topology":"subgraph_send","turns":'
    '[[{"faults":[],"id":"call_0_2","item":"x02","n":0,"tool":"ticket"},'
    '{"faults":["lost"],"id":"call_0_3","item":"x03","n":0,"tool":"email"}],'
    '[{"faults":[],"id":"call_0_0","item":"x10","n":0,"tool":"crm"},'
    '{"faults":[],"id":"call_1_1","item":"x11","n":0,"tool":"charge"},'
    '{"faults":["slow"],"id":"call_1_2","item":"x12","n":0,"tool":"crm"}],'
    '[{"faults":["slow"],"id":"call_2_0","item":"x20","n":0,"tool":"crm"}]]}')


@pytest.mark.crash
def test_a_refused_set_across_send_branches_records_none_of_its_answers(tmp_path) -> None:
    """Seed 731088 (`subgraph_send`): two `Send` branches pend `call_2_0`, one asking
    about an `unknown` outcome after an approval it took in an earlier run, the other
    for approval. The resume map answers the first with `approve` again (a type its
    question does not allow) and the second with a valid `reject`. The second branch
    took the `approve` for the first's answer of an earlier moment in this run and let
    its `reject` through (journaled, recorded `rejected`) while the first refused the
    set. Only an answer taken in this run is passed by now: both refuse, nothing is
    recorded."""
    from graph_durable.testing.explorer.model import Episode

    result = _replay(tmp_path, Episode.from_json(SEED_731088))
    assert result.ok, result.problems
    assert sum("raised RefusedDecision" in line for line in result.log) >= 4, result.log


SEED_850869 = (
    '{"after":null,"crashes":[{"occurrence":1,"phase":0,"point":"before_intent","then":{"'
    'pick":4,"via":"time_travel"},"tool":"charge"},{"occurrence":1,"phase":1,"point":"bef'
    'ore_intent","then":{"pick":1,"via":"checkpoint_config"},"tool":"crm"}],"flavour":"sy'
    'nc","fresh_ids":false,"history":"","leased":false,"reviewer":{"edit_unchanged":false'
    ',"malformed":true,"raw":false,"seed":1341448547},"sealed":false,"seed":850869,"seque'
    'ntial":false,"stack":"","tools":{"charge":{"approval":false,"lookup_faults":["error"'
    '],"mode":"lookup","policy":"lookup","result":"non_json","retries":1,"timeout":null},'
    '"crm":{"approval":true,"lookup_faults":["error"],"mode":"lookup","policy":"lookup","'
    'retries":0,"timeout":null},"email":{"approval":true,"errors":"validation","mode":"lo'
    'okup","policy":"blind","retries":0,"timeout":0.1},"search":{"mode":"read","policy":"'
    'read_only"},"ticket":{"approval":true,"errors":"validation","mode":"dedupe","policy"'
    ':"idempotent","retries":1,"timeout":null}},"topology":"subgraph_nested","turns":[[{"'
    'faults":[],"id":"call_2_0","item":"x20","n":0,"tool":"charge"},{"faults":[],"id":"ca'
    'll_2_2","item":"x22","n":0,"tool":"crm"}]]}')


@pytest.mark.crash
def test_a_subgraph_restarted_inside_a_restarted_subgraph_keeps_its_keys(tmp_path) -> None:
    """Seed 850869 (`subgraph_nested`): a time-travel fork ran `billing` (a subgraph)
    and, inside it, `payments` (a subgraph), which charged; a run from the thread's
    latest checkpoint (that same fork) restarted `billing` in its own namespace and
    `payments` under a new task id. Its earlier incarnation ran from the same root
    checkpoint, which was taken for the same run, so the charge took a new key and was
    sent twice. An incarnation inside an earlier run of an enclosing task is an earlier
    run now."""
    from graph_durable.testing.explorer.model import Episode

    result = _replay(tmp_path, Episode.from_json(SEED_850869))
    assert result.ok, result.problems



SEED_870232 = (
    '{"after":null,"crashes":[{"occurrence":1,"phase":0,"point":"after_receipt","then":{"'
    'pick":0,"via":"plain"},"tool":"ticket"}],"flavour":"sync","fresh_ids":false,"history'
    '":"","leased":false,"reviewer":{"edit_unchanged":false,"malformed":false,"raw":false'
    ',"seed":109662256},"sealed":false,"seed":870232,"sequential":true,"stack":"hitl_afte'
    'r_guard","tools":{"charge":{"approval":false,"errors":"raise","mode":"blind","policy'
    '":"blind","retries":0,"timeout":null},"crm":{"approval":true,"mode":"lookup","policy'
    '":"blind","retries":0,"timeout":null},"email":{"approval":true,"mode":"lookup","poli'
    'cy":"lookup","retries":0,"timeout":1.0},"search":{"mode":"read","policy":"read_only"'
    '},"ticket":{"approval":true,"mode":"dedupe","policy":"lookup","retries":1,"timeout":'
    'null}},"topology":"create_agent","turns":[[{"faults":[],"id":"call_0_0","item":"x00"'
    ',"n":0,"tool":"email"}],[{"faults":[],"id":"call_2_0","item":"x20","n":0,"tool":"ema'
    'il"},{"faults":[],"id":"call_2_2","item":"x22","n":0,"tool":"email"},{"faults":[],"i'
    'd":"call_2_3","item":"x23","n":0,"tool":"ticket"}]]}')


@pytest.mark.crash
def test_a_receipt_killed_after_under_create_agent_with_hitl_is_not_left_in_flight(
        tmp_path) -> None:
    """Seed 870232 (`create_agent`, HumanInTheLoopMiddleware put before the guard): the
    worker is SIGKILLed right after a `ticket` receipt (lookup policy) was recorded. The
    middleware's approval was saved only with the task's writes, so the resumed thread
    asks again, and the reviewer now rejects: the middleware answers for the call and
    the guard never sees it again. Its receipt was deferred to those writes and lost
    with them, leaving the applied ticket `in_flight`; a task that holds such an answer
    now commits its receipts at once, so the ledger says `applied`."""
    from graph_durable.testing.explorer.model import Episode

    result = _replay(tmp_path, Episode.from_json(SEED_870232))
    assert result.ok, result.problems


SEED_920585 = (
    '{"after":null,"crashes":[{"occurrence":1,"phase":0,"point":"after_effect","then":{"pic'
    'k":3,"via":"recover"},"tool":"email"}],"flavour":"sync","fresh_ids":false,"history":""'
    ',"leased":false,"reviewer":{"edit_unchanged":false,"malformed":true,"raw":false,"seed"'
    ':1183878571},"sealed":true,"seed":920585,"sequential":true,"stack":"tool_retry_inside"'
    ',"tools":{"charge":{"approval":false,"mode":"blind","policy":"blind","result":"receipt'
    '","retries":0,"timeout":null},"crm":{"approval":true,"mode":"lookup","policy":"lookup"'
    ',"result":"non_json","retries":0,"timeout":null},"email":{"approval":false,"mode":"ded'
    'upe","policy":"lookup","result":"receipt","retries":0,"timeout":null},"ticket":{"appro'
    'val":false,"errors":"error_message","mode":"lookup","policy":"blind","retries":0,"time'
    'out":0.1}},"topology":"create_agent","turns":[[{"faults":["permanent"],"id":"call_0_0"'
    ',"item":"x00","n":0,"tool":"email"}]]}')


@pytest.mark.crash
def test_a_run_killed_after_a_middleware_order_refusal_is_orphaned(tmp_path) -> None:
    """Seed 920585 (`create_agent`, ToolRetryMiddleware listed after the guard): the
    email raised, the middleware called it again, and the guard refused
    (MiddlewareOrderError, an `__error__` write on the tools task). Run again with the
    order fixed, as the error says, the call was looked up, re-sent under its key and the
    worker SIGKILLed after the send, before the task wrote anything. `thread_status` read
    the first run's error as `failed`, so `recover()` never resumed the thread."""
    from graph_durable.testing.explorer.model import Episode

    result = _replay(tmp_path, Episode.from_json(SEED_920585))
    assert result.ok, result.problems
    assert result.log[2] == "plain on t: SIGKILL at after_effect of email #1", result.log
    assert result.log[3] == "recover on t: next=[] pending=[]", result.log
    emails = FakeProvider(str(tmp_path / "episode" / "providers" / "email.sqlite"), "dedupe",
                          name="email")
    assert [e["operation"] for e in emails.effects()] == ["x00"]


SEED_981478 = (
    '{"after":null,"crashes":[{"occurrence":5,"phase":0,"point":"before_put","then":{"pick"'
    ':6,"via":"copy_both"},"tool":null}],"flavour":"sync","fresh_ids":false,"history":"","l'
    'eased":false,"reviewer":{"edit_unchanged":false,"malformed":false,"raw":false,"seed":9'
    '02628704},"sealed":false,"seed":981478,"sequential":true,"stack":"","tools":{"charge":'
    '{"approval":false,"lookup_faults":["error"],"mode":"lookup","policy":"lookup","retries'
    '":0,"timeout":0.1},"crm":{"approval":false,"mode":"blind","policy":"blind","retries":2'
    ',"timeout":1.0},"email":{"approval":false,"mode":"blind","policy":"blind","retries":0,'
    '"timeout":null},"ticket":{"approval":false,"mode":"blind","policy":"blind","retries":2'
    ',"timeout":null}},"topology":"guarded_node","turns":[[{"faults":[],"id":"call_1_0","it'
    'em":"x10","n":0,"tool":"email"}],[{"faults":[],"id":"call_2_0","item":"x20","n":0,"too'
    'l":"ticket"}]]}')


@pytest.mark.crash
def test_a_guarded_write_requested_before_a_copy_is_sent_once_in_the_family(tmp_path) -> None:
    """Seed 981478 (`guarded_node`, `copy_both`): the worker was killed before the
    checkpoint of the step after the model's request (the request itself saved, as the
    model task's pending write); the thread was copied, and both threads resumed. Each
    ran the tools step from a root checkpoint of its own, made after the copy, so the
    blind ticket took a different key in each and was sent twice. A tool call under
    `EffectGuardNode` is keyed by its AIMessage and is sent once in the family; now a
    step made again from the checkpoint the copy was made at, with the writes saved
    there before the copy, is anchored to that checkpoint in both threads
    (`copy_thread` records it), and the write is sent once too."""
    from graph_durable.testing.explorer.model import Episode

    result = _replay(tmp_path, Episode.from_json(SEED_981478))
    assert result.ok, result.problems


SEED_993623 = (
    '{"after":{"pick":7,"via":"time_travel"},"crashes":[{"occurrence":3,"phase":0,"point":"'
    'before_put_writes","then":{"pick":5,"via":"checkpoint_config"},"tool":null},{"occurren'
    'ce":2,"phase":0,"point":"after_put","then":{"pick":3,"via":"checkpoint_config"},"tool"'
    ':null}],"flavour":"sync","fresh_ids":false,"history":"","leased":false,"reviewer":{"ed'
    'it_unchanged":false,"malformed":false,"raw":false,"seed":1256867554},"sealed":true,"se'
    'ed":993623,"sequential":true,"stack":"","tools":{"charge":{"approval":false,"mode":"lo'
    'okup","policy":"blind","result":"receipt","retries":0,"timeout":null}},"topology":"sub'
    'graph","turns":[[{"faults":[],"id":"call_0_0","item":"x11","n":0,"tool":"charge"}]]}')


@pytest.mark.crash
def test_a_subgraph_restarted_twice_then_time_travelled_repeats_its_one_effect(tmp_path) -> None:
    """Seed 993623 (`subgraph`, sealed ledger): a worker killed twice, each time resumed
    from a named checkpoint, so the subgraph ran three times, the later runs taking the
    first run's key; then a time travel. Two earlier runs matched the restarted call,
    and the guard refused it as ambiguous, though both had asked for the same effect:
    now it replays that effect, sending nothing."""
    from graph_durable.testing.explorer.model import Episode

    result = _replay(tmp_path, Episode.from_json(SEED_993623))
    assert result.ok, result.problems


SEED_994371 = (
    '{"after":null,"crashes":[{"occurrence":3,"phase":0,"point":"before_put","then":{"pick"'
    ':0,"via":"copy_both"},"tool":null}],"flavour":"sync","fresh_ids":false,"history":"","l'
    'eased":false,"reviewer":{"edit_unchanged":false,"malformed":false,"raw":false,"seed":1'
    '237229171},"sealed":false,"seed":994371,"sequential":true,"stack":"","tools":{"crm":{"'
    'approval":false,"mode":"lookup","policy":"lookup","retries":0,"timeout":null}},"topolo'
    'gy":"guarded_node","turns":[[{"faults":[],"id":"call_0_3","item":"x04","n":0,"tool":"c'
    'rm"}]]}')


@pytest.mark.crash
def test_a_looked_up_guarded_write_requested_before_a_copy_is_applied_once_in_the_family(
        tmp_path) -> None:
    """Seed 994371 (`guarded_node`, `copy_both`, a looked-up CRM): as seed 981478, the
    worker is killed before the step's checkpoint is saved and the thread is copied;
    each thread keys the write from its own root checkpoint, and the lookup, asking
    under the copy's key, finds nothing: the write is applied in both threads."""
    from graph_durable.testing.explorer.model import Episode

    result = _replay(tmp_path, Episode.from_json(SEED_994371))
    assert result.ok, result.problems


SEED_1002043 = (
    '{"after":null,"crashes":[],"flavour":"sync","fresh_ids":false,"history":"","leased":fa'
    'lse,"reviewer":{"edit_unchanged":false,"malformed":false,"raw":true,"seed":1003685761}'
    ',"sealed":false,"seed":1002043,"sequential":true,"stack":"hitl_before_guard","tools":{'
    '"charge":{"approval":true,"errors":"raise","mode":"blind","policy":"blind","result":"a'
    'rtifact","retries":0,"timeout":null}},"topology":"create_agent","turns":[[{"faults":[]'
    ',"id":"call_0_0","item":"x00","n":0,"tool":"charge"}],[{"faults":["lost"],"id":"call_1'
    '_0","item":"x10","n":0,"tool":"charge"},{"faults":[],"id":"call_1_0","item":"x11","n":'
    '0,"tool":"charge"}]]}')


@pytest.mark.crash
def test_a_thread_refused_as_documented_may_leave_what_it_sent_unknown(tmp_path) -> None:
    """Seed 1002043 (`create_agent`, `HumanInTheLoopMiddleware` before the guard, two
    calls under one tool_call_id): the reviewer approved the first call, whose blind
    provider applied it and lost the answer (`unknown`), and edited the second, which the
    guard refused (`UnkeyableToolCall`, as documented: the edited call could be either).
    The thread stops there; the first call's outcome waits for a person once the thread's
    calls are renumbered, and the ledger says `unknown`, as it should. The explorer took
    the stopped thread for a finished one and that for a lost receipt."""
    from graph_durable.testing.explorer.checks import _check_ledger
    from graph_durable.testing.explorer.model import Episode

    result = _replay(tmp_path, Episode.from_json(SEED_1002043))
    assert result.ok, result.problems
    assert any(line.startswith("refused as documented: UnkeyableToolCall")
               for line in result.log), result.log
    # The same open key in a thread that was not refused is still a problem.
    record = type("Record", (), {"status": EffectStatus.UNKNOWN, "tool_call_id": "c",
                                 "tool": "charge", "args": {}, "decision": None})()
    held = {"k": [{"tool": "charge", "operation": "x10", "key": "k", "receipt": {}}]}
    assert _check_ledger({"t": {"k": record}}, held, True, refused=["t"]) == []
    assert _check_ledger({"t": {"k": record}}, held, True) != []
    # ... and in a copy that finished, though its source was refused.
    assert _check_ledger({"t": {"k": record}, "c": {"k": record}}, held, True,
                         refused=["t"]) != []


SEED_1002816 = (
    '{"after":null,"crashes":[{"occurrence":2,"phase":0,"point":"after_effect","then":{"pic'
    'k":0,"via":"plain"},"tool":"charge"}],"flavour":"sync","fresh_ids":false,"history":"",'
    '"leased":false,"reviewer":{"edit_unchanged":false,"malformed":false,"raw":false,"seed"'
    ':1757509255},"sealed":false,"seed":1002816,"sequential":false,"stack":"hitl_before_gua'
    'rd","tools":{"charge":{"approval":"odd","mode":"blind","policy":"blind","result":"non_'
    'json","retries":0,"timeout":null}},"topology":"create_agent","turns":[[{"faults":[],"i'
    'd":"call_1_0","item":"x10","n":0,"tool":"charge"}],[{"faults":[],"id":"call_0_1","item'
    '":"x21","n":0,"tool":"charge"},{"faults":[],"id":"call_2_3","item":"x23","n":0,"tool":'
    '"charge"}]]}')


@pytest.mark.crash
def test_a_call_rejected_after_a_crash_by_a_middleware_before_the_guard_is_an_orphan(
        tmp_path) -> None:
    """Seed 1002816 (`create_agent`, `HumanInTheLoopMiddleware` before the guard, two
    calls run in parallel): the worker was killed after one approved charge was applied;
    on resume the middleware asked about it again and the reviewer rejected it, so the
    middleware answered the model without reaching the guard. As documented, the charge
    sent is then an orphaned intent, listed to be settled (`ANSWERED_WITHOUT_GUARD`),
    not a finished thread's lost receipt. (Which call is killed depends on the order the
    two run in; the reject reaches the one asked again.)"""
    from graph_durable.testing.explorer.model import Episode

    result = _replay(tmp_path, Episode.from_json(SEED_1002816))
    assert result.ok, result.problems


SEED_1006086 = (
    '{"after":null,"crashes":[{"occurrence":7,"phase":0,"point":"before_put_writes","then":'
    '{"pick":2,"via":"recover"},"tool":null}],"flavour":"sync","fresh_ids":false,"history":'
    '"","leased":false,"reviewer":{"edit_unchanged":false,"malformed":false,"raw":false,"se'
    'ed":238172296},"sealed":false,"seed":1006086,"sequential":true,"stack":"tool_retry_ins'
    'ide","tools":{"charge":{"approval":false,"mode":"blind","policy":"blind","retries":0,"'
    'timeout":null},"email":{"approval":false,"errors":"error_message","mode":"lookup","pol'
    'icy":"blind","result":"non_json","retries":0,"timeout":null},"ticket":{"approval":"odd'
    '","mode":"lookup","policy":"lookup","retries":1,"timeout":0.1}},"topology":"create_age'
    'nt","turns":[[{"faults":[],"id":"call_0_0","item":"x00","n":0,"tool":"charge"},{"fault'
    's":[],"id":"call_0_1","item":"x01","n":0,"tool":"charge"},{"faults":[],"id":"call_0_2"'
    ',"item":"x02","n":0,"tool":"ticket"},{"faults":["permanent"],"id":"call_0_3","item":"x'
    '03","n":0,"tool":"email"},{"faults":[],"id":"call_0_4","item":"x04","n":0,"tool":"tick'
    'et"}]]}')

SEED_1006086_CANCELLED = SEED_1006086.replace(
    '"faults":[],"id":"call_0_1"', '"faults":["hang"],"id":"call_0_1"').replace(
    '"faults":["permanent"],"id":"call_0_3"', '"faults":[],"id":"call_0_3"')
"""The same, shrunk another way: the second charge hangs instead of the email failing."""


@pytest.mark.crash
@pytest.mark.parametrize("episode", [SEED_1006086, SEED_1006086_CANCELLED])
def test_an_unsafe_middleware_order_refused_in_a_recovered_run_is_fixed_and_run_again(
        tmp_path, episode) -> None:
    """Seed 1006086 (`create_agent` with `ToolRetryMiddleware` after the guard): the
    worker was killed mid-step; `recover()` resumed the thread, the retry called a tool
    a second time and the guard refused it (`MiddlewareOrderError`, as documented:
    nothing sent twice, the call left in flight), so the thread is failed and
    `recover()` leaves it to a person. Put in order and run again, it reconciles the
    call and finishes. The explorer took the failed thread for one `thread_status`
    misjudged. In the second episode a hanging tool makes the step's other tasks
    cancelled: `thread_status` names the refusal, not their `CancelledError`."""
    from graph_durable.testing.explorer.model import Episode

    result = _replay(tmp_path, Episode.from_json(episode))
    assert result.ok, result.problems
    assert any("MiddlewareOrderError, in a run recover() resumed" in line
               for line in result.log), result.log


SEED_1007335 = (
    '{"after":null,"crashes":[{"occurrence":2,"phase":0,"point":"after_put_writes","then":{'
    '"pick":3,"via":"copy_both"},"tool":null}],"flavour":"sync","fresh_ids":false,"history"'
    ':"","leased":false,"reviewer":{"edit_unchanged":false,"malformed":false,"raw":false,"s'
    'eed":487025479},"sealed":false,"seed":1007335,"sequential":true,"stack":"","tools":{"c'
    'harge":{"approval":false,"mode":"blind","policy":"blind","retries":0,"timeout":null}},'
    '"topology":"guarded_node","turns":[[{"faults":[],"id":"call_0_4","item":"x04","n":0,"t'
    'ool":"charge"}]]}')


@pytest.mark.crash
def test_a_guarded_write_whose_request_was_saved_before_a_copy_is_sent_once_in_the_family(
        tmp_path) -> None:
    """Seed 1007335 (`guarded_node`, `copy_both`, a blind charge): killed right after
    the model task's writes were saved (`after_put_writes`), before the next checkpoint;
    the thread copied and both resumed: each remade that checkpoint under its own id,
    and the charge, keyed from it, was sent in each. The class of seed 981478, met at
    another point of the same window."""
    from graph_durable.testing.explorer.model import Episode

    result = _replay(tmp_path, Episode.from_json(SEED_1007335))
    assert result.ok, result.problems


SEED_1011557 = (
    '{"after":null,"crashes":[{"occurrence":1,"phase":0,"point":"after_effect","then":{"pic'
    'k":6,"via":"copy_both"},"tool":"charge"}],"flavour":"sync","fresh_ids":false,"history"'
    ':"","leased":false,"reviewer":{"edit_unchanged":false,"malformed":false,"raw":true,"se'
    'ed":945429045},"sealed":true,"seed":1011557,"sequential":true,"stack":"hitl_after_guar'
    'd","tools":{"charge":{"approval":false,"errors":"raise","mode":"blind","policy":"blind'
    '","retries":0,"timeout":null},"email":{"approval":true,"mode":"blind","policy":"blind"'
    ',"result":"artifact","retries":0,"timeout":0.1}},"topology":"create_agent","turns":[[{'
    '"faults":["hang"],"id":"call_0_1","item":"x02","n":0,"tool":"charge"},{"faults":[],"id'
    '":"call_0_3","item":"x03","n":0,"tool":"email"},{"faults":[],"id":"call_0_4","item":"x'
    '04","n":0,"tool":"charge"}]]}')


@pytest.mark.crash
def test_a_tool_paused_on_its_own_question_then_resumed_in_a_copy_is_sent_once(
        tmp_path) -> None:
    """Seed 1011557 (`create_agent`, HITL middleware after the guard, `copy_both`): the
    email's tool paused on its own question inside the guard, the thread was copied, and
    each thread resumed the tool: the copy sent the email, then the source sent it again
    under the same key (a blind provider keeps both). A paused tool now checks the
    family before it is resumed, as an approved call does: the copy's send answers it. A
    copy still paused itself has sent nothing, so it does not hold the call back."""
    from graph_durable.testing.explorer.model import Episode

    result = _replay(tmp_path, Episode.from_json(SEED_1011557))
    assert result.ok, result.problems


SEED_1011825 = (
    '{"after":null,"crashes":[{"occurrence":3,"phase":2,"point":"after_intent","then":{"pic'
    'k":7,"via":"copy_both"},"tool":"email"}],"flavour":"sync","fresh_ids":false,"history":'
    '"","leased":false,"reviewer":{"edit_unchanged":false,"malformed":true,"raw":false,"see'
    'd":1946954029},"sealed":false,"seed":1011825,"sequential":true,"stack":"","tools":{"ch'
    'arge":{"approval":true,"errors":"error_message","mode":"lookup","policy":"blind","retr'
    'ies":2,"timeout":null},"email":{"approval":"odd","errors":"error_message","mode":"dedu'
    'pe","policy":"idempotent","result":"non_json","retries":2,"timeout":0.1}},"topology":"'
    'flat","turns":[[{"faults":[],"id":"call_0_2","item":"x02","n":0,"tool":"charge"},{"fau'
    'lts":["hang"],"id":"call_0_3","item":"x03","n":0,"tool":"email"}],[{"faults":[],"id":"'
    'call_1_0","item":"x10","n":0,"tool":"email"}],[{"faults":["lost"],"id":"call_2_0","ite'
    'm":"x20","n":0,"tool":"email"},{"faults":["lost"],"id":"call_2_0","item":"x21","n":0,"'
    'tool":"email"}]]}')


@pytest.mark.crash
def test_a_call_edited_in_a_copy_then_retried_in_its_source_is_sent_once(tmp_path) -> None:
    """Seed 1011825 (`copy_both`, an idempotent email needing approval): a reviewer edited
    the call in the copy, whose edited email was sent with its answer lost and then
    skipped; in the source, the same question was answered, the family's doubt put to a
    human, and a retry sent the call as first asked, under its own key: a second email.
    Now the source takes the copy's edit over (the edited call, under its key, is this
    call), so the retry re-sends that call under its key and the provider dedupes it."""
    from graph_durable.testing.explorer.model import Episode

    result = _replay(tmp_path, Episode.from_json(SEED_1011825))
    assert result.ok, result.problems


SEED_1015818 = (
    '{"after":null,"crashes":[{"occurrence":1,"phase":0,"point":"after_intent","then":{"pic'
    'k":5,"via":"recover"},"tool":"email"}],"flavour":"async","fresh_ids":false,"history":"'
    '","leased":false,"reviewer":{"edit_unchanged":true,"malformed":false,"raw":false,"seed'
    '":1915635314},"sealed":false,"seed":1015818,"sequential":true,"stack":"tool_retry_insi'
    'de","tools":{"charge":{"approval":false,"mode":"blind","policy":"blind","retries":0,"t'
    'imeout":0.1},"email":{"approval":false,"errors":"tool_exception","lookup_faults":["err'
    'or","bool"],"mode":"lookup","policy":"lookup","retries":1,"timeout":0.1},"ticket":{"ap'
    'proval":false,"mode":"dedupe","policy":"blind","result":"artifact","retries":1,"timeou'
    't":null}},"topology":"create_agent","turns":[[{"faults":["transient"],"id":"call_0_0",'
    '"item":"x10","n":0,"tool":"ticket"},{"faults":[],"id":"call_1_4","item":"x14","n":0,"t'
    'ool":"email"}]]}')


@pytest.mark.crash
def test_tasks_cancelled_by_a_refusal_a_later_run_took_up_leave_the_thread_orphaned(
        tmp_path) -> None:
    """Seed 1015818 (async `create_agent`, `ToolRetryMiddleware` after the guard): the
    guard refused the retry's second call (`MiddlewareOrderError`) and LangGraph cancelled
    the step's other task; the order put right, a run took the calls up and was killed
    mid-effect. The refusal was stale (seed 1006086), but the cancelled task's
    `CancelledError` still made `thread_status` say `failed`, so `recover()` passed the
    thread by. Those cancellations are stale with the refusal that caused them."""
    from graph_durable.testing.explorer.model import Episode

    result = _replay(tmp_path, Episode.from_json(SEED_1015818))
    assert result.ok, result.problems


SEEDS_OF_CLASS_981478 = {
    1013932: (
        '{"after":null,"crashes":[{"occurrence":3,"phase":0,"point":"before_put","then":{"pic'
        'k":0,"via":"copy_both"},"tool":null}],"flavour":"sync","fresh_ids":false,"history":"'
        '","leased":false,"reviewer":{"edit_unchanged":false,"malformed":false,"raw":false,"s'
        'eed":1342752060},"sealed":false,"seed":1013932,"sequential":true,"stack":"","tools":'
        '{"ticket":{"approval":false,"lookup_faults":null,"mode":"lookup","policy":"lookup","'
        'retries":0,"timeout":null}},"topology":"guarded_node","turns":[[{"faults":[],"id":"c'
        'all_0_0","item":"x00","n":0,"tool":"ticket"}]]}'),
    1016193: (
        '{"after":null,"crashes":[{"occurrence":4,"phase":0,"point":"after_put_writes","then"'
        ':{"pick":0,"via":"copy_both"},"tool":null}],"flavour":"sync","fresh_ids":false,"hist'
        'ory":"","leased":false,"reviewer":{"edit_unchanged":false,"malformed":false,"raw":fa'
        'lse,"seed":181779338},"sealed":false,"seed":1016193,"sequential":true,"stack":"","to'
        'ols":{"charge":{"approval":false,"mode":"dedupe","policy":"idempotent","retries":0,"'
        'timeout":null},"email":{"approval":false,"mode":"lookup","policy":"lookup","retries"'
        ':0,"timeout":null}},"topology":"guarded_node","turns":[[{"faults":[],"id":"call_0_1"'
        ',"item":"x01","n":0,"tool":"email"}],[{"faults":[],"id":"call_1_0","item":"x10","n":'
        '0,"tool":"email"}]]}'),
    1017400: (
        '{"after":null,"crashes":[{"occurrence":2,"phase":0,"point":"after_put_writes","then"'
        ':{"pick":3,"via":"copy_both"},"tool":null}],"flavour":"sync","fresh_ids":false,"hist'
        'ory":"","leased":false,"reviewer":{"edit_unchanged":false,"malformed":false,"raw":fa'
        'lse,"seed":1733946410},"sealed":false,"seed":1017400,"sequential":true,"stack":"","t'
        'ools":{"ticket":{"approval":false,"mode":"blind","policy":"blind","retries":0,"timeo'
        'ut":null}},"topology":"guarded_node","turns":[[{"faults":[],"id":"call_0_3","item":"'
        'x03","n":0,"tool":"ticket"}]]}'),
    1017764: (
        '{"after":null,"crashes":[{"occurrence":3,"phase":0,"point":"before_put","then":{"pic'
        'k":3,"via":"copy_both"},"tool":null}],"flavour":"sync","fresh_ids":false,"history":"'
        '","leased":false,"reviewer":{"edit_unchanged":true,"malformed":false,"raw":false,"se'
        'ed":1443617056},"sealed":true,"seed":1017764,"sequential":true,"stack":"","tools":{"'
        'charge":{"approval":false,"mode":"dedupe","policy":"idempotent","retries":0,"timeout'
        '":null}},"topology":"guarded_node","turns":[[{"faults":[],"id":"call_0_2","item":"x0'
        '2","n":0,"tool":"charge"}]]}'),
}
"""Later seeds the explorer met in the class of seed 981478 (`guarded_node`, `copy_both`,
killed between a step's saved writes and its next checkpoint), each shrunk."""


@pytest.mark.crash
@pytest.mark.parametrize("seed", sorted(SEEDS_OF_CLASS_981478))
def test_later_seeds_of_the_class_of_981478_send_once_in_the_family(tmp_path, seed) -> None:
    """Seeds 1013932 (killed `before_put`, a looked-up ticket), 1016193, 1017400 and
    1017764 (`after_put_writes` and `before_put`, blind and deduped providers): a
    guarded write requested before a copy, sent once per thread before copy points
    were recorded; now once in the family."""
    from graph_durable.testing.explorer.model import Episode

    result = _replay(tmp_path, Episode.from_json(SEEDS_OF_CLASS_981478[seed]))
    assert result.ok, result.problems


SEED_1023294 = (
    '{"after":{"pick":6,"via":"time_travel"},"crashes":[{"occurrence":6,"phase":0,"point":"'
    'after_put","then":{"pick":5,"via":"time_travel"},"tool":null},{"occurrence":5,"phase":'
    '0,"point":"before_put_writes","then":{"pick":6,"via":"checkpoint_config"},"tool":null}'
    '],"flavour":"sync","fresh_ids":false,"history":"","leased":false,"reviewer":{"edit_unc'
    'hanged":false,"malformed":false,"raw":false,"seed":1816502958},"sealed":false,"seed":1'
    '023294,"sequential":true,"stack":"","tools":{"audit":{"approval":false,"mode":"blind",'
    '"policy":"blind","retries":0,"timeout":null},"charge":{"approval":false,"errors":"rais'
    'e","mode":"blind","policy":"blind","result":"command","retries":0,"timeout":null},"crm'
    '":{"approval":false,"errors":"error_message","mode":"lookup","policy":"lookup","result'
    '":"command","retries":1,"timeout":0.1},"email":{"approval":false,"mode":"dedupe","poli'
    'cy":"idempotent","result":"artifact","retries":2,"timeout":0.1},"search":{"mode":"read'
    '","policy":"read_only"},"ticket":{"approval":false,"mode":"blind","policy":"blind","re'
    'sult":"artifact","retries":0,"timeout":null}},"topology":"subgraph","turns":[[{"faults'
    '":[],"id":"call_1_0","item":"x11","n":0,"tool":"charge"}]]}')


@pytest.mark.crash
def test_a_follow_up_write_after_two_time_travels_in_a_subgraph_is_applied_once(
        tmp_path) -> None:
    """Seed 1023294 (`subgraph`, a blind charge answering with a `Command` whose `goto`
    leads to a follow-up write): killed `after_put` and resumed by time travel, killed
    again `before_put_writes` and resumed from a named checkpoint, then time-travelled
    once more: the follow-up write `x11a` was applied twice, requested by one checkpointed
    model message. The first time travel's subgraph task ran twice in its namespace (the
    crash, then the resume from a named checkpoint); its second run took the first run's
    key under a new follow-up message, and the second time travel read only that second
    run's messages, so found no key to repeat. Every run of an earlier incarnation is now
    read to its own end."""
    from graph_durable.testing.explorer.model import Episode

    result = _replay(tmp_path, Episode.from_json(SEED_1023294))
    assert result.ok, result.problems


SEED_1027687 = (
    '{"after":null,"backend":"postgres","crashes":[],"flavour":"async","fresh_ids":false,'
    '"history":"","leased":false,"reviewer":{"edit_unchanged":false,"malformed":false,'
    '"raw":true,"seed":1523018252},"sealed":false,"seed":1027687,"sequential":false,'
    '"stack":"hitl_after_guard","tools":{"charge":{"approval":false,"mode":"lookup",'
    '"policy":"lookup","result":"receipt","retries":0,"timeout":null},"crm":{"approval":'
    'true,"errors":"raise","mode":"blind","policy":"blind","retries":0,"timeout":null},'
    '"email":{"approval":false,"mode":"dedupe","policy":"blind","retries":0,"timeout":null},'
    '"ticket":{"approval":false,"errors":"error_message","mode":"blind","policy":"blind",'
    '"result":"non_json","retries":0,"timeout":null}},"topology":"create_agent","turns":'
    '[[{"faults":[],"id":"call_1_2","item":"x12","n":0,"tool":"crm"},{"faults":["lost"],'
    '"id":"call_1_2","item":"x13","n":0,"tool":"charge"}]]}')


@pytest.mark.crash
def test_a_cancelled_tool_task_leaves_the_async_postgres_connection_open(tmp_path) -> None:
    """Seed 1027687 (the first explorer run on PostgreSQL; `create_agent`, parallel calls,
    `AsyncDurablePostgresSaver` on one connection): one call's task failed (a middleware
    order the guard refuses), and LangGraph cancelled the step's other task twice while
    its guard waited for the ledger. Interrupted twice, psycopg closed the connection
    under the statement, and every later read of the process failed ("the connection is
    closed"). The guard's statements are shielded from the cancellation now."""
    from graph_durable.testing.explorer.model import Episode

    for _ in range(3):  # it failed on every run before
        result = _replay(tmp_path / str(_), Episode.from_json(SEED_1027687))
        assert result.ok, result.problems
