"""The commands of `graph-durable` (a thin layer over the public API; no SQL here)."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from graph_durable.cli._open import (
    Refused,
    known_thread,
    load_graph,
    open_saver,
    parse_json,
    parse_since,
)
from graph_durable.cli._output import Column, Format, at, emit, emit_object

__all__ = ["app"]

app = typer.Typer(
    name="graph-durable", add_completion=False, no_args_is_help=True,
    rich_markup_mode=None, pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="See which LangGraph threads are stuck and why, answer their pending effects, "
         "and recover threads whose worker died.",
)

# -- options every command shares ---------------------------------------------------------

Db = Annotated[str, typer.Option(
    "--db", envvar="GRAPH_DURABLE_DB", show_default=False,
    help="SQLite file of the durable saver, or a postgresql:// URL")]
Graph = Annotated[Optional[str], typer.Option(  # noqa: UP007 - typer reads the annotation
    "--graph", envvar="GRAPH_DURABLE_GRAPH", show_default=False,
    help="module:attribute of the graph (compiled, a StateGraph, or a factory taking the "
         "saver) [env GRAPH_DURABLE_GRAPH]")]
Json = Annotated[bool, typer.Option("--json", help="print JSON (nested values, ISO 8601 times)")]
Jsonl = Annotated[bool, typer.Option("--jsonl", help="print one JSON object a line")]
Thread = Annotated[Optional[str], typer.Option("--thread", help="only this thread")]  # noqa: UP007
Limit = Annotated[Optional[int], typer.Option("--limit", min=1, help="at most this many rows")]  # noqa: UP007
Since = Annotated[Optional[str], typer.Option(  # noqa: UP007
    "--since", help="only what changed since: a duration (30m, 2h, 7d) or an ISO 8601 time")]
Reviewer = Annotated[Optional[str], typer.Option("--reviewer", help="who decides (journaled)")]  # noqa: UP007
NoResume = Annotated[bool, typer.Option(
    "--no-resume", help="only journal the decision (no graph needed); the thread's next "
                        "resume, e.g. `graph-durable recover`, acts on it")]
ThreadArg = Annotated[str, typer.Argument(metavar="THREAD", help="thread id")]
CallArg = Annotated[str, typer.Argument(metavar="CALL", help="tool_call_id (or interrupt id, or key)")]


def _format(as_json: bool, as_jsonl: bool) -> Format:
    if as_json and as_jsonl:
        raise Refused("--json is not allowed with --jsonl: choose one")
    return "json" if as_json else "jsonl" if as_jsonl else "table"


def _version_callback(value: bool) -> None:
    if value:
        from graph_durable import __version__

        typer.echo(f"graph-durable {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_version_callback,
                                          help="print the version and exit")] = False,
) -> None:
    """See which LangGraph threads are stuck and why, answer their pending effects, and
    recover threads whose worker died."""


# -- reading ------------------------------------------------------------------------------

# `graph_durable.operators.recovery.Status` and `EffectStatus` (a test keeps them equal), written
# out so that help and usage errors need not import LangGraph.
THREAD_STATUSES = ("running", "waiting", "needs_human", "done", "failed", "orphaned",
                   "cancelled")
EFFECT_STATUSES = ("awaiting_approval", "in_flight", "applied", "failed", "unknown",
                   "rejected", "skipped", "compensated", "compensation_failed",
                   "compensation_unknown")


def _check_choice(value: str | None, choices: tuple[str, ...], option: str) -> None:
    if value is not None and value not in choices:
        raise Refused(f"{option} {value!r} is not a status; one of {', '.join(choices)}")


@app.command()
def status(db: Db = "", thread: Thread = None, as_json: Json = False,
           as_jsonl: Jsonl = False) -> int:
    """Status of one or every thread, and the reason in one sentence."""
    from graph_durable.operators.recovery import thread_status

    fmt = _format(as_json, as_jsonl)
    saver = open_saver(db, read_only=True)
    known_thread(saver, thread)
    rows = [{"thread": s.thread_id, "status": s.status, "reason": s.reason}
            for s in (thread_status(saver, t) for t in ([thread] if thread else saver.thread_ids()))]
    emit(rows, fmt, [Column("thread", kind="id"), Column("status", kind="status"),
                     Column("reason")])
    return 0


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
        latest = saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
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


@app.command()
def threads(db: Db = "", status: Annotated[Optional[str], typer.Option(  # noqa: UP007
                "--status", help=f"only threads in this status: {', '.join(THREAD_STATUSES)}")] = None,
            limit: Limit = None, since: Since = None, as_json: Json = False,
            as_jsonl: Jsonl = False) -> int:
    """Every thread, newest activity first: status, last activity, pending decisions,
    lease holder and flow version."""
    fmt = _format(as_json, as_jsonl)
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
    return 0


@app.command()
def pending(db: Db = "", thread: Thread = None, as_json: Json = False,
            as_jsonl: Jsonl = False) -> int:
    """The inbox: every decision waiting for a human, across every thread (no graph
    needed), oldest question first; orphaned intents (kind `orphan`: no pending task will
    run them again) too, with the reason."""
    from graph_durable.operators.inbox import inbox

    fmt = _format(as_json, as_jsonl)
    saver = open_saver(db, read_only=True)
    known_thread(saver, thread)
    rows = []
    for item in inbox(saver, thread):
        row = {"thread": item.thread_id, **item.to_dict()}
        del row["thread_id"], row["response_schema"]
        row["asked_at"], row["created_at"] = at(item.asked_at), at(item.created_at)
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
    return 0


def _effect_rows(saver: Any, thread: str | None, status: str | None) -> list[dict[str, Any]]:
    return [{"thread": r.thread_id, "tool_call_id": r.tool_call_id, "tool": r.tool,
             "status": r.status.value, "attempts": r.attempts, "key": r.key, "args": r.args,
             "receipt": r.receipt, "error": r.error, "asked": r.asked,
             "created_at": at(r.created_at), "updated_at": at(r.updated_at)}
            for r in saver.effects(thread, status)]


_EFFECT_COLUMNS = [Column("thread", kind="id", max_width=28),
                   Column("tool_call_id", "call", kind="id", max_width=20),
                   Column("tool", kind="id"), Column("status", kind="status"),
                   Column("attempts", kind="number", optional=True),
                   Column("key", kind="id", max_width=14, optional=True),
                   Column("receipt", kind="json", max_width=40, optional=True),
                   Column("error", max_width=40, optional=True),
                   Column("updated_at", "updated (UTC)", kind="time")]


@app.command()
def effects(db: Db = "", thread: Thread = None,
            status: Annotated[Optional[str], typer.Option(  # noqa: UP007
                "--status", help=f"only effects in this status: {', '.join(EFFECT_STATUSES)}")] = None,
            tool: Annotated[Optional[str], typer.Option("--tool", help="only this tool")] = None,  # noqa: UP007
            limit: Limit = None, since: Since = None, as_json: Json = False,
            as_jsonl: Jsonl = False) -> int:
    """The effect ledger: one row per effect, oldest first."""
    fmt = _format(as_json, as_jsonl)
    _check_choice(status, EFFECT_STATUSES, "--status")
    after = parse_since(since)
    saver = open_saver(db, read_only=True)
    known_thread(saver, thread)
    rows = [r for r in _effect_rows(saver, thread, status)
            if (tool is None or r["tool"] == tool)
            and (after is None or r["updated_at"].timestamp() >= after)]
    emit(rows[-limit:] if limit else rows, fmt, _EFFECT_COLUMNS)
    return 0


def _event_rows(saver: Any, thread: str | None) -> list[dict[str, Any]]:
    names = {(r.thread_id, r.key): (r.tool, r.tool_call_id) for r in saver.effects(thread)}
    rows = []
    for e in saver.events(thread):
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


@app.command()
def events(db: Db = "", thread: Thread = None, limit: Limit = None, as_json: Json = False,
           as_jsonl: Jsonl = False) -> int:
    """The append-only journal, in order."""
    fmt = _format(as_json, as_jsonl)
    saver = open_saver(db, read_only=True)
    known_thread(saver, thread)
    rows = _event_rows(saver, thread)
    rows = rows[-limit:] if limit else rows
    if fmt == "table":
        for row in rows:
            row["details"] = _details(row["data"])
    emit(rows, fmt, [Column("thread", kind="id", max_width=28), *_EVENT_COLUMNS])
    return 0


@app.command()
def show(thread: ThreadArg, db: Db = "", as_json: Json = False, as_jsonl: Jsonl = False) -> int:
    """One thread: its status, what waits for a human, and its journal as a timeline."""
    from graph_durable.operators.inbox import inbox
    from graph_durable.operators.recovery import thread_status

    fmt = _format(as_json, as_jsonl)
    saver = open_saver(db, read_only=True)
    known_thread(saver, thread)
    state = thread_status(saver, thread)
    lease = saver.live_leases().get(thread)
    flow = saver.flow_versions().get(thread)
    waiting = inbox(saver, thread)
    timeline = _event_rows(saver, thread)
    if fmt != "table":
        emit_object({"thread": thread, "status": state.status, "reason": state.reason,
                     "next": list(state.next),
                     "lease": None if lease is None else {"owner": lease[0], "token": lease[1]},
                     "flow_version": flow,
                     "pending": [{**i.to_dict(), "asked_at": at(i.asked_at),
                                  "created_at": at(i.created_at)} for i in waiting],
                     "effects": _effect_rows(saver, thread, None),
                     "events": timeline}, fmt, [])
        return 0
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
    return 0


def _verbs(kind: str) -> str:
    return ("approve|edit|reject|respond" if kind == "approval" else "resolve")


@app.command()
def audit(thread: Annotated[Optional[str], typer.Argument(  # noqa: UP007
              metavar="[THREAD]", help="thread id (or --thread)", show_default=False)] = None,
          db: Db = "", thread_option: Annotated[Optional[str], typer.Option(  # noqa: UP007
              "--thread", hidden=True)] = None,
          as_json: Json = False, as_jsonl: Jsonl = False) -> int:
    """What ran again in each run of a thread, and what each run did with its effects."""
    fmt = _format(as_json, as_jsonl)
    thread = thread or thread_option
    if thread is None:
        raise Refused("audit needs a THREAD")
    saver = open_saver(db, read_only=True)
    known_thread(saver, thread)
    report = saver.audit(thread)
    emit_object(report.to_dict(), fmt, report.summary().splitlines())
    return 0


# -- answering ----------------------------------------------------------------------------


def _answer(db: str, graph_spec: str | None, thread: str, call: str, decision: dict[str, Any],
            reviewer: str | None, no_resume: bool, fmt: Format) -> int:
    """Answer one pending call: resume the thread with the graph, or journal only."""
    from graph_durable.operators.inbox import inbox, record_decisions
    from graph_durable.operators.orphans import find_orphans
    from graph_durable.operators.recovery import thread_status
    from graph_durable.operators.review import review

    saver = open_saver(db)
    known_thread(saver, thread)
    # An orphaned intent has no run to resume: its decision is carried out at once.
    orphan = any(call in (o.tool_call_id, o.key) for o in find_orphans(saver, thread))
    no_resume = no_resume or orphan
    if not no_resume and not graph_spec:
        raise Refused("resuming the thread needs --graph module:attribute; or pass "
                      "--no-resume to only journal the decision (the next resume, e.g. "
                      "`graph-durable recover`, acts on it)")
    if decision["type"] == "edit":  # the call keeps its tool: name it as the interrupt does
        named = [i for i in inbox(saver, thread) if call in (i.tool_call_id, i.interrupt_id, i.key)]
        if len(named) == 1:
            decision["edited_action"]["name"] = named[0].tool
    graph = load_graph(graph_spec, saver) if graph_spec else None
    if no_resume:
        record_decisions(saver, thread, {call: decision}, reviewer=reviewer, graph=graph)
    else:
        r = review(graph, {"configurable": {"thread_id": thread}})
        r._decide(call, decision, reviewer)
        r.resume()
    state = thread_status(saver, thread)
    emit([{"thread": thread, "tool_call_id": call, "decision": decision["type"],
           "resumed": not no_resume, "status": state.status, "reason": state.reason}], fmt,
         [Column("thread", kind="id"), Column("tool_call_id", "call", kind="id"),
          Column("decision", kind="status"), Column("resumed", kind="status"),
          Column("status", kind="status"), Column("reason")])
    return 1 if state.status == "failed" else 0


@app.command()
def approve(thread: ThreadArg, call: CallArg, db: Db = "", graph: Graph = None,
            reviewer: Reviewer = None, no_resume: NoResume = False, as_json: Json = False,
            as_jsonl: Jsonl = False) -> int:
    """Approve a call waiting for approval: it is sent, once, under its key."""
    return _answer(db, graph, thread, call, {"type": "approve"}, reviewer, no_resume,
                   _format(as_json, as_jsonl))


@app.command()
def reject(thread: ThreadArg, call: CallArg,
           message: Annotated[Optional[str], typer.Option(  # noqa: UP007
               "--message", "-m", help="why (the model reads it)")] = None,
           db: Db = "", graph: Graph = None, reviewer: Reviewer = None,
           no_resume: NoResume = False, as_json: Json = False, as_jsonl: Jsonl = False) -> int:
    """Reject a call waiting for approval: nothing is sent, the model is told why."""
    decision: dict[str, Any] = {"type": "reject"}
    if message is not None:
        decision["message"] = message
    return _answer(db, graph, thread, call, decision, reviewer, no_resume,
                   _format(as_json, as_jsonl))


@app.command()
def respond(thread: ThreadArg, call: CallArg,
            message: Annotated[str, typer.Option("--message", "-m", show_default=False,
                                                 help="the answer the model gets")],
            db: Db = "", graph: Graph = None, reviewer: Reviewer = None,
            no_resume: NoResume = False, as_json: Json = False, as_jsonl: Jsonl = False) -> int:
    """Answer in place of the tool: nothing is sent, the model gets your message."""
    return _answer(db, graph, thread, call, {"type": "respond", "message": message}, reviewer,
                   no_resume, _format(as_json, as_jsonl))


@app.command()
def edit(thread: ThreadArg, call: CallArg,
         args: Annotated[str, typer.Option("--args", show_default=False,
                                           help="the call's new arguments, a JSON object")],
         db: Db = "", graph: Graph = None, reviewer: Reviewer = None,
         no_resume: NoResume = False, as_json: Json = False, as_jsonl: Jsonl = False) -> int:
    """Approve a call with other arguments (checked against the tool's schema)."""
    fmt = _format(as_json, as_jsonl)
    new_args = parse_json(args, "--args", '{"amount": 40}')
    if not isinstance(new_args, dict):
        raise Refused(f"--args must be a JSON object of the tool's arguments, got {args!r}")
    return _answer(db, graph, thread, call, {"type": "edit", "edited_action": {"args": new_args}},
                   reviewer, no_resume, fmt)


@app.command()
def resolve(thread: ThreadArg, call: CallArg,
            applied: Annotated[bool, typer.Option("--applied", help="it happened: give --receipt")] = False,
            receipt: Annotated[Optional[str], typer.Option(  # noqa: UP007
                "--receipt", help="with --applied: what the provider holds, as JSON")] = None,
            retry: Annotated[bool, typer.Option("--retry", help="it did not happen: send it again, same key")] = False,
            skip: Annotated[bool, typer.Option("--skip", help="give up on it; the model is told")] = False,
            message: Annotated[Optional[str], typer.Option(  # noqa: UP007
                "--message", "-m", help="with --skip: what the model is told")] = None,
            db: Db = "", graph: Graph = None, reviewer: Reviewer = None,
            no_resume: NoResume = False, as_json: Json = False, as_jsonl: Jsonl = False) -> int:
    """Settle a call whose outcome is unknown: --applied --receipt JSON, --retry or --skip.

    An orphaned intent (listed by `pending` as `orphan`) takes --applied or --skip, carried
    out at once: no run is left to resume."""
    fmt = _format(as_json, as_jsonl)
    if applied + retry + skip != 1:
        raise Refused("resolve needs exactly one of --applied --receipt JSON, --retry, --skip")
    if receipt is not None and not applied:
        raise Refused("--receipt goes with --applied")
    if message is not None and not skip:
        raise Refused("--message goes with --skip")
    decision: dict[str, Any]
    if applied:
        if receipt is None:
            raise Refused("--applied needs --receipt JSON: what the provider holds, e.g. "
                          "--receipt '{\"id\": \"m-7\"}'")
        decision = {"type": "applied", "receipt": parse_json(receipt, "--receipt", '{"id": "m-7"}')}
    elif retry:
        decision = {"type": "retry"}
    else:
        decision = {"type": "skip", **({"message": message} if message is not None else {})}
    return _answer(db, graph, thread, call, decision, reviewer, no_resume, fmt)


def _decisions(text: str) -> dict[str, dict[str, Any]]:
    """`--decisions`, checked before anything touches the database."""
    decisions = parse_json(text, "--decisions", '{"call_1": {"type": "approve"}}')
    if not isinstance(decisions, dict) or not decisions:
        raise Refused('--decisions must be a JSON object {"tool_call_id": decision, ...}')
    for name, decision in decisions.items():
        if not isinstance(decision, dict) or not isinstance(decision.get("type"), str):
            raise Refused(f"--decisions: the decision for {name!r} must be an object with "
                          f'a "type", e.g. {{"type": "approve"}}; got {decision!r}')
    return decisions


@app.command()
def decide(db: Db = "", graph: Graph = None,
           thread: Annotated[str, typer.Option("--thread", show_default=False, help="the thread")] = "",
           decisions: Annotated[str, typer.Option(
               "--decisions", show_default=False,
               help='JSON {"tool_call_id": decision}, decisions in HumanInTheLoopMiddleware '
                    'shapes')] = "",
           reviewer: Reviewer = None, no_resume: NoResume = False, as_json: Json = False,
           as_jsonl: Jsonl = False) -> int:
    """Answer several pending calls of a thread at once (JSON), then resume it."""
    from graph_durable.operators.inbox import record_decisions
    from graph_durable.operators.orphans import find_orphans
    from graph_durable.operators.recovery import thread_status
    from graph_durable.operators.review import review

    fmt = _format(as_json, as_jsonl)
    if not thread:
        raise Refused("decide needs --thread")
    chosen = _decisions(decisions)
    if not no_resume and not graph:
        raise Refused("resuming the thread needs --graph module:attribute; or pass "
                      "--no-resume to only journal the decisions")
    saver = open_saver(db)
    known_thread(saver, thread)
    loaded = load_graph(graph, saver) if graph else None
    # Orphaned intents have no run to resume: their decisions are carried out at once.
    lost = {name for name in chosen for o in find_orphans(saver, thread)
            if name in (o.tool_call_id, o.key)}
    if no_resume:
        record_decisions(saver, thread, chosen, reviewer=reviewer, graph=loaded)
    else:
        r = review(loaded, {"configurable": {"thread_id": thread}})
        for tool_call_id, decision in chosen.items():
            if tool_call_id not in lost:  # checked here, carried out by the resume
                r._decide(tool_call_id, dict(decision), reviewer)
        if lost:
            record_decisions(saver, thread, {n: chosen[n] for n in lost}, reviewer=reviewer,
                             graph=loaded)
        if len(lost) < len(chosen):
            r.resume()
    state = thread_status(saver, thread)
    emit([{"thread": state.thread_id, "status": state.status, "reason": state.reason}], fmt,
         [Column("thread", kind="id"), Column("status", kind="status"), Column("reason")])
    return 1 if state.status == "failed" else 0


# -- operating ----------------------------------------------------------------------------


Owner = Annotated[str, typer.Option("--owner", show_default=False,
                                    help="lease owner name, e.g. worker-7 or ops-ana")]
Ttl = Annotated[float, typer.Option("--ttl", min=1.0, help="lease time to live, seconds")]


@app.command()
def recover(db: Db = "", graph: Graph = None, owner: Owner = "", limit: Limit = None,
            ttl: Ttl = 30.0, as_json: Json = False, as_jsonl: Jsonl = False) -> int:
    """Resume every orphaned thread under a lease (safe from many processes at once), and
    look orphaned intents up with their policies' lookups (those left need `resolve`)."""
    from graph_durable.operators.recovery import recover as sweep

    fmt = _format(as_json, as_jsonl)
    if not owner:
        raise Refused("recover needs --owner NAME: the lease owner, e.g. worker-7")
    saver = open_saver(db)
    loaded = load_graph(graph, saver, why=" to resume threads")
    # Orphaned intents looked up, or left for a human, only where a thread had some.
    rows = [{"thread": o.thread_id, "outcome": o.outcome, "status": o.status, "error": o.error,
             **({"reconciled": list(o.reconciled), "orphans": list(o.orphans)}
                if o.reconciled or o.orphans else {})}
            for o in sweep(loaded, saver, owner, limit, ttl=ttl)]
    emit(rows, fmt, [Column("thread", kind="id"), Column("outcome", kind="status"),
                     Column("status", kind="status"), Column("error"),
                     Column("reconciled", kind="json", optional=True),
                     Column("orphans", kind="json", optional=True)],
         empty="(no orphaned thread)")
    return 1 if any(row["outcome"] == "error" for row in rows) else 0


@app.command()
def compensate(db: Db = "", graph: Graph = None,
               thread: Annotated[str, typer.Option("--thread", show_default=False)] = "",
               call: Annotated[str, typer.Option("--call", show_default=False,
                                                 help="tool_call_id (or key) of the effect")] = "",
               receipt: Annotated[Optional[str], typer.Option(  # noqa: UP007
                   "--receipt", help="JSON: a human's word that an unknown effect happened")] = None,
               retry: Annotated[bool, typer.Option(
                   "--retry", help="a compensation whose outcome is unknown did not happen: "
                                   "send it again, same key")] = False,
               reviewer: Reviewer = None, as_json: Json = False, as_jsonl: Jsonl = False) -> int:
    """Undo one applied (or confirmed) effect with its policy's compensation."""
    from graph_durable.operators.compensation import compensate as undo

    fmt = _format(as_json, as_jsonl)
    if not thread or not call:
        raise Refused("compensate needs --thread and --call")
    said = None if receipt is None else parse_json(receipt, "--receipt", '{"id": "ch_1"}')
    saver = open_saver(db)
    known_thread(saver, thread)
    record = undo(load_graph(graph, saver, why=" for the compensation's policy"), saver,
                  thread, call, receipt=said, retry=retry, reviewer=reviewer)
    emit([{"thread": record.thread_id, "tool_call_id": record.tool_call_id, "tool": record.tool,
           "status": record.status.value, "error": record.error}], fmt,
         [Column("thread", kind="id"), Column("tool_call_id", "call", kind="id"),
          Column("tool", kind="id"), Column("status", kind="status"), Column("error")])
    return 1 if record.status.value in ("compensation_failed", "compensation_unknown") else 0


@app.command()
def cancel(db: Db = "", graph: Graph = None,
           thread: Annotated[str, typer.Option("--thread", show_default=False)] = "",
           owner: Owner = "",
           no_compensate: Annotated[bool, typer.Option(
               "--no-compensate", help="leave applied effects in place")] = False,
           ttl: Ttl = 30.0, as_json: Json = False, as_jsonl: Jsonl = False) -> int:
    """Stop a thread for good, undoing its effects newest first."""
    from graph_durable.operators.compensation import cancel as stop

    fmt = _format(as_json, as_jsonl)
    if not thread or not owner:
        raise Refused("cancel needs --thread and --owner")
    saver = open_saver(db)
    known_thread(saver, thread)
    report = stop(load_graph(graph, saver, why=" for the compensations' policies"), saver,
                  thread, compensate=not no_compensate, owner=owner, ttl=ttl)
    if report.outcome == "held_elsewhere":
        raise Refused(report.summary().replace("\n", " "), code=1)
    rows = [{"thread": report.thread_id, "tool_call_id": r.tool_call_id, "tool": r.tool,
             "outcome": outcome, "status": r.status.value, "error": r.error}
            for outcome, records in (("compensated", report.compensated),
                                     ("left in place", report.left_in_place),
                                     ("needs a human", report.needs_human),
                                     ("withdrawn", report.withdrawn))
            for r in records]
    emit(rows or [{"thread": report.thread_id, "outcome": "no effects"}], fmt,
         [Column("thread", kind="id"), Column("tool_call_id", "call", kind="id"),
          Column("tool", kind="id"), Column("outcome", kind="status"),
          Column("status", kind="status"), Column("error")])
    return 1 if report.needs_human else 0
