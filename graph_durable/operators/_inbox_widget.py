"""The ipywidgets view of an `Inbox` (see `graph_durable.operators.notebook`).

One box per waiting thread, one card per pending call. A card's controls call the
thread's `Review` (the decision is checked and kept, as `review(...).approve(...)` does);
the thread's Resume button calls `Review.resume()`, then the thread is read again from
the database. A refused decision or resume is shown on its card or thread, never
raised out of a click. An inbox opened with `await ainbox(...)` (`Inbox.asynchronous`)
refreshes and resumes as tasks on the running event loop (`Inbox.arefresh`,
`Review.aresume`): a click returns at once, and `InboxView.tasks` holds what runs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from functools import partial
from typing import Any, Protocol

from graph_durable._display import badge, esc, json_text
from graph_durable.errors import GraphDurableError, InvalidDecision
from graph_durable.operators._inbox_thread import InboxThread, args_schema, diff_html
from graph_durable.operators.recovery import thread_status
from graph_durable.operators.review import PendingItem, describe_decision

__all__ = ["CallView", "InboxLike", "InboxView", "ThreadView"]


class InboxLike(Protocol):
    """What the view reads from the `graph_durable.operators.notebook.Inbox` it shows
    (named here so that the widget does not import the module that imports it)."""

    saver: Any
    reviewer: str | None
    asynchronous: bool
    threads: dict[str, InboxThread]

    def refresh(self) -> Any: ...

    async def arefresh(self) -> Any: ...

    def load(self, thread_id: str) -> InboxThread | None: ...

    async def aload(self, thread_id: str) -> InboxThread | None: ...


_LABELS = {"approve": "Approve", "edit": "Send edited", "reject": "Reject",
           "respond": "Respond", "applied": "Mark applied", "retry": "Retry",
           "skip": "Skip"}
_STYLES = {"approve": "success", "edit": "info", "reject": "danger", "respond": "",
           "applied": "success", "retry": "warning", "skip": "danger"}


class InboxView:
    """The whole inbox: a reviewer name, a Refresh button, and each waiting thread."""

    def __init__(self, inbox: InboxLike, widgets: Any) -> None:
        self.inbox, self.w = inbox, widgets
        self.reviewer = widgets.Text(value=inbox.reviewer or "", description="Reviewer")
        self.refresh_button = widgets.Button(description="Refresh", icon="refresh")
        self.refresh_button.on_click(self.refresh)
        self.summary = widgets.HTML()
        self.body = widgets.VBox()
        self.root = widgets.VBox([widgets.HBox([self.reviewer, self.refresh_button]),
                                  self.summary, self.body])
        self.threads: dict[str, ThreadView] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        """Refreshes and resumes running on the event loop (async inboxes)."""
        self.redraw()

    def refresh(self, _button: Any = None) -> None:
        """Read the database again (a task on the loop, for an async inbox)."""
        if self.inbox.asynchronous:
            self.spawn(self.inbox.arefresh())
        else:
            self.inbox.refresh()

    def spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run `work` as a task on the running loop (a click's handler cannot await)."""
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def redraw(self) -> None:
        """Draw the inbox's threads as it holds them now."""
        self.threads = {tid: ThreadView(self, t) for tid, t in self.inbox.threads.items()}
        self.body.children = tuple(view.box for view in self.threads.values())
        self.summary.value = (f"{len(self.threads)} thread(s) wait for a person"
                              if self.threads else "No thread waits for a person.")

    @property
    def reviewer_name(self) -> str | None:
        """The name typed in the Reviewer field, if any."""
        return self.reviewer.value.strip() or None


class ThreadView:
    """One thread: its status, a card per pending call, and the Resume button."""

    def __init__(self, view: InboxView, thread: InboxThread) -> None:
        self.view, self.thread, w = view, thread, view.w
        self.header = w.HTML()
        self.cards = w.VBox()
        self.resume_button = w.Button(description="Resume thread", button_style="primary",
                                      disabled=True, icon="play")
        self.resume_button.on_click(self.resume)
        self.result = w.HTML()
        self.box = w.VBox([self.header, self.cards, self.resume_button, self.result],
                          layout=w.Layout(margin="0 0 12px 0"))
        self.calls: dict[str, CallView] = {}
        self.draw()

    def draw(self) -> None:
        """Draw the thread's header and one card per pending call."""
        self.header.value = self.thread.header_html() + self.thread.orphans_html()
        self.calls = {}
        for item in self.thread.review.pending:
            # A tool_call_id pending twice (two subgraphs) names its second card by key.
            name = item.key if item.tool_call_id in self.calls else item.tool_call_id
            self.calls[name] = CallView(self, item)
        self.cards.children = tuple(call.box for call in self.calls.values())
        self.resume_button.disabled = not self.thread.review.decisions

    def resume(self, _button: Any = None) -> None:
        """Resume the thread with the decisions taken, then read it again (for an async
        inbox: `aresume`, as a task on the running loop)."""
        if self.view.inbox.asynchronous:
            self.resume_button.disabled = True  # one resume at a time
            self.view.spawn(self.aresume())
            return
        thread_id = self.thread.thread_id
        try:
            result = self.thread.review.resume()
        except (GraphDurableError, RuntimeError, ValueError) as exc:
            self.result.value = badge(f"not resumed: {type(exc).__name__}: {exc}", "bad")
            return
        loaded = self.view.inbox.load(thread_id)
        status = None if loaded else thread_status(self.view.inbox.saver, thread_id)
        self.show_resumed(result, loaded, status)

    async def aresume(self) -> None:
        """`resume` for an async inbox: `Review.aresume()`, then `Inbox.aload`."""
        thread_id = self.thread.thread_id
        try:
            result = await self.thread.review.aresume()
        except BaseException as exc:
            # No click awaits this task: shown on the thread; a refusal ends here, and
            # anything else is raised on into the task as well.
            self.result.value = badge(f"not resumed: {type(exc).__name__}: {exc}", "bad")
            self.resume_button.disabled = not self.thread.review.decisions
            if isinstance(exc, (GraphDurableError, RuntimeError, ValueError)):
                return
            raise
        loaded = await self.view.inbox.aload(thread_id)
        status = None if loaded else await asyncio.to_thread(
            thread_status, self.view.inbox.saver, thread_id)
        self.show_resumed(result, loaded, status)

    def show_resumed(self, result: Any, loaded: InboxThread | None, status: Any) -> None:
        """Draw the thread as it stands after a resume: still waiting (`loaded`), or not
        (`status`, and its cards closed)."""
        thread_id = self.thread.thread_id
        if loaded is not None:
            self.view.inbox.threads[thread_id] = self.thread = loaded
            self.draw()
        else:
            self.view.inbox.threads.pop(thread_id, None)
            self.header.value = (f"<h4 style=\"margin: 8px 0 2px\">Thread "
                                 f"<code>{esc(thread_id)}</code> {badge(status.status)}</h4>"
                                 f"<small>{esc(status.reason)}</small>")
            # The cards stay, read-only: what was decided, and the thread done.
            for call in self.calls.values():
                call.close()
            self.resume_button.disabled = True
        messages = result.get("messages") if isinstance(result, dict) else None
        last = messages[-1].content if messages else ""
        self.result.value = (f"resumed; the agent's last message: <i>{esc(last)}</i>"
                             if last else "resumed")


class CallView:
    """One pending call: its card, the edit form, text inputs, one button per decision."""

    def __init__(self, thread: ThreadView, item: PendingItem) -> None:
        self.thread, self.item, w = thread, item, thread.view.w
        allowed = item.allowed_decisions
        self.card = w.HTML(thread.thread.card_html(item))
        self.status = w.HTML()
        self.fields: dict[str, Any] = {}
        self._json_fields: set[str] = set()
        if "edit" in allowed:
            for name, schema in args_schema(item).items():
                self.fields[name] = self._field(name, schema, item.args.get(name))
        self.message = w.Text(placeholder="message (reject, respond, skip)",
                              description="Message")
        self.receipt = w.Textarea(placeholder='{"id": "..."}', description="Receipt")
        self.buttons = {kind: w.Button(description=_LABELS.get(kind, kind),
                                       button_style=_STYLES.get(kind, ""))
                        for kind in allowed}
        for kind, button in self.buttons.items():
            button.on_click(partial(self.decide, kind))
        parts = [self.card]
        if self.fields:
            parts.append(w.VBox([w.HTML("<b>Edit the arguments</b> (then Send edited)"),
                                 *self.fields.values()]))
        if {"reject", "respond", "skip"} & set(allowed):
            parts.append(self.message)
        if "applied" in allowed:
            parts.append(self.receipt)
        parts += [w.HBox(list(self.buttons.values())), self.status]
        self.box = w.VBox(parts, layout=w.Layout(border="1px solid rgba(128,128,128,.35)",
                                                 padding="4px", margin="4px 0"))

    def _field(self, name: str, schema: dict[str, Any], value: Any) -> Any:
        w = self.thread.view.w
        kind = schema.get("type")
        if kind is None:  # Optional[...]: the first type that is not null
            kind = next((s.get("type") for s in schema.get("anyOf", [])
                         if s.get("type") not in (None, "null")), None)
        options = {"description": schema.get("title", name),
                   "style": {"description_width": "initial"}}
        if "enum" in schema:
            return w.Dropdown(options=schema["enum"], value=value, **options)
        if kind == "integer" and isinstance(value, int):
            return w.IntText(value=value, **options)
        if kind == "number" and isinstance(value, int | float):
            return w.FloatText(value=value, **options)
        if kind == "boolean" and isinstance(value, bool):
            return w.Checkbox(value=value, indent=False, **options)
        if kind == "string" and isinstance(value, str):
            return w.Text(value=value, **options)
        self._json_fields.add(name)  # objects, lists, absent values: edited as JSON
        return w.Text(value=json_text(value), **options)

    def edited_args(self) -> dict[str, Any]:
        """The arguments as the form holds them.

        Raises:
            ValueError: a field edited as JSON does not parse.
        """
        args = {}
        for name, field_ in self.fields.items():
            if name in self._json_fields:
                try:
                    args[name] = json.loads(field_.value)
                except ValueError as exc:
                    raise ValueError(f"argument {name!r} is not JSON: {exc}") from None
            else:
                args[name] = field_.value
        return args

    def close(self) -> None:
        """Disable every control: the thread no longer asks about this call."""
        for control in (*self.buttons.values(), *self.fields.values(), self.message,
                        self.receipt):
            control.disabled = True

    def decide(self, kind: str, _button: Any = None) -> None:
        """Take the decision `kind` through the thread's `Review`."""
        review, item = self.thread.thread.review, self.item
        who = {"reviewer": self.thread.view.reviewer_name, "interrupt_id": item.interrupt_id}
        call = item.tool_call_id
        try:
            if kind == "approve":
                review.approve(call, **who)
            elif kind == "edit":
                review.edit(call, self.edited_args(), **who)
            elif kind == "reject":
                review.reject(call, self.message.value, **who)
            elif kind == "respond":
                review.respond(call, self.message.value, **who)
            elif kind == "applied":
                try:
                    receipt = json.loads(self.receipt.value)
                except ValueError as exc:
                    raise ValueError(f"the receipt is not JSON: {exc}") from None
                review.mark_applied(call, receipt, **who)
            elif kind == "retry":
                review.retry(call, **who)
            elif kind == "skip":
                review.skip(call, self.message.value, **who)
            else:
                raise ValueError(f"no control for decision {kind!r}")
        except (InvalidDecision, ValueError) as exc:
            self.status.value = badge(f"refused: {exc}", "bad")
            return
        decision = review.decision_for(item) or {}
        self.status.value = badge(f"decided: {describe_decision(item, decision)}", "good")
        if kind == "edit":
            self.status.value += diff_html(item.args, decision["edited_action"]["args"])
        self.card.value = self.thread.thread.card_html(item)
        self.thread.resume_button.disabled = False
