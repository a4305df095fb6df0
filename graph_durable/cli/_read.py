"""The commands of `graph-durable` that read: `status`, `threads`, `pending`, `effects`,
`events`, `show` and `audit` (read-only savers; nothing is written).

A row that cannot be read (see `LedgerDamaged`) does not stop a listing: its thread is
shown as `damaged` with the row named, the healthy threads are listed, and the command
exits with `DAMAGED_EXIT` (3) and one line on stderr pointing to `graph-durable check`.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any, Optional

import typer

from graph_durable.cli._open import Refused, known_thread, open_saver, parse_since
from graph_durable.cli._options import (
    Db,
    Json,
    Jsonl,
    Limit,
    Since,
    Thread,
    ThreadArg,
    output_format,
)
from graph_durable.cli._output import Column, at, emit, emit_object
from graph_durable.errors import LedgerDamaged

__all__ = ["COMMANDS", "DAMAGED_EXIT", "EFFECT_STATUSES", "THREAD_STATUSES", "audit",
           "effects", "events", "passed_by", "pending", "show", "status", "threads"]

DAMAGED_EXIT = 3
"""Exit code of a command that passed by rows it cannot read (or that needed one)."""


def passed_by(threads: Any) -> int:
    """The exit code once the output is printed: `DAMAGED_EXIT` (with one line on stderr
    naming the threads) when rows of `threads` could not be read, else 0."""
    named = sorted({str(t) for t in threads})
    if not named:
        return 0
    print(f"graph-durable: passed by damaged rows of thread(s) {named}: the other threads "
          "are listed; `graph-durable check --db ...` names every damaged row",
          file=sys.stderr)
    return DAMAGED_EXIT


# `graph_durable.operators.recovery.Status` and `EffectStatus` (a test keeps them equal), written
# out so that help and usage errors need not import LangGraph.
THREAD_STATUSES = ("running", "waiting", "needs_human", "done", "failed", "orphaned",
                   "cancelled", "damaged")
EFFECT_STATUSES = ("awaiting_approval", "in_flight", "applied", "failed", "unknown",
                   "rejected", "skipped", "compensated", "compensation_failed",
                   "compensation_unknown")


def _check_choice(value: str | None, choices: tuple[str, ...], option: str) -> None:
    if value is not None and value not in choices:
        raise Refused(f"{option} {value!r} is not a status; one of {', '.join(choices)}")


def status(db: Db = "", thread: Thread = None, as_json: Json = False,
           as_jsonl: Jsonl = False) -> int:
    """Status of one or every thread, and the reason in one sentence."""
    from graph_durable.operators.recovery import thread_status

    fmt = output_format(as_json, as_jsonl)
    saver = open_saver(db, read_only=True)
    known_thread(saver, thread)
    rows = [{"thread": s.thread_id, "status": s.status, "reason": s.reason}
            for s in (thread_status(saver, t) for t in ([thread] if thread else saver.thread_ids()))]
    emit(rows, fmt, [Column("thread", kind="id"), Column("status", kind="status"),
                     Column("reason")])
    return passed_by(r["thread"] for r in rows if r["status"] == "damaged")


def _thread_rows(saver: Any) -> list[dict[str, Any]]:
    from datetime import datetime

    from graph_durable.operators.inbox import inbox
    from graph_durable.operators.recovery import thread_status

    leases = saver.live_leases()
    flows = saver.flow_versions()
    pending: dict[str, int] = {}
    for item in inbox(saver):
        pending[item.thread_id] = pending.get(item.thread_id, 0) + 1
    last_event = {}
    for event in saver.events():
        last_event[event.thread_id] = event.at
    rows = []
    for thread_id in saver.thread_ids():
        state = thread_status(saver, thread_id)
        try:
            latest = saver.get_tuple({"configurable": {"thread_id": thread_id,
                                                       "checkpoint_ns": ""}})
        except LedgerDamaged:
            latest = None  # `state` names it
        times = [last_event.get(thread_id)]
        if latest is not None and latest.checkpoint.get("ts"):
            times.append(datetime.fromisoformat(latest.checkpoint["ts"]).timestamp())
        lease = leases.get(thread_id)
        rows.append({
            "thread": thread_id, "status": state.status,
            "last_activity": at(max(t for t in times if t is not None)) if any(times) else None,
            "pending": pending.get(thread_id, 0),
            "lease": None if lease is None else {"owner": lease[0], "token": lease[1]},
            "flow_version": flows.get(thread_id), "reason": state.reason,
        })
    return rows


def threads(db: Db = "", status: Annotated[Optional[str], typer.Option(  # noqa: UP007
                "--status", help=f"only threads in this status: {', '.join(THREAD_STATUSES)}")] = None,
            limit: Limit = None, since: Since = None, as_json: Json = False,
            as_jsonl: Jsonl = False) -> int:
    """Every thread, newest activity first: status, last activity, pending decisions,
    lease holder and flow version."""
    fmt = output_format(as_json, as_jsonl)
    _check_choice(status, THREAD_STATUSES, "--status")
    after = parse_since(since)
    saver = open_saver(db, read_only=True)
    rows = [r for r in _thread_rows(saver)
            if (status is None or r["status"] == status)
            and (after is None or (r["last_activity"] and r["last_activity"].timestamp() >= after))]
    rows.sort(key=lambda r: r["last_activity"].timestamp() if r["last_activity"] else 0,
              reverse=True)
    rows = rows[:limit] if limit else rows
    for row in rows if fmt == "table" else ():
        row["lease"] = row["lease"]["owner"] if row["lease"] else None
    emit(rows, fmt, [Column("thread", kind="id", max_width=36), Column("status", kind="status"),
                     Column("last_activity", "last activity (UTC)", kind="time"),
                     Column("pending", kind="number"), Column("lease", kind="id", max_width=24, optional=True),
                     Column("flow_version", "flow", kind="id", max_width=14, optional=True),
                     Column("reason")])
    return passed_by(r["thread"] for r in rows if r["status"] == "damaged")


def pending(db: Db = "", thread: Thread = None, as_json: Json = False,
            as_jsonl: Jsonl = False) -> int:
    """The inbox: every decision waiting for a human, across every thread (no graph
    needed), oldest question first; orphaned intents (kind `orphan`: no pending task will
    run them again) too, with the reason."""
    from graph_durable.operators.inbox import inbox

    fmt = output_format(as_json, as_jsonl)
    saver = open_saver(db, read_only=True)
    known_thread(saver, thread)
    rows = []
    for item in inbox(saver, thread):
        row = {"thread": item.thread_id, **item.to_dict()}
        del row["thread_id"], row["response_schema"]
        row["asked_at"], row["created_at"] = at(item.asked_at), at(item.created_at)
        if item.kind == "damaged":
            row["asked_at"] = row["created_at"] = None
        rows.append(row)
    emit(rows, fmt, [Column("thread", kind="id", max_width=28),
                     Column("tool_call_id", "call", kind="id", max_width=20),
                     Column("kind", kind="status"), Column("tool", kind="id"),
                     Column("description"), Column("args", kind="json", max_width=40, optional=True),
                     Column("key", kind="id", max_width=14, optional=True),
                     Column("attempts", kind="number", optional=True),
                     Column("error", max_width=40, optional=True),
                     Column("asked_at", "asked (UTC)", kind="time")],
         empty="(nothing waits for a human)")
    return passed_by(r["thread"] for r in rows if r["kind"] == "damaged")


def _damaged_rows(damage: Any) -> list[dict[str, Any]]:
    """One row per `Damage` (or `LedgerDamaged`): its thread shown `damaged`, the row named."""
    return [{"thread": d.thread_id, "status": "damaged", "kind": "damaged", "key": d.key,
             "error": getattr(d, "fact", None) or str(d), "created_at": None,
             "updated_at": None, "at": None} for d in damage]


def _readable(read: Any, damaged: list[Any]) -> Any:
    """`read()`'s rows, with the damage a listing passed by added to `damaged`; a read
    of one thread that cannot be read is no rows and its `LedgerDamaged` in `damaged`."""
    try:
        found = read()
    except LedgerDamaged as exc:
        damaged.append(exc)
        return []
    damaged.extend(getattr(found, "damaged", ()))
    return found


def _effect_rows(saver: Any, thread: str | None, status: str | None,
                 damaged: list[Any]) -> list[dict[str, Any]]:
    return [{"thread": r.thread_id, "tool_call_id": r.tool_call_id, "tool": r.tool,
             "status": r.status.value, "attempts": r.attempts, "key": r.key, "args": r.args,
             "receipt": r.receipt, "error": r.error, "asked": r.asked,
             "created_at": at(r.created_at), "updated_at": at(r.updated_at)}
            for r in _readable(lambda: saver.effects(thread, status), damaged)]


_EFFECT_COLUMNS = [Column("thread", kind="id", max_width=28),
                   Column("tool_call_id", "call", kind="id", max_width=20),
                   Column("tool", kind="id"), Column("status", kind="status"),
                   Column("attempts", kind="number", optional=True),
                   Column("key", kind="id", max_width=14, optional=True),
                   Column("receipt", kind="json", max_width=40, optional=True),
                   Column("error", max_width=40, optional=True),
                   Column("updated_at", "updated (UTC)", kind="time")]


def effects(db: Db = "", thread: Thread = None,
            status: Annotated[Optional[str], typer.Option(  # noqa: UP007
                "--status", help=f"only effects in this status: {', '.join(EFFECT_STATUSES)}")] = None,
            tool: Annotated[Optional[str], typer.Option("--tool", help="only this tool")] = None,  # noqa: UP007
            limit: Limit = None, since: Since = None, as_json: Json = False,
            as_jsonl: Jsonl = False) -> int:
    """The effect ledger: one row per effect, oldest first."""
    fmt = output_format(as_json, as_jsonl)
    _check_choice(status, EFFECT_STATUSES, "--status")
    after = parse_since(since)
    saver = open_saver(db, read_only=True)
    known_thread(saver, thread)
    damaged: list[Any] = []
    rows = [r for r in _effect_rows(saver, thread, status, damaged)
            if (tool is None or r["tool"] == tool)
            and (after is None or r["updated_at"].timestamp() >= after)]
    rows = (rows[-limit:] if limit else rows) + _damaged_rows(damaged)
    emit(rows, fmt, _EFFECT_COLUMNS)
    return passed_by(d.thread_id for d in damaged)


def _event_rows(saver: Any, thread: str | None, damaged: list[Any]) -> list[dict[str, Any]]:
    names = {(r.thread_id, r.key): (r.tool, r.tool_call_id)
             for r in _readable(lambda: saver.effects(thread), [])}
    rows = []
    for e in _readable(lambda: saver.events(thread), damaged):
        tool, call = names.get((e.thread_id, e.key), (None, None))
        data = e.data if isinstance(e.data, dict) else {"sealed": e.data}
        rows.append({"seq": e.seq, "at": at(e.at), "thread": e.thread_id,
                     "tool": data.get("tool", tool), "tool_call_id": data.get("tool_call_id", call),
                     "kind": e.kind, "key": e.key, "data": e.data, "owner": e.owner,
                     "token": e.fencing_token})
    return rows


def _details(data: Any) -> Any:
    if not isinstance(data, dict):
        return data
    return {k: v for k, v in data.items() if k not in ("tool", "tool_call_id")} or None


_EVENT_COLUMNS = [Column("seq", kind="number"), Column("at", "at (UTC)", kind="time"),
                  Column("tool", kind="id"), Column("tool_call_id", "call", kind="id", max_width=20),
                  Column("kind", kind="status"), Column("details", kind="json"),
                  Column("owner", kind="id", max_width=24, optional=True),
                  Column("token", kind="number", optional=True)]


def events(db: Db = "", thread: Thread = None, limit: Limit = None, as_json: Json = False,
           as_jsonl: Jsonl = False) -> int:
    """The append-only journal, in order."""
    fmt = output_format(as_json, as_jsonl)
    saver = open_saver(db, read_only=True)
    known_thread(saver, thread)
    damaged: list[Any] = []
    rows = _event_rows(saver, thread, damaged)
    rows = rows[-limit:] if limit else rows
    if fmt == "table":
        for row in rows:
            row["details"] = _details(row["data"])
    rows += [{**row, "kind": "damaged", "details": row["error"]}
             for row in _damaged_rows(damaged)]
    emit(rows, fmt, [Column("thread", kind="id", max_width=28), *_EVENT_COLUMNS])
    return passed_by(d.thread_id for d in damaged)


def show(thread: ThreadArg, db: Db = "", as_json: Json = False, as_jsonl: Jsonl = False) -> int:
    """One thread: its status, what waits for a human, and its journal as a timeline."""
    from graph_durable.operators.inbox import inbox
    from graph_durable.operators.recovery import thread_status

    fmt = output_format(as_json, as_jsonl)
    saver = open_saver(db, read_only=True)
    known_thread(saver, thread)
    state = thread_status(saver, thread)
    lease = saver.live_leases().get(thread)
    flow = saver.flow_versions().get(thread)
    waiting = [item for item in inbox(saver, thread) if item.kind != "damaged"]
    damaged: list[Any] = []
    timeline = _event_rows(saver, thread, damaged)
    code = passed_by([thread] if state.status == "damaged" or damaged else [])
    if fmt != "table":
        emit_object({"thread": thread, "status": state.status, "reason": state.reason,
                     "next": list(state.next),
                     "lease": None if lease is None else {"owner": lease[0], "token": lease[1]},
                     "flow_version": flow,
                     "pending": [{**i.to_dict(), "asked_at": at(i.asked_at),
                                  "created_at": at(i.created_at)} for i in waiting],
                     "effects": _effect_rows(saver, thread, None, damaged),
                     "events": timeline}, fmt, [])
        return code
    emit_object({}, fmt, [
        f"thread {thread}: {state.status} ({state.reason})",
        f"lease: {lease[0] + ' (token ' + str(lease[1]) + ')' if lease else 'none'}; "
        f"flow version: {flow or 'not pinned'}; next: {', '.join(state.next) or '-'}",
    ])
    for item in waiting:
        emit_object({}, fmt, [f"waiting: {item.tool_call_id} {item.tool} ({item.kind}): "
                              f"{item.description or ''}",
                              f"  answer: graph-durable {_verbs(item.kind)} {thread} "
                              f"{item.tool_call_id} ..."])
    for row in timeline:
        row["details"] = _details(row["data"])
    emit(timeline, fmt, _EVENT_COLUMNS, title="timeline", empty="(no effects journaled)")
    return code


def _verbs(kind: str) -> str:
    return ("approve|edit|reject|respond" if kind == "approval" else "resolve")


def audit(thread: Annotated[Optional[str], typer.Argument(  # noqa: UP007
              metavar="[THREAD]", help="thread id (or --thread)", show_default=False)] = None,
          db: Db = "", thread_option: Annotated[Optional[str], typer.Option(  # noqa: UP007
              "--thread", hidden=True)] = None,
          as_json: Json = False, as_jsonl: Jsonl = False) -> int:
    """What ran again in each run of a thread, and what each run did with its effects."""
    fmt = output_format(as_json, as_jsonl)
    thread = thread or thread_option
    if thread is None:
        raise Refused("audit needs a THREAD")
    saver = open_saver(db, read_only=True)
    known_thread(saver, thread)
    report = saver.audit(thread)
    emit_object(report.to_dict(), fmt, report.summary().splitlines())
    return 0


COMMANDS = (status, threads, pending, effects, events, show, audit)
"""Registered in this order (the order `--help` lists them)."""
