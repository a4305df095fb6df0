"""The commands of `graph-durable` that act on threads under a lease: `recover`,
`compensate` and `cancel`."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from graph_durable.cli._open import Refused, known_thread, load_graph, open_saver, parse_json
from graph_durable.cli._options import Db, Graph, Json, Jsonl, Limit, Reviewer, output_format
from graph_durable.cli._output import Column, emit

__all__ = ["COMMANDS", "cancel", "compensate", "recover"]


Owner = Annotated[str, typer.Option("--owner", show_default=False,
                                    help="lease owner name, e.g. worker-7 or ops-ana")]
Ttl = Annotated[float, typer.Option("--ttl", min=1.0, help="lease time to live, seconds")]


def recover(db: Db = "", graph: Graph = None, owner: Owner = "", limit: Limit = None,
            ttl: Ttl = 30.0, as_json: Json = False, as_jsonl: Jsonl = False) -> int:
    """Resume every orphaned thread under a lease (safe from many processes at once), and
    look orphaned intents up with their policies' lookups (those left need `resolve`)."""
    from graph_durable.operators.recovery import recover as sweep

    fmt = output_format(as_json, as_jsonl)
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

    fmt = output_format(as_json, as_jsonl)
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


def cancel(db: Db = "", graph: Graph = None,
           thread: Annotated[str, typer.Option("--thread", show_default=False)] = "",
           owner: Owner = "",
           no_compensate: Annotated[bool, typer.Option(
               "--no-compensate", help="leave applied effects in place")] = False,
           ttl: Ttl = 30.0, as_json: Json = False, as_jsonl: Jsonl = False) -> int:
    """Stop a thread for good, undoing its effects newest first."""
    from graph_durable.operators.compensation import cancel as stop

    fmt = output_format(as_json, as_jsonl)
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


COMMANDS = (recover, compensate, cancel)
"""Registered in this order (the order `--help` lists them)."""
