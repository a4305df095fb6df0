"""One thread of the notebook inbox as data and HTML: `InboxThread` (its status, its
`Review`, its cards), with the argument schemas an edit may set and the diff an edit
shows. `notebook.Inbox` lists them; the widget (`_inbox_widget`) draws them with
controls. Neither imports the other for these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from graph_durable._display import args_diff, badge, esc, iso, json_text, table
from graph_durable.ledger import EffectRecord
from graph_durable.operators.recovery import ThreadStatus
from graph_durable.operators.review import PendingItem, Review, describe_decision

__all__ = ["InboxThread", "args_schema", "diff_html"]


def args_schema(item: PendingItem) -> dict[str, dict[str, Any]]:
    """The JSON schema of each argument an edit of `item` may set, by name: from the
    interrupt's `response_schema` (the tool's argument schema), or guessed from the
    call's own arguments when the interrupt has none (earlier releases)."""
    schema = item.response_schema or {}
    defs = schema.get("$defs", {})

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            node = defs.get(node["$ref"].rpartition("/")[2], {})
        return node

    for branch in schema.get("oneOf", schema.get("anyOf", [])):
        branch = resolve(branch)
        if branch.get("properties", {}).get("type", {}).get("const") != "edit":
            continue
        action = resolve(branch["properties"]["edited_action"])
        args = resolve(action.get("properties", {}).get("args", {}))
        if args.get("properties"):
            return {name: resolve(prop) for name, prop in args["properties"].items()}
    guessed = {bool: "boolean", int: "integer", float: "number", str: "string"}
    return {name: {"type": guessed.get(type(value), "object")}
            for name, value in item.args.items()}


@dataclass
class InboxThread:
    """One thread waiting for a person: where it stands, and its `Review`."""

    status: ThreadStatus
    review: Review
    records: dict[str, EffectRecord] = field(default_factory=dict)
    """The ledger's record of each pending call, by key (times, attempts, errors)."""

    @property
    def thread_id(self) -> str:
        """The thread."""
        return self.status.thread_id

    def card_html(self, item: PendingItem) -> str:
        """A pending call as a card: what it is, where it stands, what was decided."""
        record = self.records.get(item.key)
        tone = "warn" if item.kind == "approval" else "bad"
        facts = [("kind", badge(item.kind, tone)),
                 ("description", esc(item.description or "-")),
                 ("key", f"<code>{esc(item.key)}</code>"),
                 ("attempts", esc(item.attempts)),
                 ("intent at", esc(iso(record.created_at if record else None))),
                 ("last change", esc(iso(record.updated_at if record else None)))]
        if item.error:
            facts.append(("error", esc(item.error)))
        decision = self.review.decision_for(item)
        if decision is not None:
            facts.append(("decision", badge(describe_decision(item, decision), "good")))
            if decision["type"] == "edit":
                facts.append(("changed", diff_html(item.args,
                                                   decision["edited_action"]["args"])))
        rows = "".join(f'<tr><th style="text-align: left; padding-right: 8px">{name}</th>'
                       f"<td>{value}</td></tr>" for name, value in facts)
        args = table(("argument", "value"), [(n, json_text(v)) for n, v in item.args.items()])
        return (f'<div style="border: 1px solid rgba(128,128,128,.35); border-radius: '
                f'4px; padding: 6px 8px; margin: 4px 0">'
                f"<b>{esc(item.tool)}</b> <code>{esc(item.tool_call_id)}</code>"
                f"<table>{rows}</table>{args}"
                f"<small>allowed: {esc(', '.join(item.allowed_decisions))}</small></div>")

    def orphans_html(self) -> str:
        """The thread's orphaned intents: shown, not decided here (no resume answers
        them: `graph_durable.resolve_orphan`, or `graph-durable resolve`)."""
        if not self.review.orphans:
            return ""
        rows = [(o.tool_call_id, o.tool, json_text(o.args), (o.status, "bad"), o.reason)
                for o in self.review.orphans]
        return (f"<p><b>Orphaned intents</b> {badge('resolve_orphan', 'bad')}</p>"
                + table(("tool_call_id", "tool", "args", "status", "why"), rows))

    def header_html(self) -> str:
        """The thread's name, status and reason."""
        return (f"<h4 style=\"margin: 8px 0 2px\">Thread <code>{esc(self.thread_id)}</code> "
                f"{badge(self.status.status)}</h4><small>{esc(self.status.reason)}</small>")


def diff_html(before: dict[str, Any], after: dict[str, Any]) -> str:
    """What an edit changed, argument by argument (old struck through, new beside it)."""
    changes = args_diff(before, after)
    if not changes:
        return "<i>no change</i>"
    return table(("argument", "asked", "edited"),
                 [(name, (json_text(old), "bad"), (json_text(new), "good"))
                  for name, old, new in changes])
