"""The commands of `graph-durable` that answer a thread's pending questions: `approve`,
`reject`, `respond`, `edit`, `resolve` and `decide`."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from graph_durable.cli._open import Refused, known_thread, load_graph, open_saver, parse_json
from graph_durable.cli._options import (
    CallArg,
    Db,
    Graph,
    Json,
    Jsonl,
    NoResume,
    Reviewer,
    ThreadArg,
    output_format,
)
from graph_durable.cli._output import Column, Format, emit

__all__ = ["COMMANDS", "approve", "decide", "edit", "reject", "resolve", "respond"]


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


def approve(thread: ThreadArg, call: CallArg, db: Db = "", graph: Graph = None,
            reviewer: Reviewer = None, no_resume: NoResume = False, as_json: Json = False,
            as_jsonl: Jsonl = False) -> int:
    """Approve a call waiting for approval: it is sent, once, under its key."""
    return _answer(db, graph, thread, call, {"type": "approve"}, reviewer, no_resume,
                   output_format(as_json, as_jsonl))


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
                   output_format(as_json, as_jsonl))


def respond(thread: ThreadArg, call: CallArg,
            message: Annotated[str, typer.Option("--message", "-m", show_default=False,
                                                 help="the answer the model gets")],
            db: Db = "", graph: Graph = None, reviewer: Reviewer = None,
            no_resume: NoResume = False, as_json: Json = False, as_jsonl: Jsonl = False) -> int:
    """Answer in place of the tool: nothing is sent, the model gets your message."""
    return _answer(db, graph, thread, call, {"type": "respond", "message": message}, reviewer,
                   no_resume, output_format(as_json, as_jsonl))


def edit(thread: ThreadArg, call: CallArg,
         args: Annotated[str, typer.Option("--args", show_default=False,
                                           help="the call's new arguments, a JSON object")],
         db: Db = "", graph: Graph = None, reviewer: Reviewer = None,
         no_resume: NoResume = False, as_json: Json = False, as_jsonl: Jsonl = False) -> int:
    """Approve a call with other arguments (checked against the tool's schema)."""
    fmt = output_format(as_json, as_jsonl)
    new_args = parse_json(args, "--args", '{"amount": 40}')
    if not isinstance(new_args, dict):
        raise Refused(f"--args must be a JSON object of the tool's arguments, got {args!r}")
    return _answer(db, graph, thread, call, {"type": "edit", "edited_action": {"args": new_args}},
                   reviewer, no_resume, fmt)


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
    fmt = output_format(as_json, as_jsonl)
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

    fmt = output_format(as_json, as_jsonl)
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


COMMANDS = (approve, reject, respond, edit, resolve, decide)
"""Registered in this order (the order `--help` lists them)."""
