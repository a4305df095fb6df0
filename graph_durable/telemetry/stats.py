"""`LedgerStats`: the gauges a monitor alerts on, read from the ledger (`saver.stats()`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from graph_durable.ledger import EffectStatus

__all__ = ["LedgerStats", "stats_of"]


@dataclass(frozen=True)
class LedgerStats:
    """How the ledger stands: effects by status, the questions waiting for a person, and
    the orphans no task will run again. Read at one moment (`read_at`)."""

    effects: dict[str, int]
    """Effects by status (every `EffectStatus`, 0 included)."""
    questions_waiting: int
    """Calls the guard asked a person about (an approval, an outcome `unknown`) that no
    decision has answered yet."""
    oldest_question_at: float | None
    """Unix time the oldest of those was asked (`None`: none waits)."""
    read_at: float
    """Unix time of the read."""
    orphans: int | None = None
    """Open effects no pending task will run again (`None`: not counted; the saver's own
    `stats()` reads the ledger only, `ledger_stats(saver)` counts them from the
    checkpoints too, see `graph_durable.operators.orphans`)."""
    threads: int = field(default=0)
    """Threads with at least one effect."""

    @property
    def in_flight(self) -> int:
        """Effects sent, or about to be, whose outcome is not recorded yet."""
        return self.effects.get(EffectStatus.IN_FLIGHT.value, 0)

    @property
    def unknown(self) -> int:
        """Effects whose outcome is unknown: each is a duty to reconcile."""
        return self.effects.get(EffectStatus.UNKNOWN.value, 0)

    @property
    def oldest_question_age(self) -> float | None:
        """Seconds the oldest waiting question had waited when read (`None`: none)."""
        if self.oldest_question_at is None:
            return None
        return max(0.0, self.read_at - self.oldest_question_at)

    def to_dict(self) -> dict[str, Any]:
        """The stats as JSON-ready values (times stay Unix seconds)."""
        return {"effects": dict(self.effects), "in_flight": self.in_flight,
                "unknown": self.unknown, "questions_waiting": self.questions_waiting,
                "oldest_question_at": self.oldest_question_at,
                "oldest_question_age": self.oldest_question_age, "orphans": self.orphans,
                "threads": self.threads, "read_at": self.read_at}

    def summary(self) -> str:
        """The stats as lines of text."""
        age = self.oldest_question_age
        lines = [
            f"effects: {sum(self.effects.values())} in {self.threads} thread(s)",
            *(f"  {status}: {count}" for status, count in self.effects.items() if count),
            f"in flight: {self.in_flight}",
            f"unknown: {self.unknown}",
            f"questions waiting: {self.questions_waiting}"
            + (f" (oldest {age:.0f} s)" if age is not None else ""),
            "orphans: " + ("not counted" if self.orphans is None else str(self.orphans)),
        ]
        return "\n".join(lines)


def stats_of(rows_by_status: list[tuple[Any, ...]], questions: list[tuple[Any, ...]],
             threads: list[tuple[Any, ...]], read_at: float) -> LedgerStats:
    """`LedgerStats` from the rows of the savers' three stats queries."""
    effects = {status.value: 0 for status in EffectStatus}
    for status, count in rows_by_status:
        effects[str(status)] = int(count)
    waiting, oldest = questions[0] if questions else (0, None)
    return LedgerStats(effects=effects, questions_waiting=int(waiting or 0),
                       oldest_question_at=None if oldest is None else float(oldest),
                       read_at=read_at, threads=int(threads[0][0]) if threads else 0)
