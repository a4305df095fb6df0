"""What a thread's pending interrupts ask a human, as `PendingItem`s.

The guard asks about one call per interrupt (`tool_approval` before it is sent,
`effect_unknown` when its outcome is not known; `effect_approval` is the shape of earlier
releases). `HumanInTheLoopMiddleware` listed before the guard asks its own questions: per
call (a `tool_approval` without the guard's effect key, as the ledger does not know the
call yet) or batched (one per model turn, its calls answered in order). `pending_items`
reads both kinds from a thread's state; `review` (`graph_durable.operators.review`)
answers them and `inbox` lists them without a graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graph_durable.ledger import EffectRecord, EffectStatus, answered

__all__ = ["DEFAULT_ALLOWED", "HITL_DECISIONS", "QUESTION_KINDS", "PendingItem", "as_record",
           "hitl_items", "hitl_name", "is_batched_hitl_question", "is_hitl_question",
           "names_call", "pending_items", "schema_decisions"]

QUESTION_KINDS = {"tool_approval": "approval", "effect_approval": "approval",
                  "effect_unknown": "unknown"}
"""Interrupt types the guard raises; `effect_approval` is the shape of earlier releases,
still pending in some threads, and read the same way (its `tool` is today's `name`)."""
DEFAULT_ALLOWED = {"approval": ("approve", "edit", "reject"),
                   "unknown": ("applied", "retry", "skip")}
"""The decisions a guard's question takes when its interrupt does not list them."""
HITL_DECISIONS = ("approve", "edit", "reject", "respond")
"""The decisions a `HumanInTheLoopMiddleware` question takes when it does not say."""


def is_hitl_question(value: Any) -> bool:
    """Whether an interrupt value is a question of LangChain's per-call
    `HumanInTheLoopMiddleware` listed before the guard: a `tool_approval` without the
    guard's effect key (the ledger knows the call only once it is answered)."""
    return (isinstance(value, dict) and value.get("type") == "tool_approval"
            and "key" not in value and isinstance(value.get("tool_call_id"), str))


def schema_decisions(schema: Any) -> tuple[str, ...]:
    """The decision types a published `response_schema` accepts (LangChain's per-call
    schemas: a union discriminated by `type`, or a single decision's object)."""
    if not isinstance(schema, dict):
        return ()
    defs = schema.get("$defs", {})

    def kind(node: Any) -> str | None:
        while isinstance(node, dict) and "$ref" in node:
            node = defs.get(node["$ref"].rpartition("/")[2], {})
        if not isinstance(node, dict):
            return None
        const = node.get("properties", {}).get("type", {})
        return const.get("const") or next(iter(const.get("enum") or ()), None)

    branches = schema.get("oneOf", schema.get("anyOf")) or [schema]
    return tuple(k for k in (kind(branch) for branch in branches) if k)


@dataclass(frozen=True)
class PendingItem:
    """One tool call a human must decide on."""

    kind: str
    """`approval` (not sent yet) or `unknown` (may or may not have happened)."""
    tool_call_id: str
    """Id of the tool call in the model's AIMessage."""
    tool: str
    """Tool name."""
    args: dict[str, Any]
    """Arguments of the call."""
    key: str
    """Idempotency key of the effect; empty for a question of a per-call
    `HumanInTheLoopMiddleware` listed before the guard, which asks before the ledger
    knows the call."""
    attempts: int
    """How many times the tool was called for this key."""
    error: str | None
    """Last error seen (for `unknown`)."""
    description: str | None
    """The policy's description (for `approval`)."""
    allowed_decisions: tuple[str, ...]
    """Decision types this item accepts."""
    interrupt_id: str
    """Id of the LangGraph interrupt that asks about it."""
    response_schema: dict[str, Any] | None = None
    """JSON schema of the answers the interrupt accepts (an edit's args follow the tool's
    argument schema); `None` for interrupts of earlier releases."""
    position: int | None = None
    """Its place in a batched `HumanInTheLoopMiddleware` question, which is answered
    with `{"decisions": [...]}`, one per call in this order; `None` otherwise."""


def names_call(name: str, tool_call_id: str) -> bool:
    """Whether `name` names the call `tool_call_id`: the id itself, or, for a guarded
    write (`name#position@place`), its `name#position` (an ambiguous short name is
    refused by the caller, which then lists the full ids)."""
    if name == tool_call_id:
        return True
    short, at, _ = tool_call_id.rpartition("@")
    return bool(at) and "#" in short and short == name


def hitl_name(item: PendingItem) -> str:
    """What names a keyless question of a per-call HumanInTheLoopMiddleware besides its
    tool_call_id: its interrupt id (a batched question's calls share theirs)."""
    return item.interrupt_id if item.position is None else ""


def _hitl_item(interrupt: Any) -> PendingItem:
    """A question of `HumanInTheLoopMiddleware` (see `is_hitl_question`): answered by its
    interrupt id, in LangChain's decision shapes; its `key` is empty."""
    value = interrupt.value
    schema = getattr(interrupt, "response_schema", None)
    schema = schema if isinstance(schema, dict) else None
    return PendingItem(
        kind="approval", tool_call_id=value["tool_call_id"], tool=value.get("name", ""),
        args=dict(value.get("args") or {}), key="", attempts=0, error=None,
        description=value.get("description"),
        allowed_decisions=schema_decisions(schema) or HITL_DECISIONS,
        interrupt_id=interrupt.id, response_schema=schema)


def is_batched_hitl_question(value: Any) -> bool:
    """Whether an interrupt value is a batched `HumanInTheLoopMiddleware` question (one
    per model turn, its `action_requests` answered in order)."""
    return (isinstance(value, dict) and isinstance(value.get("action_requests"), list)
            and isinstance(value.get("review_configs"), list))


def hitl_items(interrupt: Any, messages: Any) -> list[PendingItem]:
    """The calls a question of `HumanInTheLoopMiddleware` asks about (per call, or
    batched), or `[]` if `interrupt` is not one. `messages` are the thread's (they name
    a batched question's calls)."""
    value = getattr(interrupt, "value", None)
    if is_hitl_question(value):
        return [_hitl_item(interrupt)]
    if is_batched_hitl_question(value):
        return _batched_items(interrupt, messages if isinstance(messages, list) else [])
    return []


def _batched_items(interrupt: Any, messages: list[Any]) -> list[PendingItem]:
    """The calls a batched `HumanInTheLoopMiddleware` question asks about, in its order.

    Its actions carry no tool_call_id: each is the next call of the last AIMessage with
    its name and args (the calls the middleware asked about, in the message's order)."""
    calls = next((list(m.tool_calls) for m in reversed(messages)
                  if getattr(m, "type", None) == "ai" and getattr(m, "tool_calls", None)), [])
    configs = {c.get("action_name"): c for c in interrupt.value["review_configs"]
               if isinstance(c, dict)}
    items, start = [], 0
    for position, action in enumerate(interrupt.value["action_requests"]):
        found = next((i for i in range(start, len(calls))
                      if calls[i].get("name") == action.get("name")
                      and calls[i].get("args") == action.get("args")), None)
        if found is not None:
            start = found + 1
        allowed = (configs.get(action.get("name")) or {}).get("allowed_decisions")
        items.append(PendingItem(
            kind="approval",
            tool_call_id=calls[found]["id"] if found is not None else f"action-{position}",
            tool=action.get("name", ""), args=dict(action.get("args") or {}), key="",
            attempts=0, error=None, description=action.get("description"),
            allowed_decisions=tuple(allowed or HITL_DECISIONS), interrupt_id=interrupt.id,
            position=position))
    return items


def pending_items(state: Any, saver: Any, thread_id: str) -> list[PendingItem]:
    """The questions the interrupts of a thread's `state` (`graph.get_state`) ask; with
    `saver`, a guard's question the ledger already holds a decision for is left out
    (resuming carries it out), and its attempts and error are the ledger's.

    Items come in the order the thread's AIMessages asked for the calls, whatever order
    the interrupts were saved in (the calls of one turn run in parallel, so their
    interrupts are saved in the order they happened to be raised); an interrupt about a
    call no message of `state` names (a subgraph's, a guarded write's) keeps its place
    after them."""
    messages = (getattr(state, "values", None) or {}).get("messages")
    groups = [_interrupt_items(interrupt, saver, thread_id, messages)
              for interrupt in state.interrupts]
    order = _call_order(messages)
    groups.sort(key=lambda group: min((order.get(i.tool_call_id, len(order)) for i in group),
                                      default=len(order)))
    return [item for group in groups for item in group]


def _call_order(messages: Any) -> dict[str, int]:
    """Each tool_call_id of `messages`' AIMessages, mapped to its place among them."""
    order: dict[str, int] = {}
    for message in messages if isinstance(messages, list) else ():
        for call in getattr(message, "tool_calls", None) or ():
            if isinstance(call, dict) and isinstance(call.get("id"), str):
                order[call["id"]] = len(order)
    return order


def _interrupt_items(interrupt: Any, saver: Any, thread_id: str,
                     messages: Any) -> list[PendingItem]:
    """The questions one interrupt asks (see `pending_items`)."""
    asked = hitl_items(interrupt, messages)
    value = interrupt.value
    if asked or not isinstance(value, dict) or value.get("type") not in QUESTION_KINDS:
        return asked
    kind = QUESTION_KINDS[value["type"]]
    record = saver.effect(value["key"], thread_id) if saver is not None else None
    if answered(record, kind):
        return []  # decided before a crash: resuming carries the decision out
    schema = getattr(interrupt, "response_schema", None)  # a dict once surfaced
    return [PendingItem(
        kind=kind,
        tool_call_id=value["tool_call_id"],
        tool=value.get("name", value.get("tool")),
        args=value["args"],
        key=value["key"],
        attempts=record.attempts if record else value.get("attempts", 0),
        error=record.error if record else value.get("error"),
        description=value.get("description"),
        allowed_decisions=tuple(value.get("allowed_decisions") or DEFAULT_ALLOWED[kind]),
        interrupt_id=interrupt.id,
        response_schema=schema if isinstance(schema, dict) else None,
    )]


def as_record(item: PendingItem, thread_id: str) -> EffectRecord:
    """The ledger's view of a pending item, enough to check a decision's shape."""
    status = EffectStatus.AWAITING_APPROVAL if item.kind == "approval" else EffectStatus.UNKNOWN
    return EffectRecord.model_construct(
        key=item.key, thread_id=thread_id, tool_call_id=item.tool_call_id, tool=item.tool,
        args=item.args, status=status, attempts=item.attempts)
