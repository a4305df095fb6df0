"""The inbox: every decision waiting for a human, across a database, read without a graph.

    for item in inbox(saver):                      # every thread, oldest question first
        print(item.thread_id, item.tool_call_id, item.kind, item.description)
    record_decisions(saver, "t1", {"call_1": {"type": "approve"}}, reviewer="ana")
    # the next resume of t1 (recover(), or any invoke) carries the decision out

From async code (an async saver on the running loop, a web handler), await `ainbox(saver)`
and `arecord_decisions(...)`, which take the same arguments.

`review(graph, config)` answers one thread from a process that has its graph. An
operator's shell or an inbox page often has only the database: `inbox(saver)` reads the
pending questions from the checkpoints and the ledger alone, and `record_decisions`
journals answers the way the guard itself journals them, under the thread's lease, so
the next run of the thread acts on them exactly as if they had come with the resume
command. Decisions are validated first, against the interrupt's own `response_schema`
(an edit's args against the tool's argument schema), and nothing is written if one of
them does not fit.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from graph_durable.errors import InvalidDecision, LedgerDamaged
from graph_durable.ledger import EffectRecord, EffectStatus, TransitionWrite, WriteBatch
from graph_durable.nodes.decisions import check_decision
from graph_durable.operators.orphans import (
    ORPHAN_DECISIONS,
    check_orphan_decision,
    find_orphans,
    resolve_orphan,
)
from graph_durable.operators._checkpoints import latest as latest_checkpoint
from graph_durable.operators._checkpoints import questions, written_at
from graph_durable.operators.pending import QUESTION_KINDS, PendingItem, hitl_items, names_call
from graph_durable.operators._worker_thread import twin_of

__all__ = ["InboxItem", "ainbox", "arecord_decisions", "inbox", "record_decisions"]


@dataclass(frozen=True)
class InboxItem:
    """One tool call a human must decide on, as the database holds it."""

    thread_id: str
    tool_call_id: str
    kind: str
    """`approval` (not sent yet), `unknown` (may or may not have happened), or `orphan`
    (may or may not have happened, and no pending task will run it again: see
    `graph_durable.operators.orphans`; `description` says why, and no interrupt asks),
    or `damaged` (a row of the thread cannot be read: `description` names it, and
    nothing of the thread can be decided until it is restored)."""
    tool: str
    args: dict[str, Any]
    key: str
    """Idempotency key of the effect."""
    status: str
    """Ledger status: `awaiting_approval` or `unknown` (an orphan's: `in_flight` too)."""
    attempts: int
    """How many times the tool was called for this key."""
    error: str | None
    description: str | None
    allowed_decisions: tuple[str, ...]
    interrupt_id: str
    created_at: float
    """Unix time of the intent."""
    asked_at: float
    """Unix time the question was (last) asked."""
    response_schema: dict[str, Any] | None = None
    """JSON schema of the answers the interrupt accepts, when the graph published one."""

    def to_dict(self) -> dict[str, Any]:
        """The item as JSON-ready values (times stay Unix seconds)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def _hitl_item(thread_id: str, item: PendingItem, asked_at: float) -> InboxItem:
    """A question of `HumanInTheLoopMiddleware` before the guard: nothing is in the
    ledger yet, so it is as the checkpoint holds it (asked when it was written)."""
    return InboxItem(
        thread_id=thread_id, tool_call_id=item.tool_call_id, kind="approval", tool=item.tool,
        args=item.args, key="", status="awaiting_approval", attempts=0, error=None,
        description=item.description, allowed_decisions=item.allowed_decisions,
        interrupt_id=item.interrupt_id, created_at=asked_at, asked_at=asked_at,
        response_schema=item.response_schema)


def inbox(saver: Any, thread_id: str | None = None) -> list[InboxItem]:
    """Every question a pending interrupt asks a human, oldest first.

    Args:
        saver: A durable saver (read-only ones too: `DurableSqliteSaver.open_read_only`).
        thread_id: Only this thread's questions.

    Reads the checkpoints and the ledger only: no graph is needed. A cancelled thread
    asks nothing any more, and a question whose decision is already journaled is not
    listed. A thread with a row that cannot be read is one item of kind `damaged`, its
    `description` naming the row (see `LedgerDamaged`); the other threads are listed.
    """
    threads = [str(thread_id)] if thread_id is not None else saver.thread_ids()
    items: list[InboxItem] = []
    for thread in threads:
        try:
            items.extend(_thread_items(saver, thread))
        except LedgerDamaged as exc:
            items.append(_damaged_item(thread, exc))
    return sorted(items, key=lambda item: (item.asked_at, item.thread_id, item.tool_call_id))


def _damaged_item(thread_id: str, exc: LedgerDamaged) -> InboxItem:
    """A thread a row of which cannot be read, as the inbox lists it (first: a person
    must restore the row before anything of the thread runs)."""
    return InboxItem(
        thread_id=thread_id, tool_call_id="", kind="damaged", tool="", args={},
        key=exc.key or "", status="damaged", attempts=0, error=exc.problem,
        description=f"{exc.fact}; graph-durable check lists every damaged row",
        allowed_decisions=(), interrupt_id="", created_at=0.0, asked_at=0.0)


def _thread_items(saver: Any, thread: str) -> list[InboxItem]:
    """One thread's questions and orphaned intents (`LedgerDamaged` if a row it needs
    cannot be read)."""
    return [*_questions_of(saver, thread),
            *(_orphan_item(orphan) for orphan in find_orphans(saver, thread))]


def _questions_of(saver: Any, thread: str) -> list[InboxItem]:
    """The questions one thread's pending interrupts ask (`LedgerDamaged` if a row it
    needs cannot be read)."""
    items: list[InboxItem] = []
    if saver.cancelled_by(thread) is not None:
        return items
    latest = latest_checkpoint(saver, thread)
    # As `get_state()` shows them: a question a functional-API task saved and its
    # caller never did is asked again when the thread is resumed (`recover`).
    for interrupt in questions(saver, latest)[0] if latest is not None else ():
        value = getattr(interrupt, "value", None)
        asked_by_hitl = hitl_items(
            interrupt, (latest.checkpoint.get("channel_values") or {}).get("messages"))
        if asked_by_hitl:
            items.extend(_hitl_item(thread, item, written_at(latest))
                         for item in asked_by_hitl)
            continue
        if not isinstance(value, dict) or value.get("type") not in QUESTION_KINDS:
            continue
        kind = QUESTION_KINDS[value["type"]]
        record = saver.effect(value.get("key", ""), thread)
        if record is None or not record.asked or _kind_of(record) != kind:
            continue  # answered, or asked anew by a run that has not saved its question
        asked = [e.at for e in saver.events(thread, record.key) if e.kind == "asked"]
        schema = getattr(interrupt, "response_schema", None)
        items.append(InboxItem(
            thread_id=thread, tool_call_id=record.tool_call_id, kind=kind,
            tool=record.tool, args=record.args, key=record.key,
            status=record.status.value, attempts=record.attempts, error=record.error,
            description=value.get("description"),
            allowed_decisions=tuple(value.get("allowed_decisions") or ()),
            interrupt_id=getattr(interrupt, "id", ""), created_at=record.created_at,
            asked_at=asked[-1] if asked else record.updated_at,
            response_schema=schema if isinstance(schema, dict) else None,
        ))
    return items


def _orphan_item(orphan: Any) -> InboxItem:
    """An orphaned intent as the inbox lists it: decided now, with no run to wait for."""
    return InboxItem(
        thread_id=orphan.thread_id, tool_call_id=orphan.tool_call_id, kind="orphan",
        tool=orphan.tool, args=orphan.args, key=orphan.key, status=orphan.status,
        attempts=orphan.attempts, error=orphan.error, description=orphan.reason,
        allowed_decisions=ORPHAN_DECISIONS, interrupt_id="", created_at=orphan.created_at,
        asked_at=orphan.updated_at)


def _kind_of(record: EffectRecord) -> str:
    return "approval" if record.status is EffectStatus.AWAITING_APPROVAL else "unknown"


def _match(items: list[InboxItem], name: str, thread_id: str) -> InboxItem:
    found = [i for i in items
             if names_call(name, i.tool_call_id) or name in (i.interrupt_id, i.key)]
    if len(found) == 1:
        return found[0]
    pending = sorted(i.tool_call_id for i in items)
    if not found:
        raise InvalidDecision(
            f"Tool call {name!r} is not waiting for a decision in thread {thread_id!r}; "
            f"pending: {pending or 'nothing'}. Nothing was recorded.",
            thread_id=thread_id, tool_call_id=name)
    raise InvalidDecision(
        f"{name!r} names {len(found)} pending calls in thread {thread_id!r} (subgraphs may "
        f"reuse a tool_call_id): name it by its full id "
        f"{sorted(i.tool_call_id for i in found)}, interrupt id or key. Nothing was recorded.",
        thread_id=thread_id, tool_call_id=name)


def _check_schema(decision: dict[str, Any], item: InboxItem) -> None:
    """The decision against the interrupt's published `response_schema` (JSON Schema)."""
    if item.response_schema is None:
        return
    import jsonschema

    errors = sorted(jsonschema.Draft202012Validator(item.response_schema).iter_errors(decision),
                    key=lambda e: list(e.absolute_path))
    if errors:
        best = jsonschema.exceptions.best_match(errors)
        where = ".".join(str(p) for p in best.absolute_path) or "decision"
        raise InvalidDecision(
            f"The decision for tool call {item.tool_call_id!r} ({item.tool}) in thread "
            f"{item.thread_id!r} does not match the interrupt's response_schema ({where}: "
            f"{best.message}). Nothing was recorded.",
            thread_id=item.thread_id, tool_call_id=item.tool_call_id)


def record_decisions(
    saver: Any,
    thread_id: str,
    decisions: Mapping[str, Mapping[str, Any]],
    *,
    reviewer: str | None = None,
    owner: str | None = None,
    graph: Any = None,
    ttl: float = 30.0,
) -> list[EffectRecord]:
    """Journal decisions for a thread's pending questions, without running its graph.

    Args:
        saver: The durable saver of the thread (a writable one).
        thread_id: The thread.
        decisions: `{tool_call_id | interrupt_id | key: decision}`, decisions in
            LangChain's HumanInTheLoopMiddleware shapes (`{"type": "approve"}`, ...).
        reviewer: Who decided; journaled with each decision.
        owner: Lease owner the writes are made under (default `decide:<reviewer>`).
        graph: The graph, if at hand: its policies' `redact` apply to what is stored,
            and edits are checked against its tools' schemas.
        ttl: Lease time to live, seconds.

    Returns:
        The records, now with their decisions journaled and no longer asked. The next
        resume of the thread (`recover()`, or `graph.invoke(None, config)`) acts on them;
        once every question is answered, `thread_status` reports the thread `orphaned`
        so that `recover()` picks it up.

    Raises:
        InvalidDecision: a name matches no pending call, or a decision does not fit its
            interrupt. Nothing is recorded.
        LedgerDamaged: a row of the thread cannot be read. Nothing is recorded.
        LeaseHeld: a worker holds the thread now; decide again once it paused.
    """
    thread_id = str(thread_id)
    if not decisions:
        raise InvalidDecision(f"No decision given for thread {thread_id!r}.", thread_id=thread_id)
    items = _thread_items(saver, thread_id)
    policies: dict[str, Any] = {}
    tools: dict[str, Any] = {}
    if graph is not None:
        from graph_durable.operators.compensation import policies_of, tools_of

        policies, tools = policies_of(graph), tools_of(graph)
    chosen: dict[str, tuple[InboxItem, dict[str, Any]]] = {}
    for name, decision in decisions.items():
        item = _match(items, str(name), thread_id)
        if not item.key:
            raise InvalidDecision(
                f"Tool call {item.tool_call_id!r} in thread {thread_id!r} is asked by "
                "HumanInTheLoopMiddleware, which reads its answer only from the command "
                "that resumes the thread, not from the ledger. Answer it with "
                "review(graph, config) (or the CLI with --graph, which resumes). Nothing "
                "was recorded.", thread_id=thread_id, tool_call_id=item.tool_call_id)
        if item.key in chosen:
            raise InvalidDecision(f"Two decisions name tool call {item.tool_call_id!r} in "
                                  f"thread {thread_id!r}. Nothing was recorded.",
                                  thread_id=thread_id, tool_call_id=item.tool_call_id)
        record = saver.effect(item.key, thread_id)
        if item.kind == "orphan":
            checked = check_orphan_decision(decision, record, thread_id)
        else:
            checked = check_decision(dict(decision), record, thread_id, tools.get(item.tool))
        if reviewer is not None and "reviewer" not in checked:
            checked["reviewer"] = reviewer
        _check_schema(checked, item)
        chosen[item.key] = (item, checked)
    lost = {key: pair for key, pair in chosen.items() if pair[0].kind == "orphan"}
    asked = {key: pair for key, pair in chosen.items() if key not in lost}
    who = owner or f"decide:{reviewer or 'operator'}"
    records = _journal(saver, thread_id, asked, policies, who, ttl) if asked else []
    # No run carries out a decision on an orphan: it is carried out now.
    return records + [resolve_orphan(saver, thread_id, key, decision, effects=policies,
                                     owner=who, ttl=ttl) for key, (_, decision) in lost.items()]


def _journal(saver: Any, thread_id: str, chosen: dict[str, tuple[InboxItem, dict[str, Any]]],
             policies: dict[str, Any], owner: str, ttl: float) -> list[EffectRecord]:
    """Journal answers to open questions under the thread's lease, in one transaction."""
    with saver.lease(thread_id, owner, ttl, wait=False) as lease:
        now = time.time()
        writes = []
        for key, (item, decision) in chosen.items():
            record = saver.effect(key, thread_id)
            if record is None or not record.asked:
                raise InvalidDecision(
                    f"Tool call {item.tool_call_id!r} in thread {thread_id!r} was answered "
                    "meanwhile. Nothing was recorded.", thread_id=thread_id,
                    tool_call_id=item.tool_call_id)
            policy = policies.get(item.tool)
            writes.append(TransitionWrite(
                thread_id=thread_id, key=key, to=record.status, kind="decision",
                decision={**decision, "decided_at": now}, asked=False,
                data={"decision": decision},
                redact=None if policy is None else policy.redact))
        return saver.apply(WriteBatch(thread_id, tuple(writes)), lease.config)


@twin_of(inbox)
async def ainbox(*args: Any, **kwargs: Any) -> list[InboxItem]:
    """`inbox` for async code (the same arguments): awaitable on the event loop an async
    saver runs on.

    The reads run on a worker thread, from where an async saver's sync methods run its
    async ones on this loop, which the await leaves free; a sync saver is read there too.
    """
    return await asyncio.to_thread(inbox, *args, **kwargs)


@twin_of(record_decisions)
async def arecord_decisions(*args: Any, **kwargs: Any) -> list[EffectRecord]:
    """`record_decisions` for async code (the same arguments; see `ainbox`): the same
    checks, the same writes under the thread's lease, and the same errors."""
    return await asyncio.to_thread(record_decisions, *args, **kwargs)
