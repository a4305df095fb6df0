"""Setting up one new SQLite file from many connections at once.

LangGraph's `SqliteSaver.setup()` switches the file to WAL (`PRAGMA journal_mode=WAL` in
an `executescript`). While another connection sets the same file up, SQLite may answer
that switch, or a `CREATE TABLE`, with `database is locked` at once, without waiting out
the connection's busy timeout: two connections that each hold a shared lock and ask for
more would wait on each other forever, so SQLite refuses one of them instead of waiting.
Every other write of ours waits for the lock; `setup()` waits too, by trying again until
the connection's own busy timeout (`PRAGMA busy_timeout`, 5 s unless the application set
another) has passed. Setup is safe to repeat, so trying again writes nothing twice.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["busy_timeout", "is_locked", "aretry_locked", "retry_locked"]

T = TypeVar("T")

_FIRST_PAUSE = 0.002
_LONGEST_PAUSE = 0.05
_SHORTEST_WAIT = 1.0


def is_locked(exc: BaseException) -> bool:
    """Whether `exc` is SQLite refusing a lock another connection holds."""
    return isinstance(exc, sqlite3.OperationalError) and (
        "locked" in str(exc) or "busy" in str(exc))


def busy_timeout(conn: sqlite3.Connection) -> float:
    """How long, in seconds, `conn` waits for a lock (its `PRAGMA busy_timeout`)."""
    return float(conn.execute("PRAGMA busy_timeout").fetchone()[0]) / 1000.0


def retry_locked(setup: Callable[[], T], wait: float) -> T:
    """`setup()`, tried again while the database is locked, for `wait` seconds at least
    one; after that the last `database is locked` is raised as it was."""
    deadline = time.monotonic() + max(wait, _SHORTEST_WAIT)
    pause = _FIRST_PAUSE
    while True:
        try:
            return setup()
        except sqlite3.OperationalError as exc:
            if not is_locked(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, _LONGEST_PAUSE)


async def aretry_locked(setup: Callable[[], Awaitable[T]], wait: float) -> T:
    """`retry_locked` for an async `setup`."""
    deadline = time.monotonic() + max(wait, _SHORTEST_WAIT)
    pause = _FIRST_PAUSE
    while True:
        try:
            return await setup()
        except sqlite3.OperationalError as exc:
            if not is_locked(exc) or time.monotonic() + pause > deadline:
                raise
        await asyncio.sleep(pause)
        pause = min(pause * 2, _LONGEST_PAUSE)
