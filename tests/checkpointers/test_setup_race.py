"""Many savers set up one new SQLite file at the same moment, as a web server's threads
and worker processes do on first start: every one of them succeeds.

LangGraph's `SqliteSaver.setup()` switches the file to WAL, and SQLite refuses that
switch (`database is locked`) at once, without waiting, when another connection is
setting the file up too (`graph_durable.checkpointers.sqlite._locked`). Each round here
starts eight threads of this process and eight other processes on a file that does not
exist yet, all released together.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from graph_durable import AsyncDurableSqliteSaver, DurableSqliteSaver

ROOT = Path(__file__).resolve().parents[2]
THREADS = 8
PROCESSES = 8

# A process that sets up the file named on each line of its input the way this module
# does (`_setup_here`, with the flavour named on the command line), and answers each
# line with the error it got ("" if none).
WORKER = """
import sys
from tests.checkpointers.test_setup_race import _setup_here

print("ready", flush=True)
for line in sys.stdin:
    try:
        _setup_here(line.strip(), sys.argv[1])
        print("", flush=True)
    except Exception as exc:
        print(repr(exc).replace(chr(10), " "), flush=True)
"""


def _setup_here(path: str, flavour: str) -> None:
    if flavour == "async":
        async def asetup() -> None:
            import aiosqlite

            async with aiosqlite.connect(path) as conn:
                await AsyncDurableSqliteSaver(conn).setup()

        asyncio.run(asetup())
        return
    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        DurableSqliteSaver(conn).setup()
    finally:
        conn.close()


def _rounds(tmp_path: Path, rounds: int, flavour: str) -> list[str]:
    """Run `rounds` rounds; every error any setup raised, with its round."""
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, flavour], text=True, cwd=ROOT,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
               for _ in range(PROCESSES)]
    errors: list[str] = []
    try:
        for worker in workers:
            assert worker.stdout is not None and worker.stdout.readline() == "ready\n"
        for n in range(rounds):
            path = str(tmp_path / f"new-{n}.sqlite")
            go = threading.Barrier(THREADS)

            def one(go: threading.Barrier = go, path: str = path) -> None:
                go.wait(timeout=30)
                try:
                    _setup_here(path, flavour)
                except Exception as exc:  # noqa: BLE001 - collected and asserted below
                    errors.append(f"round {n}, thread: {exc!r}")

            threads = [threading.Thread(target=one) for _ in range(THREADS)]
            for thread in threads:
                thread.start()
            for worker in workers:
                assert worker.stdin is not None
                worker.stdin.write(path + "\n")
                worker.stdin.flush()
            for thread in threads:
                thread.join(timeout=60)
            for worker in workers:
                assert worker.stdout is not None
                answer = worker.stdout.readline().strip()
                if answer:
                    errors.append(f"round {n}, process: {answer}")
            with sqlite3.connect(path) as check:  # the file was set up, once, whole
                assert check.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
                tables = {row[0] for row in check.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table'")}
                assert {"checkpoints", "writes", "effects", "effect_events"} <= tables
    finally:
        for worker in workers:
            if worker.stdin is not None:
                worker.stdin.close()
        for worker in workers:
            worker.wait(timeout=60)
    return errors


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_sixteen_savers_set_up_one_new_file_at_once(tmp_path: Path, flavour: str) -> None:
    assert _rounds(tmp_path, 20, flavour) == []


@pytest.mark.sweep
def test_two_hundred_rounds_of_sixteen_savers_setting_up_one_new_file(tmp_path: Path) -> None:
    assert _rounds(tmp_path, 200, "sync") == []
