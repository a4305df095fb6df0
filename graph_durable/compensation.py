"""Undo what a thread did: `compensate()` one effect, or `cancel()` a whole thread as a saga.

    report = cancel(graph, saver, "t1", owner="ops-ana")   # stops t1 for good
    report.compensated, report.left_in_place, report.needs_human

    compensate(graph, saver, "t1", "call_charge", reviewer="ana")   # one applied effect

Each compensation is a guarded effect of its own (`graph_durable.nodes.compensation`):
intent before it is sent, a key derived from the key of the effect it undoes, receipt
after, and its own policy (`Compensation.effect`) decides what a crash in the middle
costs: a lookup, a same-key re-send, or a human's look. Both functions run under a lease
on the thread, so they are fenced against any worker, and both are resumable: run them
again after a crash and they go on where they stopped, never undoing anything twice.

A compensation runs only for an effect known to exist: `applied`, or `unknown` once a
lookup finds it or a human gives its receipt. An `unknown` effect whose lookup finds
nothing is settled as not applied, and nothing is compensated.

Where the policies come from: the graph's `EffectGuardNode`s (subgraphs included), or
`effects=` (give it for graphs built with `EffectGuardMiddleware`, whose policies the
compiled graph does not expose).
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.messages import ToolMessage

from graph_durable.checkpointers._base import actor_of, durable_saver
from graph_durable.errors import GraphDurableError, InvalidDecision, LeaseHeld
from graph_durable.leases import CANCEL_PREFIX, Lease
from graph_durable.ledger import EffectRecord, EffectStatus, TransitionWrite
from graph_durable.nodes.compensation import (
    compensation_context,
    is_compensation,
    run_compensation,
)
from graph_durable.nodes.context import _CURRENT, EffectContext
from graph_durable.nodes.protocol import (
    Ask,
    CallContext,
    CallTool,
    Claim,
    Lookup,
    Outcome,
    Protocol,
    Read,
    Sleep,
    Write,
)
from graph_durable.policy import Compensation, Effect

__all__ = ["CancelReport", "cancel", "compensate", "policies_of"]

S = EffectStatus


# -- where the policies are ----------------------------------------------------------------


def policies_of(graph: Any) -> dict[str, Effect]:
    """`{tool: Effect}` of every `EffectGuardNode` in `graph` and its subgraphs."""
    from graph_durable.nodes.node import EffectGuardNode

    graphs = [graph]
    try:
        graphs += [sub for _, sub in graph.get_subgraphs(recurse=True)]
    except Exception:  # a graph without subgraph support: its own nodes only
        pass
    policies: dict[str, Effect] = {}
    for one in graphs:
        for node in getattr(one, "nodes", {}).values():
            bound = getattr(node, "bound", node)
            if isinstance(bound, EffectGuardNode):
                guard = bound.guard
                for name in bound.tools_by_name:
                    policies.setdefault(name, guard.policy_for(name))
    return policies


def _policy(policies: Mapping[str, Effect], tool: str) -> Effect:
    return policies.get(tool, Effect())


# -- the driver: performs the protocol's operations outside a graph ------------------------


class _Driver:
    """Runs compensation protocols for one thread under `lease`."""

    def __init__(self, saver: Any, lease: Lease, compensation: Compensation | None = None,
                 original: EffectRecord | None = None) -> None:
        self.saver = saver
        self.lease = lease
        self.config = lease.config
        self.compensation = compensation
        self.original = original

    def run(self, protocol: Protocol, ctx: CallContext | None = None) -> Any:
        value: Any = None
        while True:
            try:
                op = protocol.send(value)
            except StopIteration as done:
                return done.value
            if isinstance(op, Read):
                value = getattr(self.saver, op.name)(*op.args)
            elif isinstance(op, Claim):
                value = self.saver.claim(op.intent, self.config)
            elif isinstance(op, Write):
                value = self.saver.apply(op.write, self.config)
            elif isinstance(op, CallTool):
                assert ctx is not None
                value = self._undo(ctx, op)
            elif isinstance(op, Lookup):
                assert ctx is not None
                value = _lookup(ctx.policy, op.key)
            elif isinstance(op, Sleep):
                time.sleep(op.seconds)
            elif isinstance(op, Ask):
                value = None  # outside a graph nobody is asked: the record says what is owed
            else:  # pragma: no cover - the protocol yields nothing else
                raise TypeError(f"unknown protocol operation {op!r}")

    def _undo(self, ctx: CallContext, op: CallTool) -> Outcome:
        """Call the compensation once, as the guard calls a tool."""
        self.lease.check()
        compensation, original = self.compensation, self.original
        assert compensation is not None and original is not None
        effect = EffectContext(key=op.record.key, thread_id=ctx.thread_id,
                               tool_call_id=ctx.tool_call_id, tool=ctx.tool,
                               attempt=op.record.attempts, fencing_token=actor_of(self.config)[1])
        token = _CURRENT.set(effect)
        try:
            undo = compensation.undo
            if hasattr(undo, "invoke"):
                value = undo.invoke(dict(op.record.args))
            else:
                value = undo(original, original.receipt)
            if inspect.isawaitable(value):
                if inspect.iscoroutine(value):
                    value.close()
                raise TypeError(f"compensation {ctx.tool!r} is async; cancel() and "
                                "compensate() call it synchronously")
            return Outcome(value=value if isinstance(value, ToolMessage) else ctx.message(value))
        except Exception as exc:
            return Outcome(error=exc)
        finally:
            _CURRENT.reset(token)

    def compensate(self, original: EffectRecord, compensation: Compensation,
                   cause: dict[str, Any]) -> EffectRecord:
        """Undo `original` (applied or compensation_failed); its record afterwards."""
        keying = self.saver.keying(original.thread_id)
        ctx = compensation_context(original, compensation, keying,
                                   _failed_tries(self.saver, original), cause)
        self.compensation, self.original = compensation, original
        return self.run(run_compensation(ctx, original), ctx)  # type: ignore[no-any-return]

    def settle_failed(self, original: EffectRecord, compensation: Compensation,
                      decision: dict[str, Any], receipt: Any, *, have_receipt: bool
                      ) -> EffectRecord:
        """A human's word on a `compensation_failed` effect: `receipt` says it was undone
        (by the compensation whose outcome was open, or by hand); without one, the
        compensation is tried again: the same call (looked up first where it can be)
        if its outcome is open, a new call if it certainly failed."""
        keying = self.saver.keying(original.thread_id)
        ctx = compensation_context(original, compensation, keying,
                                   _failed_tries(self.saver, original), {"decision": decision})
        undo = self.saver.effect(ctx.key, original.thread_id)
        open_ = undo is not None and undo.status in (S.UNKNOWN, S.IN_FLIGHT)
        if have_receipt:
            if open_:
                assert undo is not None
                if undo.status is S.IN_FLIGHT:
                    undo = self.transition(undo, S.UNKNOWN, "unknown", error=undo.error)
                self.transition(undo, S.APPLIED, "receipt", error=None, receipt=receipt,
                                asked=False, decision=None, data={"source": "human"})
            return self.transition(original, S.COMPENSATED, "compensated", error=None,
                                   data={"source": "human", "decision": decision})
        if open_:
            assert undo is not None
            self.transition(undo, undo.status, "decision", decision={"type": "retry",
                            "decided_at": time.time()}, asked=False,
                            data={"decision": {"type": "retry"}})
        self.compensation, self.original = compensation, original
        return self.run(run_compensation(ctx, original), ctx)  # type: ignore[no-any-return]

    def transition(self, record: EffectRecord, to: EffectStatus, kind: str,
                   **fields: Any) -> EffectRecord:
        [after] = self.saver.apply(TransitionWrite(
            thread_id=record.thread_id, key=record.key, to=to, kind=kind, **fields), self.config)
        return after  # type: ignore[no-any-return]


def _failed_tries(saver: Any, original: EffectRecord) -> int:
    """How many compensations of `original` certainly failed (each retry is a new call)."""
    return sum(1 for e in saver.events(original.thread_id, original.key)
               if e.kind == "compensation_failed" and e.data.get("status") == S.FAILED.value)


def _lookup(policy: Effect, key: str) -> Outcome:
    if policy.lookup is None:
        return Outcome(error=LookupError("no lookup"))
    try:
        found = policy.lookup(key)
    except Exception as exc:
        return Outcome(error=exc)
    if inspect.isawaitable(found):
        if inspect.iscoroutine(found):
            found.close()
        return Outcome(error=TypeError("the lookup is async; cancel() calls it synchronously"))
    return Outcome(value=found)


def _saver_of(saver: Any) -> Any:
    found = durable_saver(saver)
    if found is None:
        raise GraphDurableError(f"{type(saver).__name__} keeps no effect ledger: pass the "
                                "graph's durable saver")
    return found


def _settle_open(driver: _Driver, record: EffectRecord, policy: Effect,
                 receipt: Any = None, *, have_receipt: bool = False) -> EffectRecord:
    """An effect whose outcome is open (`in_flight`, `unknown`): applied once a lookup
    finds it or a human gives its receipt, not applied once a lookup finds nothing, and
    left as it is (`unknown`) when neither can tell."""
    if have_receipt:
        return driver.transition(
            record, S.APPLIED, "receipt", error=None, receipt=receipt, asked=False,
            decision=None, result=_message(record, receipt), data={"source": "human"})
    found = _lookup(policy, record.key)
    if found.error is None and found.value is not None:
        return driver.transition(
            record, S.APPLIED, "receipt", error=None, receipt=found.value, asked=False,
            decision=None, result=_message(record, found.value), data={"source": "lookup"})
    if found.error is None:
        note = f"a lookup found no effect for key {record.key}: nothing was applied, nothing to undo"
        to = S.FAILED if record.status is S.IN_FLIGHT else S.SKIPPED
        return driver.transition(record, to, "resolved", error=None, asked=False, decision=None,
                                 result=_message(record, f"Not applied: {note}", "error"),
                                 data={"reason": note})
    if record.status is S.IN_FLIGHT:
        return driver.transition(record, S.UNKNOWN, "unknown",
                                 error="the thread was cancelled while the call was in flight")
    return record


def _message(record: EffectRecord, content: Any, status: str = "success") -> ToolMessage:
    """The answer a resumed step replays for `record`'s call."""
    if not isinstance(content, str | list):
        content = json.dumps(content, ensure_ascii=False, default=str)
    return ToolMessage(content=content, name=record.tool, tool_call_id=record.tool_call_id,
                       status=status)


# -- one effect ------------------------------------------------------------------------


def compensate(
    graph: Any, saver: Any, thread_id: str, call: str, *, receipt: Any = None,
    reviewer: str | None = None, owner: str | None = None, ttl: float = 30.0,
    effects: Mapping[str, Effect] | None = None, **kwargs: Any,
) -> EffectRecord:
    """Carry out a reviewer's `{"type": "compensate"}` on one effect of `thread_id`.

    `call` is the tool_call_id (or the effect key) of the effect to undo. It runs its
    compensation if the effect is `applied`, and for an `unknown` (or `in_flight`) effect
    only once it is known to exist: its lookup finds it, or `receipt=` is a human's word
    that it happened. On a `compensation_failed` effect, `receipt=` is a human's word
    that it was undone (by the compensation, or by hand); without it the compensation is
    tried again (the same call, looked up first, if its outcome was open). If the lookup finds nothing, the
    effect is settled as not applied and nothing is compensated (its record says why).
    The decision is journaled before it takes effect. A thread paused on the effect's
    question goes on from there when resumed: its call answers with what was recorded.

    Returns:
        The effect's record afterwards: `compensated`; `compensation_failed` (`error` says
        why); `skipped`/`failed` when a lookup showed it never happened; or `unknown`
        when nothing could tell.

    Raises:
        InvalidDecision: the effect cannot be compensated (no compensation in its policy,
            never sent, or already settled otherwise); nothing was changed.
        LeaseHeld: a worker holds the thread; try again once it has stopped.
    """
    if kwargs:
        raise TypeError(f"compensate() got unexpected arguments {sorted(kwargs)}")
    saver = _saver_of(saver)
    thread_id = str(thread_id)
    have_receipt = receipt is not None
    record = _find(saver, thread_id, call)
    policies = dict(effects) if effects is not None else policies_of(graph)
    policy = _policy(policies, record.tool)
    _check_compensable(record, policy, thread_id, have_receipt)
    who = owner or f"compensate:{reviewer or 'reviewer'}"
    if thread_id in saver.cancelled_threads():
        who = CANCEL_PREFIX + who  # settling what a cancel left to a human
    with saver.lease(thread_id, who, ttl) as lease:
        driver = _Driver(saver, lease)
        record = _find(saver, thread_id, call)  # as it stands under the lease
        _check_compensable(record, policy, thread_id, have_receipt)
        decision = {"type": "compensate", **({"reviewer": reviewer} if reviewer else {}),
                    **({"receipt": receipt} if have_receipt else {})}
        if record.status is not S.APPLIED:
            # Journaled before it takes effect; an applied effect's compensation journals
            # the decision with its own intent (an applied record does not move otherwise).
            record = driver.transition(record, record.status, "decision",
                                       data={"decision": decision}, redact=policy.redact)
        assert policy.compensation is not None
        if record.status is S.COMPENSATION_FAILED:
            return driver.settle_failed(record, policy.compensation, decision, receipt,
                                        have_receipt=have_receipt)
        if record.status in (S.IN_FLIGHT, S.UNKNOWN):
            record = _settle_open(driver, record, policy, receipt, have_receipt=have_receipt)
        if record.status is S.APPLIED:
            record = driver.compensate(record, policy.compensation, {"decision": decision})
        return record


def _find(saver: Any, thread_id: str, call: str) -> EffectRecord:
    records = [r for r in saver.effects(thread_id)
               if (r.tool_call_id == call or r.key == call) and not is_compensation(r)]
    if not records:
        raise InvalidDecision(
            f"Thread {thread_id!r} has no effect for tool call {call!r}; nothing was changed. "
            "`graph-durable effects --thread ...` lists them.", thread_id=thread_id,
            tool_call_id=call)
    return records[-1]


def _check_compensable(record: EffectRecord, policy: Effect, thread_id: str,
                       have_receipt: bool) -> None:
    why = None
    if policy.compensation is None:
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
    """`compensation_failed`, or an outcome still `unknown`: a person must check them."""
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
    saver = _saver_of(saver)
    thread_id = str(thread_id)
    policies = dict(effects) if effects is not None else policies_of(graph)
    with ExitStack() as stack:
        try:
            lease = stack.enter_context(saver.lease(thread_id, CANCEL_PREFIX + owner, ttl))
        except LeaseHeld as held:
            return CancelReport(thread_id, "held_elsewhere", held_by=held.holder)
        return _cancel_under(_Driver(saver, lease), thread_id, policies, compensate)


def _cancel_under(driver: _Driver, thread_id: str, policies: Mapping[str, Effect],
                  compensate: bool) -> CancelReport:
    saver = driver.saver
    withdrawn: list[EffectRecord] = []
    originals = [r for r in saver.effects(thread_id) if not is_compensation(r)]
    for record in originals:
        policy = _policy(policies, record.tool)
        if record.status is S.AWAITING_APPROVAL:
            note = "the thread was cancelled before the call was approved; nothing was sent"
            withdrawn.append(driver.transition(
                record, S.REJECTED, "cancelled", asked=False, decision=None,
                result=_message(record, f"Cancelled: {note}", "error"), data={"reason": note}))
        elif record.status in (S.IN_FLIGHT, S.UNKNOWN):
            settled = _settle_open(driver, record, policy)
            if settled.status in (S.FAILED, S.SKIPPED):
                withdrawn.append(settled)
    records = {r.key: r for r in saver.effects(thread_id) if not is_compensation(r)}
    compensated, left, needs_human = [], [], []
    for record in _newest_applied_first(saver, thread_id, records):
        compensation = _policy(policies, record.tool).compensation
        if record.status is S.APPLIED and (not compensate or compensation is None):
            left.append(record)
            continue
        if record.status is S.APPLIED:
            assert compensation is not None
            record = driver.compensate(record, compensation, {"cause": "cancel"})
        (compensated if record.status is S.COMPENSATED else needs_human).append(record)
    needs_human += [r for r in records.values() if r.status in (S.UNKNOWN, S.IN_FLIGHT)]
    return CancelReport(thread_id, "cancelled", tuple(compensated), tuple(left),
                        tuple(needs_human), tuple(withdrawn))


def _newest_applied_first(saver: Any, thread_id: str, records: Mapping[str, EffectRecord]
                          ) -> list[EffectRecord]:
    """The effects that were applied, the last applied first (by their receipt's place in
    the journal), compensated or not."""
    applied_at: dict[str, int] = {}
    for event in saver.events(thread_id):
        if event.kind == "receipt" and event.key in records:
            applied_at.setdefault(event.key, event.seq)
    sent = [r for r in records.values()
            if r.status in (S.APPLIED, S.COMPENSATED, S.COMPENSATION_FAILED)]
    return sorted(sent, key=lambda r: applied_at.get(r.key, 0), reverse=True)
