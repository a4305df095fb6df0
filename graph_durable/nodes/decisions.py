"""Interrupt payloads, their response schemas, and the validation of the decisions that
answer them.

Payloads follow LangChain's per-call shape (`HumanInTheLoopMiddleware(interrupt_mode=
"per_call")`): an approval is a `tool_approval` request (`tool_call_id`, `name`, `args`,
`description`) with the ledger's fields beside it (`key`, `status`, `attempts`,
`allowed_decisions`); an unknown outcome is an `effect_unknown` request in the same style.
Each interrupt carries a `response_schema` listing the decisions it allows, the edit's
args following the tool's own argument schema.

A resume value is one decision (allowed when exactly one effect of the task is pending),
a mapping `{interrupt_id | tool_call_id | effect key: decision}`, or LangChain's batched
`{"decisions": [...]}` (matched to the pending calls in their order). Decisions use
LangChain's HumanInTheLoopMiddleware shapes. Validation is pure: it runs before anything
is recorded, so a malformed answer leaves the interrupt pending and the ledger unchanged.
A mapping may answer some of the pending calls: the others stay pending.

Calls that run as tasks of their own (`create_agent`'s, the branches of a `Send`) are
each handed the whole resume map: each task checks every answer the map addresses to a
question of the thread (`check_answers`) before it takes its own, so one invalid answer
runs none of the set. Inside a graph run the guard raises the refusal as
`RefusedDecision`, an `InvalidDecision` that is also LangGraph's control-flow signal.
"""

from __future__ import annotations

import functools
from datetime import datetime, timezone
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

from langgraph.errors import GraphBubbleUp
from pydantic import BaseModel, ConfigDict, Discriminator, TypeAdapter, ValidationError, create_model

from graph_durable.errors import InvalidDecision
from graph_durable.ledger import EffectRecord, EffectStatus, canonical_json

__all__ = [
    "APPROVAL_DECISIONS",
    "UNKNOWN_DECISIONS",
    "RefusedDecision",
    "allowed_decisions",
    "approval_payload",
    "check_answers",
    "check_decision",
    "decided_note",
    "match_decisions",
    "refuse_stale",
    "response_schema",
    "unknown_payload",
]

APPROVAL_DECISIONS = ("approve", "edit", "reject", "respond")
UNKNOWN_DECISIONS = ("applied", "retry", "skip")
APPROVAL_TYPES = ("tool_approval", "effect_approval")
"""Interrupt types asking for an approval: LangChain's per-call one, and the shape of
earlier releases (`effect_approval`, with `tool` for `name`), still read."""


class RefusedDecision(InvalidDecision, GraphBubbleUp):
    """`InvalidDecision` as the guard raises it in a graph run: also a `GraphBubbleUp`,
    LangGraph's control-flow signal (an interrupt is one), so that it reaches the caller
    as an interrupt would. No middleware around the guard (`ToolRetryMiddleware`,
    `ToolErrorMiddleware`), `ToolNode(handle_tool_errors=...)`, node `RetryPolicy` or
    error handler takes it for a failed tool call. Catch it as `InvalidDecision`."""

    @classmethod
    def of(cls, refused: InvalidDecision) -> RefusedDecision:
        """`refused`, raised in a graph run."""
        if isinstance(refused, cls):
            return refused
        return cls(str(refused), thread_id=refused.thread_id, tool_call_id=refused.tool_call_id)


def allowed_decisions(record: EffectRecord) -> tuple[str, ...]:
    """Decision types that can answer the question asked about `record`."""
    if record.status is EffectStatus.AWAITING_APPROVAL:
        return APPROVAL_DECISIONS
    return UNKNOWN_DECISIONS


def approval_payload(record: EffectRecord, description: str | None) -> dict[str, Any]:
    """The `tool_approval` interrupt value for an effect awaiting approval."""
    return {
        "type": "tool_approval",
        "tool_call_id": record.tool_call_id,
        "name": record.tool,
        "args": record.args,
        "description": description or f"Tool execution pending approval: {record.tool}",
        "key": record.key,
        "status": record.status.value,
        "attempts": record.attempts,
        "allowed_decisions": list(APPROVAL_DECISIONS),
    }


def unknown_payload(record: EffectRecord) -> dict[str, Any]:
    """The `effect_unknown` interrupt value for an effect whose outcome is unknown."""
    return {
        "type": "effect_unknown",
        "tool_call_id": record.tool_call_id,
        "name": record.tool,
        "args": record.args,
        "key": record.key,
        "status": record.status.value,
        "attempts": record.attempts,
        "error": record.error,
        "description": f"The outcome of {record.tool} is unknown: check the provider, then "
                       "say it was applied, retry it, or skip it",
        "allowed_decisions": list(UNKNOWN_DECISIONS),
    }


def decided_note(events: list[Any]) -> str:
    """`decided at <when> by <whom> (<type>)` from a call's journal, or `""`."""
    decided = [e for e in events if e.kind == "decision"]
    if not decided:
        return ""
    last = decided[-1]
    decision = last.data.get("decision") or {}
    when = datetime.fromtimestamp(last.at, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    who = decision.get("reviewer") or last.owner or "an unnamed reviewer"
    return f"decided at {when} by {who} ({decision.get('type')})"


def refuse_stale(record: EffectRecord, events: list[Any], thread_id: str) -> InvalidDecision:
    """The refusal of an answer to a question about `record` that is no longer asked
    (a double click, a second reviewer, an answer to an earlier question)."""
    note = decided_note(events)
    return InvalidDecision(
        f"The interrupt about tool call {record.tool_call_id!r} ({record.tool}) in thread "
        f"{thread_id!r} is no longer pending: it was {note or 'settled'} and is now "
        f"{record.status.value}. Nothing was changed; review(graph, config) lists what is "
        "pending.", thread_id=thread_id, tool_call_id=record.tool_call_id)


# -- response schemas: what LangGraph publishes to clients, and what the guard checks ----

class _Decision(BaseModel):
    model_config = ConfigDict(extra="allow")
    reviewer: str | None = None


class Approve(_Decision):
    type: Literal["approve"]


class Reject(_Decision):
    type: Literal["reject"]
    message: str | None = None


class Respond(_Decision):
    """The reviewer answers in place of the tool: nothing is sent."""

    type: Literal["respond"]
    message: str


class Applied(_Decision):
    """The effect happened (a human checked): its receipt."""

    type: Literal["applied"]
    receipt: Any


class Retry(_Decision):
    type: Literal["retry"]


class Skip(_Decision):
    type: Literal["skip"]
    message: str | None = None


def _args_schema(tool: Any) -> Any:
    """The model an edit's args must follow: the tool's own call schema, if it is one."""
    schema = getattr(tool, "tool_call_schema", None)
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return schema
    return dict[str, Any]


@functools.lru_cache(maxsize=256)
def _decision_type(allowed: tuple[str, ...], name: str, args: Any) -> Any:
    # The fields are built as data: the tool's name is known only now.
    named: Any = Literal.__getitem__(name)
    action_fields: dict[str, Any] = {"name": (named, name), "args": (args, ...)}
    action = create_model("EditedAction", __config__=ConfigDict(extra="forbid"),
                          **action_fields)
    edit_fields: dict[str, Any] = {"type": (Literal["edit"], ...),
                                   "edited_action": (action, ...)}
    edit = create_model("Edit", __base__=_Decision, **edit_fields)
    by_type = {"approve": Approve, "edit": edit, "reject": Reject, "respond": Respond,
               "applied": Applied, "retry": Retry, "skip": Skip}
    members = tuple(by_type[kind] for kind in allowed)
    return Annotated[Union[members], Discriminator("type")]  # noqa: UP007


@functools.lru_cache(maxsize=256)
def _adapter(allowed: tuple[str, ...], name: str, args: Any) -> TypeAdapter[Any]:
    return TypeAdapter(_decision_type(allowed, name, args))


def response_schema(record: EffectRecord, tool: Any = None) -> dict[str, Any]:
    """The JSON schema of the decisions that answer the question about `record`: one
    branch per allowed type, an edit's args following `tool`'s argument schema."""
    return _adapter(allowed_decisions(record), record.tool, _args_schema(tool)).json_schema()


def _check_schema(decision: Mapping[str, Any], record: EffectRecord, tool: Any,
                  where: str, thread_id: str) -> None:
    try:
        _adapter(allowed_decisions(record), record.tool, _args_schema(tool)).validate_python(
            dict(decision))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc'][1:]) or 'decision'}: {error['msg']}"
            for error in exc.errors(include_url=False))
        raise _invalid(f"The {where} does not match the interrupt's response_schema "
                       f"({problems})", record, thread_id) from None


def _is_decision(value: Any) -> bool:
    return isinstance(value, Mapping) and "type" in value


_SHAPES = {
    "approve": "{'type': 'approve'}",
    "edit": "{'type': 'edit', 'edited_action': {'name': TOOL, 'args': {...}}}",
    "reject": "{'type': 'reject', 'message': '...'}",
    "respond": "{'type': 'respond', 'message': '...'}",
    "applied": "{'type': 'applied', 'receipt': {...}}",
    "retry": "{'type': 'retry'}",
    "skip": "{'type': 'skip', 'message': '...'}",
}
"""What each decision looks like, for error messages."""


def _valid_shapes(record: EffectRecord) -> str:
    return ", ".join(_SHAPES[kind].replace("TOOL", repr(record.tool))
                     for kind in allowed_decisions(record))


def _invalid(message: str, record: EffectRecord | None, thread_id: str) -> InvalidDecision:
    tool_call_id = record.tool_call_id if record else None
    shapes = f" A valid decision for it is one of {_valid_shapes(record)}." if record else ""
    return InvalidDecision(
        f"{message} (thread {thread_id!r}).{shapes} Nothing was recorded, nor any other "
        "answer given with it, and the interrupts are still pending: resume again with "
        "Command(resume={interrupt_id: decision, ...}), or use "
        "graph_durable.review(graph, config) to build the command.",
        thread_id=thread_id,
        tool_call_id=tool_call_id,
    )


def _check_shape(decision: Any, record: EffectRecord, thread_id: str,
                 tool: Any = None) -> dict[str, Any]:
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
    _check_schema(decision, record, tool, where, thread_id)
    return dict(decision)


def check_decision(decision: Any, record: EffectRecord, thread_id: str,
                   tool: Any = None) -> dict[str, Any]:
    """Check one decision for the question asked about `record` (`InvalidDecision` if it
    does not answer it); `tool` gives the argument schema an edit must follow."""
    return _check_shape(decision, record, thread_id, tool)


def check_answers(resume_map: Mapping[str, Any], asked: Mapping[str, EffectRecord],
                  thread_id: str, tools: Mapping[str, Any] | None = None) -> None:
    """Check every answer of `resume_map` ({interrupt_id: decision}) addressed to a
    question asked about a call of the thread (`asked`: by interrupt id), in the map's
    order, whichever task asks it.

    Each task of a step is handed the whole map, and checks it all before it takes its
    own answers: every task then refuses a set holding one invalid answer alike, with the
    same error, and none of the set runs. `tools` (by name) give the argument schemas
    edits are checked against.

    Raises:
        InvalidDecision: an answer that does not fit the question it answers.
    """
    tools = tools or {}
    for interrupt_id, decision in resume_map.items():
        record = asked.get(interrupt_id)
        if record is not None:
            _check_shape(decision, record, thread_id, tools.get(record.tool))


def match_decisions(
    resume: Any, asked: list[EffectRecord], thread_id: str, *,
    tools: Mapping[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """Match a resume value to the effects a task asked about.

    A mapping names each effect by its interrupt id (translated to its key by the
    caller), its tool_call_id, or its key: a model that gives two different calls of
    one message the same tool_call_id leaves the key as the only name that tells them
    apart (`review` uses it then). A mapping may answer only some of the calls; LangChain's
    batched `{"decisions": [...]}` answers all of them, in the order they were asked.
    `tools` (by name) give the argument schemas edits are checked against.

    Returns:
        `{key: decision}` for the effects the value answers.

    Raises:
        InvalidDecision: a decision for a call that is not pending, a single decision for
            several calls, a type the interrupt does not allow, or a malformed decision
            (args that do not fit the tool's schema included). Nothing is matched then.
    """
    tools = tools or {}
    by_call: dict[str, list[EffectRecord]] = {}
    for record in asked:
        by_call.setdefault(record.tool_call_id, []).append(record)
    by_key = {record.key: record for record in asked}

    def checked(decision: Any, record: EffectRecord) -> dict[str, Any]:
        return _check_shape(decision, record, thread_id, tools.get(record.tool))

    if _is_decision(resume):
        if len(asked) != 1:
            raise _invalid(
                f"A single decision was given but {len(asked)} tool calls are pending "
                f"({sorted(by_call)}); answer each by its interrupt id", None, thread_id,
            )
        return {asked[0].key: checked(resume, asked[0])}
    if isinstance(resume, Mapping) and set(resume) == {"decisions"}:
        batch = resume["decisions"]
        if not isinstance(batch, list | tuple) or len(batch) != len(asked):
            raise _invalid(
                f"{{'decisions': [...]}} must hold one decision per pending call, in order: "
                f"{len(asked)} pending ({[r.tool_call_id for r in asked]})", None, thread_id,
            )
        return {record.key: checked(decision, record)
                for record, decision in zip(asked, batch, strict=True)}
    if not isinstance(resume, Mapping):
        raise _invalid(
            f"Resume value {resume!r} is neither a decision nor a mapping "
            "{interrupt_id: decision}", None, thread_id,
        )
    not_ids = [name for name in resume if not isinstance(name, str)]
    if not_ids:
        raise _invalid(
            f"Decisions must be keyed by interrupt id or tool_call_id (a string); got keys "
            f"{not_ids!r}; pending: {sorted(by_call)}", None, thread_id,
        )
    if not resume:
        raise _invalid(f"The resume value decides nothing; pending: {sorted(by_call)}",
                       None, thread_id)
    chosen: dict[str, dict[str, Any]] = {}
    for name, decision in resume.items():
        if name in by_key:
            record = by_key[name]
        elif len(by_call.get(name, ())) == 1:
            [record] = by_call[name]
        elif name in by_call:
            raise _invalid(
                f"Tool call id {name!r} names {len(by_call[name])} different pending calls "
                f"(the model repeated the id); name each by its interrupt id or effect key: "
                f"{[r.key for r in by_call[name]]}", by_call[name][0], thread_id,
            )
        else:
            raise _invalid(
                f"Decisions name tool calls that are not pending: {[name]}; pending: "
                f"{sorted(by_call)}", None, thread_id,
            )
        answer = checked(decision, record)
        if record.key in chosen and not _same_answer(chosen[record.key], answer):
            raise _invalid(
                f"Call {record.tool_call_id!r} to {record.tool!r} is answered twice, "
                f"differently, under two names (its tool_call_id, interrupt id or effect key "
                f"{record.key!r}); answer it once", record, thread_id,
            )
        chosen[record.key] = answer
    return chosen


def _same_answer(one: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two answers to one call say the same, as they are recorded (an edit to
    `10` and one to `10.0` are two edits)."""
    try:
        return canonical_json(one) == canonical_json(other)
    except (TypeError, ValueError):
        return one == other
