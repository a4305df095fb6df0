"""What each engine reports of the settings its commits depend on, read on a saver's
connection and judged by `graph_durable.durability` (`saver.durability()`)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from typing import Any

from graph_durable.durability import DurabilityReport, postgres_durability, sqlite_durability

__all__ = ["POSTGRES_SETTINGS", "POSTGRES_STANDBYS", "filesystem_of", "postgres_report",
           "read_sqlite"]

POSTGRES_SETTINGS = (
    "SELECT current_setting('fsync'), current_setting('full_page_writes'), "
    "current_setting('synchronous_commit'), current_setting('synchronous_standby_names'), "
    "pg_is_in_recovery(), current_database(), current_setting('port')"
)
"""What the saver's own session sees: server, database, role and session settings all
applied, as they are for its commits."""
POSTGRES_STANDBYS = (
    "SELECT application_name, sync_state FROM pg_stat_replication ORDER BY application_name"
)


def postgres_report(settings: Sequence[Any],
                    standbys: Sequence[Sequence[Any]]) -> DurabilityReport:
    """The report from the rows of `POSTGRES_SETTINGS` and `POSTGRES_STANDBYS`."""
    fsync, pages, commit, names, in_recovery, database, port = settings
    return postgres_durability(
        f"{database} (port {port})",
        {"fsync": fsync, "full_page_writes": pages, "synchronous_commit": commit,
         "synchronous_standby_names": names},
        bool(in_recovery), [(str(name or "(unnamed)"), state) for name, state in standbys])


def filesystem_of(path: str, mounts: str = "/proc/self/mounts") -> str | None:
    """The type of the file system holding `path` (the longest mount point above it), or
    `None` where the mount table cannot be read."""
    try:
        with open(mounts, encoding="utf-8") as table:
            lines = table.read().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best: tuple[int, str] | None = None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > best[0]):
            best = (len(point), fields[2])
    return None if best is None else best[1]


def read_sqlite(conn: sqlite3.Connection) -> DurabilityReport:
    """The report on the database of `conn` (its main database), read on `conn`."""
    journal_mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    synchronous = int(conn.execute("PRAGMA synchronous").fetchone()[0])
    path = next((row[2] for row in conn.execute("PRAGMA database_list") if row[1] == "main"), "")
    return sqlite_durability(path or "", journal_mode, synchronous,
                             filesystem_of(path) if path else None)
