"""The options and arguments the commands of `graph-durable` share, and the output format
they choose."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from graph_durable.cli._open import Refused
from graph_durable.cli._output import Format

__all__ = ["CallArg", "Db", "Graph", "Json", "Jsonl", "Limit", "NoResume", "Reviewer", "Since",
           "Thread", "ThreadArg", "output_format"]

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


def output_format(as_json: bool, as_jsonl: bool) -> Format:
    """The format `--json` / `--jsonl` choose (a table without either)."""
    if as_json and as_jsonl:
        raise Refused("--json is not allowed with --jsonl: choose one")
    return "json" if as_json else "jsonl" if as_jsonl else "table"
