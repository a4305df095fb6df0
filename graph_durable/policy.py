"""Per-tool effect policy: what the guard may do when the outcome of a call is not known."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ApprovalPredicate", "Compensation", "Effect", "Lookup"]

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

    Outcomes: a tool's return value is the receipt (`applied`). Only `NotApplied`, a
    `Retryable` with no attempts left, or args that fail the tool's own schema (checked
    before sending) mean `failed`, "certainly not applied". Once the tool's body has run,
    any other error (an exception, a timeout, a `ValidationError` raised in the body, a
    `ToolException` turned into a message by `handle_tool_error`, an error ToolMessage
    the tool returns) leaves the outcome `unknown`, reconciled with `lookup`, a same-key
    re-send if `idempotent`, or a human.
    """

    read_only: bool = False
    """Not a write: the tool runs without the ledger."""

    idempotent: bool = False
    """The provider dedupes by key, so re-sending with the same key is safe."""

    lookup: Lookup | None = None
    """Asks the provider whether the keyed effect exists.

    Returns the receipt (what the tool would have returned) if it does, `None` if it
    certainly does not. Any value but `None` and a bool is a receipt, `{}`, `0` and `""`
    included; a bool is refused (it says neither what was applied nor that nothing
    was). A refused answer, an exception, or no answer within `timeout` means "cannot
    tell": an `idempotent` tool is then re-sent with the same key (unless an attempt may
    still land), any other becomes `unknown` and a human decides.
    May be a coroutine function when the graph runs async.

    A lookup answers for the tool only when a crash left the outcome unknown: after the
    effect, before its receipt was recorded. A plain receipt then gives the model a
    ToolMessage carrying it (JSON unless a string). A tool that returns more (a
    `Command` with a state update or a `goto`, an artifact) gets it back only if the
    lookup returns it too: a lookup may return a `ToolMessage` or a `Command`, which is
    used as the tool's result, its ToolMessage made to answer the call (`tool_call_id`
    and `name` set; a Command for this graph carries exactly one). A result a plain
    receipt could not rebuild is recorded at once, so a crash after the tool returned
    replays it as it was, lookup or not.
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
    """Seconds to wait for the tool, and for each lookup; a call that does not answer in
    time is `unknown` (and not sent again while it may still land), a lookup that does
    not answer in time cannot tell."""

    description: str | None = None
    """Shown to the reviewer in approval interrupts."""

    key_arg: str | None = None
    """The tool's argument that carries the idempotency key to the provider, for tools
    whose code you do not own (MCP tools, toolkits, HTTP tools) and so cannot read
    `current_effect().key`: the guard fills it with the call's key on every send, and
    hides it from the schema the model is given (`EffectGuardMiddleware` does so itself;
    with `EffectGuardNode`, bind `node.model_tools`). The ledger records, and keys, the
    args the model gave. A tool declared `idempotent` or with a `lookup` whose schema
    has a key-like argument (`idempotency_key`, `client_token`, ...) that this does not
    name is refused before anything is sent (`UndeliveredKey`): a deduplication promise
    the provider never hears of is the most dangerous setting there is."""

    compensate: Compensation | Callable[..., Any] | Any = None
    """How an applied effect of this tool is undone (a refund for a charge, a cancel for a
    ticket): a `Compensation`, or what one wraps, a callable `undo(record, receipt)` or a
    tool (then give `Compensation(tool, args=...)`). It runs when a reviewer decides to
    compensate, or when `cancel()` undoes a thread, as a guarded effect of its own."""

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
        if self.key_arg is not None and (not isinstance(self.key_arg, str) or not self.key_arg):
            raise ValueError(f"Effect.key_arg must name an argument, got {self.key_arg!r}")
        if self.read_only and (self.idempotent or self.lookup or self.approval or self.key_arg):
            raise ValueError(
                "Effect(read_only=True) runs without the ledger, so idempotent, lookup, "
                "approval and key_arg do not apply; drop them or drop read_only"
            )
        if self.compensate is not None and not isinstance(self.compensate, Compensation):
            object.__setattr__(self, "compensate", Compensation(self.compensate))

    @property
    def compensation(self) -> Compensation | None:
        """How this tool's applied effects are undone, if they can be."""
        return self.compensate  # type: ignore[no-any-return]

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


@dataclass(frozen=True)
class Compensation:
    """How one tool's applied effect is undone, as a guarded effect of its own.

    The compensation gets its own key, derived from the key of the effect it undoes
    (read it with `current_effect().key` and pass it to the provider), its own intent
    and receipt, and the lookup, idempotent and unknown rules of `effect`, its policy.
    A crash while compensating is recovered like any other effect: it never undoes
    twice where the provider dedupes or can be asked, and pauses for a human otherwise.

    Example::

        Effect(lookup=charges.find,
               compensate=Compensation(lambda record, receipt: refunds.create(
                   charge=receipt["id"], key=current_effect().key), effect=Effect(idempotent=True)))
    """

    undo: Any
    """A callable `undo(record, receipt) -> receipt` (may be a coroutine function), or a
    LangChain tool invoked with `args(record, receipt)`."""

    effect: Effect = field(default_factory=Effect)
    """The compensation's own policy (`idempotent`, `lookup`, `retries`, `timeout`). The
    default, `Effect()`, is a provider that neither dedupes nor can be asked: a crash in
    the middle of compensating then leaves it for a human, never undone twice."""

    args: Callable[[Any, Any], dict[str, Any]] | None = None
    """`args(record, receipt) -> dict`: the compensating call's arguments, recorded in the
    ledger (and, for a tool, what it is invoked with). Default: the receipt, as
    `{"receipt": receipt}`."""

    name: str | None = None
    """The name the ledger records the compensation under (default: the tool's or the
    function's name)."""

    def __post_init__(self) -> None:
        if not callable(self.undo) and not hasattr(self.undo, "invoke"):
            raise TypeError(f"Compensation.undo must be a callable or a tool, got {self.undo!r}")
        if self.effect.read_only or self.effect.approval:
            raise ValueError("a compensation is a write sent without asking: its Effect may "
                             "not be read_only or need approval")
        if self.effect.timeout is not None:
            raise ValueError("a compensation's Effect cannot have a timeout yet: compensations "
                             "are called without one; drop timeout=")
        if self.effect.compensate is not None:
            raise ValueError("a compensation has no compensation of its own")

    @property
    def tool_name(self) -> str:
        """The name the compensating call is recorded under."""
        return (self.name or getattr(self.undo, "name", None)
                or getattr(self.undo, "__name__", None) or "compensate")

    def call_args(self, record: Any, receipt: Any) -> dict[str, Any]:
        """The compensating call's arguments for the applied `record`."""
        if self.args is not None:
            return dict(self.args(record, receipt))
        return {"receipt": receipt}
