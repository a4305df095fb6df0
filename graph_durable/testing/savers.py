"""Open the durable saver a test (or a child process of one) runs on, by backend name.

The same tests run on every durable saver: a test names its database (`db_path` for
SQLite, `conninfo` for PostgreSQL) and a backend, and gets the saver:

- `sqlite`: `DurableSqliteSaver` (or, from `aopen_saver`, `AsyncDurableSqliteSaver`);
- `postgres`: `DurablePostgresSaver` on one connection;
- `postgres-async`: `AsyncDurablePostgresSaver` on an `AsyncConnectionPool`. From
  `aopen_saver`, on the running event loop (for `ainvoke`); from `open_saver`, on an
  event loop of its own thread, as a sync program uses an async saver (every call then
  runs the saver's async code on that loop).

A `SaverSpec` (`{"backend": ..., "conninfo": ...}`) is JSON, so a child process rebuilds
the same saver; `None` means SQLite on the scenario's `db_path`.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Coroutine
from typing import Any, Literal, TypedDict, TypeVar

__all__ = ["BACKENDS", "SaverSpec", "aclose_saver", "aopen_saver", "close_saver",
           "open_saver"]

Backend = Literal["sqlite", "postgres", "postgres-async"]
BACKENDS: tuple[Backend, ...] = ("sqlite", "postgres", "postgres-async")
"""Every durable saver the shared tests run on."""

POOL_SIZE = 4
"""Connections of the `postgres-async` saver's pool (parallel tool calls share it)."""

T = TypeVar("T")


class SaverSpec(TypedDict, total=False):
    """Which saver to open: `backend` (default `sqlite`) and, for PostgreSQL, `conninfo`."""

    backend: Backend
    """One of `BACKENDS`."""
    conninfo: str
    """libpq connection string of the PostgreSQL database."""


class _LoopThread:
    """An event loop running forever in a daemon thread (one per process)."""

    _lock = threading.Lock()
    _current: _LoopThread | None = None

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True,
                         name="graph-durable-saver-loop").start()

    @classmethod
    def get(cls) -> _LoopThread:
        with cls._lock:
            if cls._current is None:
                cls._current = cls()
            return cls._current

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


def _backend(spec: SaverSpec | None) -> Backend:
    return (spec or {}).get("backend", "sqlite")


def _pg_connection(conninfo: str) -> Any:
    from psycopg import Connection
    from psycopg.rows import dict_row

    return Connection.connect(conninfo, autocommit=True, prepare_threshold=0,
                              row_factory=dict_row)


async def _pg_pool(conninfo: str) -> Any:
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    pool = AsyncConnectionPool(conninfo, min_size=1, max_size=POOL_SIZE, open=False,
                               kwargs={"autocommit": True, "prepare_threshold": 0,
                                       "row_factory": dict_row})
    await pool.open()
    return pool


async def _async_pg_saver(conninfo: str, **kwargs: Any) -> Any:
    from graph_durable.checkpointers.postgres import AsyncDurablePostgresSaver

    return AsyncDurablePostgresSaver(await _pg_pool(conninfo), **kwargs)


def open_saver(spec: SaverSpec | None, db_path: str, **kwargs: Any) -> Any:
    """The saver of `spec` for sync use (`graph.invoke`, `saver.lease`, `recover`);
    `kwargs` go to its constructor (`serde`, `flow_version`, ...)."""
    backend = _backend(spec)
    if backend == "sqlite":
        from graph_durable.checkpointers.sqlite import DurableSqliteSaver

        return DurableSqliteSaver(sqlite3.connect(db_path, check_same_thread=False),
                                  **kwargs)
    conninfo = spec["conninfo"]  # type: ignore[index]
    if backend == "postgres":
        from graph_durable.checkpointers.postgres import DurablePostgresSaver

        return DurablePostgresSaver(_pg_connection(conninfo), **kwargs)
    if backend == "postgres-async":
        return _LoopThread.get().run(_async_pg_saver(conninfo, **kwargs))
    raise ValueError(f"unknown saver backend {backend!r}; one of {BACKENDS}")


async def aopen_saver(spec: SaverSpec | None, db_path: str, **kwargs: Any) -> Any:
    """The saver of `spec` for `ainvoke`, on the running event loop (`postgres` is the
    sync saver, whose async methods run its sync ones)."""
    backend = _backend(spec)
    if backend == "sqlite":
        import aiosqlite

        from graph_durable.checkpointers.sqlite import AsyncDurableSqliteSaver

        return AsyncDurableSqliteSaver(await aiosqlite.connect(db_path), **kwargs)
    if backend == "postgres-async":
        return await _async_pg_saver(spec["conninfo"], **kwargs)  # type: ignore[index]
    return open_saver(spec, db_path, **kwargs)


def close_saver(saver: Any) -> None:
    """Close what `open_saver` opened for `saver` (its connection or pool)."""
    conn = saver.conn
    loop = getattr(saver, "loop", None)
    if loop is None:
        conn.close()
    elif loop.is_running() and not _loop_is_current(loop):
        asyncio.run_coroutine_threadsafe(conn.close(), loop).result()


async def aclose_saver(saver: Any) -> None:
    """Close what `aopen_saver` opened for `saver`."""
    result = saver.conn.close()
    if asyncio.iscoroutine(result):
        await result


def _loop_is_current(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether `loop` is the event loop running in this thread."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
