"""`current_effect()`: what a tool can know about the guarded call it is running in."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["EffectContext", "current_effect"]


@dataclass(frozen=True)
class EffectContext:
    """The guarded call a tool is running in."""

    key: str
    """Idempotency key: pass it to the provider (e.g. an `Idempotency-Key` header)."""
    thread_id: str
    """Thread that requested the effect."""
    tool_call_id: str
    """Id of the tool call in the model's AIMessage."""
    tool: str
    """Tool name."""
    attempt: int
    """1 for the first call with this key, 2 for the next, ..."""
    fencing_token: int | None = None
    """Fencing token of the lease the run holds, if any (for providers that fence)."""


_CURRENT: ContextVar[EffectContext | None] = ContextVar("graph_durable_effect", default=None)


def current_effect() -> EffectContext:
    """The guarded call the calling tool runs in.

    Raises:
        LookupError: called outside a tool run by `EffectGuardNode` or
            `EffectGuardMiddleware` (read-only tools run outside the ledger too).
    """
    context = _CURRENT.get()
    if context is None:
        raise LookupError(
            "current_effect() is only available inside a write tool run by "
            "EffectGuardNode or EffectGuardMiddleware; read-only tools have no key."
        )
    return context
