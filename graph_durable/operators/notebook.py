"""Notebook views: the review inbox, the ledger's effects and its journal as a timeline.

    from graph_durable.operators.notebook import effect_table, inbox, timeline

    box = inbox(graph, saver, reviewer="ana")   # every thread waiting for a person
    box                                         # a widget: approve, edit, reject, ... resume
    effect_table(saver, "t1")                   # the ledger of a thread
    timeline(saver, "t1")                       # its journal, event by event

The inbox lists the threads of the whole database that wait for a human (`thread_status`
`needs_human` or `waiting`), each with its pending calls as cards: description, key,
attempts, times, arguments, and one control per decision the call allows. Every control
calls the thread's `Review` (`approve`, `edit`, `reject`, `respond`, `mark_applied`,
`retry`, `skip`), and the thread's Resume button calls `Review.resume()`: the widget
decides exactly as code would. The edit form is drawn from the interrupt's
`response_schema` (the tool's own argument schema), and a card shows what an edit changed.

With an async graph or saver (`AsyncDurableSqliteSaver`, `AsyncDurablePostgresSaver`)
on the notebook's own event loop, `box = await ainbox(graph, saver)` reads the threads
without calling the saver's sync methods from the loop; its Refresh and Resume buttons then
run `Inbox.arefresh()` and `Review.aresume()` as tasks on that loop.

The widget needs ipywidgets (`pip install 'graph-durable[notebooks]'`), imported only
when a widget is drawn. Without it, or in a viewer that cannot run widgets (GitHub,
nbviewer), the inbox shows as static HTML: the same cards, without controls.
"""

from __future__ import annotations

import asyncio
from html import escape
from dataclasses import dataclass
from typing import Any

from graph_durable._display import iso, json_text, table, tone_of
from graph_durable.ledger import EffectEvent, EffectRecord
from graph_durable.operators.recovery import thread_status
from graph_durable.operators._inbox_thread import InboxThread, args_schema, diff_html
from graph_durable.operators.review import areview, review

__all__ = ["EXTRA", "EffectTable", "Inbox", "InboxThread", "Timeline", "ainbox", "args_schema",
           "diff_html", "effect_table", "inbox", "require_ipywidgets", "timeline"]

EXTRA = "pip install 'graph-durable[notebooks]'"
"""How to install what the widget needs."""

WAITING = ("needs_human", "waiting")
"""Thread statuses the inbox lists: a person is asked something."""


def require_ipywidgets() -> Any:
    """The `ipywidgets` module, or an ImportError that says how to install it."""
    try:
        import ipywidgets as widgets
    except ImportError as exc:
        raise ImportError(f"The review inbox widget needs ipywidgets: {EXTRA}") from exc
    return widgets


# -- the ledger, as tables ---------------------------------------------------------------


@dataclass(frozen=True)
class EffectTable:
    """Effects of the ledger, one row each (an HTML table in notebooks)."""

    records: list[EffectRecord]

    def __repr__(self) -> str:
        return "\n".join(f"{r.thread_id} {r.tool_call_id} {r.tool} {r.status.value} "
                         f"attempts={r.attempts}" for r in self.records) or "(no effects)"

    def _repr_html_(self) -> str:
        rows = [(r.thread_id, r.tool_call_id, r.tool, (r.status.value, tone_of(r.status)),
                 r.attempts, json_text(r.args),
                 "" if r.receipt is None else json_text(r.receipt), r.error or "",
                 r.key[:15] + "…", iso(r.updated_at)) for r in self.records]
        return table(("thread", "tool_call_id", "tool", "status", "attempts", "args",
                      "receipt", "error", "key", "updated"), rows,
                     caption=f"{len(rows)} effect(s)")


def effect_table(saver: Any, thread_id: str | None = None, status: Any = None
                 ) -> EffectTable:
    """The ledger's effects (of one thread, of one status), oldest first."""
    return EffectTable(saver.effects(thread_id, status))


@dataclass(frozen=True)
class Timeline:
    """A thread's journal, event by event (an HTML table in notebooks)."""

    thread_id: str
    events: list[EffectEvent]
    calls: dict[str, str]
    """`tool(tool_call_id)` by effect key."""

    def _rows(self) -> list[tuple[str, str, str, str, str]]:
        start = self.events[0].at if self.events else 0.0
        return [(f"+{e.at - start:.3f} s", e.kind, self.calls.get(e.key, e.key),
                 _event_details(e), e.owner or "") for e in self.events]

    def __repr__(self) -> str:
        return "\n".join([f"journal of thread {self.thread_id!r}: {len(self.events)} events",
                          *("  ".join(row).rstrip() for row in self._rows())])

    def _repr_html_(self) -> str:
        rows = [(at, (kind, _EVENT_TONES.get(kind)), call, details, owner)
                for at, kind, call, details, owner in self._rows()]
        return table(("at", "event", "call", "details", "owner"), rows,
                     caption=f"journal of thread {self.thread_id}: {len(rows)} events")


_EVENT_TONES = {"receipt": "good", "compensated": "good", "asked": "warn",
                "decision": "warn", "unknown": "bad", "failure": "bad",
                "compensation_failed": "bad", "compensation_unknown": "bad"}


def _event_details(event: EffectEvent) -> str:
    data = dict(event.data)
    decision = data.pop("decision", None)
    parts = [f"{name}={json_text(value) if not isinstance(value, str) else value}"
             for name, value in data.items() if name in ("status", "source", "reason", "error")]
    if isinstance(decision, dict):
        parts.insert(0, f"{decision.get('type')}"
                        + (f" by {decision['reviewer']}" if decision.get("reviewer") else ""))
    elif decision is not None:
        parts.insert(0, str(decision))
    return ", ".join(parts)


def timeline(saver: Any, thread_id: str) -> Timeline:
    """The journal of `thread_id`: every intent, attempt, receipt, question and decision."""
    calls = {r.key: f"{r.tool}({r.tool_call_id})" for r in saver.effects(thread_id)}
    return Timeline(str(thread_id), saver.events(thread_id), calls)


# -- the inbox ---------------------------------------------------------------------------


GraphSource = Any
"""A compiled graph, or `factory(thread_id) -> graph` (a `Callable[[str], Any]`) when
threads run different graphs."""


class Inbox:
    """Every thread of a database that waits for a person, as a widget or static HTML.

    Args:
        graph_or_factory: The compiled graph the threads run (with the durable saver),
            or `factory(thread_id) -> graph`.
        saver: The durable saver whose threads are listed.
        reviewer: Name recorded with every decision the widget takes.
        asynchronous: Read nothing now, and let the widget's buttons use the async path
            (`arefresh`, `Review.aresume`); `await ainbox(...)` builds one and reads it.
    """

    def __init__(self, graph_or_factory: GraphSource, saver: Any,
                 reviewer: str | None = None, *, asynchronous: bool = False) -> None:
        self._source = graph_or_factory
        self.saver = saver
        self.reviewer = reviewer
        self.asynchronous = asynchronous
        """Whether the widget refreshes and resumes with the async methods."""
        self.threads: dict[str, InboxThread] = {}
        self.damaged: dict[str, str] = {}
        """Threads a row of which cannot be read, each with the row named (see
        `LedgerDamaged`): listed apart, nothing of them can be decided."""
        self._view: Any = None
        if not asynchronous:
            self.refresh()

    def graph_for(self, thread_id: str) -> Any:
        """The graph that runs `thread_id`."""
        if hasattr(self._source, "get_state"):
            return self._source
        return self._source(thread_id)

    def load(self, thread_id: str) -> InboxThread | None:
        """The thread as it stands now, or `None` when it waits for no one."""
        status = thread_status(self.saver, thread_id)
        if status.status == "damaged":
            self.damaged[thread_id] = status.reason
        if status.status not in WAITING:
            return None
        config = {"configurable": {"thread_id": thread_id}}
        r = review(self.graph_for(thread_id), config)
        if not r.pending and not r.orphans:
            return None
        records = {i.key: rec for i in r.pending
                   if (rec := self.saver.effect(i.key, thread_id)) is not None}
        return InboxThread(status, r, records)

    def refresh(self) -> Inbox:
        """Read the database again: which threads wait, and for what."""
        self.threads, self.damaged = {}, {}
        for thread_id in self.saver.thread_ids():
            loaded = self.load(thread_id)
            if loaded is not None:
                self.threads[thread_id] = loaded
        if self._view is not None:
            self._view.redraw()
        return self

    async def aload(self, thread_id: str) -> InboxThread | None:
        """`load` for async code: the graph's state and the ledger are awaited, and the
        status is read on a worker thread (as `ainbox` in `graph_durable.operators.inbox`
        does), so nothing calls an async saver's sync methods from its own event loop."""
        status = await asyncio.to_thread(thread_status, self.saver, thread_id)
        if status.status == "damaged":
            self.damaged[thread_id] = status.reason
        if status.status not in WAITING:
            return None
        config = {"configurable": {"thread_id": thread_id}}
        r = await areview(self.graph_for(thread_id), config)
        if not r.pending and not r.orphans:
            return None
        records = {}
        for item in r.pending:
            if (rec := await self.saver.aeffect(item.key, thread_id)) is not None:
                records[item.key] = rec
        return InboxThread(status, r, records)

    async def arefresh(self) -> Inbox:
        """`refresh` for async code (see `aload`)."""
        threads: dict[str, InboxThread] = {}
        self.damaged = {}
        for thread_id in await asyncio.to_thread(self.saver.thread_ids):
            loaded = await self.aload(thread_id)
            if loaded is not None:
                threads[thread_id] = loaded
        self.threads = threads
        if self._view is not None:
            self._view.redraw()
        return self

    @property
    def widget(self) -> Any:
        """The ipywidgets view (built on first use).

        Raises:
            ImportError: ipywidgets is not installed (`pip install
                'graph-durable[notebooks]'`).
        """
        if self._view is None:
            from graph_durable.operators._inbox_widget import InboxView

            self._view = InboxView(self, require_ipywidgets())
        return self._view.root

    def thread(self, thread_id: str) -> Any:
        """The widget view of one thread (`resume_button`, `result`, `calls`)."""
        self.widget  # noqa: B018  (builds the view)
        return self._view.threads[thread_id]

    def call(self, thread_id: str, tool_call_id: str) -> Any:
        """The widget card of one pending call (`buttons`, `fields`, `message`,
        `receipt`, `status`)."""
        return self.thread(thread_id).calls[tool_call_id]

    def __repr__(self) -> str:
        waiting = ", ".join(f"{t.thread_id}: {len(t.review.pending)}"
                            for t in self.threads.values())
        damaged = "".join(f"; {t} damaged: {why}" for t, why in self.damaged.items())
        return (f"Inbox({len(self.threads)} thread(s) waiting{': ' if waiting else ''}"
                f"{waiting}{damaged})")

    def _repr_html_(self) -> str:
        damaged = "".join(f"<p><b>{escape(t)} is damaged</b>: {escape(why)}</p>"
                          for t, why in self.damaged.items())
        if not self.threads:
            return f"<p>Inbox: no thread waits for a person.</p>{damaged}"
        parts = [f"<p>Inbox: {len(self.threads)} thread(s) wait for a person.</p>", damaged]
        for thread in self.threads.values():
            parts.append(thread.header_html())
            parts.extend(thread.card_html(item) for item in thread.review.pending)
            parts.append(thread.orphans_html())
        return "".join(parts)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        # The widget where a frontend runs widgets; the static cards beside it for
        # viewers that cannot (and for anyone without ipywidgets).
        bundle = {"text/plain": repr(self), "text/html": self._repr_html_()}
        try:
            view = self.widget._repr_mimebundle_(include=include, exclude=exclude) or {}
        except ImportError:
            return bundle
        view.pop("text/plain", None)
        return {**bundle, **view}


def inbox(graph_or_factory: GraphSource, saver: Any, *, reviewer: str | None = None) -> Inbox:
    """The threads of `saver`'s database that wait for a person (see `Inbox`)."""
    return Inbox(graph_or_factory, saver, reviewer)


async def ainbox(graph_or_factory: GraphSource, saver: Any, *,
                 reviewer: str | None = None) -> Inbox:
    """`inbox` for an async graph or saver on the running event loop (a notebook's):
    `box = await ainbox(graph, saver)`. The widget's buttons then refresh and resume
    with `Inbox.arefresh()` and `Review.aresume()`, as tasks on the loop."""
    return await Inbox(graph_or_factory, saver, reviewer, asynchronous=True).arefresh()
