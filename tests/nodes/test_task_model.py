"""The guard's pure pieces, without a graph: the task read from a config (saver,
durability, the checkpoint that requested the call, the fence) and the interrupts."""

import sqlite3
import time

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import GraphInterrupt

from graph_durable import DurabilityError, DurableSqliteSaver, LeaseLost
from graph_durable._langgraph import (
    CONFIG_KEY_CHECKPOINT_MAP,
    CONFIG_KEY_CHECKPOINTER,
    CONFIG_KEY_DURABILITY,
    CONFIG_KEY_RESUME_MAP,
    CONFIG_KEY_SCRATCHPAD,
)
from graph_durable.errors import NotDurableCheckpointer
from graph_durable.ledger import EffectRecord, EffectStatus
from graph_durable.nodes.interrupts import (
    interrupt_id_for,
    pending_placeholder,
    raise_interrupts,
    withdrawal,
)
from graph_durable.nodes.protocol import Ask
from graph_durable.nodes.task import Task, refused_by_fence, task_with_resume
from tests.fakes import Scratchpad

CALL = {"id": "call-1", "name": "charge"}


@pytest.fixture
def saver(tmp_path):
    return DurableSqliteSaver(sqlite3.connect(tmp_path / "t.sqlite", check_same_thread=False))


def config(saver, ns="tools:task-1", durability="sync", **extra):
    return {"configurable": {"thread_id": "t1", "checkpoint_ns": ns,
                             CONFIG_KEY_CHECKPOINTER: saver, CONFIG_KEY_DURABILITY: durability,
                             **extra}}


def record(key="k1", ns="tools:task-1", status=EffectStatus.AWAITING_APPROVAL, asked=True):
    return EffectRecord(key=key, thread_id="t1", checkpoint_ns=ns, tool_call_id="call-1",
                        tool="charge", args={"cents": 5}, status=status, asked=asked,
                        created_at=0.0, updated_at=0.0)


def test_the_task_reads_thread_namespace_and_saver_from_its_config(saver) -> None:
    task = Task(config(saver), CALL)
    assert (task.thread_id, task.checkpoint_ns, task.saver) == ("t1", "tools:task-1", saver)


def test_a_checkpointer_without_a_ledger_is_refused_naming_the_call() -> None:
    with pytest.raises(NotDurableCheckpointer, match="call-1.*InMemorySaver") as refused:
        Task(config(InMemorySaver()), CALL)
    assert (refused.value.thread_id, refused.value.tool_call_id) == ("t1", "call-1")


@pytest.mark.parametrize("durability, why", [("async", 'durability="async"'),
                                             (None, "no durability given")])
def test_a_run_not_durably_checkpointed_is_refused(saver, durability, why) -> None:
    with pytest.raises(DurabilityError, match=why):
        Task(config(saver, durability=durability), CALL)


def test_the_requesting_checkpoint_is_the_parent_namespace_s(saver) -> None:
    nested = Task(config(saver, ns="sub:1|tools:2",
                         **{CONFIG_KEY_CHECKPOINT_MAP: {"": "root", "sub:1": "c-sub"}}), CALL)
    assert nested.requesting_checkpoint() == ("t1", "sub:1", "c-sub")
    assert nested.pending_at() == {"configurable": {
        "thread_id": "t1", "checkpoint_ns": "sub:1", "checkpoint_id": "c-sub"}}
    assert nested.resume_at() == ("", "root")
    unknown = Task(config(saver), CALL)
    assert (unknown.requesting_checkpoint(), unknown.pending_at(), unknown.resume_at()) == (
        None, None, None)


def test_a_task_is_offered_a_resume_only_with_a_value_and_a_ledger(saver) -> None:
    assert task_with_resume(config(saver)) is None
    assert task_with_resume(config(saver, **{CONFIG_KEY_SCRATCHPAD: Scratchpad()})) is None
    offered = {CONFIG_KEY_SCRATCHPAD: Scratchpad(), CONFIG_KEY_RESUME_MAP: {"x": 1}}
    assert task_with_resume(config(InMemorySaver(), **offered)) is None
    task = task_with_resume(config(saver, **offered))
    assert task is not None and task.saver is saver
    bare = task_with_resume(config(saver, **{CONFIG_KEY_SCRATCHPAD: Scratchpad({"a": 1})}))
    assert bare is not None


def test_a_task_holds_answers_only_when_an_interrupt_of_it_was_answered(saver) -> None:
    """An answer to an `interrupt()` of the task (a HumanInTheLoopMiddleware before the
    guard) is saved only with the task's writes: its calls commit their receipts at once
    (seed 870232). A bare value offered to the guard's own question is not one."""
    assert not Task(config(saver), CALL).holds_answers()
    assert not Task(config(saver, **{CONFIG_KEY_SCRATCHPAD: Scratchpad({"a": 1})}),
                    CALL).holds_answers()
    answered = Scratchpad()
    answered.resume.append({"type": "approve"})
    assert Task(config(saver, **{CONFIG_KEY_SCRATCHPAD: answered}), CALL).holds_answers()


def test_the_fence_refuses_a_run_without_a_lease_while_another_holds_one(saver) -> None:
    task = Task(config(saver), CALL)
    refused_by_fence(task, {})
    refused_by_fence(task, {"other-thread": ("worker-b", 3, time.time() + 60)})
    with pytest.raises(LeaseLost, match="t1"):
        refused_by_fence(task, {"t1": ("worker-b", 3, saver.clock() + 60)})


def test_interrupt_ids_are_per_call_and_shaped_like_langgraph_s() -> None:
    one = interrupt_id_for("tools:task-1", "k1")
    assert len(one) == 32 and int(one, 16) >= 0
    assert one == interrupt_id_for("tools:task-1", "k1")
    assert len({one, interrupt_id_for("tools:task-1", "k2"),
                interrupt_id_for("tools:task-2", "k1")}) == 3


def test_one_interrupt_carries_every_question_of_the_task() -> None:
    asks = [(Ask(record("k1"), {"key": "k1"}), "id-1"), (Ask(record("k2"), {"key": "k2"}), "id-2")]
    raise_interrupts([])
    with pytest.raises(GraphInterrupt) as raised:
        raise_interrupts(asks)
    assert [(i.id, i.value) for i in raised.value.args[0]] == [
        ("id-1", {"key": "k1"}), ("id-2", {"key": "k2"})]
    placeholder = pending_placeholder(asks[0][0])
    assert (placeholder.tool_call_id, placeholder.status) == ("call-1", "error")


def test_a_withdrawal_unasks_each_question_keeping_its_status() -> None:
    assert withdrawal([]) is None
    batch = withdrawal([(Ask(record("k1"), {}), "id-1"), (Ask(record("k2"), {}), "id-2")])
    assert batch.thread_id == "t1"
    assert [(w.key, w.to, w.kind, w.asked) for w in batch.writes] == [
        ("k1", EffectStatus.AWAITING_APPROVAL, "withdrawn", False),
        ("k2", EffectStatus.AWAITING_APPROVAL, "withdrawn", False)]
