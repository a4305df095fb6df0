"""What a guarded call answers with: the receipt kept of a tool's result, whether a lookup
could rebuild that result after a crash, and a lookup's own answer made to answer the call.

A tool's result (a ToolMessage, a Command, a list of them) is stored with its receipt
and replayed as it was. Only a plain ToolMessage whose content is the receipt is what a
lookup rebuilds, so only such a result may wait for the step's commit (see `_send` in
`graph_durable.nodes.protocol`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.types import Command

from graph_durable.ledger import receipt_message

__all__ = ["answering", "note_edit", "rebound", "rebuilt_by_lookup", "receipt_of",
           "tool_messages"]

_JSON_STARTS = frozenset('{["-0123456789tfnNI')
"""The first characters of every text `json.loads` accepts (after JSON whitespace)."""


def receipt_of(result: Any) -> Any:
    """What to keep as the receipt of a tool's result (JSON-friendly, for people): the
    content (and artifact) of its ToolMessage, or of the one a Command carries."""
    if isinstance(result, ToolMessage):
        content: Any = result.content
        # Plain text, a common answer, is not parsed: a failed parse costs an exception.
        if isinstance(content, str) and content.lstrip(" \t\n\r")[:1] in _JSON_STARTS:
            try:
                content = json.loads(content)
            except ValueError:
                pass
        if result.artifact is not None:
            return {"content": content, "artifact": result.artifact}
        return content
    answers = tool_messages(result)
    if len(answers) == 1:
        return receipt_of(answers[0])
    return {"result": repr(result)}


def tool_messages(result: Any) -> list[ToolMessage]:
    """The ToolMessages a Command's update (or a list of results) carries."""
    if isinstance(result, list):
        return [message for item in result
                for message in ([item] if isinstance(item, ToolMessage) else tool_messages(item))]
    if not isinstance(result, Command):
        return []
    update = result.update
    values = update.values() if isinstance(update, dict) else [update]
    return [message for value in values
            for message in (value if isinstance(value, list) else [value])
            if isinstance(message, ToolMessage)]


def rebuilt_by_lookup(result: Any, receipt: Any, tool: str, tool_call_id: str) -> bool:
    """Whether the ToolMessage a lookup's `receipt` gives the model (`receipt_message`,
    answering `tool_call_id` of `tool`) is `result` in every field. Anything else (a
    Command, an artifact, a reviewer's note, fields of the tool's own) only the stored
    result replays.

    A text receipt (the common answer) makes a message that holds it as it is and every
    other field at its default: `result` is compared with those values, field by field,
    without building the message."""
    if not isinstance(result, ToolMessage):
        return False
    if type(result) is ToolMessage and isinstance(receipt, str) and not result.__pydantic_extra__:
        return result.__dict__ == {**_defaults(), "content": receipt, "name": tool,
                                   "tool_call_id": tool_call_id, "status": "success"}
    return result == receipt_message(receipt, tool, tool_call_id)


_DEFAULTS: dict[str, Any] = {}


def _defaults() -> dict[str, Any]:
    """The fields of a ToolMessage made with only content, name, tool_call_id and status
    (whose values `rebuilt_by_lookup` sets), as LangChain fills them in."""
    if not _DEFAULTS:
        _DEFAULTS.update(ToolMessage(content="", name="", tool_call_id="",
                                     status="success").__dict__)
    return _DEFAULTS


def answering(found: ToolMessage | Command, tool_call_id: str, tool: str
              ) -> ToolMessage | Command:
    """A lookup's ToolMessage or Command, made to answer the call `tool_call_id` (a lookup
    knows the key, not the call).

    Raises:
        ValueError: a Command for this graph that carries no ToolMessage, or a Command
            that carries several: it cannot answer one call.
    """
    if isinstance(found, ToolMessage):
        return found.model_copy(update={"tool_call_id": tool_call_id, "name": tool})
    answers = tool_messages(found)
    if len(answers) > 1 or (not answers and found.graph is None):
        raise ValueError(
            f"the lookup of {tool!r} returned a Command carrying {len(answers)} "
            "ToolMessages; a Command that answers a call carries exactly one in its update "
            "(one sent to the parent graph may carry none)")

    def fixed(value: Any) -> Any:
        if isinstance(value, ToolMessage):
            return answering(value, tool_call_id, tool)
        if isinstance(value, list):
            return [fixed(item) for item in value]
        return value

    update = found.update
    if isinstance(update, dict):
        update = {name: fixed(value) for name, value in update.items()}
    elif isinstance(update, list):
        update = fixed(update)
    return dataclasses.replace(found, update=update)


def rebound(result: Any, tool_call_id: str, answered: tuple[str, ...] = ()) -> Any:
    """A stored result, replayed to the call `tool_call_id`, made to answer it.

    A result answers the call that ran or settled it. A subgraph that a run from a named
    checkpoint restarted asks again under the tool_call_ids its model gives now, and takes
    the earlier request's key (`graph_durable.nodes.restarts`): the receipt it replays, or
    takes over from a copy of the thread, answers the earlier run's call. The ToolMessage
    of a result that carries one is made to answer `tool_call_id`; of a result that
    carries several, those answering one of `answered` (the ids the effect was asked
    under). Anything else is returned as it was.
    """
    answers = [result] if isinstance(result, ToolMessage) else tool_messages(result)
    stale = set(answered)
    if len(answers) == 1:
        stale.add(answers[0].tool_call_id)
    stale.discard(tool_call_id)
    if not stale or not any(answer.tool_call_id in stale for answer in answers):
        return result

    def fixed(value: Any) -> Any:
        if isinstance(value, ToolMessage):
            if value.tool_call_id not in stale:
                return value
            return value.model_copy(update={"tool_call_id": tool_call_id})
        if isinstance(value, list):
            return [fixed(item) for item in value]
        if isinstance(value, Command):
            update = value.update
            if isinstance(update, dict):
                return dataclasses.replace(
                    value, update={name: fixed(item) for name, item in update.items()})
            if isinstance(update, list):
                return dataclasses.replace(value, update=fixed(update))
        return value

    return fixed(result)


def note_edit(result: Any, args: dict[str, Any]) -> Any:
    """Tell the model that a reviewer edited the arguments it asked for."""
    note = f"[arguments edited by reviewer: {json.dumps(args, ensure_ascii=False, default=str)}]"
    if isinstance(result, ToolMessage) and isinstance(result.content, str):
        return result.model_copy(update={"content": f"{note} {result.content}"})
    return result
