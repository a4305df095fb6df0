"""HTML for notebooks: escaped cells, status tones that read in light and dark themes.

Every value that reaches HTML goes through `esc`, so a tool argument, a receipt or an
error holding markup is shown as text, never run. Colours are translucent backgrounds
over the theme's own text colour (nothing sets a text colour or an opaque background),
so a table reads the same on a white page and on a dark one. Styles are inline: viewers
that show committed notebooks (GitHub, nbviewer) drop `<style>` blocks.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

__all__ = ["TONES", "args_diff", "badge", "esc", "iso", "json_text", "table", "tone_of"]

TONES = {
    "good": "rgba(46,160,67,.2)",
    "warn": "rgba(210,153,34,.24)",
    "bad": "rgba(248,81,73,.26)",
    "quiet": "rgba(128,128,128,.16)",
}
"""Translucent backgrounds by meaning: done, waits for someone, went wrong, neutral."""

_TONE_OF = {
    "applied": "good", "ok": "good", "done": "good", "compensated": "good",
    "awaiting_approval": "warn", "approval": "warn", "in_flight": "warn", "waiting": "warn",
    "unknown": "bad", "needs_human": "bad", "failed": "bad", "error": "bad",
    "mismatch": "warn", "duplicate": "bad", "compensation_failed": "bad",
    "compensation_unknown": "bad", "orphan": "bad",
    "rejected": "quiet", "skipped": "quiet", "cancelled": "quiet", "orphaned": "warn",
}

_BORDER = "1px solid rgba(128,128,128,.35)"
_CELL = f"border: {_BORDER}; padding: 1px 6px; text-align: left"


def esc(value: Any) -> str:
    """`value` as HTML text (quotes escaped too, so it is safe in attributes)."""
    return html.escape(value if isinstance(value, str) else str(value), quote=True)


def tone_of(status: Any) -> str | None:
    """The tone of a status or outcome name (`applied` -> `good`), if it has one."""
    return _TONE_OF.get(str(getattr(status, "value", status)))


def json_text(value: Any) -> str:
    """Compact JSON of `value` for a cell (not escaped yet)."""
    return json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)


def iso(at: float | None) -> str:
    """A Unix time as ISO 8601 in UTC, to the second; `-` for none."""
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def badge(text: Any, tone: str | None = None) -> str:
    """A small label, with the background of `tone` (default: `tone_of(text)`)."""
    background = TONES.get(tone or tone_of(text) or "quiet", TONES["quiet"])
    return (f'<span style="background: {background}; border-radius: 3px; '
            f'padding: 0 4px">{esc(text)}</span>')


def _cell(value: Any, tag: str) -> str:
    """A cell; a `(value, tone)` pair gets the tone's background."""
    tone = None
    if isinstance(value, tuple) and len(value) == 2:
        value, tone = value
    style = _CELL + (f"; background: {TONES[tone]}" if tone in TONES else "")
    return f'<{tag} style="{style}">{esc(value)}</{tag}>'


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], *, caption: str = "") -> str:
    """An HTML table; each cell is a value or a `(value, tone)` pair, all escaped."""
    head = "".join(_cell(h, "th") for h in header)
    body = "".join("<tr>" + "".join(_cell(c, "td") for c in row) + "</tr>" for row in rows)
    cap = f'<caption style="text-align: left">{esc(caption)}</caption>' if caption else ""
    return (f'<table style="border-collapse: collapse; margin: 4px 0">{cap}'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def args_diff(before: Mapping[str, Any], after: Mapping[str, Any]
              ) -> list[tuple[str, Any, Any]]:
    """`(name, old, new)` for each argument an edit changed, added (old `None`) or
    removed (new `None`), in the order of the call's own arguments."""
    names = [*before, *(n for n in after if n not in before)]
    missing = object()
    changed = []
    for name in names:
        old, new = before.get(name, missing), after.get(name, missing)
        if old != new:
            changed.append((name, None if old is missing else old,
                            None if new is missing else new))
    return changed
