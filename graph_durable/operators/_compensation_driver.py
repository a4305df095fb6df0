"""The driver of compensation protocols outside a graph (`graph_durable.operators.compensation`).

It performs the operations `graph_durable.nodes.compensation.run_compensation` yields, as
the guard's drivers do inside a graph step: ledger reads and writes on the saver under a
lease's config, the compensation's own call (with `current_effect()` set to its key), its
lookup, sleeps; a question (`Ask`) has nobody to ask outside a graph, so the record is
left saying what a human owes.
"""

from __future__ import annotations

import inspect
import json
import time
from typing import Any

from langchain_core.messages import ToolMessage

from graph_durable.checkpointers._base import actor_of
from graph_durable.leases import Lease
from graph_durable.ledger import EffectRecord, EffectStatus, TransitionWrite
from graph_durable.nodes.compensation import compensation_context, run_compensation
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

__all__ = ["Driver", "answer_message", "call_lookup", "settle_open"]

S = EffectStatus


class Driver:
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
                value = call_lookup(ctx.policy, op.key)
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

    def _context(self, original: EffectRecord, compensation: Compensation,
                 cause: dict[str, Any]) -> CallContext:
        """The context of the compensating call of `original` this try is under."""
        self.compensation, self.original = compensation, original
        return compensation_context(original, compensation,
                                    self.saver.keying(original.thread_id),
                                    _failed_tries(self.saver, original), cause)

    def compensate(self, original: EffectRecord, compensation: Compensation,
                   cause: dict[str, Any]) -> EffectRecord:
        """Undo the applied `original`; its record afterwards."""
        ctx = self._context(original, compensation, cause)
        return self.run(run_compensation(ctx, original), ctx)  # type: ignore[no-any-return]

    def settle_failed(self, original: EffectRecord, compensation: Compensation,
                      decision: dict[str, Any], receipt: Any, *, have_receipt: bool
                      ) -> EffectRecord:
        """A human's word on a `compensation_failed` (or `compensation_unknown`) effect:
        `receipt` says it was undone
        (by the compensation whose outcome was open, or by hand); without one, the
        compensation is tried again: the same call (looked up first where it can be)
        if its outcome is open, a new call if it certainly failed."""
        ctx = self._context(original, compensation, {"decision": decision})
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
        return self.run(run_compensation(ctx, original), ctx)  # type: ignore[no-any-return]

    def settle_unknown(self, original: EffectRecord, compensation: Compensation,
                       cause: dict[str, Any]) -> EffectRecord:
        """Reconcile a `compensation_unknown` effect without a human, as the guard
        reconciles any call: its compensation's lookup (found: undone; certainly absent:
        sent again under its key), else a same-key re-send where the provider dedupes.
        When neither can tell, the effect stays `compensation_unknown` for a human
        (`compensate(receipt=...)` if it was undone, `retry=True` if it was not)."""
        ctx = self._context(original, compensation, cause)
        undo = self.saver.effect(ctx.key, original.thread_id)
        if undo is None or undo.status not in (S.UNKNOWN, S.IN_FLIGHT):
            return self.run(run_compensation(ctx, original), ctx)  # type: ignore[no-any-return]
        policy = compensation.effect
        found = call_lookup(policy, undo.key) if policy.lookup is not None else None
        if found is not None and found.error is None and found.value is not None:
            self.transition(undo, S.APPLIED, "receipt", error=None, receipt=found.value,
                            asked=False, decision=None, result=answer_message(undo, found.value),
                            data={"source": "lookup"})
            return self.run(run_compensation(ctx, original), ctx)  # type: ignore[no-any-return]
        if found is not None and found.error is None:
            why = "a lookup found no effect for the key: send it again, same key"
        elif policy.idempotent:
            why = "provider dedupes: re-send with the same key"
        else:
            return original
        self.transition(undo, undo.status, "decision", asked=False,
                        decision={"type": "retry", "decided_at": time.time()},
                        data={"decision": {"type": "retry"}, "reason": why})
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


def call_lookup(policy: Effect, key: str) -> Outcome:
    """Ask `policy`'s lookup about `key`, outside a graph: its receipt, `None` (certainly
    absent), or an error when it cannot tell (no lookup, it raised, or it is async)."""
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


def settle_open(driver: Driver, record: EffectRecord, policy: Effect,
                 receipt: Any = None, *, have_receipt: bool = False) -> EffectRecord:
    """An effect whose outcome is open (`in_flight`, `unknown`): applied once a lookup
    finds it or a human gives its receipt, not applied once a lookup finds nothing, and
    left as it is (`unknown`) when neither can tell."""
    if have_receipt:
        return driver.transition(
            record, S.APPLIED, "receipt", error=None, receipt=receipt, asked=False,
            decision=None, result=answer_message(record, receipt), data={"source": "human"})
    found = call_lookup(policy, record.key)
    if found.error is None and found.value is not None:
        return driver.transition(
            record, S.APPLIED, "receipt", error=None, receipt=found.value, asked=False,
            decision=None, result=answer_message(record, found.value), data={"source": "lookup"})
    if found.error is None:
        note = f"a lookup found no effect for key {record.key}: nothing was applied, nothing to undo"
        to = S.FAILED if record.status is S.IN_FLIGHT else S.SKIPPED
        return driver.transition(record, to, "resolved", error=None, asked=False, decision=None,
                                 result=answer_message(record, f"Not applied: {note}", "error"),
                                 data={"reason": note})
    if record.status is S.IN_FLIGHT:
        return driver.transition(record, S.UNKNOWN, "unknown",
                                 error="the thread was cancelled while the call was in flight")
    return record


def answer_message(record: EffectRecord, content: Any, status: str = "success") -> ToolMessage:
    """The answer a resumed step replays for `record`'s call."""
    if not isinstance(content, str | list):
        content = json.dumps(content, ensure_ascii=False, default=str)
    return ToolMessage(content=content, name=record.tool, tool_call_id=record.tool_call_id,
                       status=status)
