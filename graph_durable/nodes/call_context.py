"""`CallContext`: what the effect protocol knows about one tool call, and its key.

The key of an effect is derived here, once, from the call as the model requested it:
the thread that keys the effects, the requesting message the call is anchored to
(`graph_durable.nodes.anchor`), its tool_call_id, tool and encoded args, and the
thread's key secret.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import ToolMessage

from graph_durable.errors import UnkeyableToolCall
from graph_durable.ledger import (
    EffectRecord,
    EffectStatus,
    Keying,
    TransitionWrite,
    encode_args,
    key_of_encoded,
    receipt_message,
)
from graph_durable.policy import Effect

__all__ = ["CallContext"]


@dataclass
class CallContext:
    """Everything the protocol needs to know about one tool call."""

    thread_id: str
    checkpoint_ns: str
    tool_call: dict[str, Any]
    policy: Effect
    key_thread_id: str | None = None
    """The thread whose id keys the effects: the thread, or the one it was copied from."""
    anchor: str | None = None
    """What the call is anchored to (`graph_durable.nodes.anchor`); the task's
    namespace when not given."""
    secret: bytes | None = None
    """The key secret of the thread's keys (`Keying.secret`; `None`: plain SHA-256)."""
    key_scheme: str | None = None
    """The key scheme to pin the thread to with its first intent (`Keying.pin`)."""
    intent_data: dict[str, Any] | None = None
    """Details journaled with the call's intent (see `IntentWrite.data`)."""
    defer_receipts: bool = True
    """Whether a reconcilable call's receipt may ride on the thread's next write (a
    step's call: its step writes next); a call outside a step commits it at once, and
    so does a call whose task holds an answer another party asked for (`Task.holds_answers`)."""
    requested_args: dict[str, Any] | None = None
    """The args the model asked for, when a middleware before the guard changed them
    (`anchor.requested_args`): the key is the requested call's, and `tool_call`'s args
    are what is recorded and sent."""
    key_call_id: str | None = None
    """The call id the key is derived from, when it is not the call's own: a guarded
    write's id names where it was made, so that each question has an id unique in its
    thread, and its key stays that of `name#position`."""
    predicted_keying: Keying | None = field(default=None, init=False)
    """The keying the key was derived from, when predicted rather than read: set on a
    step's call claimed ahead (`GuardBase._claiming`), whose intent carries it for the
    claim to check (`IntentWrite.keying`)."""
    sent: bool = field(default=False, init=False)
    outcome: str | None = field(default=None, init=False)
    """What became of the call so far, as telemetry names it (`telemetry.CallOutcome`):
    set by the protocol on each of its paths, read by the drivers when the call ends."""
    """Whether this run sent the call (a tool attempt was started): what an error of the
    database under one of its writes says (`nodes.storage`)."""
    key: str = field(init=False)
    args_json: str = field(init=False)
    tool_call_id: str = field(init=False)
    """The call's id (`tool_call["id"]`)."""
    tool: str = field(init=False)
    """The tool's name (`tool_call["name"]`)."""

    def __post_init__(self) -> None:
        call = self.tool_call
        if not isinstance(call.get("id"), str) or not call["id"]:
            raise UnkeyableToolCall(
                f"A call to {call.get('name')!r} in thread {self.thread_id!r} has tool_call_id "
                f"{call.get('id')!r}; nothing was sent. The key of an effect is derived from "
                "its tool_call_id: give every tool call a non-empty string id (chat models "
                "do; check the code that builds the AIMessage).",
                thread_id=self.thread_id, tool_call_id=None,
            )
        self.tool_call_id, self.tool = call["id"], call["name"]
        self.key_thread_id = self.key_thread_id or self.thread_id
        self.anchor = self.anchor or self.checkpoint_ns
        requested = call["args"] if self.requested_args is None else self.requested_args
        self.args_json = encode_args(requested, thread_id=self.thread_id,
                                     tool_call_id=call["id"], tool=call["name"])
        self.key = self._key(self.anchor, self.args_json, self.secret)

    def _key(self, anchor: str, args_json: str, secret: bytes | None) -> str:
        """The key of this call anchored to `anchor`, with args encoded as `args_json`."""
        return key_of_encoded(self.key_thread_id or self.thread_id, anchor,
                              self.key_call_id or self.tool_call_id, self.tool, args_json,
                              secret)

    def sent_args_key(self) -> str:
        """The key earlier releases gave a call whose args a middleware before the guard
        changed, when calls to other tools share its tool_call_id: derived from the
        changed args (it is now the requested call's, see `anchor.requested_args`)."""
        return self._key(self.anchor or self.checkpoint_ns, self._sent_args_json(),
                         self.secret)

    def legacy_key(self, *, sent: bool = False) -> str:
        """The key this call had before keys were anchored to the requesting message
        (`sent`: derived from the args it is sent with, as those releases keyed a call
        a middleware before the guard changed)."""
        return self._key(self.checkpoint_ns,
                         self._sent_args_json() if sent else self.args_json, None)

    def _sent_args_json(self) -> str:
        return encode_args(self.tool_call["args"], thread_id=self.thread_id,
                           tool_call_id=self.tool_call_id, tool=self.tool)

    def message(self, content: Any, *, status: str = "success") -> ToolMessage:
        """A ToolMessage answering this call."""
        return receipt_message(content, self.tool, self.tool_call_id, status)

    def transition(self, record: EffectRecord, to: EffectStatus, kind: str,
                   **fields: Any) -> TransitionWrite:
        """A transition of `record` (which may be an edited call's record)."""
        return TransitionWrite(thread_id=self.thread_id, key=record.key, to=to, kind=kind,
                               redact=self.policy.redact, **fields)

    def unredacted(self, value: Any) -> Any:
        """`value` (what the saver answered) with the requested call's own record holding
        the call's full args again, where its policy stored them redacted: the tool is
        called, and the human asked, with what the model asked for."""
        if self.policy.redact is None:
            return value
        if isinstance(value, EffectRecord):
            if value.key == self.key and value.args != self.tool_call["args"]:
                return value.model_copy(update={"args": self.tool_call["args"]})
            return value
        if isinstance(value, list):
            return [self.unredacted(item) for item in value]
        if isinstance(value, tuple) and value and isinstance(value[0], EffectRecord):
            return (self.unredacted(value[0]), *value[1:])
        return value
