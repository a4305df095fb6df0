"""The anchor of a requested tool call: the AIMessage that asked for it.

A key must be the same for the same requested call on every path LangGraph offers
(resume, `get_state().config`, time travel, `update_state` forks, `copy_thread`), and
new for a call that is new, even when a model reuses a tool_call_id in a later turn.
The task's checkpoint namespace fails the first rule: its task id comes from the
checkpoint id, and a run that names a checkpoint id writes a new fork checkpoint. The
requesting message passes both: `add_messages` gives every message an id, which every
fork and copy of the history keeps, and a later turn is a new message.

The rule, in order:
1. `msg:<id>` — the id of the last AIMessage in the state whose `tool_calls` hold the
   call's id.
2. `idx:<n>` — that message's position, when it has no id (a state without the
   `add_messages` reducer); stable while history is only appended to.
3. the task's checkpoint namespace — when no message in the state asked for the call
   (a tool call made up by a wrapper); such a call is keyed per task, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage

__all__ = ["call_anchor", "messages_of"]


def messages_of(state: Any, messages_key: str = "messages") -> Sequence[Any]:
    """The message list of a tool node's state (a list, a dict or a model)."""
    if isinstance(state, list):
        return state
    if isinstance(state, Mapping):
        found = state.get(messages_key)
    else:
        found = getattr(state, messages_key, None)
    return found if isinstance(found, list) else ()


def call_anchor(state: Any, tool_call_id: str | None, fallback: str,
                messages_key: str = "messages") -> str:
    """The anchor of the call `tool_call_id` in `state` (see the module docstring)."""
    messages = messages_of(state, messages_key)
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AIMessage) and any(
            call.get("id") == tool_call_id for call in message.tool_calls
        ):
            return f"msg:{message.id}" if message.id else f"idx:{index}"
    return fallback
