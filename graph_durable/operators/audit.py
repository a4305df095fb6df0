"""The audit of a resume: what ran again after each crash, what was replayed, reconciled,
re-sent, decided or compensated, and what reached a provider more than once.

    graph = audited(builder.compile(checkpointer=saver))   # log node runs and model calls
    graph.invoke(inputs, config, durability="sync")
    ...                                                      # a crash, a resume
    print(saver.audit("t1").summary())                       # or: graph-durable audit

LangGraph re-runs a node that had not saved its writes when the worker died; a model call
in it is paid again. Nothing in a checkpoint says so, so `audited(graph)` adds a callback
that logs every node run and model call of the graph durably (one small write each, in the
saver's database) under the id of the run (one `invoke`/`stream`). A task that starts in
a second run had started before and not finished: it ran again. The rest of the audit is
read from the ledger's journal: each run's window is the time from its first log entry to
the next run's.

A thread run without `audited` still gets an audit of its effects (one window, and no
count of re-run nodes or model calls).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeVar
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler

from graph_durable._display import badge, esc, table
from graph_durable.ledger import EffectRecord

__all__ = ["AsyncRunLog", "Audit", "RunAudit", "RunLog", "audit_of", "audited", "logs_runs",
           "run_log"]

G = TypeVar("G")


class RunLog(BaseCallbackHandler):
    """A callback that logs each node run and model call of a graph to its durable saver
    (`saver.record_task_run`). Failing to log never stops the run."""

    raise_error = False

    def __init__(self, saver: Any) -> None:
        self.saver = saver
        self._roots: dict[UUID, UUID] = {}

    def _root(self, run_id: UUID, parent_run_id: UUID | None) -> UUID:
        root = self._roots.get(parent_run_id, parent_run_id) if parent_run_id else run_id
        return root or run_id

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID,
                       parent_run_id: UUID | None = None, metadata: dict[str, Any] | None = None,
                       **kwargs: Any) -> None:
        """A node run (the chain named as its node) is logged as `node`."""
        root = self._root(run_id, parent_run_id)
        self._roots[run_id] = root
        meta = metadata or {}
        node = meta.get("langgraph_node")
        if node is not None and kwargs.get("name") == node:
            self._log(meta, root, "node")

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Forget a finished run."""
        self._roots.pop(run_id, None)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Forget a failed run."""
        self._roots.pop(run_id, None)

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: UUID,
                            parent_run_id: UUID | None = None,
                            metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """A chat model call is logged as `model`."""
        self._log(metadata or {}, self._root(run_id, parent_run_id), "model")

    def on_llm_start(self, serialized: Any, prompts: Any, *, run_id: UUID,
                     parent_run_id: UUID | None = None, metadata: dict[str, Any] | None = None,
                     **kwargs: Any) -> None:
        """A completion model call is logged as `model`."""
        self._log(metadata or {}, self._root(run_id, parent_run_id), "model")

    def _log(self, meta: Mapping[str, Any], root: UUID, kind: str) -> None:
        thread_id, node = meta.get("thread_id"), meta.get("langgraph_node")
        if thread_id is None or node is None:
            return
        self.saver.record_task_run(str(thread_id), str(root),
                                   str(meta.get("langgraph_checkpoint_ns", "")), node, kind)


class AsyncRunLog(AsyncCallbackHandler):
    """`RunLog` for a saver that lives on an event loop (`AsyncDurableSqliteSaver`): it
    awaits `saver.arecord_task_run`."""

    raise_error = False

    def __init__(self, saver: Any) -> None:
        self.saver = saver
        self._sync = RunLog(saver)  # its run-id bookkeeping; it writes nothing itself
        self._sync._log = self._collect  # type: ignore[method-assign]
        self._pending: list[tuple[str, str, str, str, str]] = []

    def _collect(self, meta: Mapping[str, Any], root: UUID, kind: str) -> None:
        thread_id, node = meta.get("thread_id"), meta.get("langgraph_node")
        if thread_id is not None and node is not None:
            self._pending.append((str(thread_id), str(root),
                                  str(meta.get("langgraph_checkpoint_ns", "")), node, kind))

    async def _flush(self) -> None:
        while self._pending:
            await self.saver.arecord_task_run(*self._pending.pop(0))

    async def on_chain_start(self, *args: Any, **kwargs: Any) -> None:
        """See `RunLog.on_chain_start`."""
        self._sync.on_chain_start(*args, **kwargs)
        await self._flush()

    async def on_chain_end(self, *args: Any, **kwargs: Any) -> None:
        """See `RunLog.on_chain_end`."""
        self._sync.on_chain_end(*args, **kwargs)

    async def on_chain_error(self, *args: Any, **kwargs: Any) -> None:
        """See `RunLog.on_chain_error`."""
        self._sync.on_chain_error(*args, **kwargs)

    async def on_chat_model_start(self, *args: Any, **kwargs: Any) -> None:
        """See `RunLog.on_chat_model_start`."""
        self._sync.on_chat_model_start(*args, **kwargs)
        await self._flush()

    async def on_llm_start(self, *args: Any, **kwargs: Any) -> None:
        """See `RunLog.on_llm_start`."""
        self._sync.on_llm_start(*args, **kwargs)
        await self._flush()


def run_log(saver: Any) -> BaseCallbackHandler | AsyncCallbackHandler:
    """The callback that logs runs to `saver`: `AsyncRunLog` for a saver on an event loop,
    else `RunLog`."""
    from graph_durable.checkpointers.sqlite import AsyncDurableSqliteSaver

    return AsyncRunLog(saver) if isinstance(saver, AsyncDurableSqliteSaver) else RunLog(saver)


def logs_runs(graph: Any) -> bool:
    """Whether `graph` is `audited` already (its config carries a run log)."""
    callbacks = (getattr(graph, "config", None) or {}).get("callbacks") or []
    handlers = getattr(callbacks, "handlers", callbacks)
    return any(isinstance(h, RunLog | AsyncRunLog) for h in handlers)


def audited(graph: G) -> G:
    """A copy of the compiled `graph` whose runs log their node runs and model calls to
    its durable saver, so `saver.audit(thread_id)` can count what ran again."""
    from graph_durable.checkpointers._base import durable_saver

    saver = durable_saver(getattr(graph, "checkpointer", None))
    if saver is None:
        raise TypeError("audited() takes a graph compiled with a durable saver")
    if logs_runs(graph):
        return graph
    return graph.with_config(callbacks=[run_log(saver)])  # type: ignore[attr-defined,no-any-return]


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
