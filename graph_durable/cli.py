"""`graph-durable`: inspect and recover threads from a shell (a thin layer over the API).

    graph-durable status   --db agent.sqlite [--thread T]
    graph-durable effects  --db agent.sqlite [--thread T] [--status unknown]
    graph-durable events   --db agent.sqlite [--thread T]
    graph-durable pending  --db agent.sqlite --graph app.agent:graph --thread T
    graph-durable decide   --db agent.sqlite --graph app.agent:graph --thread T \\
                           --decisions '{"call_1": {"type": "approve"}}'
    graph-durable recover  --db agent.sqlite --graph app.agent:graph --owner worker-7
    graph-durable compensate --db agent.sqlite --graph app.agent:graph --thread T \
                           --call call_1 [--receipt JSON] [--reviewer ana]
    graph-durable cancel   --db agent.sqlite --graph app.agent:graph --thread T \
                           --owner ops-ana [--no-compensate]
    graph-durable audit    --db agent.sqlite --thread T

`--db` is a SQLite file, or a `postgresql://` URL for `DurablePostgresSaver` (with the
`postgres` extra). When `LANGGRAPH_AES_KEY` is set, checkpoints and ledger are opened
with LangGraph's `EncryptedSerializer` under that key; without it, read commands show
encrypted ledger values as `<encrypted>`, and commands that need the checkpoints say
the key is missing. Every command prints a table, JSON with `--json` (values nested as
they are, times in ISO 8601) or one JSON object a line with `--jsonl`; `--version` prints
the version. `--graph module:attribute` names a compiled graph, a `StateGraph` builder
(compiled here on `--db`), or a callable that takes the saver and returns a compiled
graph.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sqlite3
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from graph_durable.checkpointers.sqlite import DurableSqliteSaver
from graph_durable.compensation import cancel, compensate
from graph_durable.errors import GraphDurableError, LeaseLost
from graph_durable.ledger import EffectStatus
from graph_durable.recovery import recover, thread_status
from graph_durable.review import review
from graph_durable.secrets import explained

__all__ = ["main"]


POSTGRES_SCHEMES = ("postgresql://", "postgres://")


class _Refused(Exception):
    """A bad input: one line on stderr, exit code `code`, nothing written."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def _serde() -> Any:
    """LangGraph's `EncryptedSerializer` under `LANGGRAPH_AES_KEY` if it is set, else the
    default serializer; either way, a value it cannot open is one clear error."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    if not os.environ.get("LANGGRAPH_AES_KEY"):
        return explained(JsonPlusSerializer())
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    try:
        return explained(EncryptedSerializer.from_pycryptodome_aes())
    except (ImportError, ValueError) as exc:
        raise _Refused(f"LANGGRAPH_AES_KEY is set, but {exc}") from None


def _saver(db: str, *, read_only: bool = False) -> Any:
    """`DurablePostgresSaver` for a PostgreSQL URL, `DurableSqliteSaver` for a file.

    Read commands open SQLite read-only: a typo never creates a database, and a file
    without the ledger is never given one.
    """
    serde = _serde()
    if not db.startswith(POSTGRES_SCHEMES):
        if read_only:
            return DurableSqliteSaver.open_read_only(db, serde=serde)
        if not os.path.isfile(db):
            raise _Refused(f"{db!r}: no such file. Check the path; graph-durable never "
                           "creates a database.")
        return DurableSqliteSaver(sqlite3.connect(db, check_same_thread=False), serde=serde)
    try:
        from psycopg import Connection, OperationalError
        from psycopg.rows import dict_row

        from graph_durable.checkpointers.postgres import DurablePostgresSaver
    except ImportError as exc:
        raise SystemExit(f"graph-durable: --db {db.split('@')[-1]!r} is a PostgreSQL URL, "
                         f"which needs the postgres extra ({exc}): "
                         "pip install 'graph-durable[postgres]'") from None
    try:
        if read_only:
            return DurablePostgresSaver.open_read_only(db, serde=serde)
        conn = Connection.connect(db, autocommit=True, prepare_threshold=0,
                                  row_factory=dict_row, connect_timeout=10)
    except OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise _Refused(f"cannot reach PostgreSQL at {db.split('@')[-1]!r}: {first}") from None
    return DurablePostgresSaver(conn, serde=serde)


def _graph(spec: str, saver: Any) -> Any:
    module_name, _, attribute = spec.partition(":")
    if not attribute:
        raise _Refused(f"--graph must be module:attribute, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # `--graph myapp.agent:graph` from the app's folder
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except Exception as exc:  # an import error of any kind is the user's module's
        raise _Refused(f"--graph {spec!r} could not be loaded: {type(exc).__name__}: "
                       f"{exc}") from None
    if hasattr(target, "compile") and not hasattr(target, "invoke"):
        return target.compile(checkpointer=saver)
    if hasattr(target, "invoke"):
        return target
    return target(saver)


def _decisions(text: str) -> dict[str, dict[str, Any]]:
    """`--decisions`, checked before anything touches the database."""
    try:
        decisions = json.loads(text)
    except ValueError as exc:
        raise _Refused(f"--decisions is not JSON ({exc}): give "
                       '\'{"call_1": {"type": "approve"}}\'') from None
    if not isinstance(decisions, dict) or not decisions:
        raise _Refused('--decisions must be a JSON object {"tool_call_id": decision, ...}')
    for name, decision in decisions.items():
        if not isinstance(decision, dict) or not isinstance(decision.get("type"), str):
            raise _Refused(f"--decisions: the decision for {name!r} must be an object with "
                           f'a "type", e.g. {{"type": "approve"}}; got {decision!r}')
    return decisions


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("graph-durable")
    except PackageNotFoundError:  # run from a source tree that was not installed
        return "unknown"


def _known_thread(saver: Any, thread_id: str | None) -> None:
    if thread_id is not None and thread_id not in saver.thread_ids():
        raise _Refused(f"thread {thread_id!r} has no checkpoint in this database; "
                       "`graph-durable status --db ...` lists the threads", code=1)


def _iso(at: float | None) -> str | None:
    """A Unix time as ISO 8601 in UTC."""
    return None if at is None else datetime.fromtimestamp(at, tz=timezone.utc).isoformat()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, default=str, ensure_ascii=False)
    return str(value)


def _print(rows: list[dict[str, Any]], as_json: bool, as_jsonl: bool = False) -> None:
    """Rows as a table, as one JSON array (`--json`: values nested as they are, times
    in ISO 8601), or as one JSON object a line (`--jsonl`)."""
    if as_jsonl:
        for row in rows:
            print(json.dumps(row, default=str, ensure_ascii=False))
        return
    if as_json:
        print(json.dumps(rows, indent=2, default=str, ensure_ascii=False))
        return
    if not rows:
        print("(nothing)")
        return
    columns = list(rows[0])
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [min(max(len(c), *(len(r[i]) for r in cells)), 60)
              for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in cells:
        print("  ".join(v[:w].ljust(w) for v, w in zip(row, widths, strict=True)))


def _cmd_status(args: argparse.Namespace) -> list[dict[str, Any]]:
    saver = _saver(args.db, read_only=True)
    _known_thread(saver, args.thread)
    threads = [args.thread] if args.thread else saver.thread_ids()
    return [{"thread": s.thread_id, "status": s.status, "reason": s.reason}
            for s in (thread_status(saver, t) for t in threads)]


def _cmd_effects(args: argparse.Namespace) -> list[dict[str, Any]]:
    statuses = [s.value for s in EffectStatus]
    if args.status is not None and args.status not in statuses:
        raise _Refused(f"--status {args.status!r} is not a status; one of {statuses}")
    saver = _saver(args.db, read_only=True)
    _known_thread(saver, args.thread)
    records = saver.effects(args.thread, args.status)
    return [{"thread": r.thread_id, "tool_call_id": r.tool_call_id, "tool": r.tool,
             "status": r.status.value, "attempts": r.attempts, "key": r.key,
             "receipt": r.receipt, "error": r.error, "updated_at": _iso(r.updated_at)}
            for r in records]


def _cmd_events(args: argparse.Namespace) -> list[dict[str, Any]]:
    saver = _saver(args.db, read_only=True)
    _known_thread(saver, args.thread)
    return [{"seq": e.seq, "at": _iso(e.at), "thread": e.thread_id, "key": e.key,
             "kind": e.kind, "data": e.data, "owner": e.owner, "token": e.fencing_token}
            for e in saver.events(args.thread)]


def _cmd_pending(args: argparse.Namespace) -> list[dict[str, Any]]:
    saver = _saver(args.db, read_only=True)
    _known_thread(saver, args.thread)
    pending = review(_graph(args.graph, saver), {"configurable": {"thread_id": args.thread}})
    return [{"tool_call_id": i.tool_call_id, "kind": i.kind, "tool": i.tool,
             "args": i.args, "attempts": i.attempts, "error": i.error,
             "description": i.description, "allowed": ",".join(i.allowed_decisions)}
            for i in pending.pending]


def _cmd_decide(args: argparse.Namespace) -> list[dict[str, Any]]:
    decisions = _decisions(args.decisions)
    saver = _saver(args.db)
    _known_thread(saver, args.thread)
    pending = review(_graph(args.graph, saver), {"configurable": {"thread_id": args.thread}})
    for tool_call_id, decision in decisions.items():
        pending._decide(tool_call_id, dict(decision), args.reviewer)
    pending.resume()
    status = thread_status(saver, args.thread)
    return [{"thread": status.thread_id, "status": status.status, "reason": status.reason}]


def _cmd_recover(args: argparse.Namespace) -> list[dict[str, Any]]:
    saver = _saver(args.db)
    outcomes = recover(_graph(args.graph, saver), saver, args.owner, args.limit, ttl=args.ttl)
    return [{"thread": o.thread_id, "outcome": o.outcome, "status": o.status,
             "error": o.error} for o in outcomes]


def _cmd_compensate(args: argparse.Namespace) -> list[dict[str, Any]]:
    receipt = None
    if args.receipt is not None:
        try:
            receipt = json.loads(args.receipt)
        except ValueError as exc:
            raise _Refused(f"--receipt is not JSON ({exc}); e.g. --receipt '{{\"id\": \"ch_1\"}}'"
                           ) from None
    saver = _saver(args.db)
    _known_thread(saver, args.thread)
    record = compensate(_graph(args.graph, saver), saver, args.thread, args.call,
                        receipt=receipt, reviewer=args.reviewer)
    return [{"thread": record.thread_id, "tool_call_id": record.tool_call_id,
             "tool": record.tool, "status": record.status.value, "error": record.error}]


def _cmd_cancel(args: argparse.Namespace) -> list[dict[str, Any]]:
    saver = _saver(args.db)
    _known_thread(saver, args.thread)
    report = cancel(_graph(args.graph, saver), saver, args.thread,
                    compensate=not args.no_compensate, owner=args.owner, ttl=args.ttl)
    if report.outcome == "held_elsewhere":
        raise _Refused(report.summary(), code=1)
    rows = [{"thread": report.thread_id, "tool_call_id": r.tool_call_id, "tool": r.tool,
             "outcome": outcome, "status": r.status.value, "error": r.error}
            for outcome, records in (("compensated", report.compensated),
                                     ("left in place", report.left_in_place),
                                     ("needs a human", report.needs_human),
                                     ("withdrawn", report.withdrawn))
            for r in records]
    return rows or [{"thread": report.thread_id, "tool_call_id": None, "tool": None,
                     "outcome": "no effects", "status": None, "error": None}]


def _cmd_audit(args: argparse.Namespace) -> Any:
    saver = _saver(args.db, read_only=True)
    _known_thread(saver, args.thread)
    return saver.audit(args.thread)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="graph-durable", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version",
                        version=f"graph-durable {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str, *, graph: bool = False, thread: str = "optional"
                ) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("--db", required=True,
                         help="SQLite file of the durable saver, or a postgresql:// URL")
        output = sub.add_mutually_exclusive_group()
        output.add_argument("--json", action="store_true",
                            help="print JSON (nested values, ISO 8601 times)")
        output.add_argument("--jsonl", action="store_true", help="print one JSON object a line")
        if thread != "none":
            sub.add_argument("--thread", required=thread == "required")
        if graph:
            sub.add_argument("--graph", required=True, help="module:attribute of the graph")
        return sub

    command("status", "status of one or every thread")
    command("effects", "effect ledger").add_argument("--status")
    command("events", "the append-only journal")
    command("pending", "decisions a thread waits for", graph=True, thread="required")
    decide = command("decide", "answer pending decisions and resume", graph=True,
                     thread="required")
    decide.add_argument("--decisions", required=True, help='{"tool_call_id": decision}')
    decide.add_argument("--reviewer")
    sweep = command("recover", "resume orphaned threads under leases", graph=True,
                    thread="none")
    sweep.add_argument("--owner", required=True)
    sweep.add_argument("--limit", type=int)
    sweep.add_argument("--ttl", type=float, default=30.0)
    undo = command("compensate", "undo one applied (or confirmed) effect", graph=True,
                   thread="required")
    undo.add_argument("--call", required=True, help="tool_call_id (or key) of the effect")
    undo.add_argument("--receipt", help="JSON: a human's word that an unknown effect happened")
    undo.add_argument("--reviewer")
    stop = command("cancel", "stop a thread for good, undoing its effects newest first",
                   graph=True, thread="required")
    stop.add_argument("--owner", required=True)
    stop.add_argument("--no-compensate", action="store_true",
                      help="leave applied effects in place")
    stop.add_argument("--ttl", type=float, default=30.0)
    command("audit", "what ran again in each run of a thread, and its effects",
            thread="required")
    return parser


_COMMANDS = {"status": _cmd_status, "effects": _cmd_effects, "events": _cmd_events,
             "pending": _cmd_pending, "decide": _cmd_decide, "recover": _cmd_recover,
             "compensate": _cmd_compensate, "cancel": _cmd_cancel, "audit": _cmd_audit}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `graph-durable` command.

    Exit codes: 0 done; 1 the command ran but found a problem (an unknown thread, a
    thread `recover` could not resume); 2 a bad input or a database that cannot be read,
    with one line on stderr and nothing written.
    """
    args = _parser().parse_args(argv)
    try:
        rows = _COMMANDS[args.command](args)
        if args.command == "audit":
            if args.json or args.jsonl:
                print(json.dumps(rows.to_dict(), indent=None if args.jsonl else 2))
            else:
                print(rows.summary())
            return 0
        _print(rows, args.json, args.jsonl)
    except (GraphDurableError, _Refused) as exc:
        print(f"graph-durable: {exc}", file=sys.stderr)
        return getattr(exc, "code", 2)
    except LeaseLost as exc:  # the thread was cancelled, or another worker took it
        print(f"graph-durable: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `| head` closed the pipe: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if args.command == "recover" and any(row["outcome"] == "error" for row in rows):
        return 1
    if args.command == "cancel" and any(row["outcome"] == "needs a human" for row in rows):
        return 1
    if args.command == "compensate" and rows[0]["status"] == "compensation_failed":
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
