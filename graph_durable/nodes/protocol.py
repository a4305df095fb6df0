"""The effect protocol for one tool call, written once for sync and async drivers.

`run_call` is a generator that *yields operations* (read the ledger, write the ledger,
call the tool, look a key up, sleep, ask a human: `graph_durable.nodes.operations`) and
receives their results; the sync and async drivers (`sync_driver.py`, `async_driver.py`)
perform them. The protocol follows the crash-window table of the design: a receipt is
replayed, an intent without a receipt is reconciled (lookup, else re-send with the same
key if the provider dedupes, else `unknown` and a human decides), and every decision is
journaled before it takes effect.

Longer than 400 lines for a reason: the length is the point. The module is the one
generator `run_call` and the sub-generators it delegates to (`_resume`, `_send` with
`_applied` and `_failed`, `_reconcile`, `_ask`, `_act_on_decision` with
`_sent_in_family`, `_not_sent` and `_send_edited`), which follow the crash-window table
row by row; read together they are the whole protocol, and split they would each need
the others' states to make sense. `_send` acts on the call's `Outcome` (decided by
`outcomes.classify`) with one `match`, and `_act_on_decision` on a journaled decision
with one `match` arm per kind. What is not the protocol lives beside it: the operations
(`operations.py`), the call's context and key (`call_context.py`), what a call came
back with (`outcomes.py`), and how a tool's result is rebuilt and replayed
(`results.py`).
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.types import Command

from graph_durable.errors import GraphDurableError, NotApplied, Retryable
from graph_durable.nodes.run_once import EditedIntoEachOther
from graph_durable.faults import fault_point
from graph_durable.ledger import (
    FROM_RECEIPT,
    SENT_STATUSES,
    TERMINAL_STATUSES,
    EffectRecord,
    EffectStatus,
    IntentWrite,
    Keying,
    WriteBatch,
    derive_key,
)
from graph_durable.nodes.call_context import CallContext
from graph_durable.nodes.decisions import approval_payload, unknown_payload
from graph_durable.nodes.operations import (
    Ask,
    CallTool,
    Claim,
    Join,
    Lookup,
    Read,
    Sleep,
    Write,
)
from graph_durable.nodes.outcomes import (
    ArgsRefused,
    Outcome,
    Overruled,
    Paused,
    Raised,
    Returned,
    StillRunning,
    TimedOut,
)
from graph_durable.nodes.results import (
    answering,
    note_edit,
    rebound,
    rebuilt_by_lookup,
    receipt_of,
)

__all__ = [
    "Ask",
    "CallContext",
    "Claim",
    "CallTool",
    "Lookup",
    "Outcome",
    "Read",
    "Sleep",
    "Write",
    "run_call",
]

S = EffectStatus

Protocol = Generator[Any, Any, Any]


def _error_text(outcome: Outcome, timeout: float | None) -> str:
    match outcome:
        case TimedOut():
            return (f"no answer within {timeout} s (timeout); the attempt may still land, "
                    "so nothing is sent again until the effect is found or a human decides")
        case Raised(error) | StillRunning(error) | ArgsRefused(error) | Overruled(error, _):
            return f"{type(error).__name__}: {error}"
        case Returned(ToolMessage() as result):
            return ("the tool reported an error after it started, so the effect may exist: "
                    f"{result.content}")
    return repr(outcome)


@dataclass(frozen=True)
class _Found:
    """A lookup found the effect: the call's answer and the receipt recorded for it."""

    result: Any
    receipt: Any


def _found_answer(ctx: CallContext, found: Outcome) -> _Found | Outcome:
    """What a lookup found: `_Found` with the call's answer and receipt, `Returned(None)`
    when the effect is certainly absent, and any other outcome when it cannot tell.

    `None` is "certainly absent"; any other value but a bool is the receipt (`{}`, `0`
    and `""` included). A lookup that returns the ToolMessage or Command the tool would
    have returned gives that result, made to answer this call; any other value is the
    receipt, and the model gets a ToolMessage carrying it. A bool, or a Command that
    cannot answer the call, is a lookup that cannot tell.
    """
    if not isinstance(found, Returned) or found.value is None:
        return found
    value = found.value
    if isinstance(value, bool):
        return Raised(GraphDurableError(
            f"the lookup of tool {ctx.tool!r} returned {value!r} for tool call "
            f"{ctx.tool_call_id!r} in thread {ctx.thread_id!r}, which is neither a receipt "
            "nor None; make the lookup return the provider's record of the effect when it "
            "exists and None when it certainly does not",
            thread_id=ctx.thread_id, tool_call_id=ctx.tool_call_id))
    if not isinstance(value, ToolMessage | Command):
        return _Found(ctx.message(value), value)
    try:
        result = answering(value, ctx.tool_call_id, ctx.tool)
    except ValueError as exc:
        return Raised(exc)
    return _Found(result, receipt_of(result))


def _lookup_error_text(ctx: CallContext, found: Outcome) -> str:
    if isinstance(found, TimedOut):
        return (f"lookup failed: no answer within {ctx.policy.timeout} s (timeout), "
                "so it cannot tell whether the effect exists")
    return f"lookup failed: {_error_text(found, None)}"


def run_call(ctx: CallContext) -> Protocol:
    """The whole protocol for one guarded tool call; returns its ToolMessage or Command."""
    approval = ctx.policy.needs_approval(ctx.tool_call)
    fault_point("before_intent", tool=ctx.tool)
    record, created = yield Claim(_intent(ctx, S.AWAITING_APPROVAL if approval else S.IN_FLIGHT,
                                          keying=ctx.predicted_keying))
    if not created:
        return (yield from _resume(ctx, record))
    if approval:
        return (yield from _ask(ctx, record))
    fault_point("after_intent", tool=ctx.tool)
    return (yield from _send(ctx, record, may_resend=True))


def _intent(ctx: CallContext, status: EffectStatus, *, record_args: dict[str, Any] | None = None,
            key: str | None = None, keying: Keying | None = None) -> IntentWrite:
    if record_args is None and ctx.requested_args is not None:
        record_args = ctx.tool_call["args"]  # changed before the guard: what is sent
    return IntentWrite(
        key=key or ctx.key,
        thread_id=ctx.thread_id,
        checkpoint_ns=ctx.checkpoint_ns,
        tool_call_id=ctx.tool_call_id,
        tool=ctx.tool,
        args=record_args if record_args is not None else ctx.tool_call["args"],
        status=status,
        args_json=None if record_args is not None else ctx.args_json,
        # An edit's args are the only copy of what must be sent: never redacted.
        redact=None if record_args is not None else ctx.policy.redact,
        key_scheme=ctx.key_scheme,
        data=ctx.intent_data,
        keying=keying,
    )


def _resume(ctx: CallContext, record: EffectRecord,
            followed: frozenset[str] = frozenset()) -> Protocol:
    """An effect the ledger already knows: replay, reconcile, or act on a decision.
    `followed`: the keys of the calls this one was edited from, on the way here."""
    if record.status in TERMINAL_STATUSES:
        if (record.decision or {}).get("edited_key") is not None:
            return (yield from _resume_edited(ctx, (yield from _edited_call(
                ctx, record.decision)), followed | {record.key}))
        stored = yield Read("stored_result", (ctx.thread_id, record.key))
        ctx.outcome = "replayed"
        return rebound(stored, ctx.tool_call_id, (record.tool_call_id,))
    if record.decision is not None:
        return (yield from _act_on_decision(ctx, record))
    if record.status is S.IN_FLIGHT:
        # An open intent that another thread of the family (a copy, or the thread this
        # one was copied from) also holds may be on its way there right now, where this
        # thread's lease says nothing: a lookup that finds nothing yet proves nothing,
        # so the call is not sent again from here unless the provider dedupes. What
        # became of it there is taken over (a receipt), else reconciled without a send.
        sent = yield Read("sent_in_family", (record.key, ctx.thread_id))
        if sent is not None and (sent.status in SENT_STATUSES or not ctx.policy.idempotent):
            return (yield from _adopt_family_send(ctx, record, sent, {}))
        return (yield from _reconcile(ctx, record, may_resend=True))
    if record.status is S.UNKNOWN and ctx.policy.lookup is not None:
        # An outcome left unknown (a cancelled run, a timeout, an error once the tool had
        # started) may have been settled since: a hit is the receipt. A miss proves
        # nothing while an attempt may still land, so it is never sent again from here.
        found = _found_answer(ctx, (yield Lookup(record.key)))
        if isinstance(found, _Found):
            yield Write(ctx.transition(record, S.APPLIED, "receipt", error=None,
                                       receipt=found.receipt, result=found.result,
                                       asked=False, data={"source": "lookup"}))
            ctx.outcome = "reconciled"
            return found.result
    # awaiting_approval or unknown, and no decision yet: ask (again).
    return (yield from _ask(ctx, record))


def _send(ctx: CallContext, record: EffectRecord, *, may_resend: bool) -> Protocol:
    """Call the tool with the record's key; retry `Retryable`; act on the outcome."""
    while True:
        outcome = yield CallTool(record, args=record.args)
        match outcome:
            case Paused(interrupt):
                ctx.outcome = "paused_tool"
                yield Write(ctx.transition(
                    record, S.IN_FLIGHT, "paused", decision={"type": "resume_tool"},
                    data={"reason": "the tool paused on its own interrupt before applying "
                                    "anything"}))
                raise interrupt
            case Overruled(_, refusal):
                ctx.outcome = "refused"
                # The call stays in flight, as after a crash: the next run reconciles it
                # (lookup, same-key re-send, or a human) instead of trusting a middleware
                # that re-calls tools inside the guard.
                yield Write(ctx.transition(
                    record, S.IN_FLIGHT, "refused", error=_error_text(outcome, None),
                    data={"reason": "a middleware inside the guard overruled the tool"}))
                raise refusal
            case Returned(result) if not (isinstance(result, ToolMessage)
                                          and result.status == "error"):
                return (yield from _applied(ctx, record, result))
            case ArgsRefused(error) | Raised(NotApplied() as error):
                # Only these say "not applied": the args never reached the tool's body, or
                # the tool says so. Any other error once the body ran (an exception, an
                # error ToolMessage, a `ToolException` a handler turned into one) leaves
                # the effect unknown.
                return (yield from _failed(ctx, record, outcome, f"Not applied: {error}"))
            case Raised(Retryable() as error):
                if record.attempts > ctx.policy.retries:
                    return (yield from _failed(
                        ctx, record, outcome,
                        f"Not applied after {record.attempts} attempts: {error}"))
                yield Sleep(min(0.05 * 2 ** (record.attempts - 1), 2.0))
                [record] = yield Write(ctx.transition(
                    record, S.IN_FLIGHT, "attempt", bump_attempts=True,
                    error=_error_text(outcome, None), data={"reason": "retryable error"}))
                continue
        # An error once the body ran, an error ToolMessage, no answer in time, or an
        # earlier attempt still out: the effect may exist.
        [record] = yield Write(ctx.transition(
            record, S.UNKNOWN, "unknown", error=_error_text(outcome, ctx.policy.timeout)))
        return (yield from _reconcile(
            ctx, record,
            may_resend=may_resend and not isinstance(outcome, TimedOut | StillRunning)))


def _applied(ctx: CallContext, record: EffectRecord, result: Any) -> Protocol:
    """Record the receipt of a call the tool applied; the result for the model."""
    fault_point("after_effect", tool=ctx.tool)
    # The receipt is the provider's answer, the same shape for an edited call as for any
    # other; only the message to the model says what was edited.
    receipt = receipt_of(result)
    if record.args != ctx.tool_call["args"]:
        result = note_edit(result, record.args)
    # A receipt that a lookup or a same-key re-send could recover rides on the step's
    # own commit; one only a human could recover is committed now, and so is a result a
    # lookup could not rebuild, so that a crash replays it. A result that is the
    # receipt's own message is not stored beside it: replay rebuilds it from the receipt.
    rebuilt = rebuilt_by_lookup(result, receipt, ctx.tool, ctx.tool_call_id)
    yield Write(ctx.transition(record, S.APPLIED, "receipt", error=None, receipt=receipt,
                               result=(FROM_RECEIPT if rebuilt and ctx.policy.redact is None
                                       else result),
                               data={"source": "tool"},
                               defer=rebuilt and ctx.policy.reconcilable and ctx.defer_receipts))
    fault_point("after_receipt", tool=ctx.tool)
    ctx.outcome = "resent" if ctx.outcome == "resent" else "sent"
    return result


def _failed(ctx: CallContext, record: EffectRecord, outcome: Outcome, text: str) -> Protocol:
    """Record a call that certainly did not apply its effect; the error for the model."""
    message = ctx.message(text, status="error")
    yield Write(ctx.transition(record, S.FAILED, "failure",
                               error=_error_text(outcome, None), result=message))
    ctx.outcome = "failed"
    return message


def _reconcile(ctx: CallContext, record: EffectRecord, *, may_resend: bool,
               why: str | None = None) -> Protocol:
    """An effect that may or may not exist: ask the provider, re-send, or ask a human
    (told `why` the outcome is unknown, when the record does not say)."""
    policy = ctx.policy
    if policy.lookup is not None:
        found = _found_answer(ctx, (yield Lookup(record.key)))
        if isinstance(found, _Found):
            yield Write(ctx.transition(record, S.APPLIED, "receipt", error=None,
                                       receipt=found.receipt, result=found.result,
                                       data={"source": "lookup"}))
            ctx.outcome = "reconciled"
            return found.result
        absent = isinstance(found, Returned)
        if may_resend and (absent or policy.idempotent):
            reason = ("lookup found no effect for the key" if absent else
                      f"{_lookup_error_text(ctx, found)}; the provider dedupes: re-send "
                      "with the same key")
            [record] = yield Write(ctx.transition(
                record, S.IN_FLIGHT, "attempt", bump_attempts=True, data={"reason": reason}))
            ctx.outcome = "resent"
            return (yield from _send(ctx, record, may_resend=False))
        if not absent:
            [record] = yield Write(ctx.transition(
                record, S.UNKNOWN, "unknown", error=_lookup_error_text(ctx, found)))
    elif policy.idempotent and may_resend:
        [record] = yield Write(ctx.transition(
            record, S.IN_FLIGHT, "attempt", bump_attempts=True,
            data={"reason": "provider dedupes: re-send with the same key"}))
        ctx.outcome = "resent"
        return (yield from _send(ctx, record, may_resend=False))
    if record.status is not S.UNKNOWN:
        [record] = yield Write(ctx.transition(
            record, S.UNKNOWN, "unknown",
            error=why or record.error or "the process stopped while the call was in flight"))
    return (yield from _ask(ctx, record))


def _ask(ctx: CallContext, record: EffectRecord) -> Protocol:
    # The question names the call asking now: a restarted subgraph's model may have given
    # the call another tool_call_id than the run that recorded its intent (the key is kept).
    renamed = ({"tool_call_id": ctx.tool_call_id, "was": record.tool_call_id}
               if record.tool_call_id != ctx.tool_call_id else {})
    [record] = yield Write(ctx.transition(record, record.status, "asked", asked=True,
                                          checkpoint_ns=ctx.checkpoint_ns,
                                          tool_call_id=ctx.tool_call_id, data=renamed))
    if record.status is S.AWAITING_APPROVAL:
        payload = approval_payload(record, ctx.policy.description)
        ctx.outcome = "paused_approval"
    else:
        payload = unknown_payload(record)
        ctx.outcome = "paused_unknown"
    return (yield Ask(record, payload))


def _adopt_family_send(ctx: CallContext, record: EffectRecord, sent: EffectRecord,
                       data: dict[str, Any], *, unsent_here: bool = False) -> Protocol:
    """A decision to send a call that a copy of this thread (or its source) already sent:
    replay its receipt, or reconcile its outcome; never send it a second time.
    `unsent_here`: nothing of the call left from this thread (its tool paused on its own
    question; a call awaiting its approval is known to be unsent)."""
    how = "already sent" if sent.status in SENT_STATUSES else f"{sent.status.value}"
    why = {**data, "reason": f"{how} in thread {sent.thread_id!r} of the same family"}
    unsent_here = unsent_here or record.status is S.AWAITING_APPROVAL
    edited = yield from _edited_there(sent)
    if edited is not None:
        # Sent there as a reviewer edited it: that effect is this call's.
        if unsent_here and edited.status in (S.IN_FLIGHT, S.UNKNOWN, S.SKIPPED):
            return (yield from _take_over_edit(ctx, record, sent, why))
        sent = edited
    [record] = yield Write(ctx.transition(record, S.IN_FLIGHT, "attempt", decision=None,
                                          data=why))
    if sent.status in SENT_STATUSES:
        result = rebound((yield Read("stored_result", (sent.thread_id, sent.key))),
                         ctx.tool_call_id, (sent.tool_call_id, record.tool_call_id))
        yield Write(ctx.transition(record, S.APPLIED, "receipt", error=None,
                                   receipt=sent.receipt, result=result,
                                   data={"source": "family", "thread": sent.thread_id}))
        ctx.outcome = "replayed"
        return result
    return (yield from _reconcile(
        ctx, record, may_resend=False,
        why=f"thread {sent.thread_id!r} of the same family has this call {sent.status.value} "
            "(it may be on its way there), so it is not sent again from here"))


def _take_over_edit(ctx: CallContext, record: EffectRecord, edited_there: EffectRecord,
                    data: dict[str, Any]) -> Protocol:
    """A call never sent from here that a reviewer edited, in another thread of the
    family, into a call whose outcome is not known there: that edited call is this one,
    under its own key. This call is resolved in its favour as it was there, then the
    edited call is taken up here (claimed, taking over what the family knows of it: an
    outcome skipped there is unknown here), so that what is decided next (a lookup, a
    re-send under the same key, a human's word) is about the call that may have reached
    the provider, never a second one under this call's key."""
    decision = dict(edited_there.decision or {})
    edited_key = decision["edited_key"]
    resolved = ctx.transition(record, S.SKIPPED, "resolved", decision=decision,
                              data={**data, "edited_key": edited_key})
    if record.status is S.IN_FLIGHT:
        # A tool paused on its own question sent nothing; an intent on its way is never
        # skipped, so the call passes through unknown in the same transaction.
        yield Write(WriteBatch(ctx.thread_id, (ctx.transition(
            record, S.UNKNOWN, "unknown", decision=None,
            data={**data, "reason": "paused on its tool's own question, not sent from "
                                    "here; the family's edit of it is taken over"}),
            resolved)))
    else:
        yield Write(resolved)
    return (yield from _resume_edited(ctx, (yield from _edited_call(ctx, decision))))


def _resume_edited(ctx: CallContext, edited: EffectRecord,
                   followed: frozenset[str] = frozenset()) -> Protocol:
    """Go on as the call a reviewer's edit made this one (`edited`). Its key may be that
    of another call of the same message under the same tool_call_id (same tool, same
    args), running now in this process with a decision of its own to act on: this call
    then waits for that one's answer (`Join`) instead of acting on the same decision at
    the same time, which sent the same key twice. Calls edited into each other (each
    skipped in favour of the other) were neither sent: each is answered so."""
    if edited.key in followed or edited.key == ctx.key and followed:
        return _edited_into_each_other(ctx)
    try:
        joined = yield Join(edited.key)
    except EditedIntoEachOther:
        return _edited_into_each_other(ctx)
    if joined is not None:
        ctx.outcome = "replayed"
        return joined.result
    # Read again now that this call runs it: the call it joined may have ended since.
    edited = (yield Read("effect", (edited.key, ctx.thread_id))) or edited
    return (yield from _resume(ctx, edited, followed))


def _edited_into_each_other(ctx: CallContext) -> ToolMessage:
    ctx.outcome = "decided"
    return ctx.message(
        f"Not sent: this call and another call to {ctx.tool!r} under tool_call_id "
        f"{ctx.tool_call_id!r} were each edited into the other, so one could not be told "
        "from the other. Neither was sent; ask for them again with different args.",
        status="error")


def _edited_call(ctx: CallContext, decision: dict[str, Any]
                 ) -> Generator[Read | Claim, Any, EffectRecord]:
    """The record, in this thread, of the call a reviewer's edit (`decision`) made. A
    call resolved in favour of one not claimed here yet (taken over from the family, and
    stopped before its claim) claims it now."""
    edited_key = decision["edited_key"]
    edited = yield Read("effect", (edited_key, ctx.thread_id))
    if edited is None:
        edited, _ = yield Claim(_intent(
            ctx, S.IN_FLIGHT, record_args=dict(decision["edited_action"]["args"]),
            key=edited_key))
    return edited  # type: ignore[no-any-return]


def _act_on_decision(ctx: CallContext, record: EffectRecord) -> Protocol:
    """Carry out a journaled decision (the journal entry already exists)."""
    decision = record.decision or {}
    kind = decision["type"]
    data = {"decision": kind, **({"reviewer": decision["reviewer"]} if "reviewer" in decision
                                 else {})}
    if kind == "edit" and dict(decision["edited_action"]["args"]) == record.args:
        kind = "approve"  # an edit form submitted unchanged approves the call as asked
    ttl = ctx.policy.approval_ttl
    decided_at = decision.get("decided_at")
    if (kind in ("approve", "edit") and ttl is not None and decided_at is not None
            and time.time() - decided_at > ttl):
        # A stale approval (the worker stopped after the decision, and this one resumes
        # later than the policy allows) is asked again, never sent on an old word.
        [record] = yield Write(ctx.transition(
            record, record.status, "expired", decision=None,
            data={**data, "decided_at": decided_at, "approval_ttl": ttl}))
        return (yield from _ask(ctx, record))
    match kind:
        case "resume_tool":
            # The tool paused on its own question; LangGraph hands it the answer when it
            # is called again. Clearing the mark first means a crash from here on is an
            # ordinary in-flight effect, reconciled, never silently sent twice; and that
            # a copy of this thread (or its source) resuming it at the same time sees
            # this one on its way. A copy that resumed it first has sent it: that send
            # is this call's.
            [record] = yield Write(ctx.transition(
                record, S.IN_FLIGHT, "attempt", decision=None,
                data={"reason": "resume the paused tool"}))
            sent = yield from _sent_in_family(ctx, record, kind)
            if sent is not None:
                return (yield from _adopt_family_send(ctx, record, sent, data,
                                                      unsent_here=True))
            return (yield from _send(ctx, record, may_resend=False))
        case "approve" | "retry":
            if kind == "retry" and ctx.policy.lookup is not None:
                # A lookup is cheap and conclusive now that no attempt is out: a late
                # landing of an earlier attempt is found, not sent again.
                found = _found_answer(ctx, (yield Lookup(record.key)))
                if isinstance(found, _Found):
                    yield Write(ctx.transition(
                        record, S.APPLIED, "receipt", error=None, receipt=found.receipt,
                        result=found.result, decision=None, data={**data, "source": "lookup"}))
                    ctx.outcome = "reconciled"
                    return found.result
            sent = yield from _sent_in_family(ctx, record, kind)
            if sent is not None:
                return (yield from _adopt_family_send(ctx, record, sent, data))
            [record] = yield Write(ctx.transition(record, S.IN_FLIGHT, "attempt",
                                                  bump_attempts=True, decision=None, data=data))
            if kind == "retry":
                ctx.outcome = "resent"
            fault_point("after_intent", tool=ctx.tool)
            return (yield from _send(ctx, record, may_resend=False))
        case "edit":
            sent = yield from _sent_in_family(ctx, record, kind)
            if sent is not None:
                return (yield from _adopt_family_send(ctx, record, sent, data))
            return (yield from _send_edited(ctx, record, decision, data))
        case "reject" | "respond" | "skip":
            if kind != "skip":
                sent = yield from _sent_in_family(ctx, record, kind)
                if sent is not None:
                    return (yield from _adopt_family_send(ctx, record, sent, data))
            return (yield from _not_sent(ctx, record, kind, decision, data))
        case "applied":
            message = ctx.message(decision["receipt"])
            yield Write(ctx.transition(record, S.APPLIED, "receipt", error=None,
                                       receipt=decision["receipt"], result=message,
                                       decision=None, data={**data, "source": "human"}))
            ctx.outcome = "decided"
            return message
        case _:
            raise GraphDurableError(
                f"tool call {ctx.tool_call_id!r} ({ctx.tool}) in thread {ctx.thread_id!r} "
                f"has a journaled decision of type {kind!r}, which this release does not "
                "know: nothing was sent. Run it with the release that recorded the "
                "decision, or answer the call again.",
                thread_id=ctx.thread_id, tool_call_id=ctx.tool_call_id)


def _sent_in_family(ctx: CallContext, record: EffectRecord, kind: str
                    ) -> Generator[Read, Any, EffectRecord | None]:
    """The record of this call in a copy (or the source) of this thread that stands
    against carrying out the decision `kind` here, if any.

    An approval or an edit assumes nothing was sent; a copy of this thread that sent the
    call makes that false, so the call is not sent again, in any form. A rejection (or
    an answer in place of the tool) comes too late then: the effect exists, so the
    ledger and the model get what became of it, not a "not sent" that is no longer true
    (the decision stays in the journal). A retry answers the very doubt a sibling's open
    attempt raises; only a sibling's receipt still stands against it (or that of the
    call a reviewer edited it into there).
    """
    sent = yield Read("sent_in_family", (record.key, ctx.thread_id))
    if sent is None or kind != "retry" or sent.status in SENT_STATUSES:
        return sent
    # Edited there into a call of its own key: a receipt of that one stands too.
    edited = yield from _edited_there(sent)
    return sent if edited is not None and edited.status in SENT_STATUSES else None


def _edited_there(sent: EffectRecord) -> Generator[Read, Any, EffectRecord | None]:
    """The call a reviewer edited `sent` into, in its own thread (`sent` was resolved
    as skipped in its favour), or `None`."""
    edited_key = (sent.decision or {}).get("edited_key")
    if sent.status is not S.SKIPPED or edited_key is None:
        return None
    return (yield Read("effect", (edited_key, sent.thread_id)))  # type: ignore[no-any-return]


def _not_sent(ctx: CallContext, record: EffectRecord, kind: str, decision: dict[str, Any],
              data: dict[str, Any]) -> Protocol:
    """A reviewer's `reject`, `skip` or `respond`: nothing is sent; the model gets the
    reviewer's answer."""
    if kind == "respond":
        # The reviewer answers in place of the tool.
        message = ctx.message(decision["message"])
        yield Write(ctx.transition(record, S.REJECTED, "resolved", result=message,
                                   decision=None, data=data))
        ctx.outcome = "decided"
        return message
    verb = "Rejected" if kind == "reject" else "Skipped"
    note = decision.get("message") or "no reason given"
    message = ctx.message(f"{verb} by reviewer: {note}", status="error")
    to = S.REJECTED if kind == "reject" else S.SKIPPED
    yield Write(ctx.transition(record, to, "resolved", result=message, decision=None,
                               data=data))
    ctx.outcome = "decided"
    return message


def _send_edited(ctx: CallContext, record: EffectRecord, decision: dict[str, Any],
                 data: dict[str, Any]) -> Protocol:
    """A reviewer's edit: nothing was sent under the old key, so the edited call gets a
    new one, and the old call is resolved as skipped in its favour."""
    edited_args = dict(decision["edited_action"]["args"])
    edited_key = derive_key(thread_id=ctx.key_thread_id or ctx.thread_id,
                            anchor=ctx.anchor or ctx.checkpoint_ns,
                            tool_call_id=ctx.tool_call_id, tool=ctx.tool, args=edited_args,
                            secret=ctx.secret)
    resolved = ctx.transition(record, S.SKIPPED, "resolved",
                              decision={**decision, "edited_key": edited_key},
                              data={**data, "edited_key": edited_key})
    try:
        joined = yield Join(edited_key)
    except EditedIntoEachOther:
        return _edited_into_each_other(ctx)
    if joined is not None:
        # Another call of this process runs the call this edit makes (the call the edit
        # made this one, or another call edited into the same): its answer is this one's.
        yield Write(resolved)
        ctx.outcome = "replayed"
        return joined.result
    known = yield Read("effect", (edited_key, ctx.thread_id))
    if known is not None:
        # The same edit was made before in this thread's history (a fork or time travel
        # replays the question), or the edit made this call another one of its message
        # under the same tool_call_id: that call is this one, replayed or reconciled.
        yield Write(resolved)
        return (yield from _resume_edited(ctx, known))
    _, edited = yield Write(WriteBatch(ctx.thread_id, (
        resolved, _intent(ctx, S.IN_FLIGHT, record_args=edited_args, key=edited_key))))
    fault_point("after_intent", tool=ctx.tool)
    return (yield from _send(ctx, edited, may_resend=False))
