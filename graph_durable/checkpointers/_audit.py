"""The audit report of a thread, read from a durable saver's run log and journal:
`Audit`, one `RunAudit` per run, built by `audit_of` (what `saver.audit(thread_id)`
returns). The callbacks that write the run log (`audited`) are in
`graph_durable.operators.audit`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from graph_durable._display import badge, esc, table
from graph_durable.ledger import EffectRecord

__all__ = ["Audit", "RunAudit", "audit_of"]


@dataclass(frozen=True)
class RunAudit:
    """One run of the thread (the first, or a resume) and what happened in it."""

    run_id: str | None
    """The run's id (`None`: the thread was not run `audited`)."""
    started_at: float | None
    """Unix time of its first logged node run."""
    nodes_rerun: list[str] = field(default_factory=list)
    """Nodes that had started in an earlier run and ran again (`node (task)`)."""
    model_calls: int | None = None
    """Model calls made in this run (`None`: not audited)."""
    model_calls_repeated: int | None = None
    """Of those, calls a task had made before and made again: the token bill of a crash."""
    sent: list[str] = field(default_factory=list)
    """Effects sent for the first time (`tool(tool_call_id)`)."""
    asked: list[str] = field(default_factory=list)
    """Effects a person was asked about (an approval, or an outcome `unknown`)."""
    replayed: list[str] = field(default_factory=list)
    """Effects whose task ran again and got the stored receipt, not a new call."""
    reconciled: list[str] = field(default_factory=list)
    """Effects a lookup found at the provider."""
    resent: list[str] = field(default_factory=list)
    """Effects sent again under the same key (a provider that dedupes, or a retry)."""
    decided: list[str] = field(default_factory=list)
    """Human decisions carried out (`tool(tool_call_id): type by reviewer`)."""
    compensated: list[str] = field(default_factory=list)
    """Effects undone, or whose undoing failed or is unknown (`... : compensation_failed`,
    `... : compensation_unknown`)."""


@dataclass(frozen=True)
class Audit:
    """The audit of one thread: its runs in order, and the effects sent more than once."""

    thread_id: str
    runs: list[RunAudit]
    sent_more_than_once: list[dict[str, Any]]
    """`{tool_call_id, tool, attempts, status, answered_by}` of every effect the tool was
    called for more than once (`answered_by`: what settled it: tool, lookup, human)."""

    def to_dict(self) -> dict[str, Any]:
        """The audit as JSON-friendly data (times in ISO 8601)."""
        data = asdict(self)
        for run in data["runs"]:
            run["started_at"] = _iso(run["started_at"])
        return data

    def summary(self) -> str:
        """The audit as lines of text, one section per run."""
        lines = [f"thread {self.thread_id!r}: {len(self.runs)} run(s)"]
        for n, run in enumerate(self.runs):
            label = "first run" if n == 0 else f"resume {n}"
            lines.append(f"{label} ({run.run_id or 'not audited'}, {_iso(run.started_at)})")
            if run.model_calls is not None:
                lines.append(f"  nodes run again: {', '.join(run.nodes_rerun) or 'none'}; "
                             f"model calls: {run.model_calls}, repeated: "
                             f"{run.model_calls_repeated}")
            for name in ("sent", "asked", "replayed", "reconciled", "resent", "decided",
                         "compensated"):
                items = getattr(run, name)
                if items:
                    lines.append(f"  {name}: {', '.join(items)}")
        twice = [f"{e['tool']}({e['tool_call_id']}) x{e['attempts']}, {e['status']} by "
                 f"{e['answered_by']}" for e in self.sent_more_than_once]
        lines.append(f"sent more than once: {', '.join(twice) or 'none'}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"<Audit of thread {self.thread_id!r}: {len(self.runs)} run(s), "
                f"{len(self.sent_more_than_once)} effect(s) sent more than once>")

    def _repr_html_(self) -> str:
        columns = ("sent", "asked", "replayed", "reconciled", "resent", "decided",
                   "compensated")
        rows = [
            ("first run" if n == 0 else f"resume {n}", ", ".join(r.nodes_rerun) or "-",
             "" if r.model_calls_repeated is None else
             (r.model_calls_repeated, "bad" if r.model_calls_repeated else None),
             *(", ".join(getattr(r, name)) or "-" for name in columns))
            for n, r in enumerate(self.runs)]
        header = ("run", "nodes run again", "model calls repeated", "sent", "asked",
                  "replayed", "reconciled", "re-sent", "decided", "compensated")
        twice = self.summary().splitlines()[-1]
        return (f"<b>Audit of thread {esc(self.thread_id)}</b>" + table(header, rows)
                + f"<p>{badge(twice, 'warn' if self.sent_more_than_once else 'good')}</p>")


def _iso(at: float | None) -> str | None:
    return None if at is None else datetime.fromtimestamp(at, tz=timezone.utc).isoformat()


def _name(record: EffectRecord | None, key: str) -> str:
    return f"{record.tool}({record.tool_call_id})" if record is not None else key


def audit_of(saver: Any, thread_id: str) -> Audit:
    """The audit of `thread_id` from `saver`'s run log and journal (`saver.audit`)."""
    thread_id = str(thread_id)
    log = saver.task_runs(thread_id)
    events = saver.events(thread_id)
    records = {r.key: r for r in saver.effects(thread_id)}
    order: list[str] = []
    for _, run_id, *_rest in log:
        if run_id not in order:
            order.append(run_id)
    starts = {run_id: min(row[5] for row in log if row[1] == run_id) for run_id in order}
    windows: list[tuple[str | None, float | None, float]] = [
        (run_id, starts[run_id], starts[order[i + 1]] if i + 1 < len(order) else float("inf"))
        for i, run_id in enumerate(order)] or [(None, None, float("inf"))]
    runs: list[RunAudit] = []
    started_before: set[str] = set()
    called_before: set[str] = set()
    for n, (run_id, start, end) in enumerate(windows):
        rows = [row for row in log if row[1] == run_id]
        nodes = [(node, ns) for _, _, ns, node, kind, _ in rows if kind == "node"]
        models = [ns for _, _, ns, _, kind, _ in rows if kind == "model"]
        rerun = [(node, ns) for node, ns in nodes if ns in started_before]
        lower = float("-inf") if n == 0 else (start or float("-inf"))
        in_window = [e for e in events if lower <= e.at < end]
        earlier = {e.key for e in events if e.at < lower}
        settled_earlier = {e.key for e in events if e.at < lower and e.kind in
                           ("receipt", "failure", "resolved")}
        rerun_ns = {ns for _, ns in rerun}

        def names(kind: str, test: Any = lambda e: True, in_window: list[Any] = in_window) -> list[str]:
            return [_name(records.get(e.key), e.key) for e in in_window
                    if e.kind == kind and test(e)]

        decided = [f"{_name(records.get(e.key), e.key)}: {(e.data.get('decision') or {}).get('type')}"
                   + (f" by {(e.data.get('decision') or {}).get('reviewer')}"
                      if (e.data.get("decision") or {}).get("reviewer") else "")
                   for e in in_window if e.kind == "decision" and isinstance(e.data.get("decision"), dict)]
        runs.append(RunAudit(
            run_id=run_id, started_at=start,
            nodes_rerun=[f"{node} ({ns.rpartition(':')[2][:8]})" for node, ns in rerun],
            model_calls=None if run_id is None else len(models),
            model_calls_repeated=None if run_id is None else sum(
                1 for ns in models if ns in called_before),
            sent=names("intent", lambda e: not e.data.get("inherited")
                       and "compensates" not in e.data
                       and e.data.get("status") != "awaiting_approval")
            + names("attempt", lambda e: e.data.get("decision") in ("approve", "edit")),
            asked=names("asked"),
            replayed=[_name(r, key) for key, r in records.items()
                      if key in settled_earlier and r.checkpoint_ns in rerun_ns],
            reconciled=names("receipt", lambda e: e.data.get("source") == "lookup"),
            resent=names("attempt", lambda e: "re-send" in str(e.data.get("reason", "")) or (
                e.key in earlier and e.data.get("decision") not in ("approve", "edit"))),
            decided=decided,
            compensated=names("compensated")
            + [f"{name}: {kind}" for kind in ("compensation_failed", "compensation_unknown")
               for name in names(kind)],
        ))
        started_before |= {ns for _, ns in nodes}
        called_before |= set(models)
    twice = [{"tool_call_id": r.tool_call_id, "tool": r.tool, "attempts": r.attempts,
              "status": r.status.value, "answered_by": _answered_by(events, r.key)}
             for r in records.values() if r.attempts > 1]
    return Audit(thread_id, runs, twice)


def _answered_by(events: list[Any], key: str) -> str | None:
    receipts = [e for e in events if e.key == key and e.kind == "receipt"]
    return receipts[-1].data.get("source") if receipts else None
