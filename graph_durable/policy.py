"""Per-tool effect policy: what the guard may do when the outcome of a call is not known."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Effect", "Lookup", "ApprovalPredicate"]

Lookup = Callable[[str], Any | None] | Callable[[str], Awaitable[Any | None]]
"""`lookup(key)`: the provider's record of the keyed effect, or `None` if certainly absent."""

ApprovalPredicate = Callable[[dict[str, Any]], bool]
"""`predicate(tool_call) -> bool`: whether this particular call needs a human's approval."""


@dataclass(frozen=True)
class Effect:
    """How one tool's external write is guarded.

    A tool with no policy is treated as `Effect()`: a write that the provider neither
    dedupes nor lets us look up. That is the safest default: after a crash its outcome
    is `unknown` and a human decides.
    """

    read_only: bool = False
    """Not a write: the tool runs without the ledger."""

    idempotent: bool = False
    """The provider dedupes by key, so re-sending with the same key is safe."""

    lookup: Lookup | None = None
    """Asks the provider whether the keyed effect exists.

    Returns the receipt (what the tool would have returned) if it does, `None` if it
    certainly does not; raising means "cannot tell" and leads to `unknown`.
    May be a coroutine function when the graph runs async.
    """

    approval: bool | ApprovalPredicate = False
    """Pause for a human before sending: `True`, or a predicate on the tool call."""

    approval_ttl: float | None = None
    """Seconds an approval (or edit) stays good. One not acted on in time, say because
    the worker stopped between the decision and the call and a new one resumes later,
    is asked again rather than sent on a stale word."""

    retries: int = 0
    """Extra attempts after a `Retryable` error, with the same key and backoff."""

    timeout: float | None = None
    """Seconds to wait for the tool; a call that does not answer in time is `unknown`."""

    description: str | None = None
    """Shown to the reviewer in approval interrupts."""

    redact: Callable[[Any], Any] | None = None
    """What the ledger stores of this tool's calls: `redact(value) -> value` is applied
    to the args, receipts (the tool's, a lookup's or a human's), stored results, error
    texts and journal data before they are written, e.g.
    `graph_durable.secrets.redact_keys("card")`. The tool still gets the full args and
    the model the full result; keys come from the full args. A result replayed after a
    crash is the redacted one. An edit's args are kept whole (they are what is sent)."""

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError(f"Effect.retries must be >= 0, got {self.retries}")
        if self.approval_ttl is not None and self.approval_ttl <= 0:
            raise ValueError(f"Effect.approval_ttl must be > 0 seconds, got {self.approval_ttl}")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError(f"Effect.timeout must be > 0 seconds, got {self.timeout}")
        if self.read_only and (self.idempotent or self.lookup or self.approval):
            raise ValueError(
                "Effect(read_only=True) runs without the ledger, so idempotent, lookup "
                "and approval do not apply; drop them or drop read_only"
            )

    @property
    def reconcilable(self) -> bool:
        """Whether an intent without a receipt settles without a human: the provider
        dedupes (a same-key re-send is safe) or can be asked (`lookup`)."""
        return self.idempotent or self.lookup is not None

    def needs_approval(self, tool_call: dict[str, Any]) -> bool:
        """Whether `tool_call` must be approved by a human before it is sent."""
        if callable(self.approval):
            return bool(self.approval(tool_call))
        return bool(self.approval)
