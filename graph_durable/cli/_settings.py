"""`graph-durable durability`: the settings the database's commits depend on (read-only)."""

from __future__ import annotations

from graph_durable.cli._open import open_saver
from graph_durable.cli._options import Db, Json
from graph_durable.cli._output import emit_object

__all__ = ["COMMANDS", "durability"]


def durability(db: Db = "", as_json: Json = False) -> int:
    """The settings the database's commits depend on, and what each risks (a failover
    to an asynchronous standby, fsync off, a network file system...); exit 1 when one is
    at risk. Reads only."""
    report = open_saver(db, read_only=True).durability()
    emit_object(report.to_dict(), "json" if as_json else "table", report.summary().splitlines())
    return 0 if report.ok else 1


COMMANDS = (durability,)
