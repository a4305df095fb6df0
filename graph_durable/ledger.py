"""The effect ledger's data model: statuses, records, journal events and key derivation.

Lifecycle of one effect (one row per key)::

    (new) ──► awaiting_approval ──► in_flight ──► applied
      │              │                 │  ▲  ──► failed
      │              └──► rejected     │  │
      │              └──► skipped      ▼  │
      └──────────────────────────► unknown ──► applied | skipped

    applied ──► compensated                (its compensation applied: undone)
    applied ──► compensation_failed ──► compensated
                 (the compensation certainly failed: a human's question, or a new try)
    applied ──► compensation_unknown ──► compensated | compensation_failed
                 (the compensation's outcome is unknown: its lookup, a same-key re-send
                  where the provider dedupes, or a human settles it)

`unknown` is never `failed`: `failed` means "certainly not applied", while `unknown`
keeps the duty to reconcile (look the key up, or ask a human) before anything is retried.
The same holds for compensations: `compensation_unknown` is not `compensation_failed`.
A compensation is an effect of its own (its own key, intent and receipt; see
`graph_durable.operators.compensation`); the statuses above are those of the effect it undoes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from collections.abc import Iterable
from typing import Any, NamedTuple

from langchain_core.messages import ToolMessage
from pydantic import BaseModel, ConfigDict, Field

from graph_durable._sha256 import hmac_sha256_hex, sha256_hex
from graph_durable.errors import UnkeyableToolCall

__all__ = [
    "EffectEvent",
    "EffectRecord",
    "EffectStatus",
    "IntentWrite",
    "Keying",
    "LedgerWrite",
    "SENT_STATUSES",
    "TERMINAL_STATUSES",
    "TransitionWrite",
    "WriteBatch",
    "FROM_RECEIPT",
    "sent_from",
    "RESULT_FROM_RECEIPT",
    "answered",
    "canonical_json",
    "derive_key",
    "receipt_message",
    "trusted_record",
]


class _Unset(Enum):
    UNSET = "unset"


_UNSET = _Unset.UNSET


class _FromReceipt(Enum):
    FROM_RECEIPT = "from_receipt"


FROM_RECEIPT = _FromReceipt.FROM_RECEIPT
"""`TransitionWrite.result` of a result that is exactly `receipt_message` of its receipt
(a plain ToolMessage whose content is the receipt): the saver stores the receipt alone,
and the result is rebuilt from it for replay, so the result is neither serialised nor
sealed a second time."""

RESULT_FROM_RECEIPT = "gd-receipt"
"""The `result_type` stored for `FROM_RECEIPT`: the result is `receipt_message` of the
row's receipt, tool and tool_call_id."""


def receipt_message(content: Any, tool: str, tool_call_id: str,
                    status: str = "success") -> ToolMessage:
    """The ToolMessage answering a call with `content` (a receipt: text and lists as
    they are, anything else as JSON): what the guard answers for a receipt a lookup,
    a human or the ledger gives, and what a stored receipt is rebuilt into."""
    if not isinstance(content, str | list):
        content = json.dumps(content, ensure_ascii=False, default=str)
    return ToolMessage(content=content, name=tool, tool_call_id=tool_call_id, status=status)


class EffectStatus(str, Enum):
    """Where one effect stands. See the module docstring for the lifecycle."""

    AWAITING_APPROVAL = "awaiting_approval"
    IN_FLIGHT = "in_flight"
    APPLIED = "applied"
    FAILED = "failed"
    UNKNOWN = "unknown"
    REJECTED = "rejected"
    SKIPPED = "skipped"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"
    COMPENSATION_UNKNOWN = "compensation_unknown"

    def can_become(self, other: EffectStatus) -> bool:
        """Whether the lifecycle allows moving from this status to `other`."""
        return other in _ALLOWED[self]


_S = EffectStatus
_ALLOWED: dict[EffectStatus, frozenset[EffectStatus]] = {
    # Staying in awaiting_approval records a decision that has not been acted on yet.
    _S.AWAITING_APPROVAL: frozenset(
        {_S.AWAITING_APPROVAL, _S.IN_FLIGHT, _S.REJECTED, _S.SKIPPED}
    ),
    # in_flight -> in_flight is a further attempt with the same key.
    _S.IN_FLIGHT: frozenset({_S.IN_FLIGHT, _S.APPLIED, _S.FAILED, _S.UNKNOWN}),
    _S.UNKNOWN: frozenset({_S.UNKNOWN, _S.IN_FLIGHT, _S.APPLIED, _S.SKIPPED}),
    # An applied effect stays applied unless its compensation runs.
    _S.APPLIED: frozenset({_S.COMPENSATED, _S.COMPENSATION_FAILED, _S.COMPENSATION_UNKNOWN}),
    # A new try of a failed compensation may end with its outcome unknown, and an unknown
    # one may turn out failed once its lookup finds nothing and a new try fails.
    _S.COMPENSATION_FAILED: frozenset({_S.COMPENSATION_FAILED, _S.COMPENSATED,
                                       _S.COMPENSATION_UNKNOWN}),
    _S.COMPENSATION_UNKNOWN: frozenset({_S.COMPENSATION_UNKNOWN, _S.COMPENSATED,
                                        _S.COMPENSATION_FAILED}),
    _S.COMPENSATED: frozenset(),
    _S.FAILED: frozenset(),
    _S.REJECTED: frozenset(),
    _S.SKIPPED: frozenset(),
}

TERMINAL_STATUSES = frozenset({_S.APPLIED, _S.FAILED, _S.REJECTED, _S.SKIPPED,
                               _S.COMPENSATED, _S.COMPENSATION_FAILED,
                               _S.COMPENSATION_UNKNOWN})
"""Statuses whose stored result is replayed, never re-executed (a compensated effect
was sent: re-running its step replays, it never sends again)."""

SENT_STATUSES = frozenset({_S.APPLIED, _S.COMPENSATED, _S.COMPENSATION_FAILED,
                           _S.COMPENSATION_UNKNOWN})
"""Statuses of an effect known to have reached its provider."""


def sent_from(records: Iterable[EffectRecord]) -> EffectRecord | None:
    """The first of `records` (another family thread's rows of one key, oldest first,
    each sent, on its way or settled) that stands against sending the call again: not
    one paused on its tool's own question (`in_flight` with a `resume_tool` decision),
    which has sent nothing there (the tool asks before it acts)."""
    for record in records:
        if not (record.status is _S.IN_FLIGHT
                and (record.decision or {}).get("type") == "resume_tool"):
            return record
    return None


def answered(record: EffectRecord | None, asks: str | None = None) -> bool:
    """Whether an interrupt's question about `record` needs no human any more.

    A journaled decision clears `asked`, so a question is answered once its record is no
    longer asked: the decision waits to be carried out, is being carried out, or was (a
    worker stopped in between; resuming the thread goes on with it). `asks` is what the
    interrupt asked (`approval` or `unknown`): a record asked about something else was
    asked anew by a run that stopped before its interrupt was saved, so the saved
    question is stale and resuming asks the new one.
    """
    if record is None:
        return False
    if not record.asked:
        return True
    asked_now = "approval" if record.status is EffectStatus.AWAITING_APPROVAL else "unknown"
    return asks is not None and asks != asked_now


class EffectRecord(BaseModel):
    """One external write as the ledger knows it (one row per key and thread)."""

    model_config = ConfigDict(frozen=True)

    key: str
    """Stable idempotency key passed to the tool (see `derive_key`)."""
    thread_id: str
    """Thread whose step requested the effect."""
    checkpoint_ns: str
    """Namespace of the task that runs the tool call."""
    tool_call_id: str
    """Id of the tool call in the model's AIMessage."""
    tool: str
    """Tool name."""
    args: dict[str, Any]
    """Arguments the tool is (or was) called with."""
    status: EffectStatus
    """Current lifecycle status."""
    receipt: Any = None
    """What the provider answered: the tool's result, a lookup's record or a human's."""
    error: str | None = None
    """Last error seen, for `failed` and `unknown`."""
    attempts: int = 0
    """How many times the tool has been called for this key."""
    decision: dict[str, Any] | None = None
    """A journaled human decision not yet acted upon."""
    asked: bool = False
    """Whether an interrupt has asked a human about this effect and awaits the answer."""
    created_at: float
    """Unix time of the intent."""
    updated_at: float
    """Unix time of the last transition."""


_RECORD_DEFAULTS: dict[str, Any] = {"receipt": None, "error": None, "attempts": 0,
                                     "decision": None, "asked": False}
_RECORD_FIELDS = tuple(EffectRecord.model_fields)
_set = object.__setattr__


def trusted_record(**values: Any) -> EffectRecord:
    """An `EffectRecord` of values already checked (a row the ledger decoded, or an
    intent it planned): `model_construct`, without its per-field work."""
    given = {**_RECORD_DEFAULTS, **values}
    record = EffectRecord.__new__(EffectRecord)
    _set(record, "__dict__", {name: given[name] for name in _RECORD_FIELDS})
    _set(record, "__pydantic_fields_set__", set(values))
    _set(record, "__pydantic_extra__", None)
    _set(record, "__pydantic_private__", None)
    return record


class EffectEvent(BaseModel):
    """One entry of the append-only journal: a transition or a decision."""

    model_config = ConfigDict(frozen=True)

    seq: int
    """Position in the journal (monotonic per database)."""
    key: str
    """Effect key."""
    thread_id: str
    """Thread of the effect."""
    kind: str
    """`intent`, `attempt`, `receipt`, `failure`, `unknown`, `asked`, `decision`, ..."""
    data: dict[str, Any] = Field(default_factory=dict)
    """Details of the event (status, error, decision, source of a receipt)."""
    at: float
    """Unix time of the event."""
    owner: str | None = None
    """Lease owner that wrote it, if the write carried a lease."""
    fencing_token: int | None = None
    """Fencing token presented with the write, if any."""


def canonical_json(value: Any) -> str:
    """Encode `value` as canonical JSON: sorted keys, no spaces, finite numbers only.

    Raises:
        TypeError, ValueError: `value` holds something JSON cannot represent exactly.
    """
    return _CANONICAL.encode(value)


_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
"""`json.dumps` builds an encoder per call when given options; every key is encoded twice."""


def derive_key(
    *,
    thread_id: str,
    anchor: str,
    tool_call_id: str,
    tool: str,
    args: dict[str, Any],
    secret: bytes | None = None,
) -> str:
    """The idempotency key of one requested tool call.

    Derived from the key thread (the thread, or the thread a copy came from), the
    call's anchor (the requesting AIMessage, see `graph_durable.nodes.anchor`), the
    tool_call_id, the tool name and the canonical JSON of the arguments. The same
    requested call gets the same key after any crash and on every resume, fork, time
    travel or copy of its thread; a new requesting message or edited arguments get a
    new one.

    With `secret`, the key is an HMAC-SHA256 under it, so a provider that sees the key
    cannot confirm a guess of the arguments; without, a plain SHA-256 (keys of threads
    started before key secrets, see `graph_durable.secrets.KeySecrets`).

    Raises:
        UnkeyableToolCall: the arguments are not JSON-encodable.
    """
    encoded_args = encode_args(args, thread_id=thread_id, tool_call_id=tool_call_id, tool=tool)
    return key_of_encoded(thread_id, anchor, tool_call_id, tool, encoded_args, secret)


def encode_args(args: dict[str, Any], *, thread_id: str, tool_call_id: str, tool: str) -> str:
    """The canonical JSON of a call's arguments, as keys and intents store them.

    Raises:
        UnkeyableToolCall: the arguments are not JSON-encodable.
    """
    try:
        return canonical_json(args)
    except (TypeError, ValueError) as exc:
        raise UnkeyableToolCall(
            f"Tool call {tool_call_id!r} to {tool!r} in thread {thread_id!r} has arguments "
            f"that are not JSON ({exc}); nothing was sent. Pass JSON-serializable "
            "arguments (str, numbers, bools, None, lists, dicts) so the effect can be keyed.",
            thread_id=thread_id,
            tool_call_id=tool_call_id,
        ) from exc


def key_of_encoded(
    thread_id: str, anchor: str, tool_call_id: str, tool: str, encoded_args: str,
    secret: bytes | None = None,
) -> str:
    """`derive_key` for arguments already encoded by `encode_args`.

    Ledgers written before keys were anchored to the requesting message used the task's
    checkpoint namespace as `anchor`; the same function derives those legacy keys.
    """
    material = canonical_json([thread_id, anchor, tool_call_id, tool, encoded_args]).encode()
    if secret is None:
        return "gd-" + sha256_hex(material)[:40]
    return "gd-" + hmac_sha256_hex(secret, material)[:40]


class Keying(NamedTuple):
    """How a thread's calls are keyed (`saver.keying(thread_id)`)."""

    key_thread: str
    """The thread whose id keys the effects: the thread, or the one it was copied from."""
    legacy: bool
    """Whether effects recorded before keys were anchored to the requesting message may
    be found under their legacy keys."""
    secret: bytes | None = None
    """The key secret (`None`: plain SHA-256 keys, as before key secrets)."""
    pin: str | None = None
    """The key scheme to pin the key thread to with its first intent (`None`: pinned)."""


@dataclass(frozen=True)
class IntentWrite:
    """Ledger write: record a new effect (the intent) before anything is sent."""

    key: str
    thread_id: str
    checkpoint_ns: str
    tool_call_id: str
    tool: str
    args: dict[str, Any]
    status: EffectStatus
    args_json: str | None = None
    """`args` as `encode_args` encodes them, when the caller has it already."""
    redact: Any = None
    """`Effect.redact`: what of `args` is stored (`None`: all of it)."""
    key_scheme: str | None = None
    """Pins the thread's key scheme with this intent (`Keying.pin`), if not pinned yet."""
    data: dict[str, Any] | None = None
    """Details for the intent's journal entry (a compensation: what it undoes, and the
    decision that asked for it)."""
    keying: Keying | None = field(default=None, repr=False)  # it holds the key secret
    """The keying `key` was derived from when it was predicted rather than read
    (`predicted_keying`): the claim checks it in its transaction, and writes nothing of
    a claim whose thread is keyed otherwise (`KeyingChanged`)."""


@dataclass(frozen=True)
class TransitionWrite:
    """Ledger write: move one effect to `to`, journaled as an event of `kind`.

    `result` (a ToolMessage or Command) is stored for replay (`FROM_RECEIPT`: it is the
    receipt's own message, rebuilt from the receipt); `receipt` and `decision` are
    stored as JSON; `asked` flags an effect a pending interrupt asks about.
    `defer` lets the saver commit the write with the thread's next write (at the latest
    the step's own writes) instead of on its own: for receipts of effects that reconcile
    without a human (idempotent or looked up), whose loss in a crash costs a lookup or a
    deduplicated re-send, never a duplicate.
    """

    thread_id: str
    key: str
    to: EffectStatus
    kind: str
    data: dict[str, Any] = field(default_factory=dict)
    bump_attempts: bool = False
    error: str | None | _Unset = _UNSET
    receipt: Any | _Unset = _UNSET
    result: Any | _Unset = _UNSET
    decision: dict[str, Any] | None | _Unset = _UNSET
    asked: bool | _Unset = _UNSET
    checkpoint_ns: str | _Unset = _UNSET
    """The task now handling the effect: a question is answered in the task that asked
    it, which after a fork or time travel is not the task that recorded the intent."""
    tool_call_id: str | _Unset = _UNSET
    """The call now asking about the effect: a subgraph that a run from a named checkpoint
    restarted asks again under the tool_call_ids its model gives now, and a question (and
    a decision keyed by tool_call_id) names that call; the key stays the earlier one."""
    defer: bool = False
    redact: Any = None
    """`Effect.redact`: what of the receipt, result, decision, error and data is stored
    (an edit's args are kept whole: they are the only copy of what must be sent)."""


@dataclass(frozen=True)
class WriteBatch:
    """Ledger write: several writes of one thread in one transaction.

    `resume_at` names the checkpoint `(checkpoint_ns, checkpoint_id)` whose stored resume
    value a batch of decisions consumes; it is deleted in the same transaction, so the
    same answer can never be applied twice. `resume_value` is that value as the run
    holds it: LangGraph saves it in the background, so its save may land after the
    batch, and the saver then deletes it in that save's own transaction.
    """

    thread_id: str
    writes: tuple[IntentWrite | TransitionWrite, ...]
    resume_at: tuple[str, str] | None = None
    resume_value: Any = None


LedgerWrite = IntentWrite | TransitionWrite | WriteBatch
"""What the guard asks a durable saver to write (`saver.apply(write, config)`)."""
