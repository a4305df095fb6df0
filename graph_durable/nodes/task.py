"""The task a guarded call runs in, read from its config: thread, namespace, durable
saver, the checkpoint that requested the call, and the lease and fence checks (pure:
reading a config, no I/O; the drivers perform the reads these checks need)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langgraph.prebuilt.tool_node import ToolCallRequest

from graph_durable._langgraph import (
    CONFIG_KEY_CHECKPOINT_MAP,
    CONFIG_KEY_CHECKPOINTER,
    CONFIG_KEY_DURABILITY,
    CONFIG_KEY_RESUME_MAP,
    CONFIG_KEY_SCRATCHPAD,
)
from graph_durable.checkpointers._base import actor_of, durable_saver
from graph_durable.errors import DurabilityError, NotDurableCheckpointer
from graph_durable.leases import active_lease, check_fence

__all__ = ["Task", "check_lease", "config_of", "refused_by_fence", "task_with_resume"]


def _offered_resume(conf: Mapping[str, Any]) -> bool:
    """Whether this run offers any resume value at all (bare, or a map)."""
    scratchpad = conf.get(CONFIG_KEY_SCRATCHPAD)
    if scratchpad is None:
        return False
    return scratchpad.get_null_resume(False) is not None or bool(conf.get(CONFIG_KEY_RESUME_MAP))



def config_of(request: ToolCallRequest) -> Mapping[str, Any]:
    return getattr(request.runtime, "config", None) or {}



class Task:
    """Where one guarded tool call runs: thread, task namespace, saver, config."""

    def __init__(self, config: Mapping[str, Any], call: Mapping[str, Any]) -> None:
        self.config = config
        self.call = call
        self.conf: Mapping[str, Any] = config.get("configurable", {})
        self.thread_id = str(self.conf.get("thread_id", ""))
        self.checkpoint_ns = str(self.conf.get("checkpoint_ns", ""))
        wrapped = self.conf.get(CONFIG_KEY_CHECKPOINTER)
        saver = durable_saver(wrapped)
        if saver is None:
            raise NotDurableCheckpointer(
                f"Tool call {call.get('id')!r} ({call.get('name')}) in thread "
                f"{self.thread_id or '<none>'!r}: the graph was compiled with "
                f"{type(wrapped).__name__ if wrapped is not None else 'no checkpointer'}, which "
                "keeps no effect ledger. Compile it with a durable saver, e.g. "
                "builder.compile(checkpointer=DurableSqliteSaver(conn)).",
                thread_id=self.thread_id or None,
                tool_call_id=call.get("id"),
            )
        self.saver = saver
        durability = self.conf.get(CONFIG_KEY_DURABILITY)
        if durability != "sync":
            why = (f'durability="{durability}"' if durability else
                   'no durability given, and LangGraph defaults to "async"')
            raise self.not_durable(call, why)

    def for_call(self, call: Mapping[str, Any]) -> Task:
        """The task of another call of the same step: the same config, already checked."""
        other = object.__new__(Task)
        other.__dict__.update(self.__dict__)
        other.call = call
        return other

    def not_durable(self, call: Mapping[str, Any], why: str) -> DurabilityError:
        return DurabilityError(
            f"Tool call {call.get('id')!r} ({call.get('name')}) in thread {self.thread_id!r} "
            f"was not sent: the step that requested it is not durably checkpointed ({why}). "
            "A crash now could make the model ask again under new tool_call_ids and repeat "
            'the effect. Run the graph with durability="sync", e.g. '
            'graph.invoke(inputs, config, durability="sync").',
            thread_id=self.thread_id,
            tool_call_id=call.get("id"),
        )

    def requesting_checkpoint(self) -> tuple[str, str, str] | None:
        """`(thread_id, checkpoint_ns, checkpoint_id)` of the checkpoint the task runs from."""
        parent_ns = self.checkpoint_ns.rpartition("|")[0]
        checkpoint_id = self.conf.get(CONFIG_KEY_CHECKPOINT_MAP, {}).get(parent_ns)
        if checkpoint_id is None:
            return None
        return self.thread_id, parent_ns, checkpoint_id

    def pending_at(self) -> dict[str, Any] | None:
        """The config of the checkpoint whose pending writes hold this task's."""
        where = self.requesting_checkpoint()
        if where is None:
            return None
        thread_id, checkpoint_ns, checkpoint_id = where
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns,
                                 "checkpoint_id": checkpoint_id}}

    def holds_answers(self) -> bool:
        """Whether an `interrupt()` of this task has an answer in this run.

        The guard asks through the ledger, never through `interrupt()`: such an answer
        is another party's (a `HumanInTheLoopMiddleware` listed before the guard, or
        the tool's own question), and LangGraph saves it only with the task's writes.
        After a crash the question is asked again, and its middleware may then answer
        for the call without calling the guard (a rejection), so the guard never sees
        the call again to reconcile it."""
        scratchpad = self.conf.get(CONFIG_KEY_SCRATCHPAD)
        return bool(getattr(scratchpad, "resume", None))

    def resume_at(self) -> tuple[str, str] | None:
        """Where the graph-level resume value of this run is stored."""
        checkpoint_id = self.conf.get(CONFIG_KEY_CHECKPOINT_MAP, {}).get("")
        return None if checkpoint_id is None else ("", checkpoint_id)



def task_with_resume(config: Mapping[str, Any]) -> Task | None:
    """The task, if a resume value is offered to it and its graph keeps a ledger.

    A resume value meant for another node of a graph without a durable saver is none of
    the guard's business: only a durable saver can hold the questions it answers.
    """
    conf = config.get("configurable", {})
    if not _offered_resume(conf):
        return None
    if durable_saver(conf.get(CONFIG_KEY_CHECKPOINTER)) is None:
        return None
    return Task(config, {})



def refused_by_fence(task: Task, leases: Mapping[str, tuple[str, int, float]]) -> None:
    """Raise `LeaseLost` when the fence refuses this run's writes to the thread.

    The fork checkpoint a run from a checkpoint id saves in the background is then
    refused, so waiting for it would only end in a misleading `DurabilityError`.
    """
    row = leases.get(task.thread_id)
    if row is not None:
        check_fence(row, task.thread_id, actor_of(task.config)[1], task.saver.clock())


def check_lease(task: Task) -> None:
    """Send nothing once this process knows its lease on the thread is gone."""
    lease = active_lease(task.config)
    if lease is not None:
        lease.check()
