"""The anchor of a requested tool call: the AIMessage that asked for it.

A key must be the same for the same requested call on every path LangGraph offers
(resume, `get_state().config`, time travel, `update_state` forks, `copy_thread`), and
new for a call that is new, even when a model reuses a tool_call_id and args in a later
turn. The task's checkpoint namespace fails the first rule: its task id comes from the
checkpoint id, and a run that names a checkpoint id writes a new fork checkpoint. The
requesting message passes both: `add_messages` gives every message an id, which every
fork and copy of the history keeps, and a later turn is a new message.

The rule, in order:
1. `msg:<id>` — the id of the last AIMessage in the state whose `tool_calls` hold the
   call's id.
2. refused (`UnkeyableToolCall`, before anything is claimed or sent) — when that
   message has no id (a state without `add_messages`). Nothing else about an id-less
   message is both stable and new for a new request: its position repeats when a
   reducer keeps the last N messages, in every `Send` payload (index 0), and in a fork
   where time travel re-ran the model; its content repeats when a scripted model asks
   again. LangGraph's own marks of the step fail the other rule: checkpoint and task
   ids are new in every fork, the messages channel's version is new when `update_state`
   writes the messages again, and a `Send` payload never enters the channels at all.
   An earlier receipt given to a later request would tell the model a charge was made
   that was never sent, so the guard asks for an id.
3. the task's checkpoint namespace — when no message in the state asked for the call
   (a tool call made up by a wrapper). It names the checkpoint the step ran from and the
   task's place in it, so a later request, which runs from a later checkpoint, never
   shares it; a fork of the step gets a new one, so such a call is keyed per task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage

from graph_durable.errors import UnkeyableToolCall
from graph_durable.ledger import canonical_json

__all__ = ["UNREAD", "Request", "call_anchor", "messages_of", "request_of", "requested_args",
           "requests_of"]


def messages_of(state: Any, messages_key: str = "messages") -> Sequence[Any]:
    """The message list of a tool node's state (a list, a dict or a model)."""
    if isinstance(state, list):
        return state
    if isinstance(state, Mapping):
        found = state.get(messages_key)
    else:
        found = getattr(state, messages_key, None)
    return found if isinstance(found, list) else ()


Request = tuple[AIMessage, list[Mapping[str, Any]]] | None
"""The AIMessage that requested a call and its calls under the call's id (`request_of`),
or `None` when no message of the state asked for it."""


def request_of(state: Any, tool_call_id: str | None, messages_key: str = "messages"
               ) -> Request:
    """The last AIMessage in `state` whose `tool_calls` hold `tool_call_id`, with those
    calls: what `call_anchor` and `requested_args` read (found once for both)."""
    for message in reversed(messages_of(state, messages_key)):
        if not isinstance(message, AIMessage):
            continue
        asked = [call for call in message.tool_calls if call.get("id") == tool_call_id]
        if asked:
            return message, asked
    return None


def requests_of(state: Any, tool_call_ids: Sequence[str | None],
                messages_key: str = "messages") -> dict[str | None, Request]:
    """`request_of` for each of `tool_call_ids` (a step's calls), the messages read
    once for all of them: the last AIMessage holding each id, with its calls under
    it, or `None`."""
    found: dict[str | None, Request] = {}
    wanted = set(tool_call_ids)
    for message in reversed(messages_of(state, messages_key)):
        if not wanted:
            break
        if not isinstance(message, AIMessage):
            continue
        for call in message.tool_calls:
            call_id = call.get("id")
            if call_id in wanted:
                found.setdefault(call_id, (message, []))[1].append(call)
        wanted.difference_update(found)
    return {call_id: found.get(call_id) for call_id in tool_call_ids}


UNREAD: Any = object()
"""What a `request` argument defaults to: not looked up yet."""


def call_anchor(state: Any, tool_call_id: str | None, fallback: str,
                messages_key: str = "messages", *, thread_id: str | None = None,
                request: Request = UNREAD) -> str:
    """The anchor of the call `tool_call_id` in `state` (see the module docstring);
    `request` is its `request_of`, when already found.

    Raises:
        UnkeyableToolCall: the requesting AIMessage has no id.
    """
    if request is UNREAD:
        request = request_of(state, tool_call_id, messages_key)
    if request is not None:
        message, asked = request
        if message.id:
            return f"msg:{message.id}"
        raise UnkeyableToolCall(
            f"The AIMessage that requested call {tool_call_id!r} to {asked[0].get('name')!r} "
            f"in thread {thread_id!r} has no id; nothing was sent. A key is anchored to the "
            "id of the requesting message: without one, a later request that repeats this "
            "tool_call_id and args (a history that keeps the last N messages, AIMessages "
            "built by hand and sent with Send) would be answered with this one's receipt. "
            "Give the AIMessage an id, e.g. use the add_messages reducer / MessagesState, "
            "or set AIMessage(id=...). Nothing was claimed, so the step runs once its "
            "message has one (e.g. graph.update_state with the message given an id).",
            thread_id=thread_id, tool_call_id=tool_call_id,
        )
    return fallback


def requested_args(state: Any, tool_call: Mapping[str, Any],
                   messages_key: str = "messages", *, thread_id: str | None = None,
                   request: Request = UNREAD) -> dict[str, Any] | None:
    """The args the model asked for, when `tool_call` reaches the guard with others.

    A middleware listed before the guard may change a call's args before it runs (a
    per-call `HumanInTheLoopMiddleware`'s `edit`). The call is still the one the model
    requested: it keeps that request's key, so a question asked again after a crash (or
    on a fork), answered otherwise the second time, reaches the same effect and is
    reconciled with it, never sent as a second one. `None` when the args are those of the
    requesting AIMessage, or when the call is not one the message asked for (no call to
    its tool under the id). Calls to other tools under the same id do not change which
    call it is.

    Calls under one tool_call_id are told apart by their args (the key holds them), so a
    changed call under an id that several calls of the message share could be any of
    them: it is refused.

    Raises:
        UnkeyableToolCall: the args were changed and the requesting message holds several
            calls to the tool under the call's id.
    """
    if request is UNREAD:
        request = request_of(state, tool_call.get("id"), messages_key)
    if request is not None:
        same_tool = [call for call in request[1] if call.get("name") == tool_call.get("name")]
        args = tool_call.get("args")
        if any(_same_args(call.get("args"), args) for call in same_tool):
            return None
        if len(same_tool) > 1:
            raise UnkeyableToolCall(
                f"A middleware listed before the guard changed the args of call "
                f"{tool_call.get('id')!r} to {tool_call.get('name')!r} in thread "
                f"{thread_id!r} (e.g. HumanInTheLoopMiddleware's edit), and the AIMessage "
                f"that requested it holds {len(same_tool)} calls to that tool under this "
                "tool_call_id; nothing was sent. The changed call could be any of them, so "
                "it has no key that a later answer to the same request (after a crash, on a "
                "fork) would find again, and sending it could charge twice. Give every call "
                "of the AIMessage its own tool_call_id (e.g. graph.update_state with the "
                "message's calls renumbered), or answer the question with approve, reject "
                "or respond instead of edit.",
                thread_id=thread_id, tool_call_id=tool_call.get("id"),
            )
        if len(same_tool) != 1:
            return None  # no call to this tool under the id: not one the message asked for
        # The one call to this tool under the id, even where calls to other tools share
        # it (seed 1033101: keyed by its changed args, it was charged again on a fork).
        return dict(same_tool[0].get("args") or {})
    return None


def _same_args(requested: Any, sent: Any) -> bool:
    """Whether `sent` are the args the model requested as the key encodes them: equal
    in Python is not enough (an edit that sends `10` for a requested `10.0`, or `True`
    for `1`, compares equal but keys apart: keyed by what it sends, it was charged again
    on a fork). The same object, as an unchanged call passes them, is not encoded."""
    if requested is sent:
        return True
    if requested != sent:
        return False
    try:
        return canonical_json(requested) == canonical_json(sent)
    except (TypeError, ValueError):
        return False  # not JSON: keying the call refuses it (`encode_args`)
