"""Thread status, and `recover()`: resume the threads whose worker died.

    for outcome in recover(graph, saver, owner="worker-7"):
        print(outcome.thread_id, outcome.outcome, outcome.status)

A thread is *orphaned* when it has steps to run, no pending interrupt and no live
lease: its worker crashed. `recover` takes a lease on each orphaned thread before
resuming it and checks again once it holds the lease, so any number of processes can
sweep the same database at once and each thread is resumed by exactly one of them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Literal

from graph_durable._langgraph import ERROR, INTERRUPT, RESUME, TASKS
from graph_durable.errors import GraphDurableError, LeaseHeld
from graph_durable.ledger import EffectStatus, answered

__all__ = ["RecoveryOutcome", "ThreadStatus", "recover", "thread_status"]

Status = Literal["running", "waiting", "needs_human", "done", "failed", "orphaned",
                 "cancelled"]

START = "__start__"


@dataclass(frozen=True)
class ThreadStatus:
    """Where a thread stands, and why."""

    thread_id: str
    status: Status
    """`running`, `waiting`, `needs_human`, `done`, `failed`, `orphaned` or `cancelled`
    (stopped for good by `cancel()`)."""
    reason: str
    """One sentence a person can act on."""
    next: tuple[str, ...] = ()
    """Nodes the thread would run next."""
    pending: tuple[str, ...] = field(default=())
    """tool_call_ids a human is asked about."""


def _next_nodes(channel_values: dict[str, Any]) -> tuple[str, ...]:
    nodes = [name.removeprefix("branch:to:") for name in channel_values
             if name.startswith("branch:to:")]
    if START in channel_values:
        nodes.append(START)  # the input checkpoint: killed before the first step
    if channel_values.get(TASKS):
        nodes.append("(sent tasks)")
    return tuple(sorted(nodes))


def thread_status(saver: Any, thread_id: str, *, ignore_owner: str | None = None
                  ) -> ThreadStatus:
    """Classify a thread from its latest checkpoint, its ledger and its lease.

    Args:
        saver: A durable saver.
        thread_id: The thread.
        ignore_owner: Do not count this owner's own lease as `running`.

    Raises:
        GraphDurableError: the thread has no checkpoint.
    """
    thread_id = str(thread_id)
    latest = saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
    if latest is None:
        raise GraphDurableError(f"Thread {thread_id!r} has no checkpoint in this database.",
                                thread_id=thread_id)
    nxt = _next_nodes(latest.checkpoint["channel_values"])
    lease = saver.live_leases().get(thread_id)
    canceller = saver.cancelled_by(thread_id)
    if canceller is not None:
        return _cancelled_status(saver, thread_id, canceller, nxt, live=lease is not None)
    if lease is not None and lease[0] != ignore_owner:
        return ThreadStatus(thread_id, "running",
                            f"{lease[0]!r} holds a live lease for {lease[2] - saver.clock():.1f} s",
                            nxt)
    # Only an interrupt the checkpoint holds is pending: a worker killed between asking
    # (ledger) and interrupting (checkpoint) left an orphan that must be resumed to ask.
    # An interrupt whose task has since written its results was answered: the worker
    # stopped before the next checkpoint.
    finished = _finished_tasks(latest)
    interrupts = [w for w in latest.pending_writes if w[1] == INTERRUPT and w[0] not in finished]
    if interrupts and _all_answered(saver, thread_id, interrupts):
        return ThreadStatus(thread_id, "orphaned",
                            "its questions were answered and the decisions journaled, but its "
                            "worker stopped before acting on them: resume it (recover)", nxt)
    asked = [r for r in saver.effects(thread_id) if r.asked] if interrupts else []
    unknown = tuple(r.tool_call_id for r in asked if r.status is EffectStatus.UNKNOWN)
    approvals = tuple(r.tool_call_id for r in asked if r.status is not EffectStatus.UNKNOWN)
    if unknown:
        also = f"; waiting for approval of {list(approvals)}" if approvals else ""
        return ThreadStatus(thread_id, "needs_human",
                            f"outcome unknown for tool calls {list(unknown)}: decide applied, "
                            f"retry or skip{also}", nxt, unknown + approvals)
    if interrupts:
        return ThreadStatus(thread_id, "waiting",
                            f"waiting for approval of {list(approvals)}" if approvals
                            else "waiting for input to an interrupt", nxt, approvals)
    # An error of a task that has since written its results is stale: a refused answer
    # raised, and a later run of the same task succeeded before the worker stopped.
    errors = [w[2] for w in latest.pending_writes if w[1] == ERROR and w[0] not in finished]
    if errors:
        return ThreadStatus(thread_id, "failed", f"a step raised: {errors[-1]!r}", nxt)
    if nxt:
        return ThreadStatus(thread_id, "orphaned",
                            f"has next steps {list(nxt)}, no pending interrupt and no live "
                            "lease: its worker stopped; resume it (recover)", nxt)
    return ThreadStatus(thread_id, "done", "ran to its end")


def _finished_tasks(latest: Any) -> set[str]:
    """Tasks of a checkpoint that wrote their results (an interrupt of theirs is answered)."""
    return {w[0] for w in latest.pending_writes if w[1] not in (INTERRUPT, RESUME, ERROR)}


def open_interrupts(latest: Any) -> list[Any]:
    """The interrupts a checkpoint tuple holds that no task has answered since."""
    finished = _finished_tasks(latest)
    found: list[Any] = []
    for task_id, channel, value in latest.pending_writes:
        if channel == INTERRUPT and task_id not in finished:
            found.extend(value if isinstance(value, list | tuple) else [value])
    return found


def _cancelled_status(saver: Any, thread_id: str, canceller: str, nxt: tuple[str, ...],
                      *, live: bool) -> ThreadStatus:
    """A thread `cancel()` stopped: whether its cancel finished, and what a human owes."""
    records = saver.effects(thread_id)
    open_ = tuple(r.tool_call_id for r in records if r.status in _OPEN_AFTER_CANCEL)
    if live:
        why = f"being cancelled by {canceller!r}"
    elif open_:
        why = (f"cancelled by {canceller!r}; a human must settle tool calls {list(open_)} "
               "(a compensation failed or its outcome is unknown, or a call's outcome is unknown)")
    else:
        why = f"cancelled by {canceller!r}; it does not run again"
    return ThreadStatus(thread_id, "cancelled", why, nxt, open_)


_OPEN_AFTER_CANCEL = frozenset({EffectStatus.COMPENSATION_FAILED,
                                EffectStatus.COMPENSATION_UNKNOWN, EffectStatus.UNKNOWN,
                                EffectStatus.IN_FLIGHT})


def _all_answered(saver: Any, thread_id: str, interrupts: list[Any]) -> bool:
    """Whether every pending interrupt is the guard's and each of its questions has a
    journaled decision (any other interrupt waits for its own answer)."""
    for write in interrupts:
        values = write[2] if isinstance(write[2], list | tuple) else [write[2]]
        for interrupt in values:
            value = getattr(interrupt, "value", None)
            if not isinstance(value, dict) or "key" not in value:
                return False
            asks = "unknown" if value.get("type") == "effect_unknown" else "approval"
            if not answered(saver.effect(value["key"], thread_id), asks):
                return False
    return True


@dataclass(frozen=True)
class RecoveryOutcome:
    """What `recover` did with one orphaned thread."""

    thread_id: str
    outcome: Literal["resumed", "held_elsewhere", "no_longer_orphaned", "error"]
    """`resumed` by this process; `held_elsewhere` (another worker has it);
    `no_longer_orphaned` (another worker finished it first); `error`."""
    status: Status | None = None
    """The thread's status afterwards (for `resumed`)."""
    error: str | None = None
    """What went wrong (for `error`)."""


def recover(
    graph: Any,
    saver: Any,
    owner: str,
    limit: int | None = None,
    *,
    ttl: float = 30.0,
) -> list[RecoveryOutcome]:
    """Resume every orphaned thread of `saver` (at most `limit`) under a lease.

    Safe to run from many processes at once. Each thread is resumed with
    `durability="sync"` until it finishes or pauses again.
    """
    outcomes: list[RecoveryOutcome] = []
    threads = saver.thread_ids()
    # Sweepers start at different places, and pass by a thread another one is writing
    # (`wait=False`), so many of them split the work instead of queueing on one thread.
    random.Random(owner).shuffle(threads)
    for thread_id in threads:
        if limit is not None and len(outcomes) >= limit:
            break
        if thread_status(saver, thread_id).status != "orphaned":
            continue
        try:
            with saver.lease(thread_id, owner, ttl, wait=False) as lease:
                if thread_status(saver, thread_id, ignore_owner=owner).status != "orphaned":
                    outcomes.append(RecoveryOutcome(thread_id, "no_longer_orphaned"))
                    continue
                graph.invoke(None, lease.config, durability="sync")
        except LeaseHeld:
            outcomes.append(RecoveryOutcome(thread_id, "held_elsewhere"))
            continue
        except Exception as exc:
            outcomes.append(RecoveryOutcome(thread_id, "error", error=f"{type(exc).__name__}: {exc}"))
            continue
        outcomes.append(RecoveryOutcome(thread_id, "resumed",
                                        status=thread_status(saver, thread_id).status))
    return outcomes
