"""What a crash sweep reads between two processes: it looks, and leaves the files alone.

After a SIGKILL the sweep decides whether the next process starts the thread again or
resumes it, and after the last process it reads the ledger and the audit. The next
process (or a pair's copy of the files) must find the database exactly as the killed
one left it: the reads neither create, migrate, checkpoint nor write it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from graph_durable.testing.crash.child import run_child
from graph_durable.testing.crash.matrix import (
    CrashPoint,
    _case,
    _next_after_crash,
    default_resolver,
)
from graph_durable.testing.crash.reads import read_only, resume_costs, snapshot_of
from graph_durable.testing.faults import FaultPlan

pytestmark = pytest.mark.crash

TICKET = "graph_durable.demo.ticket:build_ticket_agent"


def files(folder: Path) -> dict[str, str]:
    """Digest of every file, but the `-shm` wal-index: shared memory that every reader
    marks its reads in, and that SQLite rebuilds from the log when it is missing."""
    return {path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*"))
            if path.is_file() and not path.name.endswith("-shm")}


def test_reads_after_a_kill_leave_the_files_as_the_killed_process_left_them(
        tmp_path: Path) -> None:
    case = _case(TICKET, {}, str(tmp_path), "t", default_resolver, 60.0, 12)
    # Killed once the first tool call's intent is durable: checkpoints and an in-flight
    # effect sit in the write-ahead log the killed process could not fold back.
    crash = CrashPoint("after_intent", "create_ticket")
    killed = run_child(TICKET, case.kwargs, thread_id="t", fault=crash.plan())
    assert killed.killed
    before = files(tmp_path)
    assert "agent.sqlite-wal" in before

    assert _next_after_crash(case) == "resume"
    with read_only(case.kwargs) as saver:
        snapshot = snapshot_of(case.kwargs, "t", {}, saver)
        costs = resume_costs(case.kwargs, "t", saver)
    assert snapshot.ledger == {"call_ticket": "in_flight"}
    assert costs == {"models": 0, "nodes": 0, "replayed": 0, "reconciled": 0, "resent": 0}
    assert files(tmp_path) == before


def test_a_crash_before_any_database_starts_again_and_creates_nothing(
        tmp_path: Path) -> None:
    case = _case(TICKET, {}, str(tmp_path), "t", default_resolver, 60.0, 12)
    assert _next_after_crash(case) == "start"
    assert resume_costs(case.kwargs, "t", None) == {}
    assert not Path(case.kwargs["db_path"]).exists()


def test_a_thread_killed_before_its_input_checkpoint_starts_again(tmp_path: Path) -> None:
    case = _case(TICKET, {}, str(tmp_path), "t", default_resolver, 60.0, 12)
    killed = run_child(TICKET, case.kwargs, thread_id="t", fault=FaultPlan("before_put"))
    assert killed.killed
    before = files(tmp_path)
    assert _next_after_crash(case) == "start"
    assert files(tmp_path) == before
