"""Interrupt payloads, and the validation of the decisions that answer them.

A resume value is either one decision (allowed when exactly one effect of the task is
pending) or a mapping `{tool_call_id: decision}`. Decisions use LangChain's
HumanInTheLoopMiddleware shapes. Validation is pure: it runs before anything is
recorded, so a malformed answer leaves the interrupt pending and the ledger unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graph_durable.errors import InvalidDecision
from graph_durable.ledger import EffectRecord, EffectStatus

__all__ = [
    "APPROVAL_DECISIONS",
    "UNKNOWN_DECISIONS",
    "allowed_decisions",
    "approval_payload",
    "match_decisions",
    "unknown_payload",
]

APPROVAL_DECISIONS = ("approve", "edit", "reject")
UNKNOWN_DECISIONS = ("applied", "retry", "skip")


def allowed_decisions(record: EffectRecord) -> tuple[str, ...]:
    """Decision types that can answer the question asked about `record`."""
    if record.status is EffectStatus.AWAITING_APPROVAL:
        return APPROVAL_DECISIONS
    return UNKNOWN_DECISIONS


def approval_payload(record: EffectRecord, description: str | None) -> dict[str, Any]:
    """The `effect_approval` interrupt value for an effect awaiting approval."""
    return {
        "type": "effect_approval",
        "tool_call_id": record.tool_call_id,
        "tool": record.tool,
        "args": record.args,
        "key": record.key,
        "description": description,
        "allowed_decisions": list(APPROVAL_DECISIONS),
    }


def unknown_payload(record: EffectRecord) -> dict[str, Any]:
    """The `effect_unknown` interrupt value for an effect whose outcome is unknown."""
    return {
        "type": "effect_unknown",
        "tool_call_id": record.tool_call_id,
        "tool": record.tool,
        "args": record.args,
        "key": record.key,
        "attempts": record.attempts,
        "error": record.error,
        "allowed_decisions": list(UNKNOWN_DECISIONS),
    }


def _is_decision(value: Any) -> bool:
    return isinstance(value, Mapping) and "type" in value


def _invalid(message: str, record: EffectRecord | None, thread_id: str) -> InvalidDecision:
    tool_call_id = record.tool_call_id if record else None
    return InvalidDecision(
        f"{message} (thread {thread_id!r}). Nothing was recorded and the interrupt is still "
        "pending: resume again with Command(resume={tool_call_id: decision}), or use "
        "graph_durable.review(graph, config) to build the command.",
        thread_id=thread_id,
        tool_call_id=tool_call_id,
    )


def _check_shape(decision: Any, record: EffectRecord, thread_id: str) -> dict[str, Any]:
    where = f"decision for tool call {record.tool_call_id!r} ({record.tool})"
    if not _is_decision(decision):
        raise _invalid(f"The {where} must be a dict with a 'type', got {decision!r}",
                       record, thread_id)
    kind = decision["type"]
    allowed = allowed_decisions(record)
    if kind not in allowed:
        raise _invalid(
            f"The {where} has type {kind!r}; this interrupt allows {list(allowed)}",
            record, thread_id,
        )
    if kind == "edit":
        action = decision.get("edited_action")
        if not isinstance(action, Mapping) or not isinstance(action.get("args"), Mapping):
            raise _invalid(
                f"The {where} is an edit without 'edited_action': "
                "{'name': ..., 'args': {...}}", record, thread_id,
            )
        if action.get("name", record.tool) != record.tool:
            raise _invalid(
                f"The {where} edits the call into tool {action.get('name')!r}; an edit may "
                "change the arguments, not the tool", record, thread_id,
            )
    if kind == "applied" and "receipt" not in decision:
        raise _invalid(f"The {where} says 'applied' without a 'receipt'", record, thread_id)
    for text_field in ("message", "reviewer"):
        if text_field in decision and not isinstance(decision[text_field], str):
            raise _invalid(f"The {where} has a non-string {text_field!r}", record, thread_id)
    return dict(decision)


def match_decisions(
    resume: Any, asked: list[EffectRecord], thread_id: str
) -> dict[str, dict[str, Any]]:
    """Match a resume value to the effects a task asked about, by tool_call_id.

    A mapping may also name an effect by its key: a model that gives two different
    calls of one message the same tool_call_id leaves the key as the only name that
    tells them apart (`review` uses it then).

    Returns:
        `{key: decision}` for every asked effect.

    Raises:
        InvalidDecision: a decision for an unknown tool call, a missing decision, a type
            the interrupt does not allow, or a malformed decision.
    """
    by_call: dict[str, list[EffectRecord]] = {}
    for record in asked:
        by_call.setdefault(record.tool_call_id, []).append(record)
    by_key = {record.key: record for record in asked}
    if _is_decision(resume):
        if len(asked) != 1:
            raise _invalid(
                f"A single decision was given but {len(asked)} tool calls are pending "
                f"({sorted(by_call)}); answer each by tool_call_id", None, thread_id,
            )
        return {asked[0].key: _check_shape(resume, asked[0], thread_id)}
    if not isinstance(resume, Mapping):
        raise _invalid(
            f"Resume value {resume!r} is neither a decision nor a mapping "
            "{tool_call_id: decision}", None, thread_id,
        )
    not_ids = [name for name in resume if not isinstance(name, str)]
    if not_ids:
        raise _invalid(
            f"Decisions must be keyed by tool_call_id (a string); got keys {not_ids!r}; "
            f"pending: {sorted(by_call)}", None, thread_id,
        )
    chosen: dict[str, dict[str, Any]] = {}
    for name, decision in resume.items():
        if name in by_key:
            record = by_key[name]
        elif len(by_call.get(name, ())) == 1:
            [record] = by_call[name]
        elif name in by_call:
            raise _invalid(
                f"Tool call id {name!r} names {len(by_call[name])} different pending calls "
                f"(the model repeated the id); name each by its effect key instead: "
                f"{[r.key for r in by_call[name]]}", by_call[name][0], thread_id,
            )
        else:
            raise _invalid(
                f"Decisions name tool calls that are not pending: {[name]}; pending: "
                f"{sorted(by_call)}", None, thread_id,
            )
        chosen[record.key] = _check_shape(decision, record, thread_id)
    missing = [record for record in asked if record.key not in chosen]
    if missing:
        raise _invalid(
            f"No decision for tool call {missing[0].tool_call_id!r} ({missing[0].tool}); "
            f"every pending call needs one: {sorted(by_call)}", missing[0], thread_id,
        )
    return chosen
