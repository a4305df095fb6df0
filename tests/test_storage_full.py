"""A full disk is the library's error, never a duplicate: the agent's SQLite database
lives on a real tmpfs the test mounts (as root; skipped otherwise, CI runs as root). A
worker is frozen (SIGSTOP) at a write point of the guard, the file system is filled,
the worker goes on (SIGCONT) and its next write fails: with `StorageFull` naming the
thread, the call and whether anything was sent. Space is freed, a new process resumes
the thread, and each effect exists once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from graph_durable import DurableSqliteSaver
from graph_durable.testing import FakeProvider, FaultPlan
from graph_durable.testing.crash.child import run_child, start_child

pytestmark = pytest.mark.crash

TICKET = "graph_durable.demo.ticket:build_ticket_agent"


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 6 MB tmpfs mounted for this test (root only), unmounted after it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _fill(disk: Path) -> Path:
    """Fill `disk` to its last byte; the file that holds the space."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for chunk in (1 << 16, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


def _stopped(pid: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, "the worker never reached the write point"
        time.sleep(0.02)


def _ledger(db: Path) -> dict[str, str]:
    with DurableSqliteSaver.from_conn_string(str(db)) as saver:
        return {r.tool: r.status.value for r in saver.effects("t")}


def _failed_when_full(disk: Path, kwargs: dict[str, Any], point: FaultPlan, **options: Any
                      ) -> str:
    """Run the agent until `point`, fill the disk, let it go on; its error output."""
    child = start_child(TICKET, kwargs, thread_id="t", fault=point, **options)
    _stopped(child.pid)
    filler = _fill(disk)
    os.kill(child.pid, signal.SIGCONT)
    with pytest.raises(RuntimeError) as failed:
        child.wait()
    filler.unlink()
    return str(failed.value)


@pytest.mark.parametrize("mode", ["blind", "dedupe"])
def test_a_full_disk_before_the_claim_sends_nothing(
    tmp_path: Path, disk: Path, mode: str
) -> None:
    kwargs = {"db_path": str(disk / "agent.sqlite"), "provider_dir": str(tmp_path),
              "ticket_mode": mode, "email_mode": "dedupe"}
    tickets = FakeProvider(str(tmp_path / "tickets.sqlite"), mode)
    error = _failed_when_full(
        disk, kwargs, FaultPlan("before_intent", tool="create_ticket", action="stop"))
    assert "StorageFull" in error and "thread 't'" in error and "create_ticket" in error
    assert "Nothing was sent" in error
    assert tickets.count() == 0

    resumed = run_child(TICKET, kwargs, thread_id="t", action="resume")
    assert resumed.done, resumed.summary
    assert tickets.count() == 1


def test_a_full_disk_after_a_blind_call_is_sent_says_so_and_pauses_on_resume(
    tmp_path: Path, disk: Path
) -> None:
    kwargs = {"db_path": str(disk / "agent.sqlite"), "provider_dir": str(tmp_path),
              "ticket_mode": "blind", "email_mode": "dedupe"}
    tickets = FakeProvider(str(tmp_path / "tickets.sqlite"), "blind")
    error = _failed_when_full(
        disk, kwargs, FaultPlan("after_effect", tool="create_ticket", action="stop"))
    assert "StorageFull" in error and "create_ticket" in error
    assert "was sent" in error and "receipt is not recorded" in error
    assert tickets.count() == 1

    resumed = run_child(TICKET, kwargs, thread_id="t", action="resume")
    [question] = resumed.interrupts  # blind: a person says whether it happened
    assert question["type"] == "effect_unknown" and tickets.count() == 1


def test_a_full_disk_at_the_steps_checkpoint_write_reconciles_on_resume(
    tmp_path: Path, disk: Path
) -> None:
    kwargs = {"db_path": str(disk / "agent.sqlite"), "provider_dir": str(tmp_path),
              "ticket_mode": "lookup", "email_mode": "dedupe"}
    tickets = FakeProvider(str(tmp_path / "tickets.sqlite"), "lookup")
    error = _failed_when_full(disk, kwargs, FaultPlan("before_put_writes", occurrence=3,
                                                      action="stop"))
    assert "StorageFull" in error and "thread 't'" in error
    assert tickets.count() == 1
    assert _ledger(disk / "agent.sqlite")["create_ticket"] == "in_flight"

    resumed = run_child(TICKET, kwargs, thread_id="t", action="resume")
    assert resumed.done, resumed.summary
    assert tickets.count() == 1 and _ledger(disk / "agent.sqlite")["create_ticket"] == "applied"
