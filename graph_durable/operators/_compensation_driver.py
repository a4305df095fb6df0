"""The drivers of compensations outside a graph (`graph_durable.operators.compensation`), sync
and async.

What `compensate()` and `cancel()` decide is written once, as generators that yield
operations, as the guard's protocol is (`graph_durable.nodes.protocol`): the compensation
protocol's own (`run_compensation`: ledger reads and writes, the compensation's call, its
lookup, sleeps), plus `TakeLease` (hold the thread until the run ends), `Undo` (call a
compensation, with `current_effect()` set to its key) and `AskLookup` (ask a policy's
lookup about a key). `Driver` performs them with the saver's sync methods, `AsyncDriver`
with its `a`-prefixed ones, so an async saver is never called synchronously on its own
event loop. A question (`Ask`) has nobody to ask outside a graph, so the record is left
saying what a human owes. An operation that raises is thrown back into the generator.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Generator, Iterator
from contextlib import AsyncExitStack, ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from langchain_core.messages import ToolMessage

from graph_durable import telemetry
from graph_durable.checkpointers._base import actor_of
from graph_durable.errors import NotApplied
from graph_durable.leases import Lease
from graph_durable.ledger import EffectRecord, EffectStatus, TransitionWrite, receipt_message
from graph_durable.nodes.async_driver import aperform
from graph_durable.nodes.compensation import compensation_context, run_compensation
from graph_durable.nodes.context import _CURRENT, EffectContext
from graph_durable.nodes.operations import (
    Ask,
    CallTool,
    Failed,
    Join,
    Lookup,
    Read,
    Write,
    aperformed,
    performed,
)
from graph_durable.nodes.outcomes import (
    Attempt,
    Outcome,
    Raised,
    Returned,
    acall_lookup,
    call_lookup,
    classify,
)
from graph_durable.nodes.protocol import CallContext, Protocol
from graph_durable.nodes.sync_driver import perform
from graph_durable.policy import Compensation, Effect

__all__ = ["AskLookup", "AsyncDriver", "Driver", "Steps", "TakeLease", "Undo",
           "answer_message", "compensate_steps", "settle_failed", "settle_open",
           "settle_unknown", "transition"]

_USE_ASYNC = "cancel() and compensate() call it synchronously: use acancel() or acompensate()"

S = EffectStatus
T = TypeVar("T")

Steps = Generator[Any, Any, T]
"""A run of compensation logic: yields operations, receives their results, returns `T`."""


@dataclass(frozen=True)
class TakeLease:
    """Operation: hold `thread_id` as `owner` until the run ends (raises `LeaseHeld`);
    every later ledger write presents its fencing token. The result is the `Lease`."""

    thread_id: str
    owner: str
    ttl: float


@dataclass(frozen=True)
class Undo:
    """Operation: call `compensation` once for the compensating call `ctx` of
    `original`; the result is an `Outcome`."""

    ctx: CallContext
    compensation: Compensation
    original: EffectRecord
    call: CallTool


@dataclass(frozen=True)
class AskLookup:
    """Operation: ask `policy`'s lookup (of the call to `tool`) about `key`; the result
    is an `Outcome` (see `outcomes.call_lookup`)."""

    policy: Effect
    key: str
    tool: str


class _Driver:
    """What both drivers hold: the saver, and the lease the steps took (if any)."""

    def __init__(self, saver: Any) -> None:
        self.saver = saver
        self.lease: Lease | None = None

    @property
    def config(self) -> dict[str, Any] | None:
        return None if self.lease is None else self.lease.config


class Driver(_Driver):
    """Performs compensation steps with the saver's sync methods."""

    def run(self, steps: Steps[T]) -> T:
        """Perform `steps` to their end; a lease they took is released then."""
        with ExitStack() as stack:
            return performed(  # type: ignore[no-any-return]
                steps, lambda op: self._attempt(op, stack))

    def _attempt(self, op: Any, stack: ExitStack) -> Any:
        """`op`'s result, or `Failed` if it raised (thrown back into the steps)."""
        try:
            return self._perform(op, stack)
        except Exception as exc:
            return Failed(exc)

    def _perform(self, op: Any, stack: ExitStack) -> Any:
        if isinstance(op, TakeLease):
            self.lease = stack.enter_context(self.saver.lease(op.thread_id, op.owner, op.ttl))
            return self.lease
        if isinstance(op, Undo):
            with _compensating(op, self.lease), _observed_undo(op) as observed:
                with observed.undo():
                    outcome = _undo(op)
                observed.outcome(_undo_outcome(outcome))
                return outcome
        if isinstance(op, AskLookup):
            return call_lookup(op.policy, op.key, tool=op.tool, use_async=_USE_ASYNC)
        return perform(self.saver, self.config, op)


class AsyncDriver(_Driver):
    """Performs compensation steps with the saver's async (`a`-prefixed) methods; a sync
    compensation or lookup runs on a worker thread, never on the event loop."""

    async def run(self, steps: Steps[T]) -> T:
        """Perform `steps` to their end; a lease they took is released then."""
        async with AsyncExitStack() as stack:
            return await aperformed(  # type: ignore[no-any-return]
                steps, lambda op: self._aattempt(op, stack))

    async def _aattempt(self, op: Any, stack: AsyncExitStack) -> Any:
        """`op`'s result, or `Failed` if it raised (thrown back into the steps)."""
        try:
            return await self._perform(op, stack)
        except Exception as exc:
            return Failed(exc)

    async def _perform(self, op: Any, stack: AsyncExitStack) -> Any:
        if isinstance(op, TakeLease):
            alease = getattr(self.saver, "alease", None)
            if alease is None:  # a sync saver: its lease is taken as its writes are, at once
                self.lease = stack.enter_context(
                    self.saver.lease(op.thread_id, op.owner, op.ttl))
            else:
                self.lease = await stack.enter_async_context(
                    alease(op.thread_id, op.owner, op.ttl))
            return self.lease
        if isinstance(op, Undo):
            with _compensating(op, self.lease):
                async with _observed_undo(op) as observed:
                    with observed.undo():
                        outcome = await _aundo(op)
                    observed.outcome(_undo_outcome(outcome))
                    return outcome
        if isinstance(op, AskLookup):
            return await acall_lookup(op.policy, op.key)
        return await aperform(self.saver, self.config, op)


def _observed_undo(op: Undo) -> telemetry.ObservedCall:
    """The compensating call as telemetry sees it (kind `compensation`)."""
    ctx = op.ctx
    return telemetry.observe(telemetry.CallInfo(
        ctx.thread_id, ctx.tool, ctx.tool_call_id, op.call.record.key,
        telemetry.policy_label(ctx.policy), "compensation"))


def _undo_outcome(outcome: Outcome) -> telemetry.CallOutcome:
    """What a compensation's attempt says of the undo: done, certainly not done, or
    not known (the ledger's `compensation_unknown`)."""
    if isinstance(outcome, Returned) and not (isinstance(outcome.value, ToolMessage)
                                              and outcome.value.status == "error"):
        return telemetry.CallOutcome.COMPENSATED
    if isinstance(outcome, Raised) and isinstance(outcome.error, NotApplied):
        return telemetry.CallOutcome.COMPENSATION_FAILED
    return telemetry.CallOutcome.COMPENSATION_UNKNOWN


@contextmanager
def _compensating(op: Undo, lease: Lease | None) -> Iterator[None]:
    """Check the lease, then set `current_effect()` to the compensating call's key for
    as long as the compensation runs."""
    assert lease is not None, "a compensation runs under a lease"
    lease.check()
    ctx, record = op.ctx, op.call.record
    token = _CURRENT.set(EffectContext(
        key=record.key, thread_id=ctx.thread_id, tool_call_id=ctx.tool_call_id, tool=ctx.tool,
        attempt=record.attempts, fencing_token=actor_of(lease.config)[1]))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def _undo(op: Undo) -> Outcome:
    """Call the compensation synchronously; what it answered, or its error."""
    undo = op.compensation.undo
    try:
        if hasattr(undo, "invoke"):
            value = undo.invoke(dict(op.call.record.args))
        else:
            value = undo(op.original, op.original.receipt)
        if inspect.isawaitable(value):
            if inspect.iscoroutine(value):
                value.close()
            raise TypeError(f"compensation {op.ctx.tool!r} is async; {_USE_ASYNC}")
        return _undone(op, Attempt(value=value))
    except Exception as exc:  # noqa: BLE001 - classify reads it
        return _undone(op, Attempt(error=exc))


async def _aundo(op: Undo) -> Outcome:
    """Call the compensation from async code; what it answered, or its error."""
    undo = op.compensation.undo
    try:
        if hasattr(undo, "ainvoke"):
            value = await undo.ainvoke(dict(op.call.record.args))
        elif inspect.iscoroutinefunction(undo):
            value = await undo(op.original, op.original.receipt)
        else:  # copies the context: current_effect() is set on the worker thread
            value = await asyncio.to_thread(undo, op.original, op.original.receipt)
            if inspect.isawaitable(value):
                value = await value
        return _undone(op, Attempt(value=value))
    except Exception as exc:  # noqa: BLE001 - classify reads it
        return _undone(op, Attempt(error=exc))


def _undone(op: Undo, attempt: Attempt) -> Outcome:
    """What the compensation's attempt came to; a receipt that is not a ToolMessage is
    carried by one."""
    outcome = classify(attempt)
    if isinstance(outcome, Returned) and not isinstance(outcome.value, ToolMessage):
        return Returned(op.ctx.message(outcome.value))
    return outcome


# -- the steps, written once -----------------------------------------------------------------


def _undoing(ctx: CallContext, compensation: Compensation, original: EffectRecord,
             protocol: Protocol) -> Steps[EffectRecord]:
    """`protocol` (a compensation's), its call and lookups made operations of their own:
    the compensating call calls the compensation, and is looked up by its own policy."""
    value: Any = None
    while True:
        try:
            op = protocol.send(value)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        if isinstance(op, CallTool):
            value = yield Undo(ctx, compensation, original, op)
        elif isinstance(op, Lookup):
            value = yield AskLookup(ctx.policy, op.key, ctx.tool)
        elif isinstance(op, Ask):
            value = None  # outside a graph nobody is asked: the record says what is owed
        elif isinstance(op, Join):
            value = None  # a compensation runs alone: no other call to wait for
        else:
            value = yield op


def _context(original: EffectRecord, compensation: Compensation,
             cause: dict[str, Any]) -> Steps[CallContext]:
    """The context of the compensating call of `original` this try is under."""
    keying = yield Read("keying", (original.thread_id,))
    events = yield Read("events", (original.thread_id, original.key))
    return compensation_context(original, compensation, keying, _failed_tries(events), cause)


def compensate_steps(original: EffectRecord, compensation: Compensation,
                     cause: dict[str, Any]) -> Steps[EffectRecord]:
    """Undo the applied `original`; its record afterwards."""
    ctx = yield from _context(original, compensation, cause)
    return (yield from _undoing(ctx, compensation, original, run_compensation(ctx, original)))


def settle_failed(original: EffectRecord, compensation: Compensation,
                  decision: dict[str, Any], receipt: Any, *, have_receipt: bool
                  ) -> Steps[EffectRecord]:
    """A human's word on a `compensation_failed` (or `compensation_unknown`) effect:
    `receipt` says it was undone
    (by the compensation whose outcome was open, or by hand); without one, the
    compensation is tried again: the same call (looked up first where it can be)
    if its outcome is open, a new call if it certainly failed."""
    ctx = yield from _context(original, compensation, {"decision": decision})
    undo = yield Read("effect", (ctx.key, original.thread_id))
    open_ = undo is not None and undo.status in (S.UNKNOWN, S.IN_FLIGHT)
    if have_receipt:
        if open_:
            assert undo is not None
            if undo.status is S.IN_FLIGHT:
                undo = yield from transition(undo, S.UNKNOWN, "unknown", error=undo.error)
            yield from transition(undo, S.APPLIED, "receipt", error=None, receipt=receipt,
                                  asked=False, decision=None, data={"source": "human"})
        return (yield from transition(original, S.COMPENSATED, "compensated", error=None,
                                      data={"source": "human", "decision": decision}))
    if open_:
        assert undo is not None
        yield from transition(undo, undo.status, "decision", decision={
            "type": "retry", "decided_at": time.time()}, asked=False,
            data={"decision": {"type": "retry"}})
    return (yield from _undoing(ctx, compensation, original, run_compensation(ctx, original)))


def settle_unknown(original: EffectRecord, compensation: Compensation,
                   cause: dict[str, Any]) -> Steps[EffectRecord]:
    """Reconcile a `compensation_unknown` effect without a human, as the guard
    reconciles any call: its compensation's lookup (found: undone; certainly absent:
    sent again under its key), else a same-key re-send where the provider dedupes.
    When neither can tell, the effect stays `compensation_unknown` for a human
    (`compensate(receipt=...)` if it was undone, `retry=True` if it was not)."""
    ctx = yield from _context(original, compensation, cause)
    undo = yield Read("effect", (ctx.key, original.thread_id))
    if undo is None or undo.status not in (S.UNKNOWN, S.IN_FLIGHT):
        return (yield from _undoing(ctx, compensation, original, run_compensation(ctx, original)))
    policy = compensation.effect
    found = (yield AskLookup(policy, undo.key, undo.tool)) if policy.lookup is not None else None
    if isinstance(found, Returned) and found.value is not None:
        yield from transition(undo, S.APPLIED, "receipt", error=None, receipt=found.value,
                              asked=False, decision=None,
                              result=answer_message(undo, found.value), data={"source": "lookup"})
        return (yield from _undoing(ctx, compensation, original, run_compensation(ctx, original)))
    if isinstance(found, Returned):
        why = "a lookup found no effect for the key: send it again, same key"
    elif policy.idempotent:
        why = "provider dedupes: re-send with the same key"
    else:
        return original
    yield from transition(undo, undo.status, "decision", asked=False,
                          decision={"type": "retry", "decided_at": time.time()},
                          data={"decision": {"type": "retry"}, "reason": why})
    return (yield from _undoing(ctx, compensation, original, run_compensation(ctx, original)))


def transition(record: EffectRecord, to: EffectStatus, kind: str,
               **fields: Any) -> Steps[EffectRecord]:
    """Move `record` to `to`, journaling `kind`; its record afterwards."""
    [after] = yield Write(TransitionWrite(
        thread_id=record.thread_id, key=record.key, to=to, kind=kind, **fields))
    return after  # type: ignore[no-any-return]


def _failed_tries(events: list[Any]) -> int:
    """How many compensations of an effect certainly failed, from its journal `events`
    (each retry is a new call)."""
    return sum(1 for e in events
               if e.kind == "compensation_failed" and e.data.get("status") == S.FAILED.value)


def settle_open(record: EffectRecord, policy: Effect, receipt: Any = None, *,
                have_receipt: bool = False) -> Steps[EffectRecord]:
    """An effect whose outcome is open (`in_flight`, `unknown`): applied once a lookup
    finds it or a human gives its receipt, not applied once a lookup finds nothing, and
    left as it is (`unknown`) when neither can tell."""
    if have_receipt:
        return (yield from transition(
            record, S.APPLIED, "receipt", error=None, receipt=receipt, asked=False,
            decision=None, result=answer_message(record, receipt), data={"source": "human"}))
    found = yield AskLookup(policy, record.key, record.tool)
    if isinstance(found, Returned) and found.value is not None:
        return (yield from transition(
            record, S.APPLIED, "receipt", error=None, receipt=found.value, asked=False,
            decision=None, result=answer_message(record, found.value), data={"source": "lookup"}))
    if isinstance(found, Returned):
        note = f"a lookup found no effect for key {record.key}: nothing was applied, nothing to undo"
        to = S.FAILED if record.status is S.IN_FLIGHT else S.SKIPPED
        return (yield from transition(
            record, to, "resolved", error=None, asked=False, decision=None,
            result=answer_message(record, f"Not applied: {note}", "error"), data={"reason": note}))
    if record.status is S.IN_FLIGHT:
        return (yield from transition(
            record, S.UNKNOWN, "unknown",
            error="the thread was cancelled while the call was in flight"))
    return record


def answer_message(record: EffectRecord, content: Any, status: str = "success") -> ToolMessage:
    """The answer a resumed step replays for `record`'s call."""
    return receipt_message(content, record.tool, record.tool_call_id, status)
