"""`graph-durable check`: the database verifies itself (read-only) and names any damage."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from graph_durable.cli._open import Refused, open_saver, where
from graph_durable.cli._options import Db, Json
from graph_durable.cli._output import Column, emit, emit_object

__all__ = ["COMMANDS", "check"]

Url = Annotated[Optional[str], typer.Option(  # noqa: UP007 - typer reads the annotation
    "--url", show_default=False, help="postgresql:// URL of the database (or use --db)")]
Full = Annotated[bool, typer.Option(
    "--full", help="SQLite: PRAGMA integrity_check instead of the faster quick_check")]


def check(db: Db = "", url: Url = None, full: Full = False, as_json: Json = False) -> int:
    """Verify the database: the engine's own integrity check, every ledger row and each
    thread's latest checkpoint decoded, and the ledger's invariants. Reads only and
    repairs nothing; exit 0 when clean, 1 when anything is damaged."""
    if url and db and url != db:
        raise Refused("give the database once: --db FILE or --url postgresql://...")
    target = url or db
    if url and not url.startswith(("postgresql://", "postgres://")):
        raise Refused(f"--url {where(url)!r} is not a postgresql:// URL; a SQLite file "
                      "goes with --db")
    report = open_saver(target, read_only=True).check(full=full)
    if as_json:
        emit_object({"database": where(target), **report.to_dict()}, "json", [])
        return 0 if report.ok else 1
    rows = ", ".join(f"{table} {count}" for table, count in report.rows.items())
    verdict = ("no damage found" if report.ok else
               f"{len(report.damage)} finding(s), threads {report.threads or '(none named)'}")
    emit_object({}, "table", [
        f"{where(target)}: {report.engine}, {report.engine_check}; schema "
        f"{report.schema[0]} (this release knows up to {report.schema[1]})",
        f"read: {rows} in {report.seconds:.2f} s",
        f"{verdict}",
    ])
    if not report.ok:
        emit([{**d.to_dict(), "row": d.key} for d in report.damage], "table",
             [Column("kind", kind="status"), Column("thread_id", "thread", kind="id"),
              Column("table", kind="id"), Column("row", kind="id", max_width=24),
              Column("column", kind="id"), Column("problem")],
             title="damage")
        emit_object({}, "table", [
            "Restore the damaged rows from a backup (or run the release that wrote them); "
            "until then runs of those threads raise LedgerDamaged and send nothing, and "
            "the other threads run as before."])
    return 0 if report.ok else 1


COMMANDS = (check,)
