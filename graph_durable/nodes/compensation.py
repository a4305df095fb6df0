"""The compensation protocol: undo one applied effect, as a guarded effect of its own.

A compensation is a call like any other in the ledger: its intent is claimed before it
is sent, under a key derived from the key of the effect it undoes, and its receipt is
recorded after. So `run_compensation` is `protocol.run_call` for the compensating call
(a crash in the middle of it is reconciled by its own policy: looked up, re-sent with the
same key where the provider dedupes, or left `unknown` for a human, never sent twice),
followed by the transition of the original effect to `compensated`, to
`compensation_failed` when the compensation certainly failed, or to `compensation_unknown`
when its outcome is unknown (not failed: it may have landed).

The compensating call is recorded in the thread of the effect it undoes, with
tool_call_id `compensate:<the original's tool_call_id>` and the compensation's name as
its tool. The drivers (`graph_durable.operators.compensation`) perform its `CallTool` by calling
the compensation, not the tool.
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import ToolMessage

from graph_durable.ledger import (
    EffectRecord,
    EffectStatus,
    Keying,
    TransitionWrite,
    key_of_encoded,
)
from graph_durable.nodes.protocol import CallContext, Protocol, Read, Write, run_call
from graph_durable.policy import Compensation

__all__ = [
    "COMPENSATION_PREFIX",
    "compensation_context",
    "compensation_key",
    "is_compensation",
    "run_compensation",
]

S = EffectStatus

COMPENSATION_PREFIX = "compensate:"
"""tool_call_ids of compensating calls start with this."""


def is_compensation(record: EffectRecord) -> bool:
    """Whether `record` is a compensating call (not an effect the model asked for)."""
    return record.tool_call_id.startswith(COMPENSATION_PREFIX)


def compensation_key(original: EffectRecord, keying: Keying, attempt: int = 0) -> str:
    """The key of the compensation of `original`: derived from its key alone (not from
    the compensation's args or name, which a deployment may change between a crash and
    the resume), under the thread's key secret. `attempt` counts the compensations of
    `original` that certainly failed before (each new try is a new call)."""
    return key_of_encoded(keying.key_thread, "compensate", original.key, str(attempt), "",
                          keying.secret)


def compensation_context(original: EffectRecord, compensation: Compensation, keying: Keying,
                         attempt: int = 0, cause: dict[str, Any] | None = None) -> CallContext:
    """The protocol context of the call that undoes `original`; `cause` (the decision, or
    the cancel, that asks for it) is journaled with its intent."""
    call = {"id": COMPENSATION_PREFIX + original.tool_call_id,
            "name": compensation.tool_name,
            "args": compensation.call_args(original, original.receipt)}
    ctx = CallContext(original.thread_id, original.checkpoint_ns, call, compensation.effect,
                      keying.key_thread, f"compensate:{original.key}", secret=keying.secret,
                      key_scheme=keying.pin,
                      intent_data={"compensates": original.key, **(cause or {})},
                      defer_receipts=False)
    ctx.key = compensation_key(original, keying, attempt)
    return ctx


def run_compensation(ctx: CallContext, original: EffectRecord) -> Protocol:
    """Undo `original` through the compensating call `ctx`; returns the original's record
    afterwards: `compensated`, `compensation_failed` (it certainly failed, or a human gave
    it up) or `compensation_unknown` (its outcome is open), with the reason in `error`."""
    if original.status is S.COMPENSATED:
        return original
    yield from run_call(ctx)
    undo: EffectRecord = yield Read("effect", (ctx.key, ctx.thread_id))
    data: dict[str, Any] = {"compensation": undo.key, "by": undo.tool,
                            "status": undo.status.value}
    if undo.status is S.APPLIED:
        # A step that re-runs the call (time travel, a paused question resumed) replays
        # what became of it: applied, then undone.
        answer = ToolMessage(
            content=f"Applied, then undone by {undo.tool}: {json.dumps(undo.receipt, default=str)}",
            name=original.tool, tool_call_id=original.tool_call_id, status="error")
        [original] = yield Write(TransitionWrite(
            thread_id=original.thread_id, key=original.key, to=S.COMPENSATED,
            kind="compensated", data=data, error=None, asked=False, result=answer))
        return original
    if undo.status in (S.UNKNOWN, S.IN_FLIGHT):
        to = S.COMPENSATION_UNKNOWN
        error = (f"the outcome of the compensation {undo.tool} is unknown ({undo.error}): "
                 f"check the provider under key {undo.key}")
    elif undo.status is S.FAILED:
        to = S.COMPENSATION_FAILED
        error = f"the compensation {undo.tool} failed: {undo.error}"
    else:  # a human rejected or skipped the compensating call
        to = S.COMPENSATION_FAILED
        error = f"the compensation {undo.tool} was {undo.status.value}: {undo.error}"
    [original] = yield Write(TransitionWrite(
        thread_id=original.thread_id, key=original.key, to=to, kind=to.value, data=data,
        error=error))
    return original
