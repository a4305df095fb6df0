"""A full disk is the library's error, never a duplicate: the agent's SQLite database
lives on a real tmpfs the test mounts (as root; skipped otherwise, CI runs as root). A
worker is frozen (SIGSTOP) at a write point of the guard, the file system is filled,
the worker goes on (SIGCONT) and its next write fails with `StorageFull` naming the
thread. Which write meets the full disk first is not fixed: LangGraph saves a task's
writes on a background thread, which may come before the guard's own; when the error is
the guard's, it names the call and says whether it was sent. Space is freed, a new
process resumes the thread, and each effect exists once.
"""

from __future__ import annotations

import os
import signal
import sqlite3
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

AGENT = "graph_durable.testing.scenarios.effects:build_effects_agent"
# One call a turn, so that the write that meets the full disk is always the same one.
TURNS = [[["ticket", "t1"]], [["email", "e1"]]]


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


def _kwargs(tmp_path: Path, disk: Path, mode: str) -> dict[str, Any]:
    return {"db_path": str(disk / "agent.sqlite"), "provider_dir": str(tmp_path),
            "turns": TURNS, "modes": {"ticket": mode, "email": "dedupe"}}


def _ledger(db: Path) -> dict[str, str]:
    with DurableSqliteSaver.from_conn_string(str(db)) as saver:
        return {r.tool: r.status.value for r in saver.effects("t")}


def _failed_when_full(disk: Path, kwargs: dict[str, Any], point: FaultPlan, **options: Any
                      ) -> str:
    """Run the agent until `point`, fill the disk, let it go on; its error output."""
    child = start_child(AGENT, kwargs, thread_id="t", fault=point, **options)
    _stopped(child.pid)
    filler = _fill(disk)
    os.kill(child.pid, signal.SIGCONT)
    with pytest.raises(RuntimeError) as failed:
        child.wait()
    filler.unlink()
    return str(failed.value)


@pytest.mark.parametrize("mode", ["blind", "dedupe"])
def test_a_full_disk_at_the_claim_never_sends_twice(tmp_path: Path, disk: Path,
                                                    mode: str) -> None:
    kwargs = _kwargs(tmp_path, disk, mode)
    tickets = FakeProvider(str(tmp_path / "ticket.sqlite"), mode)
    error = _failed_when_full(
        disk, kwargs, FaultPlan("before_intent", tool="ticket", action="stop"))
    assert "StorageFull" in error and "thread 't'" in error
    # Usually the claim meets the full disk: nothing is sent. A write that failed
    # before it may have left log space the claim then reuses: the call is sent, and
    # its receipt meets the full disk. Either way the error says which.
    sent = tickets.count()
    assert sent in (0, 1)
    if "(ticket)" in error:
        assert ("Nothing was sent" in error) == (sent == 0), error

    _resumes_once(kwargs, tickets, mode)


def _resumes_once(kwargs: dict[str, Any], tickets: FakeProvider, mode: str) -> None:
    """Resume after space was freed: the ticket exists once. A blind one whose intent the
    ledger holds without a receipt is asked about; anything else finishes."""
    recorded = _ledger(Path(kwargs["db_path"])).get("ticket")
    resumed = run_child(AGENT, kwargs, thread_id="t", action="resume")
    if recorded == "in_flight" and mode == "blind":
        [question] = resumed.interrupts  # a person says whether it happened
        assert question["type"] == "effect_unknown"
    else:
        assert resumed.done, resumed.summary
    assert tickets.count() == 1


def test_a_full_disk_after_a_blind_call_was_sent_never_sends_it_again(
    tmp_path: Path, disk: Path
) -> None:
    kwargs = _kwargs(tmp_path, disk, "blind")
    tickets = FakeProvider(str(tmp_path / "ticket.sqlite"), "blind")
    error = _failed_when_full(
        disk, kwargs, FaultPlan("after_effect", tool="ticket", action="stop"))
    assert "StorageFull" in error and "thread 't'" in error
    assert "(ticket)" not in error or (
        "was sent" in error and "receipt is not recorded" in error)
    assert tickets.count() == 1
    _resumes_once(kwargs, tickets, "blind")


def test_a_full_disk_at_the_steps_checkpoint_write_reconciles_on_resume(
    tmp_path: Path, disk: Path
) -> None:
    kwargs = _kwargs(tmp_path, disk, "lookup")
    tickets = FakeProvider(str(tmp_path / "ticket.sqlite"), "lookup")
    error = _failed_when_full(disk, kwargs, FaultPlan("before_put_writes", occurrence=3,
                                                      action="stop"))
    assert "StorageFull" in error and "thread 't'" in error
    assert tickets.count() == 1

    resumed = run_child(AGENT, kwargs, thread_id="t", action="resume")
    assert resumed.done, resumed.summary
    assert tickets.count() == 1 and _ledger(disk / "agent.sqlite")["ticket"] == "applied"


def test_the_saver_and_the_guard_name_what_a_full_disk_stopped(tmp_path: Path,
                                                               disk: Path) -> None:
    from graph_durable.errors import StorageFull
    from graph_durable.ledger import EffectStatus, IntentWrite
    from graph_durable.nodes.storage import described

    saver = DurableSqliteSaver(sqlite3.connect(str(disk / "agent.sqlite"),
                                               check_same_thread=False))
    saver.setup()
    filler = _fill(disk)
    intent = IntentWrite(key="k1", thread_id="t", checkpoint_ns="tools:x",
                         tool_call_id="call-1", tool="pay", args={"cents": 5},
                         status=EffectStatus.IN_FLIGHT)
    with pytest.raises(StorageFull, match="to thread 't' was not committed: the disk") as full:
        saver.claim_many([intent])
    assert isinstance(full.value, sqlite3.OperationalError)  # as the stock saver's error
    assert full.value.thread_id == "t" and full.value.sent is None
    call = {"id": "call-1", "name": "pay"}
    said = str(described(full.value, "t", call, sent=False))
    assert "'call-1' (pay) was not sent: Nothing was sent." in said
    filler.unlink()
    assert [created for _, created in saver.claim_many([intent])] == [True]
    again = StorageFull("A write to thread 't' was not committed.", thread_id="t")
    assert "was sent, and its receipt is not recorded yet" in str(
        described(again, "t", call, sent=True)) and again.sent is True


def test_a_full_disk_when_an_approval_is_answered_sends_nothing_until_it_is_freed(
    tmp_path: Path, disk: Path
) -> None:
    kwargs = {**_kwargs(tmp_path, disk, "blind"), "approvals": ["ticket"]}
    tickets = FakeProvider(str(tmp_path / "ticket.sqlite"), "blind")
    [question] = run_child(AGENT, kwargs, thread_id="t").interrupts
    assert question["type"] == "tool_approval"

    filler = _fill(disk)
    with pytest.raises(RuntimeError) as failed:
        run_child(AGENT, kwargs, thread_id="t", action="decide", resume={"type": "approve"})
    error = str(failed.value)
    # A new process on a full disk may not even create SQLite's write-ahead log, which
    # SQLite reports as a disk I/O error: ours too, without naming a thread.
    assert "SqliteStorageFull" in error or "SqliteUnavailable" in error, error[-2000:]
    assert "(ticket)" not in error or "Nothing was sent" in error
    assert tickets.count() == 0  # the decision was not journaled: nothing was sent
    filler.unlink()

    answered = run_child(AGENT, kwargs, thread_id="t", action="decide",
                         resume={"type": "approve"})
    assert answered.done, answered.summary
    assert tickets.count() == 1
