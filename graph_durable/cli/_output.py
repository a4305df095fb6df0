"""How a command's rows are printed: a rich table, JSON (`--json`) or JSON lines (`--jsonl`).

A table fits the terminal: long values wrap or end in an ellipsis, statuses are
coloured. Piped into another program it is plain: no colour, no box, one row a line
(values whole). JSON keeps values nested as they are and
writes times in ISO 8601 (UTC).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from typing import Any, Literal

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["Column", "Format", "at", "console", "emit", "emit_object"]

Format = Literal["table", "json", "jsonl"]

STATUS_STYLES = {
    # thread statuses
    "done": "green", "running": "cyan", "waiting": "yellow", "needs_human": "bold red",
    "orphaned": "magenta", "failed": "bold red", "cancelled": "dim", "damaged": "bold red",
    # effect statuses
    "applied": "green", "intent": "cyan", "in_flight": "yellow", "awaiting_approval": "yellow",
    "unknown": "bold red", "rejected": "dim", "skipped": "dim",
    "compensated": "blue", "compensation_failed": "bold red",
    "compensation_unknown": "bold red", "orphan": "bold red",
    # outcomes and kinds
    "resumed": "green", "reconciled": "green", "error": "bold red", "held_elsewhere": "yellow", "approval": "yellow",
    "needs a human": "bold red", "left in place": "dim",
}


@dataclass(frozen=True)
class Column:
    """One column of a table: the row field, its header, and how its cells behave."""

    field: str
    header: str | None = None
    kind: Literal["text", "id", "status", "time", "json", "number"] = "text"
    max_width: int | None = None
    optional: bool = False
    """Left out (right to left) when the table would not fit the terminal otherwise."""


def at(unix: float | None) -> datetime | None:
    """A Unix time as an aware UTC datetime (printed as ISO 8601 in JSON)."""
    return None if unix is None else datetime.fromtimestamp(unix, tz=timezone.utc)


def _terminal() -> bool:
    return sys.stdout.isatty()


def console(*, stderr: bool = False) -> Console:
    """A console on stdout (or stderr): coloured on a terminal, plain when piped."""
    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    width = None if tty else 100_000  # piped: whole values, one row a line
    return Console(file=stream, width=width, no_color=not tty or "NO_COLOR" in os.environ,
                   highlight=False, soft_wrap=not tty, emoji=False, markup=False)


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    return str(value)


def _text(value: Any, column: Column) -> Text:
    if value is None or value == ():
        return Text("")
    if isinstance(value, datetime):
        return Text(value.strftime("%Y-%m-%d %H:%M:%S"))
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, dict | list | tuple):
        value = json.dumps(value, default=_json_default, ensure_ascii=False)
    text = str(value)
    style = STATUS_STYLES.get(text, "") if column.kind == "status" else ""
    return Text(text, style=style)


def emit(rows: list[dict[str, Any]], fmt: Format, columns: list[Column], *,
         title: str | None = None, empty: str = "(nothing)") -> None:
    """Print `rows`: as a table of `columns`, or every field of each row as JSON."""
    if fmt == "jsonl":
        for row in rows:
            sys.stdout.write(json.dumps(row, default=_json_default, ensure_ascii=False) + "\n")
        return
    if fmt == "json":
        sys.stdout.write(json.dumps(rows, indent=2, default=_json_default,
                                    ensure_ascii=False) + "\n")
        return
    out = console()
    if not rows:
        out.print(empty)
        return
    tty = _terminal()
    if tty:
        columns = _fit(columns, rows, out.width)
    table = Table(box=box.SIMPLE_HEAD if tty else None, show_edge=False, pad_edge=False,
                  header_style="bold" if tty else "", title=title if tty else None,
                  title_justify="left", expand=False)
    for column in columns:
        wraps = column.kind == "text"  # sentences wrap; JSON and ids end in an ellipsis
        flexible = column.kind in ("text", "json")
        if not tty:
            width = {"max_width": None, "min_width": None}
        elif flexible:
            width = {"max_width": column.max_width or 36, "min_width": 12}
        else:  # ids, statuses, times and numbers keep their width; sentences give way
            width = {"max_width": column.max_width,
                     "min_width": min(_longest(column, rows), column.max_width or 24)}
        table.add_column(column.header or column.field, **width,
                         no_wrap=not wraps or not tty,
                         overflow="fold" if wraps and tty else "ellipsis",
                         justify="right" if column.kind == "number" else "left")
    for row in rows:
        table.add_row(*(_text(row.get(c.field), c) for c in columns))
    if title and not tty:
        out.print(title)
    out.print(table)


def _longest(column: Column, rows: list[dict[str, Any]]) -> int:
    return max([len(column.header or column.field)]
               + [len(_text(row.get(column.field), column).plain) for row in rows])


def _fit(columns: list[Column], rows: list[dict[str, Any]], width: int) -> list[Column]:
    """The columns a terminal of `width` shows whole: optional ones go, right first."""
    def need(column: Column) -> int:
        longest = _longest(column, rows)
        flexible = column.kind in ("text", "json")
        cap = column.max_width or (36 if flexible else None)
        floor = 12 if flexible else 0
        return max(floor, min(longest, cap) if cap else longest) + 2

    kept = list(columns)
    while sum(need(c) for c in kept) > width:
        optional = [i for i, c in enumerate(kept) if c.optional]
        if not optional:
            break
        del kept[optional[-1]]
    return kept


def emit_object(value: dict[str, Any], fmt: Format, lines: list[str]) -> None:
    """One object: as JSON, or as the `lines` a person reads."""
    if fmt in ("json", "jsonl"):
        sys.stdout.write(json.dumps(value, indent=None if fmt == "jsonl" else 2,
                                    default=_json_default, ensure_ascii=False) + "\n")
        return
    out = console()
    for line in lines:
        out.print(line)
