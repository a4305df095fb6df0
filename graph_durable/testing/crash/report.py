"""What a crash sweep reports: crash points, normalized snapshots, rows, the report.

`Snapshot` is what a finished run leaves behind, normalized so two runs compare:
effect keys (`gd-...`) and provider receipt ids are renamed by order of first
appearance, because keys hash task ids that LangGraph derives from time-based
checkpoint ids. `compare` words the differences; `CrashReport` renders them as a
terminal table (`str(report)`) or an HTML one (`_repr_html_`, for notebooks).
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

from graph_durable._display import esc, table, tone_of
from graph_durable.testing.faults import FaultPlan

__all__ = ["VERDICTS", "CrashPoint", "CrashReport", "CrashRow", "OutcomeGrid", "Progress",
           "Reference", "Snapshot", "compare", "normalize"]

_KEY = re.compile(r"gd-[0-9a-f]{8,}")


@dataclass(frozen=True, order=True)
class CrashPoint:
    """One place to crash: the `occurrence`-th time a process reaches `point` (for `tool`)."""

    point: str
    """Fault point name (see `graph_durable.testing.faults`)."""
    tool: str | None = None
    """Tool whose call reaches it; `None` for saver points and `after_decision`."""
    occurrence: int = 1
    """Counted within one process, as `FaultPlan` counts."""
    phase: int = 0
    """Pauses resolved before the process that reaches it (0: the first run)."""

    @property
    def label(self) -> str:
        """Short form, e.g. `after_effect(create_ticket)#1`, `p1:after_put#2`."""
        tool = f"({self.tool})" if self.tool else ""
        phase = f"p{self.phase}:" if self.phase else ""
        return f"{phase}{self.point}{tool}#{self.occurrence}"

    def plan(self) -> FaultPlan:
        """The fault plan that kills a process here."""
        return FaultPlan(self.point, tool=self.tool, occurrence=self.occurrence)


@dataclass(frozen=True)
class Snapshot:
    """What a finished run left behind, normalized so runs can be compared."""

    state: dict[str, Any]
    """Final state as `child.summarize` shows it, keys and receipt ids renamed."""
    ledger: dict[str, str]
    """Final ledger status per tool_call_id (`skipped/applied` after an edit)."""
    counts: dict[str, dict[str, dict[str, int]]]
    """Effects applied per provider, operation and key."""

    def totals(self) -> dict[str, int]:
        """Effects applied per provider."""
        return {name: sum(sum(keys.values()) for keys in ops.values())
                for name, ops in sorted(self.counts.items())}


@dataclass(frozen=True)
class Reference:
    """The fault-free run of a scenario: its outcome and every point it reached."""

    snapshot: Snapshot
    """What the run left behind."""
    points: tuple[CrashPoint, ...]
    """Every fault point it reached, in order, phase by phase."""
    pauses: tuple[str, ...]
    """Interrupt types the resolver answered."""
    duration: float
    """Wall time in seconds."""


@dataclass
class CrashRow:
    """One crash schedule run and compared with the fault-free run."""

    schedule: tuple[CrashPoint, ...]
    outcome: str
    """`ok`, `mismatch` (state, ledger or effects differ) or `error` (a run failed)."""
    effects: dict[str, int] = field(default_factory=dict)
    """Effects applied per provider."""
    duplicates: int = 0
    """Effects applied beyond what the fault-free run applied for the same key."""
    questions: list[Any] = field(default_factory=list)
    """Interrupt values the resolver answered, in order."""
    runs: int = 0
    """Child processes the schedule ran through (a pair's, up to its first crash, are
    its first point's: it resumes from a copy of the files they left)."""
    fired: int = 0
    """Crashes of the schedule that happened (a point may not be reached)."""
    duration: float = 0.0
    """Wall time in seconds."""
    diff: str = ""
    """Why the row is not ok, in words."""
    recovery: tuple[CrashPoint, ...] = ()
    """Points reached by the first process after the first crash (for pairs)."""
    audit: dict[str, int] = field(default_factory=dict)
    """What the resumes cost, from `saver.audit`: `models` (model calls paid again),
    `nodes` (node runs repeated), `replayed`, `reconciled` and `resent` effects."""

    @property
    def pauses(self) -> list[str]:
        """Types of the interrupts answered (`tool_approval`, `effect_unknown`), in order."""
        return [q.get("type", "?") if isinstance(q, dict) else "?" for q in self.questions]

    @property
    def verdict(self) -> str:
        """`duplicate` if an effect was applied more often than without a crash, else the
        outcome (`ok`, `mismatch`, `error`)."""
        return "duplicate" if self.duplicates else self.outcome

    @property
    def label(self) -> str:
        """The schedule, e.g. `after_intent(pay)#1 -> after_effect(pay)#1`."""
        return " -> ".join(p.label for p in self.schedule) or "(no crash)"


def _canonical_content(content: Any) -> Any:
    """JSON text in a message, re-encoded with sorted keys (else unchanged).

    A receipt given by a human is journaled as canonical JSON, so it comes back with
    sorted keys where the tool's own answer kept the provider's order.
    """
    if isinstance(content, str) and content[:1] in "{[":
        try:
            return json.dumps(json.loads(content), sort_keys=True, ensure_ascii=False)
        except ValueError:
            pass
    return content


def normalize(state: dict[str, Any], receipt_ids: Iterable[str]) -> dict[str, Any]:
    """Canonical JSON contents; keys and receipt ids renamed by first appearance.

    Renaming is consistent (`<key1>`, `<id1>`, ...), so two runs that used different
    keys for the same calls compare equal, while two calls sharing one key do not.
    """
    messages = [{**m, "content": _canonical_content(m.get("content"))}
                for m in state.get("messages") or []]
    text = json.dumps({**state, "messages": messages}, sort_keys=True)
    ids = sorted(set(receipt_ids), key=len, reverse=True)
    pattern = _KEY.pattern + "".join(
        f"|(?<![\\w-]){re.escape(i)}(?![\\w-])" for i in ids)
    names: dict[str, str] = {}

    def rename(match: re.Match[str]) -> str:
        token = match.group(0)
        if token not in names:
            kind = "key" if _KEY.fullmatch(token) else "id"
            names[token] = f"<{kind}{sum(n.startswith(f'<{kind}') for n in names.values()) + 1}>"
        return names[token]

    return json.loads(re.sub(pattern, rename, text))


def compare(reference: Snapshot, got: Snapshot) -> tuple[list[str], int]:
    """Differences in words, and the number of duplicate effects."""
    lines, duplicates = [], 0
    for name in sorted(set(reference.counts) | set(got.counts)):
        for op in sorted(set(reference.counts.get(name, {})) | set(got.counts.get(name, {}))):
            want = reference.counts.get(name, {}).get(op, {})
            have = got.counts.get(name, {}).get(op, {})
            allowed = max(want.values(), default=1)
            extra = {k: n for k, n in have.items() if n > allowed}
            duplicates += sum(n - allowed for n in extra.values())
            for key, n in extra.items():
                lines.append(f"DUPLICATE  {name}/{op}: key {key} applied {n} times "
                             f"(fault-free run: at most {allowed})")
            if sum(have.values()) != sum(want.values()):
                lines.append(f"effects    {name}/{op}: {sum(have.values())} applied, "
                             f"fault-free run applied {sum(want.values())}")
    for call in sorted(set(reference.ledger) | set(got.ledger)):
        if reference.ledger.get(call) != got.ledger.get(call):
            lines.append(f"ledger     {call}: {got.ledger.get(call)} "
                         f"(fault-free run: {reference.ledger.get(call)})")
    if reference.state != got.state:
        lines.append("state      final graph state differs:")
        lines.extend("  " + line for line in difflib.unified_diff(
            json.dumps(reference.state, indent=1).splitlines(),
            json.dumps(got.state, indent=1).splitlines(),
            "fault-free run", "this run", lineterm="", n=2))
    return lines, duplicates


@dataclass
class CrashReport:
    """Rows of a sweep; `str(report)` is a terminal table, `_repr_html_` a notebook one."""

    scenario: str
    reference: Reference
    rows: list[CrashRow]
    duration: float
    directory: str | None = None
    """Where the runs are kept (`None` once a passing sweep's temporary folder is gone)."""

    @property
    def ok(self) -> bool:
        """Every row matches the fault-free run."""
        return all(row.outcome == "ok" for row in self.rows)

    @property
    def duplicates(self) -> int:
        """Duplicate effects over all rows (0 is the guarantee)."""
        return sum(row.duplicates for row in self.rows)

    def failures(self) -> str:
        """Each row that is not ok, with its differences in words."""
        return "\n\n".join(f"{row.label}: {row.outcome}\n{row.diff}"
                           for row in self.rows if row.outcome != "ok")

    def summary(self) -> str:
        """One line: crash schedules run, outcomes, duplicates and the wall time."""
        sizes = [len(row.schedule) for row in self.rows]
        outcomes = {o: sum(r.outcome == o for r in self.rows) for o in ("ok", "mismatch", "error")}
        unreached = sum(row.fired < len(row.schedule) for row in self.rows)
        longer = sum(size > 2 for size in sizes)
        return (f"crash matrix {self.scenario}: {sizes.count(1)} points, {sizes.count(2)} pairs"
                + (f", {longer} longer schedules" if longer else "") + "; "
                + ", ".join(f"{n} {o}" for o, n in outcomes.items())
                + f"; {self.duplicates} duplicate effects"
                + f"; {sum(row.audit.get('models', 0) for row in self.rows)} model calls "
                  "paid again"
                + (f"; {unreached} scheduled crashes not reached" if unreached else "")
                + f"; {self.duration:.1f} s")

    def _cells(self) -> list[tuple[str, ...]]:
        return [(str(i), row.label, row.outcome,
                 " ".join(f"{name}:{n}" for name, n in sorted(row.effects.items())),
                 ",".join(p.removeprefix("effect_") for p in row.pauses) or "-",
                 f"{row.fired}/{len(row.schedule)}", str(row.runs),
                 " ".join(f"{name}:{n}" for name, n in row.audit.items() if n) or "-",
                 f"{row.duration:.1f}s")
                for i, row in enumerate(self.rows, 1)]

    _HEADER = ("#", "crash point(s)", "outcome", "effects", "pauses", "crashed", "runs",
               "ran again", "time")

    def render(self) -> str:
        """The table, then the differences of every row that is not ok."""
        rows = [self._HEADER, *self._cells()]
        widths = [max(len(row[c]) for row in rows) for c in range(len(self._HEADER))]
        lines = [self.summary(), *("  ".join(cell.ljust(w) for cell, w in zip(row, widths))
                                   .rstrip() for row in rows)]
        if not self.ok:
            lines += ["", self.failures()]
        return "\n".join(lines)

    __str__ = render

    def __repr__(self) -> str:
        return f"<CrashReport {self.summary()}>"

    def grid(self) -> OutcomeGrid:
        """How many crash schedules ended in each verdict, per fault point (a colour grid
        in notebooks)."""
        counts: dict[str, dict[str, int]] = {}
        for row in self.rows:
            first = row.schedule[0] if row.schedule else None
            where = (f"{first.point}({first.tool})" if first and first.tool
                     else first.point if first else "(no crash)")
            verdicts = counts.setdefault(where, dict.fromkeys(VERDICTS, 0))
            verdicts[row.verdict] += 1
        return OutcomeGrid(self.scenario, counts)

    def _repr_html_(self) -> str:
        rows = [tuple((c, tone_of(row.verdict)) if n == 2 else c for n, c in enumerate(cells))
                for row, cells in zip(self.rows, self._cells())]
        diffs = "".join(f"<pre>{esc(row.label)}: {esc(row.outcome)}\n{esc(row.diff)}</pre>"
                        for row in self.rows if row.outcome != "ok")
        return (f"<p>{esc(self.summary())}</p>" + self.grid()._repr_html_()
                + table(self._HEADER, rows) + diffs)


VERDICTS = ("ok", "duplicate", "mismatch", "error")
"""What a crash schedule can end in (`CrashRow.verdict`), best first."""


@dataclass(frozen=True)
class OutcomeGrid:
    """Crash schedules per fault point (the first crash of each) and verdict."""

    scenario: str
    counts: dict[str, dict[str, int]]
    """`{fault point: {verdict: schedules}}`, points in the order the run reached them."""

    def __str__(self) -> str:
        width = max((len(p) for p in self.counts), default=5)
        lines = [f"{'fault point':<{width}}  " + "  ".join(f"{v:>9}" for v in VERDICTS)]
        lines += [f"{point:<{width}}  " + "  ".join(f"{n[v]:>9}" for v in VERDICTS)
                  for point, n in self.counts.items()]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        rows = [(point, *((n[v], tone_of(v) if n[v] else None) for v in VERDICTS))
                for point, n in self.counts.items()]
        return table(("fault point", *VERDICTS), rows,
                     caption=f"crash schedules of {self.scenario} by first fault point")


class Progress:
    """A text progress bar on stderr (redrawn in place)."""

    def __init__(self, total: int, enabled: bool, stream: TextIO | None = None) -> None:
        self.total, self.done, self.bad = total, 0, 0
        self.enabled = enabled
        self.stream = stream or sys.stderr

    def step(self, row: CrashRow) -> None:
        """Count one finished row and redraw."""
        self.done += 1
        self.bad += row.outcome != "ok"
        if self.enabled:
            filled = 30 * self.done // max(self.total, 1)
            self.stream.write(f"\rcrash matrix [{'#' * filled}{'.' * (30 - filled)}] "
                              f"{self.done}/{self.total} ({self.bad} not ok) "
                              f"{row.label[:48]:<48}")
            self.stream.flush()

    def close(self) -> None:
        """End the bar's line."""
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
