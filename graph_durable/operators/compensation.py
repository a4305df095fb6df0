"""Undo what a thread did: `compensate()` one effect, or `cancel()` a whole thread as a saga.

    report = cancel(graph, saver, "t1", owner="ops-ana")   # stops t1 for good
    report.compensated, report.left_in_place, report.needs_human

    compensate(graph, saver, "t1", "call_charge", reviewer="ana")   # one applied effect

    await acancel(graph, saver, "t1")      # the same, from async code: on the event loop
    await acompensate(graph, saver, "t1", "call_charge")            # of an async saver

Each compensation is a guarded effect of its own (`graph_durable.nodes.compensation`):
intent before it is sent, a key derived from the key of the effect it undoes, receipt
after, and its own policy (`Compensation.effect`) decides what a crash in the middle
costs: a lookup, a same-key re-send, or a human's look. Both functions run under a lease
on the thread, so they are fenced against any worker, and both are resumable: run them
again after a crash and they go on where they stopped, never undoing anything twice.
What they decide is written once (`graph_durable.operators._compensation_driver`); the sync and
async functions differ only in how the saver, the compensations and lookups are called.

A compensation runs only for an effect known to exist: `applied`, or `unknown` once a
lookup finds it or a human gives its receipt. An `unknown` effect whose lookup finds
nothing is settled as not applied, and nothing is compensated.

Where the policies come from: the graph's `EffectGuardNode`s (subgraphs included), or
`effects=` (give it for graphs built with `EffectGuardMiddleware`, whose policies the
compiled graph does not expose).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from graph_durable.operators._compensation_driver import (
    AsyncDriver,
    Driver,
    Steps,
    TakeLease,
    answer_message,
    compensate_steps,
    settle_failed,
    settle_open,
    settle_unknown,
    transition,
)
from graph_durable.checkpointers._base import durable_saver
from graph_durable.errors import GraphDurableError, InvalidDecision, LeaseHeld
from graph_durable.leases import CANCEL_PREFIX
from graph_durable.ledger import EffectRecord, EffectStatus
from graph_durable.nodes.compensation import is_compensation
from graph_durable.nodes.protocol import Read
from graph_durable.policy import Effect

__all__ = ["CancelReport", "acancel", "acompensate", "cancel", "compensate", "policies_of",
           "tools_of"]

S = EffectStatus


# -- where the policies are ----------------------------------------------------------------


def _guards(graph: Any) -> Iterator[Any]:
    """Every `EffectGuardNode` of `graph` and of its subgraphs."""
    from graph_durable.nodes.node import EffectGuardNode

    graphs = [graph]
    try:
        graphs += [sub for _, sub in graph.get_subgraphs(recurse=True)]
    except Exception:  # a graph without subgraph support: its own nodes only
        pass
    for one in graphs:
        for node in getattr(one, "nodes", {}).values():
            bound = getattr(node, "bound", node)
            if isinstance(bound, EffectGuardNode):
                yield bound


def policies_of(graph: Any) -> dict[str, Effect]:
    """`{tool: Effect}` of every `EffectGuardNode` in `graph` and its subgraphs."""
    policies: dict[str, Effect] = {}
    for node in _guards(graph):
        for name in node.tools_by_name:
            policies.setdefault(name, node.guard.policy_for(name))
    return policies


def tools_of(graph: Any) -> dict[str, Any]:
    """`{name: tool}` of every tool an `EffectGuardNode` of `graph` (or of its
    subgraphs) guards: the argument schemas an edit is checked against."""
    tools: dict[str, Any] = {}
    for node in _guards(graph):
        for name, tool in node.tools_by_name.items():
            tools.setdefault(name, tool)
    return tools


def _policy(policies: Mapping[str, Effect], tool: str) -> Effect:
    return policies.get(tool, Effect())


def _saver_of(saver: Any) -> Any:
    found = durable_saver(saver)
    if found is None:
        raise GraphDurableError(f"{type(saver).__name__} keeps no effect ledger: pass the "
                                "graph's durable saver")
    return found


# -- one effect ------------------------------------------------------------------------


def compensate(
    graph: Any, saver: Any, thread_id: str, call: str, *, receipt: Any = None,
    retry: bool = False, reviewer: str | None = None, owner: str | None = None,
    ttl: float = 30.0, effects: Mapping[str, Effect] | None = None,
) -> EffectRecord:
    """Carry out a reviewer's `{"type": "compensate"}` on one effect of `thread_id`.

    `call` is the tool_call_id (or the effect key) of the effect to undo. It runs its
    compensation if the effect is `applied`, and for an `unknown` (or `in_flight`) effect
    only once it is known to exist: its lookup finds it, or `receipt=` is a human's word
    that it happened. On a `compensation_failed` effect, `receipt=` is a human's word
    that it was undone (by the compensation, or by hand); without it the compensation is
    tried again (the same call, looked up first, if its outcome was open). On a
    `compensation_unknown` effect (the compensation's outcome is open), `receipt=` is a
    human's word that it was undone and `retry=True` that it was not (it is sent again
    under its key); without either, its lookup or a same-key re-send where the provider
    dedupes settles it, and otherwise it stays `compensation_unknown`. If the lookup of an
    open effect finds nothing, the effect is settled as not applied and nothing is
    compensated (its record says why).
    The decision is journaled before it takes effect. A thread paused on the effect's
    question goes on from there when resumed: its call answers with what was recorded.

    Returns:
        The effect's record afterwards: `compensated`; `compensation_failed` (`error` says
        why); `compensation_unknown` when nothing could tell whether the compensation
        landed; `skipped`/`failed` when a lookup showed it never happened; or `unknown`
        when nothing could tell.

    Raises:
        InvalidDecision: the effect cannot be compensated (no compensation in its policy,
            never sent, or already settled otherwise); nothing was changed.
        LeaseHeld: a worker holds the thread; try again once it has stopped.
    """
    return Driver(_saver_of(saver)).run(_compensate(
        graph, str(thread_id), call, receipt, retry, reviewer, owner, ttl, effects))


async def acompensate(
    graph: Any, saver: Any, thread_id: str, call: str, *, receipt: Any = None,
    retry: bool = False, reviewer: str | None = None, owner: str | None = None,
    ttl: float = 30.0, effects: Mapping[str, Effect] | None = None,
) -> EffectRecord:
    """Async `compensate`: the same decisions, made with the saver's `a`-prefixed methods,
    so it runs on the event loop of an async saver (`AsyncDurableSqliteSaver`,
    `AsyncDurablePostgresSaver`), where the sync `compensate` refuses. A compensation or
    lookup may be async; a sync one runs on a worker thread."""
    return await AsyncDriver(_saver_of(saver)).run(_compensate(
        graph, str(thread_id), call, receipt, retry, reviewer, owner, ttl, effects))


def _compensate(graph: Any, thread_id: str, call: str, receipt: Any, retry: bool,
                reviewer: str | None, owner: str | None, ttl: float,
                effects: Mapping[str, Effect] | None) -> Steps[EffectRecord]:
    have_receipt = receipt is not None
    record = yield from _find(thread_id, call)
    policies = dict(effects) if effects is not None else policies_of(graph)
    policy = _policy(policies, record.tool)
    _check_compensable(record, policy, thread_id, have_receipt, retry)
    who = owner or f"compensate:{reviewer or 'reviewer'}"
    if (yield Read("cancelled_by", (thread_id,))) is not None:
        who = CANCEL_PREFIX + who  # settling what a cancel left to a human
    yield TakeLease(thread_id, who, ttl)
    record = yield from _find(thread_id, call)  # as it stands under the lease
    _check_compensable(record, policy, thread_id, have_receipt, retry)
    decision = {"type": "compensate", **({"reviewer": reviewer} if reviewer else {}),
                **({"receipt": receipt} if have_receipt else {}),
                **({"retry": True} if retry else {})}
    if record.status is not S.APPLIED:
        # Journaled before it takes effect; an applied effect's compensation journals
        # the decision with its own intent (an applied record does not move otherwise).
        record = yield from transition(record, record.status, "decision",
                                       data={"decision": decision}, redact=policy.redact)
    assert policy.compensation is not None
    if record.status is S.COMPENSATION_UNKNOWN and not (have_receipt or retry):
        return (yield from settle_unknown(record, policy.compensation, {"decision": decision}))
    if record.status in (S.COMPENSATION_FAILED, S.COMPENSATION_UNKNOWN):
        return (yield from settle_failed(record, policy.compensation, decision, receipt,
                                         have_receipt=have_receipt))
    if record.status in (S.IN_FLIGHT, S.UNKNOWN):
        record = yield from settle_open(record, policy, receipt, have_receipt=have_receipt)
    if record.status is S.APPLIED:
        record = yield from compensate_steps(record, policy.compensation,
                                             {"decision": decision})
    return record


def _find(thread_id: str, call: str) -> Steps[EffectRecord]:
    records = [r for r in (yield Read("effects", (thread_id,)))
               if (r.tool_call_id == call or r.key == call) and not is_compensation(r)]
    if not records:
        raise InvalidDecision(
            f"Thread {thread_id!r} has no effect for tool call {call!r}; nothing was changed. "
            "`graph-durable effects --thread ...` lists them.", thread_id=thread_id,
            tool_call_id=call)
    return records[-1]


def _check_compensable(record: EffectRecord, policy: Effect, thread_id: str,
                       have_receipt: bool, retry: bool = False) -> None:
    why = None
    if retry and (have_receipt or record.status is not S.COMPENSATION_UNKNOWN):
        why = ("retry=True is a human's word that a compensation whose outcome is unknown "
               f"did not happen; this effect is {record.status.value}"
               + (" and a receipt says it was undone" if have_receipt else ""))
    elif policy.compensation is None:
        why = (f"the policy of {record.tool!r} has no compensation: give it "
               "Effect(compensate=...)")
    elif record.status in (S.AWAITING_APPROVAL, S.REJECTED, S.FAILED, S.SKIPPED):
        why = f"it is {record.status.value}: nothing was applied, so there is nothing to undo"
    elif record.status is S.COMPENSATED:
        why = "it is compensated already"
    elif (record.status in (S.IN_FLIGHT, S.UNKNOWN) and policy.lookup is None
          and not have_receipt):
        why = (f"its outcome is {record.status.value} and {record.tool!r} has no lookup: give "
               "receipt=... once you have checked that it happened")
    if why is not None:
        raise InvalidDecision(
            f"Tool call {record.tool_call_id!r} ({record.tool}) in thread {thread_id!r} cannot "
            f"be compensated: {why}. Nothing was changed.", thread_id=thread_id,
            tool_call_id=record.tool_call_id)


# -- a whole thread ------------------------------------------------------------------------


@dataclass(frozen=True)
class CancelReport:
    """What `cancel()` did with one thread."""

    thread_id: str
    outcome: Literal["cancelled", "held_elsewhere"]
    """`cancelled` (stopped for good; the lists say what became of its effects), or
    `held_elsewhere`: a worker holds the thread now; nothing was done, try again."""
    compensated: tuple[EffectRecord, ...] = ()
    """Effects undone by their compensation, in the order they were undone."""
    left_in_place: tuple[EffectRecord, ...] = ()
    """Applied effects without a compensation (or with `compensate=False`)."""
    needs_human: tuple[EffectRecord, ...] = ()
    """`compensation_failed`, `compensation_unknown`, or an outcome still `unknown`: a
    person must check them."""
    withdrawn: tuple[EffectRecord, ...] = ()
    """Calls never sent (awaiting approval, or found absent by a lookup)."""
    held_by: str | None = None
    """Who holds the thread (for `held_elsewhere`)."""

    def summary(self) -> str:
        """One line a person can act on."""
        if self.outcome == "held_elsewhere":
            return f"thread {self.thread_id!r} is held by {self.held_by!r}: try again later"
        names = lambda records: ", ".join(f"{r.tool}({r.tool_call_id})" for r in records) or "none"  # noqa: E731
        return (f"thread {self.thread_id!r} cancelled: compensated {names(self.compensated)}; "
                f"left in place {names(self.left_in_place)}; needs a human "
                f"{names(self.needs_human)}; withdrawn {names(self.withdrawn)}")


def cancel(
    graph: Any, saver: Any, thread_id: str, *, compensate: bool = True,
    owner: str = "graph-durable", ttl: float = 30.0,
    effects: Mapping[str, Effect] | None = None,
) -> CancelReport:
    """Stop `thread_id` for good and, with `compensate`, undo its applied effects in
    reverse order, as a saga does.

    - Calls never sent (awaiting approval) are rejected.
    - Calls whose outcome is open are looked up where their tool can be asked: found, they
      join the saga; absent, they are settled as not applied. Otherwise they stay
      `unknown`, listed in `needs_human`.
    - Each applied effect with a compensation is undone (`Effect(compensate=...)`), newest
      first; one without stays, listed in `left_in_place`.

    The thread is marked cancelled before anything else, in its lease row (the lease's
    owner is `cancelled-by:<owner>`), so from then on every write to it, by any worker,
    raises `ThreadCancelled`, and `thread_status` says `cancelled`. A cancel that stopped
    half way (a crash) is finished by running `cancel` again, from any process.

    Returns:
        `CancelReport`; `held_elsewhere` when a worker holds the thread now.
    """
    return Driver(_saver_of(saver)).run(
        _cancel(graph, str(thread_id), compensate, owner, ttl, effects))


async def acancel(
    graph: Any, saver: Any, thread_id: str, *, compensate: bool = True,
    owner: str = "graph-durable", ttl: float = 30.0,
    effects: Mapping[str, Effect] | None = None,
) -> CancelReport:
    """Async `cancel`: the same saga, run with the saver's `a`-prefixed methods, so it
    runs on the event loop of an async saver, where the sync `cancel` refuses. A
    compensation or lookup may be async; a sync one runs on a worker thread. A cancel
    that stopped half way is finished by `cancel` or `acancel`, from any process."""
    return await AsyncDriver(_saver_of(saver)).run(
        _cancel(graph, str(thread_id), compensate, owner, ttl, effects))


def _cancel(graph: Any, thread_id: str, compensate: bool, owner: str, ttl: float,
            effects: Mapping[str, Effect] | None) -> Steps[CancelReport]:
    policies = dict(effects) if effects is not None else policies_of(graph)
    try:
        yield TakeLease(thread_id, CANCEL_PREFIX + owner, ttl)
    except LeaseHeld as held:
        return CancelReport(thread_id, "held_elsewhere", held_by=held.holder)
    withdrawn: list[EffectRecord] = []
    originals = [r for r in (yield Read("effects", (thread_id,))) if not is_compensation(r)]
    for record in originals:
        policy = _policy(policies, record.tool)
        if record.status is S.AWAITING_APPROVAL:
            note = "the thread was cancelled before the call was approved; nothing was sent"
            withdrawn.append((yield from transition(
                record, S.REJECTED, "cancelled", asked=False, decision=None,
                result=answer_message(record, f"Cancelled: {note}", "error"),
                data={"reason": note})))
        elif record.status in (S.IN_FLIGHT, S.UNKNOWN):
            settled = yield from settle_open(record, policy)
            if settled.status in (S.FAILED, S.SKIPPED):
                withdrawn.append(settled)
    records = {r.key: r for r in (yield Read("effects", (thread_id,)))
               if not is_compensation(r)}
    compensated, left, needs_human = [], [], []
    for record in (yield from _newest_applied_first(thread_id, records)):
        compensation = _policy(policies, record.tool).compensation
        if record.status is S.APPLIED and (not compensate or compensation is None):
            left.append(record)
            continue
        if record.status is S.APPLIED:
            assert compensation is not None
            record = yield from compensate_steps(record, compensation, {"cause": "cancel"})
        elif record.status is S.COMPENSATION_UNKNOWN and compensate and compensation:
            record = yield from settle_unknown(record, compensation, {"cause": "cancel"})
        (compensated if record.status is S.COMPENSATED else needs_human).append(record)
    needs_human += [r for r in records.values() if r.status in (S.UNKNOWN, S.IN_FLIGHT)]
    return CancelReport(thread_id, "cancelled", tuple(compensated), tuple(left),
                        tuple(needs_human), tuple(withdrawn))


def _newest_applied_first(thread_id: str, records: Mapping[str, EffectRecord]
                          ) -> Steps[list[EffectRecord]]:
    """The effects that were applied, the last applied first (by their receipt's place in
    the journal), compensated or not."""
    applied_at: dict[str, int] = {}
    for event in (yield Read("events", (thread_id,))):
        if event.kind == "receipt" and event.key in records:
            applied_at.setdefault(event.key, event.seq)
    sent = [r for r in records.values()
            if r.status in (S.APPLIED, S.COMPENSATED, S.COMPENSATION_FAILED,
                            S.COMPENSATION_UNKNOWN)]
    return sorted(sent, key=lambda r: applied_at.get(r.key, 0), reverse=True)
