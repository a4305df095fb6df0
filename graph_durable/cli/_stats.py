"""`graph-durable stats`: the ledger's gauges, for a cron job or a shell (read-only)."""

from __future__ import annotations

from graph_durable.cli._open import open_saver
from graph_durable.cli._options import Db, Json
from graph_durable.cli._output import at, emit_object
from graph_durable.operators.stats import ledger_stats

__all__ = ["COMMANDS", "stats"]


def stats(db: Db = "", as_json: Json = False) -> int:
    """Effects by status, the questions waiting for a person and the age of the oldest,
    and the orphans: what the OpenTelemetry gauges export (`register_gauges`). Exit 1
    when an effect's outcome is unknown or an effect is orphaned (a person must settle
    it). Reads only."""
    report = ledger_stats(open_saver(db, read_only=True))
    data = report.to_dict()
    data.update(oldest_question_at=at(report.oldest_question_at), read_at=at(report.read_at))
    emit_object(data, "json" if as_json else "table", report.summary().splitlines())
    return 1 if report.unknown or report.orphans else 0


COMMANDS = (stats,)
