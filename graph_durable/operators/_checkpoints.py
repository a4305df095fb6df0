"""What the operators' views read in a thread's checkpoints, through the saver's own reads.

`thread_status`, the inbox and the orphan finder classify threads from the database
alone (no graph): the latest checkpoint of a namespace, the steps it would run next, the
tasks that already wrote their results, and the interrupts still open.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from graph_durable._langgraph import ERROR, INTERRUPT, RESUME, TASKS

__all__ = ["SENT_TASKS", "finished_tasks", "latest", "next_nodes", "open_interrupts",
           "written_at"]

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
    """The interrupts a checkpoint tuple holds that no task has answered since."""
    finished = finished_tasks(checkpoint)
    found: list[Any] = []
    for task_id, channel, value in checkpoint.pending_writes:
        if channel == INTERRUPT and task_id not in finished:
            found.extend(value if isinstance(value, list | tuple) else [value])
    return found


def written_at(checkpoint: Any) -> float:
    """When a checkpoint was written (Unix time, from its `ts`)."""
    return datetime.fromisoformat(checkpoint.checkpoint["ts"]).timestamp()
