"""Matching a resume value to a task's questions, without a graph: the generator that
reads the ledger is driven by hand, answering each `Read` it yields."""

import sqlite3

import pytest

from graph_durable import DurableSqliteSaver, Effect, InvalidDecision
from graph_durable._langgraph import (
    CONFIG_KEY_CHECKPOINTER,
    CONFIG_KEY_DURABILITY,
    CONFIG_KEY_RESUME_MAP,
    CONFIG_KEY_SCRATCHPAD,
)
from graph_durable.ledger import EffectRecord, EffectStatus
from graph_durable.nodes.answers import peek_resume, read_decisions, stale_ids
from graph_durable.nodes.interrupts import interrupt_id_for
from graph_durable.nodes.protocol import Read
from graph_durable.nodes.task import Task
from tests.fakes import Scratchpad

NS = "tools:task-1"
APPROVE = {"type": "approve"}


def record(key, ns=NS, asked=True, call="call-1"):
    return EffectRecord(key=key, thread_id="t1", checkpoint_ns=ns, tool_call_id=call,
                        tool="charge", args={"cents": 5}, status=EffectStatus.AWAITING_APPROVAL,
                        asked=asked, created_at=0.0, updated_at=0.0)


@pytest.fixture
def saver(tmp_path):
    return DurableSqliteSaver(sqlite3.connect(tmp_path / "a.sqlite", check_same_thread=False))


def task(saver, resume_map=None, bare=None):
    return Task({"configurable": {
        "thread_id": "t1", "checkpoint_ns": NS, CONFIG_KEY_CHECKPOINTER: saver,
        CONFIG_KEY_DURABILITY: "sync", CONFIG_KEY_SCRATCHPAD: Scratchpad(bare),
        CONFIG_KEY_RESUME_MAP: resume_map or {}}}, {})


def drive(reads, answers):
    """Run the generator, answering each read from `answers` by name; the reads made
    and what the generator returned."""
    made, value = [], None
    while True:
        try:
            op = reads.send(value)
        except StopIteration as done:
            return made, done.value
        assert isinstance(op, Read), op
        made.append(op.name)
        value = answers[op.name]


def test_answers_are_read_by_interrupt_id_then_bare(saver) -> None:
    k1, k2 = record("k1"), record("k2", call="call-2")
    by_id = {interrupt_id_for(NS, "k2"): APPROVE, "someone-else": {"type": "reject"}}
    assert peek_resume(task(saver, by_id).conf, [k1, k2]) == {"k2": APPROVE}
    assert peek_resume(task(saver, bare=APPROVE).conf, [k1]) == APPROVE
    assert peek_resume(task(saver).conf, [k1]) is None


def test_ids_naming_no_question_of_the_task_are_stale(saver) -> None:
    mine = interrupt_id_for(NS, "k1")
    assert stale_ids(task(saver, {mine: APPROVE, "other": APPROVE}), [record("k1")]) == {
        "other"}
    assert stale_ids(task(saver), [record("k1")]) == set()


def test_a_decision_for_an_asked_call_becomes_its_journal_entry(saver) -> None:
    asked = [record("k1"), record("k2", call="call-2")]
    reads, batch = drive(
        read_decisions(task(saver, {interrupt_id_for(NS, "k1"): APPROVE}), None,
                       lambda tool: Effect()),
        {"asked_in_task": asked, "events": []})
    assert reads == ["asked_in_task", "events"]  # the journal of the call answered
    assert [(w.key, w.kind, w.asked, w.decision["type"]) for w in batch.writes] == [
        ("k1", "decision", False, "approve")]
    assert batch.resume_value == {"k1": APPROVE}


def test_no_resume_value_records_nothing(saver) -> None:
    reads, batch = drive(read_decisions(task(saver), None, lambda tool: Effect()),
                         {"asked_in_task": [record("k1")]})
    assert (reads, batch) == (["asked_in_task"], None)


def test_an_invalid_answer_to_another_task_s_question_refuses_the_set(saver) -> None:
    theirs = record("k9", ns="tools:task-2", call="call-9")
    resume = {interrupt_id_for(NS, "k1"): APPROVE,
              interrupt_id_for("tools:task-2", "k9"): {"type": "launch"}}
    with pytest.raises(InvalidDecision, match="call-9"):
        drive(read_decisions(task(saver, resume), None, lambda tool: Effect()),
              {"asked_in_task": [record("k1")], "effects": [record("k1"), theirs],
               "events": []})


def test_an_answer_to_a_question_no_longer_asked_is_refused(saver) -> None:
    settled = record("k1", asked=False)
    with pytest.raises(InvalidDecision, match="no longer pending"):
        drive(read_decisions(task(saver, {interrupt_id_for(NS, "k1"): APPROVE}), None,
                             lambda tool: Effect()),
              {"asked_in_task": [], "effects": [settled], "events": []})
