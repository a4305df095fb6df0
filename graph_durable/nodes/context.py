"""`current_effect()`: what a tool can know about the guarded call it is running in."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field

from graph_durable._sha256 import sha256_hex
from graph_durable.ledger import canonical_json

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
    _asked: list[bool] = field(default_factory=list, init=False, repr=False, compare=False)

    @property
    def asked(self) -> bool:
        """Whether the tool asked for this context (`current_effect()`) while it ran: a
        tool that never did cannot have passed its key on."""
        return bool(self._asked)

    def subkey(self, name: str) -> str:
        """The idempotency key of one of several provider writes this call makes.

        The rule is one provider write per guarded tool: the ledger records one intent
        and one receipt per call, and reconciles the call by its one key (a lookup of
        `key`, a re-send the provider dedupes by `key`). A tool that must make two
        writes (charge, then email the receipt) gives each its own sub-key,
        `subkey("charge")` and `subkey("email")`, and passes it where it would pass
        `key`. A sub-key depends only on the call's key and `name`, so it is the same
        after any crash, resume, fork or copy that keeps the key, differs for every
        other name and call, and has the form of a key (`gd-` and 40 hex digits).

        After a crash the guard re-runs the whole tool, so every write is re-sent
        under its sub-key: use sub-keys with providers that dedupe by key, and declare
        the tool `Effect(idempotent=True)` only if every one of its writes does. A
        write that cannot be deduped (only looked up, or neither) belongs in a tool of
        its own, where the guard can look it up or ask a human about it.

        Args:
            name: Names the write within the call (`"charge"`, `"email"`); fixed in
                the code, never derived from data that may change between runs.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"subkey() needs a non-empty name, got {name!r}")
        material = canonical_json(["subkey", self.key, name]).encode()
        return "gd-" + sha256_hex(material)[:40]


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
    if not context._asked:
        context._asked.append(True)
    return context
