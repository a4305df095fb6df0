"""`graph-durable`: see which threads are stuck and why, and answer them, from a shell.

    graph-durable threads  --db agent.sqlite [--status needs_human] [--since 2h]
    graph-durable pending  --db agent.sqlite [--thread T]        # the inbox, every thread
    graph-durable show     T --db agent.sqlite                   # the thread's timeline
    graph-durable effects  --db agent.sqlite [--thread T] [--status unknown]
    graph-durable approve  T call_1 --db agent.sqlite --graph app.agent:graph
    graph-durable reject   T call_1 --message "wrong customer" --db ... --no-resume
    graph-durable edit     T call_1 --args '{"amount": 40}' --db ... --graph ...
    graph-durable resolve  T call_2 --applied --receipt '{"id": "m-7"}' --db ... --graph ...
    graph-durable resolve  T call_2 --retry | --skip [--message M]
    graph-durable recover  --db agent.sqlite --graph app.agent:graph --owner worker-7
    graph-durable check    --db agent.sqlite [--json]            # verify the database

Also `status`, `events`, `decide` (JSON decisions in bulk), `compensate`, `cancel`,
`audit`, `durability` and `stats` (the ledger's gauges); `graph-durable COMMAND --help`
tells more.

`--db` is a SQLite file or a `postgresql://` URL (`GRAPH_DURABLE_DB` by default). Read
commands open it read-only and never create or migrate it. `--graph module:attribute`
(`GRAPH_DURABLE_GRAPH` by default) names a compiled graph, a `StateGraph`, or a callable
that takes the saver and returns a compiled graph; answering a call resumes the thread
with it, or with `--no-resume` only journals the decision, and the thread's next resume
(`recover`) acts on it. With `LANGGRAPH_AES_KEY` set, the database is read with
LangGraph's `EncryptedSerializer` under that key. Every command prints a table (plain
when piped), `--json` (nested values, ISO 8601 times) or `--jsonl`.

Exit codes: 0 done; 1 the command ran and found a problem (an unknown thread, a thread
that could not be recovered, an effect a human must settle; `check`: damage found); 2 a
bad input or a database that cannot be used, with one line on stderr and nothing
written; 3 rows that cannot be read (`LedgerDamaged`): a listing passed them by and
showed their threads as `damaged`, or the command needed one and did nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["app", "main"]

from graph_durable.cli._commands import app


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `graph-durable` command; returns the exit code."""
    import typer

    from graph_durable.cli._open import Refused, where
    from graph_durable.errors import GraphDurableError, LeaseHeld, LeaseLost, LedgerDamaged

    command = typer.main.get_command(app)
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        code = command.main(args=args, prog_name="graph-durable", standalone_mode=False)
    except Refused as exc:
        return _fail(str(exc), exc.code)
    except LedgerDamaged as exc:  # a row the command needs cannot be read
        return _fail(str(exc).replace("\n", " "), 3)
    except (LeaseHeld, LeaseLost) as exc:  # another worker has the thread, or it was cancelled
        return _fail(str(exc).replace("\n", " "), 1)
    except GraphDurableError as exc:
        return _fail(str(exc).replace("\n", " "), 2)
    except BrokenPipeError:  # `| head` closed the pipe: stop quietly
        _quiet_stdout()
        return 0
    except Exception as exc:
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            # click's usage errors (typer's own copy of click, in newer releases)
            return _fail(_usage(exc), 2 if _is_usage(exc) else exc.exit_code or 2)
        if type(exc).__name__ == "Abort":
            return _fail("aborted", 130)
        # a database or driver error: one line, no traceback, no password
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        for arg in args:
            if "://" in arg:
                message = message.replace(arg, where(arg))
        return _fail(f"{type(exc).__name__}: {message}", 2)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()
    return code if isinstance(code, int) else 0


def _is_usage(exc: Exception) -> bool:
    return any(cls.__name__ == "UsageError" for cls in type(exc).__mro__)


def _usage(exc: Any) -> str:
    """A usage error in one line, naming the command's help."""
    ctx = getattr(exc, "ctx", None)
    name = getattr(ctx, "info_name", None)
    hint = f" (graph-durable {name} --help)" if name and name != "graph-durable" \
        else " (graph-durable --help)"
    return exc.format_message().replace("\n", " ") + (hint if _is_usage(exc) else "")


def _fail(message: str, code: int) -> int:
    print(f"graph-durable: {message}", file=sys.stderr)
    return code


def _quiet_stdout() -> None:
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
