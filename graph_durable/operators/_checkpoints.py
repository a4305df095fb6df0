"""What the operators' views read in a thread's checkpoints, through the saver's own reads.

`thread_status`, the inbox and the orphan finder classify threads from the database
alone (no graph): the latest checkpoint of a namespace, the steps it would run next, the
tasks that already wrote their results, and the interrupts still open (those
`get_state()` shows, and a functional-API task's that its caller never saved).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from graph_durable._langgraph import ERROR, INTERRUPT, RESUME, TASKS

__all__ = ["SENT_TASKS", "asked_interrupts", "finished_tasks", "latest", "next_nodes",
           "open_interrupts", "questions", "written_at"]

START = "__start__"
SENT_TASKS = "(sent tasks)"
"""Stands for the tasks a `Send` scheduled, in `next_nodes`."""


def latest(saver: Any, thread_id: str, checkpoint_ns: str = "") -> Any:
    """The latest checkpoint tuple of `thread_id` in `checkpoint_ns`, or `None`."""
    return saver.get_tuple({"configurable": {"thread_id": str(thread_id),
                                             "checkpoint_ns": checkpoint_ns}})


def next_nodes(channel_values: dict[str, Any]) -> tuple[str, ...]:
    """The nodes a checkpoint would run next (`SENT_TASKS` for tasks a `Send` scheduled)."""
    nodes = [name.removeprefix("branch:to:") for name in channel_values
             if name.startswith("branch:to:")]
    if START in channel_values:
        nodes.append(START)  # the input checkpoint: killed before the first step
    if channel_values.get(TASKS):
        nodes.append(SENT_TASKS)
    return tuple(sorted(nodes))


def finished_tasks(checkpoint: Any) -> set[str]:
    """Tasks of a checkpoint that wrote their results (an interrupt of theirs is answered)."""
    return {w[0] for w in checkpoint.pending_writes if w[1] not in (INTERRUPT, RESUME, ERROR)}


def open_interrupts(checkpoint: Any) -> list[Any]:
    """The interrupts a checkpoint tuple holds that no task has answered since, each once
    (a functional-API `@task`'s question is saved by the task and again by its caller)."""
    shown, _ = asked_interrupts(checkpoint, set())
    return shown


def asked_interrupts(checkpoint: Any, called: set[str]) -> tuple[list[Any], list[Any]]:
    """The open interrupts of a checkpoint tuple that `get_state()` shows, and those it
    does not, each once.

    `called` are the tasks another task called (`saver.called_tasks`: functional-API
    `@task`s). LangGraph shows the questions of the checkpoint's own tasks; a called
    task's question only through its caller, which saves it again when the interrupt
    reaches it. One a called task saved and its caller did not (its worker stopped
    between the two writes) is not shown: resuming the thread asks it again. A question
    a task that has since finished asked was answered, whoever saved it too.
    """
    finished = finished_tasks(checkpoint)
    answered = {_id(i) for task_id, channel, value in checkpoint.pending_writes
                if channel == INTERRUPT and task_id in finished for i in _each(value)}
    shown: dict[Any, Any] = {}
    hidden: dict[Any, Any] = {}
    for task_id, channel, value in checkpoint.pending_writes:
        if channel != INTERRUPT or task_id in finished:
            continue
        for interrupt in _each(value):
            if _id(interrupt) not in answered:
                (hidden if task_id in called else shown).setdefault(_id(interrupt), interrupt)
    return list(shown.values()), [i for key, i in hidden.items() if key not in shown]


def questions(saver: Any, checkpoint: Any) -> tuple[list[Any], list[Any]]:
    """`asked_interrupts` of a checkpoint tuple, with the tasks it calls `called` read from
    `saver` (only when a task of it saved a question)."""
    if not any(w[1] == INTERRUPT for w in checkpoint.pending_writes):
        return [], []
    conf = checkpoint.config["configurable"]
    return asked_interrupts(checkpoint, saver.called_tasks(
        conf["thread_id"], conf.get("checkpoint_ns", ""), conf["checkpoint_id"]))


def _each(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _id(interrupt: Any) -> Any:
    """An interrupt's id, which its caller's write repeats (one without: itself)."""
    return getattr(interrupt, "id", None) or id(interrupt)


def written_at(checkpoint: Any) -> float:
    """When a checkpoint was written (Unix time, from its `ts`)."""
    return datetime.fromisoformat(checkpoint.checkpoint["ts"]).timestamp()
