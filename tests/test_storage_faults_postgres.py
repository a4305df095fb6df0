"""On PostgreSQL, a storage fault at any write the guard or the saver makes is the
library's error, never a duplicate: the server stopped (`pg_ctl stop -m immediate`, as
by a power cut) or its disk full (the server's whole folder, data and pg_wal, on a small
tmpfs the test mounts as root; skipped otherwise, CI runs as root).

A worker is frozen (SIGSTOP) at a write point: the intent claim, the receipt, the
decision of an answered approval, the step's checkpoint write. The fault is caused, the
worker goes on, and its error is `DatabaseUnavailable` (or `StorageFull`) naming the
thread; when the guard's write met it, it names the call too and says whether it was
sent. Which write meets the fault first is not fixed (LangGraph saves a task's writes
on a background thread), so the error is checked to tell the truth about what the
provider saw. The database is then restored, a new process resumes the thread, and each
effect exists once: a blind call whose receipt was lost pauses on `unknown` instead.

A full disk fails only a write that needs new space: PostgreSQL writes into the free
room of pages it has. The tickets' items are long and random (incompressible), so each
write that carries one needs new pages of its table's TOAST relation.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import random
import re
import signal
import string
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from graph_durable.checkpointers.postgres import DurablePostgresSaver
from graph_durable.errors import DatabaseUnavailable, StorageFull
from graph_durable.ledger import EffectStatus, IntentWrite
from graph_durable.testing import FakeProvider, FaultPlan
from graph_durable.testing.crash.child import ChildResult, run_child, start_child
from graph_durable.testing.postgres import PostgresServer
from tests.test_storage_full import _fill, _stopped

pytestmark = pytest.mark.crash

FACTORY = {"postgres": "graph_durable.testing.scenarios.effects:build_effects_agent",
           "postgres-async": "graph_durable.testing.scenarios.effects:build_effects_agent_async"}
BACKEND = ["postgres", pytest.param("postgres-async", marks=pytest.mark.backends)]
# One call a turn, so that the guard's write at each point is the ticket's.
ITEM = "".join(random.Random(39).choices(string.ascii_letters + string.digits, k=7000))
TURNS = [[["ticket", ITEM]], [["email", "e1"]]]

# Each write point: the mode of the ticket's provider, whether it needs approval, and
# where the worker is frozen (in the run that answers the approval, for "decision").
WRITES: dict[str, tuple[str, bool, FaultPlan]] = {
    "claim": ("blind", False, FaultPlan("before_intent", tool="ticket", action="stop")),
    "receipt": ("blind", False, FaultPlan("after_effect", tool="ticket", action="stop")),
    # The tool step's own writes, carrying the looked-up ticket's deferred receipt.
    "checkpoint": ("lookup", False, FaultPlan("before_put_writes", occurrence=3,
                                              action="stop")),
    # The resume value's write, then the decision's reads and journal entry.
    "decision": ("blind", True, FaultPlan("before_put_writes", occurrence=1,
                                          action="stop")),
}


@pytest.fixture
def disk() -> Iterator[Path]:
    """A 96 MB tmpfs mounted for this test (root only), unmounted after it: room for a
    cluster (about 50 MB) and a little more. Its path is short, as the server's unix
    socket in it must be."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = Path(tempfile.mkdtemp(prefix="gd-disk-"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
        mount.rmdir()


def _kwargs(tmp_path: Path, conninfo: str, backend: str, write: str) -> dict[str, Any]:
    mode, approval, _ = WRITES[write]
    return {"db_path": str(tmp_path / "unused.sqlite"), "provider_dir": str(tmp_path),
            "turns": TURNS, "modes": {"ticket": mode, "email": "dedupe"},
            "approvals": ["ticket"] if approval else [],
            "saver": {"backend": backend, "conninfo": conninfo}}


def _ledger(conninfo: str) -> dict[str, str]:
    with DurablePostgresSaver.from_conn_string(conninfo) as saver:
        return {r.tool: r.status.value for r in saver.effects("t")}


def _error(stderr: str) -> tuple[type[BaseException], str]:
    """The class and message of the error a worker's traceback ends with."""
    raised = re.findall(r"^([A-Za-z_]\w*(?:\.\w+)+): (.*)$", stderr, re.M)
    assert raised, f"no error in the worker's output:\n{stderr[-3000:]}"
    name, message = raised[-1]
    module, _, cls = name.rpartition(".")
    return getattr(importlib.import_module(module), cls), message


def _failed_at(factory: str, kwargs: dict[str, Any], write: str,
               fault: Callable[[], None]) -> tuple[type[BaseException], str]:
    """Run the worker to `write`'s point, cause `fault`, let it go on: its error."""
    _, approval, point = WRITES[write]
    if approval:
        [question] = run_child(factory, kwargs, thread_id="t").interrupts
        assert question["type"] == "tool_approval"
        child = start_child(factory, kwargs, thread_id="t", action="decide",
                            resume={"type": "approve"}, fault=point)
    else:
        child = start_child(factory, kwargs, thread_id="t", fault=point)
    _stopped(child.pid)
    fault()
    os.kill(child.pid, signal.SIGCONT)
    with pytest.raises(RuntimeError) as failed:
        child.wait()
    return _error(str(failed.value))


def _tells_the_truth(message: str, sent: int) -> None:
    """The error says what the provider saw: a guarded call's error names it, and says
    it was sent only if it was; any error names the thread."""
    assert "thread 't'" in message or "Thread 't'" in message, message
    if "(ticket)" in message:
        said_sent = "was sent, and its receipt is not recorded" in message
        assert said_sent == (sent == 1) and ("Nothing was sent" in message) != said_sent, \
            message
    elif "answers of this resume" in message:
        assert "Nothing was sent" in message and sent == 0, message


def _resumes_once(factory: str, kwargs: dict[str, Any], conninfo: str, write: str,
                  tickets: FakeProvider) -> ChildResult:
    """Resume (with the same answer, for a decision) once the database is back: the
    ticket exists once; a blind one the ledger holds without a receipt is asked about."""
    recorded = _ledger(conninfo).get("ticket")
    if WRITES[write][1]:
        resumed = run_child(factory, kwargs, thread_id="t", action="decide",
                            resume={"type": "approve"})
    else:
        resumed = run_child(factory, kwargs, thread_id="t", action="resume")
    if recorded == "in_flight" and kwargs["modes"]["ticket"] == "blind":
        [question] = resumed.interrupts  # a person says whether it happened
        assert question["type"] == "effect_unknown" and question["name"] == "ticket"
    else:
        assert resumed.done, resumed.summary
        assert _ledger(conninfo)["ticket"] == "applied"
    assert tickets.count() == 1, "the ticket was sent twice"
    return resumed


# The claim runs in make test; the receipt, the decision and the checkpoint write in the
# sweeps (CI runs both), to keep make test under ten minutes.
@pytest.mark.parametrize("write", [
    *(write for write in WRITES if write == "claim"),
    *(pytest.param(write, marks=pytest.mark.sweep) for write in WRITES if write != "claim")])
@pytest.mark.parametrize("backend", BACKEND)
def test_a_stopped_server_at_each_write_is_our_error_and_sends_nothing_twice(
    tmp_path: Path, backend: str, write: str
) -> None:
    # On a pool (postgres-async), a read that broke is tried again on a fresh connection,
    # which the pool waits its timeout (30 s) for while the server is down.
    with PostgresServer() as server:
        conninfo = server.create_database("agent")
        kwargs = _kwargs(tmp_path, conninfo, backend, write)
        tickets = FakeProvider(str(tmp_path / "ticket.sqlite"), kwargs["modes"]["ticket"])

        error, message = _failed_at(FACTORY[backend], kwargs, write, server.crash)
        assert issubclass(error, DatabaseUnavailable), (error, message)
        sent = tickets.count()
        assert sent == {"claim": 0, "receipt": 1, "checkpoint": 1, "decision": 0}[write]
        _tells_the_truth(message, sent)
        if write in ("claim", "receipt"):  # the guard's own write, the first after the stop
            assert "(ticket)" in message, message

        server.start_again()
        _resumes_once(FACTORY[backend], kwargs, conninfo, write, tickets)


@pytest.mark.parametrize("write", [
    "claim", "receipt",
    *(pytest.param(write, marks=pytest.mark.sweep) for write in ("checkpoint", "decision"))])
def test_a_full_server_disk_at_each_write_is_storage_full_and_sends_nothing_twice(
    tmp_path: Path, disk: Path, write: str
) -> None:
    backend = "postgres"
    with PostgresServer(base_dir=str(disk)) as server:
        conninfo = server.create_database("agent")
        kwargs = _kwargs(tmp_path, conninfo, backend, write)
        tickets = FakeProvider(str(tmp_path / "ticket.sqlite"), kwargs["modes"]["ticket"])
        fillers: list[Path] = []

        error, message = _failed_at(FACTORY[backend], kwargs, write,
                                    lambda: fillers.append(_fill(disk)))
        assert issubclass(error, StorageFull), (error, message)
        assert "disk of the PostgreSQL server" in message and "is full" in message
        sent = tickets.count()
        _tells_the_truth(message, sent)
        if write == "claim":
            assert sent == 0 and "(ticket)" in message, message
        elif write == "decision":
            # The decision fits in a page the journal has, or not: either nothing is
            # sent, or the ticket is and its receipt meets the full disk.
            assert sent in (0, 1)
        else:
            assert sent == 1

        fillers[0].unlink()
        _resumes_once(FACTORY[backend], kwargs, conninfo, write, tickets)


@pytest.mark.parametrize("fault", ["stopped", "full"])
def test_the_error_carries_the_thread_the_call_and_whether_it_was_sent(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
    fault: str,
) -> None:
    from psycopg.errors import DiskFull

    from graph_durable.testing.scenarios.effects import build_effects_agent
    from graph_durable.testing.savers import close_saver

    disk = request.getfixturevalue("disk") if fault == "full" else None
    with PostgresServer(base_dir=str(disk) if disk else None) as server:
        conninfo = server.create_database("agent")
        fillers: list[Path] = []

        def break_at(target: str) -> None:
            def reached(point: str, *, tool: str | None = None) -> None:
                if point == target and tool == "ticket":
                    if disk is None:
                        server.crash()
                    else:
                        fillers.append(_fill(disk))
            monkeypatch.setattr("graph_durable.nodes.protocol.fault_point", reached)

        def restore() -> None:
            if disk is None:
                server.start_again()
            else:
                fillers.pop().unlink()

        for thread, point, sent in (("t", "before_intent", False),
                                    ("u", "after_effect", True)):
            agent = build_effects_agent(**_kwargs(tmp_path / thread, conninfo, "postgres",
                                                  "claim"))
            break_at(point)
            with pytest.raises(DatabaseUnavailable) as failed:
                agent.graph.invoke(agent.inputs, {"configurable": {"thread_id": thread}},
                                   durability="sync")
            close_saver(agent.saver)
            restore()
            error = failed.value
            assert error.thread_id == thread and error.tool_call_id == "call_0_0"
            assert error.sent is sent, str(error)
            assert f"thread {thread!r}" in str(error) and "'call_0_0' (ticket)" in str(error)
            if disk is not None:  # still the psycopg error the stock saver raises
                assert isinstance(error, StorageFull) and isinstance(error, DiskFull)
            assert agent.providers["ticket"].count() == int(sent)
            with DurablePostgresSaver.from_conn_string(conninfo) as saver:
                recorded = {r.tool: r.status.value for r in saver.effects(thread)}
            assert recorded == ({"ticket": "in_flight"} if sent else {})


def test_an_error_from_the_answers_of_a_resume_names_the_thread_and_no_call() -> None:
    from graph_durable.nodes.storage import described

    broken = DatabaseUnavailable("The connection to PostgreSQL broke under a read.")
    said = str(described(broken, "t", {}, sent=False))
    assert said.startswith("Thread 't': ") and "None" not in said, said
    assert "Nothing was sent, and no answer was recorded" in said and broken.sent is False


def _intent(key: str) -> IntentWrite:
    return IntentWrite(key=key, thread_id="t", checkpoint_ns="tools:x", tool_call_id=f"c-{key}",
                       tool="pay", args={"cents": 5}, status=EffectStatus.IN_FLIGHT)


@pytest.mark.parametrize("asynchronous", [False, pytest.param(True, marks=pytest.mark.backends)])
def test_a_write_that_finds_no_pooled_connection_is_our_error(asynchronous: bool) -> None:
    """On a pool, the server stopped: the first write meets its broken connection, the
    next finds no connection within the pool's timeout. Both are `DatabaseUnavailable`
    naming the thread (not psycopg_pool's `PoolTimeout`), and nothing is written; the
    saver writes again once the server is back."""
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool, ConnectionPool

    from graph_durable.checkpointers.postgres import AsyncDurablePostgresSaver

    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    with PostgresServer() as server:
        conninfo = server.create_database("agent")

        async def claims() -> list[str]:
            async with AsyncConnectionPool(conninfo, min_size=1, max_size=1, timeout=2,
                                           kwargs=kwargs) as pool:
                saver = AsyncDurablePostgresSaver(pool)
                await saver.aclaim(_intent("k1"))
                server.crash()
                errors = []
                for key in ("k2", "k3"):
                    with pytest.raises(DatabaseUnavailable) as raised:
                        await saver.aclaim(_intent(key))
                    errors.append(str(raised.value))
                server.start_again()
                # The pool reconnects with a backoff (1 s, then 2, 4, ...): wait for it,
                # not for the claim's 2 s timeout, which a slow restart outlasts.
                await pool.wait(timeout=60)
                await saver.aclaim(_intent("k2"))
                return errors + [r.key for r in await saver.aeffects("t")]

        if asynchronous:
            errors = asyncio.run(claims())
        else:
            with ConnectionPool(conninfo, min_size=1, max_size=1, timeout=2,
                                kwargs=kwargs) as pool:
                saver = DurablePostgresSaver(pool)
                saver.claim(_intent("k1"))
                server.crash()
                errors = []
                for key in ("k2", "k3"):
                    with pytest.raises(DatabaseUnavailable) as raised:
                        saver.claim(_intent(key))
                    errors.append(str(raised.value))
                server.start_again()
                pool.wait(timeout=60)  # the pool's reconnect backoff (as above)
                saver.claim(_intent("k2"))
                errors += [r.key for r in saver.effects("t")]

    broke, none_found, *keys = errors
    assert "broke under a write to thread 't'" in broke, broke
    assert "No connection to PostgreSQL for a write to thread 't'" in none_found, none_found
    assert "Nothing was written" in none_found and "PoolTimeout" in none_found
    assert keys == ["k1", "k2"]
