"""What the guard tells the world about one guarded call: its outcome, and the call.

`CallInfo` is what is known when a guarded call starts (thread, tool, tool_call_id, key,
policy); `CallReport` adds how it ended (`CallOutcome`), how long it took and how many
times the tool was called. Neither holds a tool's args, its receipt or an error's text:
what a report carries is what the ledger keeps in the clear even when it is encrypted
(see `graph_durable.secrets`), so telemetry never says more than the database does.

The names of the attributes every channel uses (OpenTelemetry attributes, LangChain run
metadata, log records' `extra`) are constants here, so that they stay the same
everywhere and can be documented once.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

__all__ = [
    "ATTRIBUTES",
    "CallInfo",
    "CallKind",
    "CallOutcome",
    "CallReport",
    "policy_label",
]

CallKind = Literal["tool", "guarded", "compensation"]
"""What was guarded: a tool call (`EffectGuardNode`, `EffectGuardMiddleware`), a
`guarded` write in a custom node or the functional API, or the undo of an effect."""

ATTRIBUTES = {
    "thread_id": "graph_durable.thread_id",
    "tool": "graph_durable.tool",
    "tool_call_id": "graph_durable.tool_call_id",
    "key": "graph_durable.effect.key",
    "policy": "graph_durable.effect.policy",
    "outcome": "graph_durable.effect.outcome",
    "attempts": "graph_durable.effect.attempts",
    "status": "graph_durable.effect.status",
    "kind": "graph_durable.call.kind",
    "operation": "graph_durable.operation",
    "error_type": "error.type",
}
"""Field -> its name as an OpenTelemetry attribute and in run metadata (`error.type` is
OpenTelemetry's own name; `status` is a ledger status, the attribute of the
`graph_durable.effects` gauge; `operation` is `send`, `lookup` or `undo`)."""


class CallOutcome(str, Enum):
    """How a guarded call ended, as the ledger's journal tells it (and the audit names it).

    Each is one path of the effect protocol: a caller that `match`es on it can tell a
    replay, a reconcile, a re-send and a pause apart.
    """

    SENT = "sent"
    """Sent for the first time; the provider answered and the receipt is recorded."""
    RESENT = "resent"
    """Sent again under the same key (a lookup found nothing, the provider dedupes, or a
    reviewer said retry) and answered."""
    REPLAYED = "replayed"
    """The ledger already had the receipt: the stored result was returned and nothing
    was sent (also a call another thread of the family had sent)."""
    RECONCILED = "reconciled"
    """The outcome was unknown and a lookup found the effect at the provider: its
    receipt is recorded and nothing was sent."""
    DECIDED = "decided"
    """A reviewer's decision settled the call without sending it (`applied` with a
    receipt, `reject`, `skip`, `respond`)."""
    PAUSED_APPROVAL = "paused_approval"
    """Paused: the call waits for a reviewer's approval; nothing was sent."""
    PAUSED_UNKNOWN = "paused_unknown"
    """Paused: the outcome is unknown and cannot be settled without a person."""
    PAUSED_TOOL = "paused_tool"
    """Paused by the tool's own interrupt, before it applied anything."""
    FAILED = "failed"
    """Certainly not applied (`NotApplied`, `Retryable` with no attempts left, args the
    tool's schema refused)."""
    REFUSED = "refused"
    """Refused by the guard before sending (no durable checkpoint, args that cannot be
    keyed, a middleware order that could call the tool twice, a stale decision)."""
    COMPENSATED = "compensated"
    """An applied effect was undone."""
    COMPENSATION_FAILED = "compensation_failed"
    """The undo certainly did not apply."""
    COMPENSATION_UNKNOWN = "compensation_unknown"
    """Whether the undo applied is unknown."""
    ABORTED = "aborted"
    """The call stopped on an error of the run or the library (a lease lost, the database
    gone, a cancelled task) before an outcome was known; the ledger holds its state."""


def policy_label(policy: Any) -> str:
    """A short, stable name of an `Effect` policy for telemetry: `read_only`, or what
    settles an unknown outcome (`idempotent`, `lookup`, both, or `blind` for neither),
    with `+approval` and `+compensable` when they apply, e.g. `idempotent+lookup+approval`.
    """
    if policy is None:
        return "blind"
    if getattr(policy, "read_only", False):
        return "read_only"
    parts = [name for name, on in (("idempotent", policy.idempotent),
                                   ("lookup", policy.lookup is not None)) if on] or ["blind"]
    if policy.approval:
        parts.append("approval")
    if getattr(policy, "compensate", None) is not None:
        parts.append("compensable")
    return "+".join(parts)


@dataclass(frozen=True, slots=True)
class CallInfo:
    """A guarded call as it starts: what every report, span and log record of it names."""

    thread_id: str
    """The thread the call belongs to."""
    tool: str
    """The tool's name (a `guarded` write's `<name>#<position>`; an undo's tool)."""
    tool_call_id: str | None
    """The model's tool_call_id (`None` for a `guarded` write, which has none)."""
    key: str | None
    """The effect's idempotency key, as the ledger and the provider see it: an HMAC of
    the call under the saver's key secret when one is configured (`None` before it is
    derived, as for a call refused because it cannot be keyed)."""
    policy: str = "blind"
    """The policy's label (`policy_label`)."""
    kind: CallKind = "tool"
    """What was guarded (`CallKind`)."""


@dataclass(frozen=True, slots=True)
class CallReport:
    """How a guarded call ended: the one value every telemetry channel is fed from."""

    call: CallInfo
    """The call."""
    outcome: CallOutcome
    """How it ended."""
    duration: float | None = None
    """Seconds from the start of the guarded call to its outcome (`None`: not timed)."""
    attempts: int | None = None
    """How many times the tool has been called for this key (the ledger's count)."""
    error_type: str | None = None
    """The class name of the error that decided the outcome, never its text (which may
    quote the args)."""

    def payload(self) -> dict[str, Any]:
        """The report as the JSON-ready dict custom events and stream clients get."""
        call = self.call
        return {
            "thread_id": call.thread_id,
            "tool": call.tool,
            "tool_call_id": call.tool_call_id,
            "key": call.key,
            "policy": call.policy,
            "kind": call.kind,
            "outcome": self.outcome.value,
            "duration": self.duration,
            "attempts": self.attempts,
            "error_type": self.error_type,
        }

    def attributes(self) -> dict[str, Any]:
        """The report as OpenTelemetry span attributes (`ATTRIBUTES`), `None`s left out."""
        values = self.payload()
        return {name: values[field] for field, name in ATTRIBUTES.items()
                if values.get(field) is not None}
