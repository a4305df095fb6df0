"""Orphaned intents: open effects that no pending task of their thread will run again.

    for orphan in find_orphans(saver):             # every thread, or thread_id=...
        print(orphan.thread_id, orphan.tool_call_id, orphan.reason)
    resolve_orphan(saver, "t1", "call_7", effects={"charge": policy})      # its lookup
    resolve_orphan(saver, "t1", "call_8", {"type": "skip", "message": "checked"})
    await aresolve_orphan(saver, "t1", "call_9", effects=...)  # async code, async savers

An `in_flight` or `unknown` effect is reconciled by the task that holds its call: when the
thread resumes, the task runs again, claims the same key and looks it up, re-sends it or
asks a human. An effect is *orphaned* when no task will: it is open, no open interrupt of
the thread asks about it, and resuming the thread as it stands would not run its task
again. That happens when the parent of a subgraph is resumed from a named checkpoint (the
subgraph starts afresh, under new task ids), when the Agent Server rolls a run back
(`multitask_strategy="rollback"` deletes the run's checkpoints) while a call was in
flight, or when a thread is forked away from a step that never finished.

Whether resuming runs the task again is read from the checkpoints alone, level by level
of the effect's `checkpoint_ns` (`child:<task_id>|tools:<task_id>`; the tools task's
namespace is the last level):

- at every level, the latest checkpoint of the parent namespace still has the task's
  node to run (a `branch:to:<node>` channel, or sent tasks), and the task has not
  written its results there;
- for a subgraph level, the subgraph's latest checkpoint was written by a run of its task
  from that very parent checkpoint (its metadata's `parents` names it): a subgraph that
  restarted under a forked parent is another task's;
- at the last level, that checkpoint was written no later than the effect's last
  transition (a task runs from a checkpoint already written, and it claims or moves the
  effect after that): a checkpoint written since belongs to a run that went elsewhere.

So a crashed worker's call (its checkpoints untouched) and a running thread's call are
never orphans: `thread_status` says `orphaned` (resume it) or `running`. The comparison
of times assumes the clocks of the writers agree to better than the time between a call
and the restart of its thread; compensating calls (settled by `compensate()`) and
cancelled threads (settled by `cancel()`) are not listed.

An orphan is reconciled outside any run, under the thread's lease, and journaled like
every transition: by its policy's lookup (found: `applied` with the lookup's receipt;
certainly absent: `skipped`, the journal says why; cannot tell: left as it is), or by a
human's `applied` (with the receipt) or `skip`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from graph_durable.nodes.outcomes import Returned, call_lookup
from graph_durable.operators._compensation_driver import answer_message
from graph_durable.operators._checkpoints import (
    SENT_TASKS,
    finished_tasks,
    latest,
    next_nodes,
    open_interrupts,
    written_at,
)
from graph_durable.errors import InvalidDecision, LedgerDamaged
from graph_durable.operators.compensation import policies_of
from graph_durable.operators._worker_thread import twin_of
from graph_durable.ledger import EffectRecord, EffectStatus, TransitionWrite, WriteBatch
from graph_durable.nodes.compensation import is_compensation
from graph_durable.nodes.decisions import check_decision
from graph_durable.policy import Effect

__all__ = ["ANSWERED_WITHOUT_GUARD", "ORPHAN_DECISIONS", "Orphan", "OrphanList",
           "afind_orphans", "aresolve_orphan", "check_orphan_decision", "find_orphans",
           "orphan_reason", "resolve_orphan"]

S = EffectStatus
OPEN = (S.IN_FLIGHT, S.UNKNOWN)
ORPHAN_DECISIONS = ("applied", "skip")
"""What a human may decide for an orphan: no task runs it again, so a retry has no run
to send it (resume or fork the thread to ask the call anew instead)."""


@dataclass(frozen=True)
class Orphan:
    """An open effect that no pending task of its thread will run again."""

    thread_id: str
    tool_call_id: str
    tool: str
    args: dict[str, Any]
    key: str
    """Idempotency key of the effect (what a lookup at the provider asks for)."""
    status: str
    """Ledger status: `in_flight` or `unknown`."""
    attempts: int
    """How many times the tool was called for this key."""
    error: str | None
    checkpoint_ns: str
    """Namespace of the task that last held the call."""
    reason: str
    """Why no pending task runs it again."""
    created_at: float
    """Unix time of the intent."""
    updated_at: float
    """Unix time of its last transition."""
    allowed_decisions: tuple[str, ...] = ORPHAN_DECISIONS

    def to_dict(self) -> dict[str, Any]:
        """The orphan as JSON-ready values (times stay Unix seconds)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def orphan_reason(saver: Any, record: EffectRecord, root: Any) -> str | None:
    """Why no pending task of `record`'s thread runs its call again, or `None` when
    resuming the thread would (see the module docstring). `root` is the thread's latest
    root checkpoint tuple."""
    if not record.checkpoint_ns:
        return "it was recorded outside any graph task"
    parent_ns, checkpoint = "", root
    segments = record.checkpoint_ns.split("|")
    for depth, segment in enumerate(segments):
        node, _, task_id = segment.rpartition(":")
        where = f"namespace {parent_ns!r}" if parent_ns else "the thread"
        if checkpoint is None:
            return f"{where} has no checkpoint any more (its run was rolled back or deleted)"
        nodes = next_nodes(checkpoint.checkpoint["channel_values"])
        if node not in nodes and SENT_TASKS not in nodes:
            if (depth == len(segments) - 1 and written_at(checkpoint) > record.updated_at
                    and _answered(checkpoint, record.tool_call_id)):
                return ANSWERED_WITHOUT_GUARD
            return (f"the latest checkpoint of {where} has no step {node!r} to run: the run "
                    "that held the call was rolled back, restarted or forked away")
        if task_id in finished_tasks(checkpoint):
            return f"its task {segment!r} already wrote its results"
        if depth == len(segments) - 1:
            if written_at(checkpoint) > record.updated_at:
                return (f"{where} has moved to a later checkpoint since the call, from which "
                        "its task does not run again (a restart, a fork or a rollback)")
            return None
        inner_ns = f"{parent_ns}|{segment}" if parent_ns else segment
        inner = latest(saver, record.thread_id, inner_ns)
        parents = (inner.metadata or {}).get("parents") or {} if inner is not None else {}
        if parents.get(parent_ns) != checkpoint.config["configurable"]["checkpoint_id"]:
            return (f"its subgraph task {segment!r} is not the one {where} runs next (the "
                    "parent was resumed from another checkpoint, so the subgraph restarted)")
        parent_ns, checkpoint = inner_ns, inner
    return None  # pragma: no cover - the loop returns at its last level


ANSWERED_WITHOUT_GUARD = (
    "its call was answered without the guard: a middleware listed before it replied to "
    "the model after the call had been sent (a reviewer's reject or respond, asked again "
    "after a crash)")
"""`Orphan.reason` of an effect whose call a middleware answered in the guard's place
(see docs/how-to/create-agent.md, "After a crash")."""


def _answered(checkpoint: Any, tool_call_id: str) -> bool:
    """Whether a message list of the checkpoint's state holds the call's ToolMessage."""
    for value in checkpoint.checkpoint["channel_values"].values():
        if isinstance(value, list) and any(
                getattr(m, "type", None) == "tool" and getattr(m, "tool_call_id", None)
                == tool_call_id for m in value):
            return True
    return False


def _asked_keys(root: Any) -> set[str]:
    keys = set()
    for interrupt in open_interrupts(root) if root is not None else ():
        value = getattr(interrupt, "value", None)
        if isinstance(value, dict) and isinstance(value.get("key"), str):
            keys.add(value["key"])
    return keys


class OrphanList(list[Orphan]):
    """`find_orphans`' result: the orphans, and in `damaged` the `LedgerDamaged` of each
    thread passed by."""

    damaged: tuple[LedgerDamaged, ...] = ()


def find_orphans(saver: Any, thread_id: str | None = None) -> OrphanList:
    """Every orphaned intent (of one thread, or of all), oldest first.

    Reads the ledger and the checkpoints only (no graph): read-only savers work too.
    Across every thread, a thread with a row that cannot be read is passed by, and the
    error naming the row is in the result's `damaged`; of one thread, it raises.

    Raises:
        LedgerDamaged: `thread_id` is given and a row it needs cannot be read.
    """
    threads = [str(thread_id)] if thread_id is not None else saver.thread_ids()
    found: OrphanList = OrphanList()
    damaged: list[LedgerDamaged] = []
    for thread in threads:
        try:
            found.extend(_thread_orphans(saver, thread))
        except LedgerDamaged as exc:
            if thread_id is not None:
                raise
            damaged.append(exc)
    found.sort(key=lambda o: (o.created_at, o.thread_id, o.tool_call_id))
    found.damaged = tuple(damaged)
    return found


def _thread_orphans(saver: Any, thread: str) -> list[Orphan]:
    """The orphaned intents of one thread (`LedgerDamaged` if a row of it cannot be read)."""
    found: list[Orphan] = []
    records = [r for r in saver.effects(thread)
               if r.status in OPEN and not is_compensation(r)]
    if not records or saver.cancelled_by(thread) is not None:
        return found
    root = latest(saver, thread)
    asked = _asked_keys(root)
    for record in records:
        reason = None if record.key in asked else orphan_reason(saver, record, root)
        if reason is not None:
            found.append(Orphan(
                thread_id=thread, tool_call_id=record.tool_call_id, tool=record.tool,
                args=record.args, key=record.key, status=record.status.value,
                attempts=record.attempts, error=record.error,
                checkpoint_ns=record.checkpoint_ns, reason=reason,
                created_at=record.created_at, updated_at=record.updated_at))
    return found


def _match(saver: Any, thread_id: str, call: str) -> Orphan:
    found = [o for o in find_orphans(saver, thread_id) if call in (o.tool_call_id, o.key)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise InvalidDecision(
            f"Tool call {call!r} is not an orphaned intent of thread {thread_id!r} (it is "
            "settled, or a pending task or question of the thread still holds it); "
            "`graph-durable pending` lists what waits. Nothing was recorded.",
            thread_id=thread_id, tool_call_id=call)
    raise InvalidDecision(
        f"{call!r} names {len(found)} orphaned intents of thread {thread_id!r}: name one by "
        f"its key ({[o.key for o in found]}). Nothing was recorded.",
        thread_id=thread_id, tool_call_id=call)


def check_orphan_decision(decision: Mapping[str, Any], record: EffectRecord,
                          thread_id: str) -> dict[str, Any]:
    """`decision` checked for the orphan `record` (`InvalidDecision` if it does not fit)."""
    kind = decision.get("type") if isinstance(decision, Mapping) else None
    if kind not in ORPHAN_DECISIONS:
        raise InvalidDecision(
            f"The decision for orphaned tool call {record.tool_call_id!r} ({record.tool}) in "
            f"thread {thread_id!r} has type {kind!r}; an orphan takes {list(ORPHAN_DECISIONS)} "
            "(no pending task would send a retry). Nothing was recorded.",
            thread_id=thread_id, tool_call_id=record.tool_call_id)
    return check_decision(dict(decision), record.model_copy(update={"status": S.UNKNOWN}),
                          thread_id)


def resolve_orphan(
    saver: Any,
    thread_id: str,
    call: str,
    decision: Mapping[str, Any] | None = None,
    *,
    effects: Mapping[str, Effect] | None = None,
    graph: Any = None,
    reviewer: str | None = None,
    owner: str | None = None,
    ttl: float = 30.0,
) -> EffectRecord:
    """Reconcile one orphaned intent now, under the thread's lease.

    Args:
        saver: The thread's durable saver (a writable one).
        thread_id: The thread.
        call: The orphan's tool_call_id, or its key.
        decision: A human's word: `{"type": "applied", "receipt": ...}` or
            `{"type": "skip", "message": ...}`. Without one, the policy's lookup asks the
            provider (policies from `effects=`, else from `graph`'s guards).
        reviewer: Who decided; journaled with the decision.
        owner: Lease owner the writes are made under (default `resolve:<reviewer>`).
        ttl: Lease time to live, seconds.

    Returns:
        The record afterwards: `applied`, `skipped`, or as it was when a lookup could not
        tell (its `error` unchanged; decide by hand then).

    Raises:
        InvalidDecision: `call` names no orphan, the decision does not fit, or there is
            neither a decision nor a lookup. Nothing is recorded.
        LeaseHeld: a worker holds the thread now; try again once it stopped.
    """
    thread_id = str(thread_id)
    orphan = _match(saver, thread_id, call)
    record = saver.effect(orphan.key, thread_id)
    policy = _policy(effects, graph, record.tool)
    checked = None if decision is None else check_orphan_decision(decision, record, thread_id)
    if checked is not None and reviewer is not None:
        checked.setdefault("reviewer", reviewer)
    if checked is None and policy.lookup is None:
        raise InvalidDecision(
            f"Orphaned tool call {record.tool_call_id!r} ({record.tool}) in thread "
            f"{thread_id!r} has no lookup to ask the provider with: check under key "
            f"{record.key} and decide `applied` with its receipt, or `skip` "
            "(`graph-durable resolve`). Nothing was recorded.",
            thread_id=thread_id, tool_call_id=record.tool_call_id)
    with saver.lease(thread_id, owner or f"resolve:{reviewer or 'operator'}", ttl,
                     wait=False) as lease:
        orphan = _match(saver, thread_id, orphan.key)  # still an orphan, under the lease
        record = saver.effect(orphan.key, thread_id)
        settle = _decided(record, checked) if checked is not None else _looked_up(record, policy)
        if settle is None:
            return record  # the lookup cannot tell: a human decides
        writes = []
        if record.status is S.IN_FLIGHT:
            writes.append(_write(record, S.UNKNOWN, "unknown", policy,
                                 error=f"orphaned: {orphan.reason}",
                                 data={"reason": orphan.reason}))
        writes.extend(_write(record, to, kind, policy, **fields) for to, kind, fields in settle)
        changed = saver.apply(WriteBatch(thread_id, tuple(writes)), lease.config)
        return changed[-1]  # type: ignore[no-any-return]


@twin_of(find_orphans)
async def afind_orphans(*args: Any, **kwargs: Any) -> list[Orphan]:
    """Async `find_orphans` (the same arguments): read on a worker thread, whose saver
    calls an async saver answers on this loop, which the await leaves free."""
    return await asyncio.to_thread(find_orphans, *args, **kwargs)


@twin_of(resolve_orphan)
async def aresolve_orphan(*args: Any, **kwargs: Any) -> EffectRecord:
    """Async `resolve_orphan` (the same arguments), for an async saver on its own loop
    (an orphan a `Review` from `areview` lists): it runs on a worker thread, the lookup
    too, and the saver calls it makes are answered on this loop, which the await leaves
    free."""
    return await asyncio.to_thread(resolve_orphan, *args, **kwargs)


def _policy(effects: Mapping[str, Effect] | None, graph: Any, tool: str) -> Effect:
    if effects is None and graph is not None:
        effects = policies_of(graph)
    return (effects or {}).get(tool, Effect())


Settle = list[tuple[EffectStatus, str, dict[str, Any]]]


def _decided(record: EffectRecord, decision: dict[str, Any]) -> Settle:
    """A human's decision: journaled first, then carried out."""
    journal = (S.UNKNOWN, "decision", {"data": {"decision": decision, "orphan": True},
                                       "decision": {**decision, "decided_at": time.time()}})
    data = {"decision": decision["type"], "orphan": True,
            **({"reviewer": decision["reviewer"]} if "reviewer" in decision else {})}
    if decision["type"] == "applied":
        return [journal, (S.APPLIED, "receipt", {
            "receipt": decision["receipt"], "result": answer_message(record, decision["receipt"]),
            "data": {**data, "source": "human"}})]
    note = decision.get("message") or "no reason given"
    return [journal, (S.SKIPPED, "resolved", {
        "result": answer_message(record, f"Skipped by reviewer: {note}", "error"), "data": data})]


def _looked_up(record: EffectRecord, policy: Effect) -> Settle | None:
    """The provider's answer to the policy's lookup, or `None` when it cannot tell."""
    found = call_lookup(policy, record.key, tool=record.tool)
    if not isinstance(found, Returned):
        return None
    if found.value is not None:
        return [(S.APPLIED, "receipt", {
            "receipt": found.value, "result": answer_message(record, found.value),
            "data": {"source": "lookup", "orphan": True}})]
    note = (f"orphaned, and a lookup found no effect for key {record.key}: it was not "
            "applied, and no pending task will send it")
    return [(S.SKIPPED, "resolved", {
        "result": answer_message(record, f"Not applied: {note}", "error"),
        "data": {"reason": note, "source": "lookup", "orphan": True}})]


def _write(record: EffectRecord, to: EffectStatus, kind: str, policy: Effect,
           **fields: Any) -> TransitionWrite:
    fields = {"asked": False, **fields}
    if to in (S.APPLIED, S.SKIPPED):
        fields = {"error": None, "decision": None, **fields}
    return TransitionWrite(thread_id=record.thread_id, key=record.key, to=to, kind=kind,
                           redact=policy.redact, **fields)
