"""Thread status, and `recover()`: resume the threads whose worker died.

    for outcome in recover(graph, saver, owner="worker-7"):
        print(outcome.thread_id, outcome.outcome, outcome.status)

A thread is *orphaned* when it has steps to run, no pending interrupt and no live
lease: its worker crashed. So is one whose only unanswered questions were saved by a task
another task called (a functional-API `@task`) and not by its caller (the worker died
between the two writes): `get_state()` shows none of them, and resuming asks them again.
`recover` takes a lease on each orphaned thread before resuming it and checks again once
it holds the lease, so any number of processes can sweep the same database at once and
each thread is resumed by exactly one of them.
From async code (an async saver on its own loop), await `arecover` and `athread_status`.

An *orphaned intent* is another thing: an open effect no pending task of its thread will
run again (`graph_durable.operators.orphans`). A thread with one is never `done`; `recover` looks
each up with its policy's lookup and lists those left for a human.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from graph_durable.operators._checkpoints import (
    finished_tasks,
    next_nodes,
    open_interrupts,
    questions,
)
from graph_durable._langgraph import ERROR
from graph_durable.operators.compensation import policies_of
from graph_durable.errors import (
    GraphDurableError,
    InvalidDecision,
    LeaseHeld,
    LedgerDamaged,
    MiddlewareOrderError,
)
from graph_durable.ledger import EffectStatus, answered
from graph_durable.operators.orphans import Orphan, find_orphans, resolve_orphan
from graph_durable.operators._worker_thread import twin_of

__all__ = ["RecoveryOutcome", "ThreadStatus", "arecover", "athread_status", "damaged_status",
           "open_interrupts", "recover", "step_error", "thread_status"]

Status = Literal["running", "waiting", "needs_human", "done", "failed", "orphaned",
                 "cancelled", "damaged"]

@dataclass(frozen=True)
class ThreadStatus:
    """Where a thread stands, and why."""

    thread_id: str
    status: Status
    """`running`, `waiting`, `needs_human`, `done`, `failed`, `orphaned`, `cancelled`
    (stopped for good by `cancel()`) or `damaged` (a row of it cannot be read: the
    reason names it; see `LedgerDamaged`)."""
    reason: str
    """One sentence a person can act on."""
    next: tuple[str, ...] = ()
    """Nodes the thread would run next."""
    pending: tuple[str, ...] = field(default=())
    """tool_call_ids a human is asked about."""


def step_error(errors: Sequence[Any]) -> Any:
    """The error a failed step is reported by: the last one that is not a cancellation
    (when a task raises, LangGraph cancels its step's other tasks, and their
    `CancelledError`s say nothing of why), else the last."""
    causes = [e for e in errors if not _cancellation(e)]
    return (causes or list(errors))[-1]


def _cancellation(error: Any) -> bool:
    """Whether an `__error__` write (the error, or its repr) is a `CancelledError`."""
    return (type(error).__name__ if isinstance(error, BaseException) else str(error)
            ).startswith("CancelledError")


def thread_status(saver: Any, thread_id: str, *, ignore_owner: str | None = None
                  ) -> ThreadStatus:
    """Classify a thread from its latest checkpoint, its ledger and its lease.

    Args:
        saver: A durable saver.
        thread_id: The thread.
        ignore_owner: Do not count this owner's own lease as `running`.

    A thread with a row that cannot be read (its latest checkpoint, a ledger row or
    journal entry, its lease) is `damaged`, the reason naming the row.

    Raises:
        GraphDurableError: the thread has no checkpoint.
    """
    thread_id = str(thread_id)
    try:
        return _thread_status(saver, thread_id, ignore_owner)
    except LedgerDamaged as exc:
        return damaged_status(thread_id, exc)


def damaged_status(thread_id: str, exc: LedgerDamaged) -> ThreadStatus:
    """The status of a thread a row of which cannot be read."""
    return ThreadStatus(thread_id, "damaged",
                        f"{exc.fact}; nothing of it runs until the row is restored "
                        "(graph-durable check lists every damaged row)")


def _thread_status(saver: Any, thread_id: str, ignore_owner: str | None) -> ThreadStatus:
    latest = saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
    if latest is None:
        raise GraphDurableError(f"Thread {thread_id!r} has no checkpoint in this database.",
                                thread_id=thread_id)
    nxt = next_nodes(latest.checkpoint["channel_values"])
    saver.effects(thread_id), saver.events(thread_id)  # each of its rows must read
    lease = saver.live_leases().get(thread_id)
    canceller = saver.cancelled_by(thread_id)
    if canceller is not None:
        return _cancelled_status(saver, thread_id, canceller, nxt, live=lease is not None)
    if lease is not None and lease[0] != ignore_owner:
        return ThreadStatus(thread_id, "running",
                            f"{lease[0]!r} holds a live lease for {lease[2] - saver.clock():.1f} s",
                            nxt)
    found = _settled_status(saver, thread_id, latest, nxt)
    lost = find_orphans(saver, thread_id)
    return _with_orphans(found, lost) if lost else found


def _settled_status(saver: Any, thread_id: str, latest: Any, nxt: tuple[str, ...]
                    ) -> ThreadStatus:
    """The status of a thread neither cancelled nor running, its orphans aside."""
    # Only an interrupt the checkpoint holds is pending: a worker killed between asking
    # (ledger) and interrupting (checkpoint) left an orphan that must be resumed to ask.
    # An interrupt whose task has since written its results was answered: the worker
    # stopped before the next checkpoint.
    shown, hidden = questions(saver, latest)
    if hidden and (not shown or _all_answered(saver, thread_id, shown)):
        return ThreadStatus(thread_id, "orphaned", _hidden_reason(hidden), nxt)
    if shown and _all_answered(saver, thread_id, shown):
        return ThreadStatus(thread_id, "orphaned",
                            "its questions were answered and the decisions journaled, but its "
                            "worker stopped before acting on them: resume it (recover)", nxt)
    asked = [r for r in saver.effects(thread_id) if r.asked] if shown else []
    unknown = tuple(r.tool_call_id for r in asked if r.status is EffectStatus.UNKNOWN)
    approvals = tuple(r.tool_call_id for r in asked if r.status is not EffectStatus.UNKNOWN)
    if unknown:
        also = f"; waiting for approval of {list(approvals)}" if approvals else ""
        return ThreadStatus(thread_id, "needs_human",
                            f"outcome unknown for tool calls {list(unknown)}: decide applied, "
                            f"retry or skip{also}", nxt, unknown + approvals)
    if shown:
        return ThreadStatus(thread_id, "waiting",
                            f"waiting for approval of {list(approvals)}" if approvals
                            else "waiting for input to an interrupt", nxt, approvals)
    # An error of a task that has since written its results is stale: a refused answer
    # raised, and a later run of the same task succeeded before the worker stopped. So is
    # a middleware-order refusal whose call a later run has taken up since, and with it
    # the cancellations of the tasks LangGraph stopped when it was raised.
    finished = finished_tasks(latest)
    pending = [(w[0], w[2]) for w in latest.pending_writes
               if w[1] == ERROR and w[0] not in finished]
    errors = [error for task_id, error in pending
              if not _refusal_taken_up(saver, thread_id, task_id, error)]
    if len(errors) < len(pending) and all(_cancellation(error) for error in errors):
        errors = []
    if errors:
        return ThreadStatus(thread_id, "failed", f"a step raised: {step_error(errors)!r}", nxt)
    if nxt:
        return ThreadStatus(thread_id, "orphaned",
                            f"has next steps {list(nxt)}, no pending interrupt and no live "
                            "lease: its worker stopped; resume it (recover)", nxt)
    return ThreadStatus(thread_id, "done", "ran to its end")


def _refusal_taken_up(saver: Any, thread_id: str, task_id: str, error: Any) -> bool:
    """Whether `error`, the `__error__` write of task `task_id`, is a `MiddlewareOrderError`
    the guard raised on overruling a call (journaled `refused`) that a later run of the
    task has taken up since: what MiddlewareOrderError asks for is to run the thread
    again, and a worker killed in that run writes nothing over the error.

    The guard journals `refused` and raises at once, so no event on that key follows it
    in the same run; one that does is a later run's. A later run refused again journals
    a later `refused`, and one that raised otherwise wrote its own error over this one.
    """
    if not (isinstance(error, MiddlewareOrderError)  # the error as written, or its repr
            or (isinstance(error, str) and error.startswith(MiddlewareOrderError.__name__ + "("))):
        return False
    keys = {r.key for r in saver.effects(thread_id)
            if task_id in {part.rpartition(":")[2] for part in r.checkpoint_ns.split("|")}}
    events = [e for e in saver.events(thread_id) if e.key in keys]
    refused = [e for e in events if e.kind == "refused"]
    return bool(refused) and any(e.key == refused[-1].key and e.seq > refused[-1].seq
                                 for e in events)


def _hidden_reason(hidden: list[Any]) -> str:
    """Why a thread whose questions only called tasks saved is orphaned."""
    calls = [v["tool_call_id"] for v in (getattr(i, "value", None) for i in hidden)
             if isinstance(v, dict) and isinstance(v.get("tool_call_id"), str)]
    what = f"about tool calls {calls}" if calls else "a question"
    return (f"a task another task called (a functional-API @task) asked {what}, but its "
            "worker stopped before the calling task saved the question, so get_state() "
            "shows none and no one can answer it: resume it to ask again (recover)")


def _with_orphans(found: ThreadStatus, lost: list[Orphan]) -> ThreadStatus:
    """`found`, told about the thread's orphaned intents: a thread with one is never
    `done`, and a human (or a lookup) owes each an answer."""
    calls = tuple(o.tool_call_id for o in lost)
    note = (f"orphaned intents {list(calls)}: no pending task will run them again; "
            "reconcile each (recover looks them up) or decide applied or skip "
            "(graph-durable resolve THREAD CALL)")
    if found.status in ("done", "waiting"):
        reason = note if found.status == "done" else f"{note}; {found.reason}"
        return ThreadStatus(found.thread_id, "needs_human", reason, found.next,
                            found.pending + calls)
    return ThreadStatus(found.thread_id, found.status, f"{found.reason}; {note}", found.next,
                        found.pending + calls)


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
    for interrupt in interrupts:
        value = getattr(interrupt, "value", None)
        if not isinstance(value, dict) or "key" not in value:
            return False
        asks = "unknown" if value.get("type") == "effect_unknown" else "approval"
        if not answered(saver.effect(value["key"], thread_id), asks):
            return False
    return True


@dataclass(frozen=True)
class RecoveryOutcome:
    """What `recover` did with one thread: resumed it, or reconciled its orphaned intents."""

    thread_id: str
    outcome: Literal["resumed", "reconciled", "needs_human", "held_elsewhere",
                     "no_longer_orphaned", "damaged", "error"]
    """`resumed` by this process; `reconciled` (not resumed: its orphaned intents were
    looked up); `needs_human` (not resumed: orphaned intents no lookup settles, listed in
    `orphans`); `held_elsewhere` (another worker has it); `no_longer_orphaned` (another
    worker finished it first); `damaged` (a row of it cannot be read, named in `error`:
    passed by); `error`."""
    status: Status | None = None
    """The thread's status afterwards (for `resumed`, `reconciled` and `needs_human`)."""
    error: str | None = None
    """What went wrong (for `error`)."""
    reconciled: tuple[str, ...] = ()
    """tool_call_ids of orphaned intents its lookup settled (applied, or not applied)."""
    orphans: tuple[str, ...] = ()
    """tool_call_ids of orphaned intents left for a human (`resolve_orphan`)."""


def recover(
    graph: Any,
    saver: Any,
    owner: str,
    limit: int | None = None,
    *,
    ttl: float = 30.0,
) -> list[RecoveryOutcome]:
    """Resume every orphaned thread of `saver` (at most `limit`) under a lease, and
    reconcile orphaned intents (`graph_durable.operators.orphans`) with their policies' lookups.

    Safe to run from many processes at once. Each thread is resumed with
    `durability="sync"` until it finishes or pauses again. An orphaned intent no lookup
    settles is listed in its thread's `orphans`, for a human.
    """
    return _recover(graph, saver, owner, limit, ttl,
                    lambda config: graph.invoke(None, config, durability="sync"))


@twin_of(recover)
async def arecover(*args: Any, **kwargs: Any) -> list[RecoveryOutcome]:
    """Async `recover` (the same arguments), for async code and async savers: the sweep
    runs on a worker thread, whose saver calls an async saver answers on this loop (which
    the await leaves free), and each thread is resumed with `graph.ainvoke` on this loop."""
    call = inspect.signature(recover).bind(*args, **kwargs)
    call.apply_defaults()
    graph, loop = call.arguments["graph"], asyncio.get_running_loop()

    def resume(config: dict[str, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(
            graph.ainvoke(None, config, durability="sync"), loop).result()

    return await asyncio.to_thread(_recover, **call.arguments, resume=resume)


@twin_of(thread_status)
async def athread_status(*args: Any, **kwargs: Any) -> ThreadStatus:
    """Async `thread_status` (the same arguments): read on a worker thread, whose saver
    calls an async saver answers on this loop, which the await leaves free."""
    return await asyncio.to_thread(thread_status, *args, **kwargs)


def _recover(graph: Any, saver: Any, owner: str, limit: int | None, ttl: float,
             resume: Callable[[dict[str, Any]], Any]) -> list[RecoveryOutcome]:
    outcomes: list[RecoveryOutcome] = []
    threads = saver.thread_ids()
    # Sweepers start at different places, and pass by a thread another one is writing
    # (`wait=False`), so many of them split the work instead of queueing on one thread.
    random.Random(owner).shuffle(threads)
    policies = None
    for thread_id in threads:
        if limit is not None and len(outcomes) >= limit:
            break
        found = thread_status(saver, thread_id)
        status = found.status
        if status == "damaged":
            outcomes.append(RecoveryOutcome(thread_id, "damaged", status=status,
                                            error=found.reason))
            continue
        outcome = (_resume(resume, saver, thread_id, owner, ttl) if status == "orphaned"
                   else None)
        if status not in ("running", "cancelled") and (
                outcome is None or outcome.outcome == "resumed"):
            lost = find_orphans(saver, thread_id)
            if lost:
                if policies is None:
                    policies = policies_of(graph)
                outcome = _reconcile(saver, thread_id, lost, policies, outcome, owner, ttl)
        if outcome is not None:
            outcomes.append(outcome)
    return outcomes


def _resume(resume: Callable[[dict[str, Any]], Any], saver: Any, thread_id: str, owner: str,
            ttl: float) -> RecoveryOutcome:
    try:
        with saver.lease(thread_id, owner, ttl, wait=False) as lease:
            if thread_status(saver, thread_id, ignore_owner=owner).status != "orphaned":
                return RecoveryOutcome(thread_id, "no_longer_orphaned")
            resume(lease.config)
    except LeaseHeld:
        return RecoveryOutcome(thread_id, "held_elsewhere")
    except Exception as exc:
        return RecoveryOutcome(thread_id, "error", error=f"{type(exc).__name__}: {exc}")
    return RecoveryOutcome(thread_id, "resumed", status=thread_status(saver, thread_id).status)


def _reconcile(saver: Any, thread_id: str, lost: list[Orphan], policies: Any,
               resumed: RecoveryOutcome | None, owner: str, ttl: float) -> RecoveryOutcome:
    """Look up each orphaned intent that has a lookup; the rest wait for a human."""
    settled, left = [], []
    for orphan in lost:
        try:
            record = resolve_orphan(saver, thread_id, orphan.key, effects=policies,
                                    owner=owner, ttl=ttl)
        except (InvalidDecision, LeaseHeld):  # no lookup, or settled or taken meanwhile
            record = saver.effect(orphan.key, thread_id)
        open_ = record is not None and record.status in (EffectStatus.IN_FLIGHT,
                                                          EffectStatus.UNKNOWN)
        (left if open_ else settled).append(orphan.tool_call_id)
    kind: Any = resumed.outcome if resumed is not None else "needs_human" if left else "reconciled"
    return RecoveryOutcome(thread_id, kind, status=thread_status(saver, thread_id).status,
                           reconciled=tuple(settled), orphans=tuple(left))
