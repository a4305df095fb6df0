"""The aiosqlite internals `AsyncDurableSqliteSaver` touches, pinned: a release that moves
one fails here first, by name (they are named, with why, in
`graph_durable/checkpointers/sqlite/_aiosqlite.py`)."""

import sqlite3
import threading
from pathlib import Path

import aiosqlite

from graph_durable.checkpointers.sqlite._aiosqlite import on_connection_thread


def test_connection_has_the_internals_the_saver_uses() -> None:
    assert callable(getattr(aiosqlite.Connection, "_execute", None))
    assert isinstance(getattr(aiosqlite.Connection, "_conn", None), property)


async def test_a_function_runs_on_the_connection_thread_in_one_round_trip(
    tmp_path: Path,
) -> None:
    async with aiosqlite.connect(tmp_path / "a.sqlite") as conn:
        seen: dict[str, object] = {}
        puts = 0
        queue = conn._tx

        class Counting:
            def put_nowait(self, item: object) -> None:
                nonlocal puts
                puts += 1
                queue.put_nowait(item)

        def body(raw: sqlite3.Connection, value: int) -> int:
            seen["thread"] = threading.current_thread()
            seen["raw"] = raw
            raw.execute("CREATE TABLE t (x INTEGER)")
            raw.execute("INSERT INTO t VALUES (?)", (value,))
            raw.commit()
            return raw.execute("SELECT x FROM t").fetchone()[0]

        conn._tx = Counting()  # type: ignore[assignment]
        try:
            assert await on_connection_thread(conn, body, 7) == 7
        finally:
            conn._tx = queue
        assert puts == 1
        assert seen["thread"] is conn._thread
        assert isinstance(seen["raw"], sqlite3.Connection)
        async with conn.execute("SELECT x FROM t") as cur:
            assert await cur.fetchone() == (7,)
