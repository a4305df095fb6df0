"""The aiosqlite internals `AsyncDurableSqliteSaver` touches, in one place.

aiosqlite runs every call on one worker thread, which owns the `sqlite3` connection:
each statement, fetch, commit or cursor is a round trip (a queue put, the worker wakes,
a callback wakes the event loop), so a transaction of ten statements costs ten. Its
public API has no way to run a function of ours on that thread, which would make a
whole transaction one round trip. Two internals do:

- `Connection._execute(fn, *args)`: queue a callable for the worker thread and await
  its result (aiosqlite's own methods are built on it);
- `Connection._conn`: the `sqlite3.Connection`, touched only from the worker thread.

Both are pinned by `tests/checkpointers/test_aiosqlite_internals.py`, which fails first,
by name, when a release moves one.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

import aiosqlite

__all__ = ["on_connection_thread"]

T = TypeVar("T")


async def on_connection_thread(
    conn: aiosqlite.Connection, fn: Callable[..., T], *args: Any
) -> T:
    """`fn(sqlite3_connection, *args)`, run on `conn`'s worker thread: one round trip."""
    return await conn._execute(_call, conn, fn, args)  # type: ignore[no-any-return]


def _call(conn: aiosqlite.Connection, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    raw: sqlite3.Connection = conn._conn
    return fn(raw, *args)
