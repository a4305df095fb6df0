"""`review(graph, config)`: the decisions a thread waits for, and the command that answers them.

    r = review(graph, config)          # works from any process, after any crash
    for item in r.pending: print(item.kind, item.tool, item.args)
    r.approve("call_1", reviewer="ana").reject("call_2", "wrong customer")
    r.respond("call_3", "Ana already has it")  # in place of the tool: nothing is sent
    r.resume()                         # graph.invoke(r.command(), config, durability="sync")

Decisions are taken by tool_call_id. Every call is asked in its own interrupt, so
`command()` keys each decision by the id of the interrupt that asked, LangGraph's own
form, which it accepts however many interrupts are pending; calls not decided stay
pending. (An interrupt of an earlier release asking about several calls at once is
answered with `{interrupt_id: {tool_call_id: decision}}`.)

Questions asked inside subgraphs are listed too: LangGraph reports a subgraph's interrupt
on the parent's task, with the id of the task that asked (namespace
`child:<task_id>|tools:<task_id>`), and resumes it from the parent with
`Command(resume={interrupt_id: value})`, the command `command()` builds. Each subgraph
keeps its own conversation, so the same tool_call_id can be pending in two of them: then
name the question with `interrupt_id=` as well.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from langgraph.types import Command

from graph_durable._display import args_diff, badge, esc, json_text, table
from graph_durable.checkpointers._base import durable_saver
from graph_durable.errors import InvalidDecision
from graph_durable.ledger import EffectRecord, EffectStatus, answered
from graph_durable.nodes.decisions import check_decision, decided_note
from graph_durable.operators.orphans import find_orphans

__all__ = ["PendingItem", "Review", "areview", "describe_decision", "review"]

_KINDS = {"tool_approval": "approval", "effect_approval": "approval", "effect_unknown": "unknown"}
"""Interrupt types the guard raises; `effect_approval` is the shape of earlier releases,
still pending in some threads, and read the same way (its `tool` is today's `name`)."""
_DEFAULT_ALLOWED = {"approval": ("approve", "edit", "reject"),
                    "unknown": ("applied", "retry", "skip")}


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
    """Idempotency key of the effect."""
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


@dataclass
class Review:
    """The pending decisions of one thread, and the decisions taken so far."""

    graph: Any
    config: dict[str, Any]
    pending: list[PendingItem]
    decisions: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """Decisions taken so far, by `(interrupt_id, key)`."""
    settled: list[PendingItem] = field(default_factory=list)
    """Items settled outside the graph (`compensate`): the thread resumes past them."""
    orphans: list[Any] = field(default_factory=list)
    """The thread's orphaned intents (`graph_durable.orphans.Orphan`): open calls no
    pending task will run again, so no resume answers them; settle each with
    `graph_durable.resolve_orphan` (its lookup, or `applied` / `skip`)."""

    def _item(self, tool_call_id: str, kind: str, interrupt_id: str | None = None
              ) -> PendingItem:
        # A call is named by its tool_call_id, or by its effect key when a model gave
        # two calls of one message the same id.
        found = [item for item in self.pending if tool_call_id in (item.tool_call_id, item.key)
                 and interrupt_id in (None, item.interrupt_id)]
        if not found:
            where = "" if interrupt_id is None else f" in interrupt {interrupt_id!r}"
            raise InvalidDecision(
                f"No pending decision for tool call {tool_call_id!r}{where} in thread "
                f"{self.thread_id!r}{self._decided_before(tool_call_id)}; pending: "
                f"{[i.tool_call_id for i in self.pending]}. Nothing was changed.",
                thread_id=self.thread_id, tool_call_id=tool_call_id,
            )
        if len(found) > 1:
            asked = ", ".join(f"{i.interrupt_id} ({i.tool} {json.dumps(i.args, default=str)})"
                              for i in found)
            raise InvalidDecision(
                f"Tool call id {tool_call_id!r} is pending {len(found)} times in thread "
                f"{self.thread_id!r} (subgraphs keep their own tool_call_ids, and a model may "
                f"repeat one): {asked}. Name the one you decide with interrupt_id=, or by "
                f"its effect key: {[i.key for i in found]}.",
                thread_id=self.thread_id, tool_call_id=tool_call_id,
            )
        [item] = found
        if kind not in item.allowed_decisions:
            raise InvalidDecision(
                f"Tool call {tool_call_id!r} ({item.tool}) is pending {item.kind}; it "
                f"accepts {list(item.allowed_decisions)}, not {kind!r}.",
                thread_id=self.thread_id, tool_call_id=tool_call_id,
            )
        return item

    def _tools(self) -> dict[str, Any]:
        from graph_durable.operators.compensation import tools_of

        return tools_of(self.graph)

    def _decided_before(self, tool_call_id: str) -> str:
        """`: it was decided at <when> by <whom> (<type>)`, when the ledger says so (a
        double click, a second reviewer, an answer to an earlier question)."""
        saver = _saver_of(self.graph)
        if saver is None:
            return ""
        keys = {r.key for r in saver.effects(self.thread_id)
                if tool_call_id in (r.tool_call_id, r.key)}
        note = decided_note(sorted((e for key in keys for e in saver.events(self.thread_id, key)),
                                   key=lambda e: e.seq))
        return f": it was {note}" if note else ""

    def _decide(self, tool_call_id: str, decision: dict[str, Any],
                reviewer: str | None, interrupt_id: str | None = None) -> Review:
        if decision.get("type") == "compensate":  # carried out now, outside the graph
            return self.compensate(tool_call_id, receipt=decision.get("receipt"),
                                   reviewer=reviewer or decision.get("reviewer"),
                                   interrupt_id=interrupt_id)
        item = self._item(tool_call_id, decision["type"], interrupt_id)
        if reviewer is not None:
            decision["reviewer"] = reviewer
        # Checked here too, before any run, an edit's args against the tool's schema: a
        # refused answer then never reaches the graph (where LangGraph would record the
        # refusal as the step's error).
        check_decision(decision, _as_record(item, self.thread_id), self.thread_id,
                       self._tools().get(item.tool))
        self.decisions[(item.interrupt_id, item.key)] = decision
        return self

    @property
    def thread_id(self) -> str:
        """The reviewed thread."""
        return str(self.config["configurable"]["thread_id"])

    # Every decision method takes `interrupt_id=`: needed only when the same tool_call_id
    # is pending in several interrupts (e.g. in two subgraphs).

    def approve(self, tool_call_id: str, *, reviewer: str | None = None,
                interrupt_id: str | None = None) -> Review:
        """Send the call as requested."""
        return self._decide(tool_call_id, {"type": "approve"}, reviewer, interrupt_id)

    def edit(self, tool_call_id: str, args: dict[str, Any], *,
             reviewer: str | None = None, interrupt_id: str | None = None) -> Review:
        """Send the call with edited arguments (under a new key: nothing was sent)."""
        item = self._item(tool_call_id, "edit", interrupt_id)
        action = {"name": item.tool, "args": dict(args)}
        return self._decide(tool_call_id, {"type": "edit", "edited_action": action}, reviewer,
                            item.interrupt_id)

    def reject(self, tool_call_id: str, message: str, *, reviewer: str | None = None,
               interrupt_id: str | None = None) -> Review:
        """Do not send; the model sees `message` as an error."""
        return self._decide(tool_call_id, {"type": "reject", "message": message}, reviewer,
                            interrupt_id)

    def respond(self, tool_call_id: str, message: str, *, reviewer: str | None = None,
                interrupt_id: str | None = None) -> Review:
        """Answer in place of the tool: nothing is sent, the model gets `message` as the
        tool's result, and the decision is journaled."""
        return self._decide(tool_call_id, {"type": "respond", "message": message}, reviewer,
                            interrupt_id)

    def mark_applied(self, tool_call_id: str, receipt: Any, *,
                     reviewer: str | None = None, interrupt_id: str | None = None) -> Review:
        """The effect did happen (you checked): record `receipt`, do not call again."""
        return self._decide(tool_call_id, {"type": "applied", "receipt": receipt}, reviewer,
                            interrupt_id)

    def retry(self, tool_call_id: str, *, reviewer: str | None = None,
              interrupt_id: str | None = None) -> Review:
        """The effect did not happen (you checked): call again with the same key."""
        return self._decide(tool_call_id, {"type": "retry"}, reviewer, interrupt_id)

    def skip(self, tool_call_id: str, message: str = "", *,
             reviewer: str | None = None, interrupt_id: str | None = None) -> Review:
        """Give up on the effect; the model sees `message` as an error."""
        return self._decide(tool_call_id, {"type": "skip", "message": message}, reviewer,
                            interrupt_id)

    def compensate(self, tool_call_id: str, *, receipt: Any = None,
                   reviewer: str | None = None, interrupt_id: str | None = None) -> Review:
        """Undo a pending `unknown` effect, now (`graph_durable.compensate`): only once its
        lookup finds it, or `receipt` is your word that it happened; a lookup that finds
        nothing settles it as not applied, and nothing is undone. The call then answers
        with what was recorded when the thread resumes (`resume()`)."""
        from graph_durable.operators.compensation import compensate

        found = [i for i in self.pending if tool_call_id in (i.tool_call_id, i.key)]
        if found and all(i.kind == "approval" for i in found):
            raise InvalidDecision(
                f"Tool call {tool_call_id!r} in thread {self.thread_id!r} awaits approval: it "
                "was never sent, so there is nothing to compensate; reject it instead. "
                "Nothing was changed.", thread_id=self.thread_id, tool_call_id=tool_call_id)
        item = self._item(tool_call_id, "applied", interrupt_id)
        saver = _saver_of(self.graph)
        compensate(self.graph, saver, self.thread_id, item.key, receipt=receipt,
                   reviewer=reviewer)
        self.pending = [i for i in self.pending if i is not item]
        self.settled.append(item)
        return self

    def command(self) -> Command:
        """The `Command(resume=...)` carrying the decisions, keyed by interrupt id.

        Each call is asked in its own interrupt, so the resume value is `{interrupt_id:
        decision}`, LangGraph's own form, which it routes to the task that asked, in this
        graph or in any of its subgraphs, however many interrupts are pending. Calls not
        decided stay pending. (An interrupt of an earlier release that asks about several
        calls gets `{interrupt_id: {tool_call_id: decision}}`.)

        Raises:
            InvalidDecision: nothing was decided.
        """
        groups: dict[str, list[PendingItem]] = {}
        for item in self.pending:
            groups.setdefault(item.interrupt_id, []).append(item)
        resume: dict[str, Any] = {}
        for interrupt_id, items in groups.items():
            decided = [i for i in items if (interrupt_id, i.key) in self.decisions]
            if not decided:
                continue
            if len(items) == 1:
                resume[interrupt_id] = self.decisions[(interrupt_id, items[0].key)]
                continue
            ids = [i.tool_call_id for i in items]
            # Name each call by its tool_call_id, or by its key where the id repeats.
            resume[interrupt_id] = {
                (i.tool_call_id if ids.count(i.tool_call_id) == 1 else i.key):
                self.decisions[(interrupt_id, i.key)] for i in decided}
        if not resume:
            raise InvalidDecision(
                f"No decisions taken for thread {self.thread_id!r}; pending: "
                f"{[i.tool_call_id for i in self.pending]}.", thread_id=self.thread_id,
            )
        return Command(resume=resume)

    def _resume_value(self) -> Command | None:
        # Only items settled outside the graph: the step runs again and replays them.
        return None if self.settled and not self.decisions else self.command()

    def resume(self) -> Any:
        """Resume the thread with the decisions (`durability="sync"`)."""
        return self.graph.invoke(self._resume_value(), self.config, durability="sync")

    async def aresume(self) -> Any:
        """Async `resume`."""
        return await self.graph.ainvoke(self._resume_value(), self.config, durability="sync")

    def decision_for(self, item: PendingItem) -> dict[str, Any] | None:
        """The decision taken so far for `item`, if any."""
        return self.decisions.get((item.interrupt_id, item.key))

    def __repr__(self) -> str:
        shown = [f"{i.tool_call_id} {i.kind} {i.tool}" for i in self.pending[:4]]
        if len(self.pending) > 4:
            shown.append(f"... {len(self.pending) - 4} more")
        lost = f", orphans={[o.tool_call_id for o in self.orphans]}" if self.orphans else ""
        return (f"Review(thread={self.thread_id!r}, pending=[{', '.join(shown)}], "
                f"decided={len(self.decisions)}{lost})")

    def _repr_html_(self) -> str:
        thread = f"Thread <code>{esc(self.thread_id)}</code>"
        if not self.pending:
            return f"<p>{thread}: nothing pending.</p>"
        # A tool_call_id pending twice (in two subgraphs) is told apart by its interrupt.
        repeated = len({i.tool_call_id for i in self.pending}) < len(self.pending)
        header = ("kind", "tool_call_id", "tool", "args", "attempts", "error", "allowed",
                  "decision") + (("interrupt_id",) if repeated else ())
        rows = []
        for item in self.pending:
            decision = self.decision_for(item)
            rows.append((
                (item.kind, "warn" if item.kind == "approval" else "bad"), item.tool_call_id,
                item.tool, json_text(item.args), item.attempts, item.error or "",
                ", ".join(item.allowed_decisions),
                (describe_decision(item, decision), "good") if decision else "",
            ) + ((item.interrupt_id,) if repeated else ()))
        decided = f", {badge(f'{len(self.decisions)} decided', 'good')}" if self.decisions else ""
        return (f"<p>{thread}: {len(self.pending)} pending{decided}</p>"
                + table(header, rows))


def describe_decision(item: PendingItem, decision: dict[str, Any]) -> str:
    """A decision in words: its type, reviewer, message or receipt, an edit's changes."""
    words = [decision["type"]]
    if decision.get("reviewer"):
        words.append(f"by {decision['reviewer']}")
    if decision["type"] == "edit":
        changes = args_diff(item.args, decision["edited_action"]["args"])
        words.append("; ".join(f"{name}: {json_text(old)} -> {json_text(new)}"
                               for name, old, new in changes) or "(no change)")
    elif decision.get("message"):
        words.append(repr(decision["message"]))
    elif "receipt" in decision:
        words.append(f"receipt {json_text(decision['receipt'])}")
    return " ".join(words)


def _pending_from(state: Any, saver: Any, thread_id: str) -> list[PendingItem]:
    items = []
    for interrupt in state.interrupts:
        value = interrupt.value
        if not isinstance(value, dict) or value.get("type") not in _KINDS:
            continue
        record = saver.effect(value["key"], thread_id) if saver is not None else None
        if answered(record, _KINDS[value["type"]]):
            continue  # decided before a crash: resuming carries the decision out
        schema = getattr(interrupt, "response_schema", None)  # a dict once surfaced
        items.append(PendingItem(
            kind=_KINDS[value["type"]],
            tool_call_id=value["tool_call_id"],
            tool=value.get("name", value.get("tool")),
            args=value["args"],
            key=value["key"],
            attempts=record.attempts if record else value.get("attempts", 0),
            error=record.error if record else value.get("error"),
            description=value.get("description"),
            allowed_decisions=tuple(value.get("allowed_decisions")
                                    or _DEFAULT_ALLOWED[_KINDS[value["type"]]]),
            interrupt_id=interrupt.id,
            response_schema=schema if isinstance(schema, dict) else None,
        ))
    return items


def _as_record(item: PendingItem, thread_id: str) -> EffectRecord:
    """The ledger's view of a pending item, enough to check a decision's shape."""
    status = EffectStatus.AWAITING_APPROVAL if item.kind == "approval" else EffectStatus.UNKNOWN
    return EffectRecord.model_construct(
        key=item.key, thread_id=thread_id, tool_call_id=item.tool_call_id, tool=item.tool,
        args=item.args, status=status, attempts=item.attempts)


def _saver_of(graph: Any) -> Any:
    return durable_saver(getattr(graph, "checkpointer", None))


def review(graph: Any, config: dict[str, Any]) -> Review:
    """Load the decisions a thread waits for (approvals and unknown outcomes), and its
    orphaned intents."""
    state = graph.get_state(config)
    thread_id = str(config["configurable"]["thread_id"])
    saver = _saver_of(graph)
    return Review(graph, config, _pending_from(state, saver, thread_id),
                  orphans=find_orphans(saver, thread_id) if saver is not None else [])


async def areview(graph: Any, config: dict[str, Any]) -> Review:
    """Async `review`, for graphs compiled with an async saver."""
    state = await graph.aget_state(config)
    thread_id = str(config["configurable"]["thread_id"])
    saver = _saver_of(graph)
    items = []
    for item in _pending_from(state, None, thread_id):
        record = await saver.aeffect(item.key, thread_id) if saver is not None else None
        if answered(record, item.kind):
            continue
        if record is not None:
            item = PendingItem(**{**item.__dict__, "attempts": record.attempts,
                                  "error": record.error})
        items.append(item)
    lost = [] if saver is None else await asyncio.to_thread(find_orphans, saver, thread_id)
    return Review(graph, config, items, orphans=lost)
