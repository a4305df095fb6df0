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

`HumanInTheLoopMiddleware` listed before `EffectGuardMiddleware` asks its own questions:
per call (`tool_approval`, without an effect key) or batched (one per model turn). They are
listed as approvals with an empty `key`, take the decisions the middleware allows, and
are answered as it expects: a per-call question by its interrupt id, a batched one with
`{"decisions": [...]}`, one per call in its order (so all of them are decided at once).

What the interrupts ask is read in `graph_durable.operators.pending` (`PendingItem`, the
guard's and the middleware's questions); the names it shares with this module
(`PendingItem`, `hitl_items`, `is_hitl_question`, ...) are importable from here too.

The module is a little over 400 lines because `Review` is one object: its reading of the
thread, its decisions (approve, edit, reject, respond, compensate) and the command that
answers them share its state, and their sync and async forms sit side by side.
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
from graph_durable.ledger import EffectRecord, answered
from graph_durable.nodes.decisions import check_decision, decided_note
from graph_durable.operators.orphans import find_orphans
from graph_durable.operators.pending import (
    PendingItem,
    as_record,
    hitl_items,
    hitl_name,
    is_batched_hitl_question,
    is_hitl_question,
    names_call,
    pending_items,
    schema_decisions,
)

__all__ = ["PendingItem", "Review", "areview", "describe_decision", "hitl_items",
           "is_batched_hitl_question", "is_hitl_question", "review", "schema_decisions"]


@dataclass
class Review:
    """The pending decisions of one thread, and the decisions taken so far."""

    graph: Any
    config: dict[str, Any]
    pending: list[PendingItem]
    decisions: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """Decisions taken so far, by `(interrupt_id, key)` (`(interrupt_id, "#<position>")`
    for the calls of a batched `HumanInTheLoopMiddleware` question)."""
    settled: list[PendingItem] = field(default_factory=list)
    """Items settled outside the graph (`compensate`): the thread resumes past them."""
    orphans: list[Any] = field(default_factory=list)
    """The thread's orphaned intents (`graph_durable.operators.orphans.Orphan`): open calls no
    pending task will run again, so no resume answers them; settle each with
    `graph_durable.resolve_orphan` (its lookup, or `applied` / `skip`)."""
    _journal: tuple[list[EffectRecord], list[Any]] | None = field(default=None, repr=False)
    """The thread's effects and decision events as `areview` read them: they explain a
    refused decision with no synchronous read, which an async saver refuses on its own
    event loop. `None` (`review`): read when needed."""

    def _item(self, tool_call_id: str, kind: str, interrupt_id: str | None = None
              ) -> PendingItem:
        # A call is named by its tool_call_id, or by its effect key when a model gave
        # two calls of one message the same id (a question of HumanInTheLoopMiddleware,
        # which has no key, by its interrupt id then).
        found = [item for item in self.pending
                 if (names_call(tool_call_id, item.tool_call_id)
                     or tool_call_id == (item.key or hitl_name(item)))
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
                f"repeat one): {asked}. Name the one you decide by its full id "
                f"{sorted(i.tool_call_id for i in found)}, with interrupt_id=, or by its "
                f"effect key: {[i.key for i in found]}.",
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
        if self._journal is None and (saver is None or _on_its_loop(saver)):
            # An async saver is not read synchronously on its own loop: without what
            # `areview` read, the refusal goes without the note.
            return ""
        records = self._journal[0] if self._journal else saver.effects(self.thread_id)
        keys = {r.key for r in records
                if names_call(tool_call_id, r.tool_call_id) or tool_call_id == r.key}
        events = (self._journal[1] if self._journal
                  else [e for key in keys for e in saver.events(self.thread_id, key)])
        note = decided_note(sorted((e for e in events if e.key in keys), key=lambda e: e.seq))
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
        check_decision(decision, as_record(item, self.thread_id), self.thread_id,
                       self._tools().get(item.tool))
        self.decisions[_slot(item)] = decision
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

        item = self._compensable(tool_call_id, interrupt_id)
        compensate(self.graph, _saver_of(self.graph), self.thread_id, item.key,
                   receipt=receipt, reviewer=reviewer)
        return self._settled(item)

    async def acompensate(self, tool_call_id: str, *, receipt: Any = None,
                          reviewer: str | None = None, interrupt_id: str | None = None
                          ) -> Review:
        """Async `compensate` (`graph_durable.acompensate`): for a `Review` of a graph on
        an async saver, from its event loop."""
        from graph_durable.operators.compensation import acompensate

        item = self._compensable(tool_call_id, interrupt_id)
        await acompensate(self.graph, _saver_of(self.graph), self.thread_id, item.key,
                          receipt=receipt, reviewer=reviewer)
        return self._settled(item)

    def _compensable(self, tool_call_id: str, interrupt_id: str | None) -> PendingItem:
        """The pending item a compensate decision names (an `unknown` one)."""
        found = [i for i in self.pending
                 if names_call(tool_call_id, i.tool_call_id) or tool_call_id == i.key]
        if found and all(i.kind == "approval" for i in found):
            raise InvalidDecision(
                f"Tool call {tool_call_id!r} in thread {self.thread_id!r} awaits approval: it "
                "was never sent, so there is nothing to compensate; reject it instead. "
                "Nothing was changed.", thread_id=self.thread_id, tool_call_id=tool_call_id)
        return self._item(tool_call_id, "applied", interrupt_id)

    def _settled(self, item: PendingItem) -> Review:
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
            decided = [i for i in items if _slot(i) in self.decisions]
            if not decided:
                continue
            if items[0].position is not None:  # batched HumanInTheLoopMiddleware
                resume[interrupt_id] = self._batch(interrupt_id, items)
                continue
            if len(items) == 1:
                resume[interrupt_id] = self.decisions[_slot(items[0])]
                continue
            ids = [i.tool_call_id for i in items]
            # Name each call by its tool_call_id, or by its key where the id repeats.
            resume[interrupt_id] = {
                (i.tool_call_id if ids.count(i.tool_call_id) == 1 else i.key):
                self.decisions[_slot(i)] for i in decided}
        if not resume:
            raise InvalidDecision(
                f"No decisions taken for thread {self.thread_id!r}; pending: "
                f"{[i.tool_call_id for i in self.pending]}.", thread_id=self.thread_id,
            )
        return Command(resume=resume)

    def _batch(self, interrupt_id: str, items: list[PendingItem]) -> dict[str, Any]:
        """`{"decisions": [...]}` for a batched `HumanInTheLoopMiddleware` question,
        which takes one decision per call it asked about, in its order, or none."""
        missing = [i.tool_call_id for i in items if _slot(i) not in self.decisions]
        if missing:
            raise InvalidDecision(
                f"HumanInTheLoopMiddleware asks about {len(items)} calls at once in thread "
                f"{self.thread_id!r} (interrupt {interrupt_id!r}) and takes a decision for "
                f"each, in order: decide {missing} too. Nothing was sent.",
                thread_id=self.thread_id, tool_call_id=missing[0])
        ordered = sorted(items, key=lambda i: i.position or 0)
        return {"decisions": [self.decisions[_slot(i)] for i in ordered]}

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
        return self.decisions.get(_slot(item))

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


def _slot(item: PendingItem) -> tuple[str, str]:
    """Where `Review.decisions` keeps the decision for `item`."""
    return item.interrupt_id, item.key or ("" if item.position is None else f"#{item.position}")


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


def _saver_of(graph: Any) -> Any:
    return durable_saver(getattr(graph, "checkpointer", None))


def _on_its_loop(saver: Any) -> bool:
    """Whether `saver` is an async saver whose event loop runs this code."""
    try:
        return getattr(saver, "loop", None) is asyncio.get_running_loop()
    except RuntimeError:  # no running loop
        return False


def review(graph: Any, config: dict[str, Any]) -> Review:
    """Load the decisions a thread waits for (approvals and unknown outcomes), and its
    orphaned intents."""
    state = graph.get_state(config)
    thread_id = str(config["configurable"]["thread_id"])
    saver = _saver_of(graph)
    return Review(graph, config, pending_items(state, saver, thread_id),
                  orphans=find_orphans(saver, thread_id) if saver is not None else [])


async def areview(graph: Any, config: dict[str, Any]) -> Review:
    """Async `review`, for graphs compiled with an async saver."""
    state = await graph.aget_state(config)
    thread_id = str(config["configurable"]["thread_id"])
    saver = _saver_of(graph)
    items = []
    for item in pending_items(state, None, thread_id):
        if not item.key:  # HumanInTheLoopMiddleware's: the ledger has no record of it yet
            items.append(item)
            continue
        record = await saver.aeffect(item.key, thread_id) if saver is not None else None
        if answered(record, item.kind):
            continue
        if record is not None:
            item = PendingItem(**{**item.__dict__, "attempts": record.attempts,
                                  "error": record.error})
        items.append(item)
    if saver is None:
        return Review(graph, config, items)
    lost = await asyncio.to_thread(find_orphans, saver, thread_id)
    # Read now what explains a refused decision: the decision methods are synchronous,
    # and an async saver cannot be read synchronously from its own event loop.
    decided = [e for e in await saver.aevents(thread_id) if e.kind == "decision"]
    return Review(graph, config, items, orphans=lost,
                  _journal=(await saver.aeffects(thread_id), decided))
