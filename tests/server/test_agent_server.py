"""The example app under `examples/agent_server` on a real LangGraph Agent Server.

`langgraph dev` runs as a subprocess on a free port, driven by `langgraph-sdk`:
- a refund pauses on its approval, is resumed by interrupt id, and is sent once;
- the server is SIGKILLed (a fault plan in its environment) after the provider applied
  a blind email and before its receipt; a new server on the same files resumes the run,
  which pauses on `effect_unknown` instead of sending again; answered, the provider's
  count stays 1;
- a run is cancelled (`runs.cancel`) while a card charge is on its way to a provider
  that can be looked up but does not dedupe; the next run pauses on `effect_unknown`
  instead of charging again after a lookup that finds nothing yet, and a human's retry
  finds the charge once it landed.

Only the server processes this test started are stopped.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from graph_durable import DurableSqliteSaver, EffectStatus
from graph_durable.errors import GraphDurableError
from graph_durable.testing import FakeProvider, FaultPlan

pytest.importorskip("langgraph_api", reason="needs the 'server' extra (langgraph-cli[inmem])")
from langgraph_sdk import get_client  # noqa: E402

pytestmark = pytest.mark.server

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_server"
LANGGRAPH = Path(sys.executable).with_name("langgraph")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """One `langgraph dev` process on the app copied to `app`."""

    def __init__(self, app: Path, env: dict[str, str] | None = None) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(app / f"server-{self.port}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [str(LANGGRAPH), "dev", "--no-browser", "--no-reload", "--port", str(self.port)],
            cwd=app, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "BILLING_AGENT_DB": str(app / "agent.sqlite"),
                 "BILLING_PROVIDER_DIR": str(app / "providers"), **(env or {})},
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"langgraph dev exited early: {self.output()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.2)
        else:
            self.stop()
            raise RuntimeError(f"langgraph dev did not listen in 60 s: {self.output()[-3000:]}")

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture
def app(tmp_path: Path) -> Path:
    target = tmp_path / "app"
    shutil.copytree(EXAMPLE, target, ignore=shutil.ignore_patterns("*.sqlite", ".langgraph_api",
                                                                   "providers", "__pycache__"))
    return target


def _count(app: Path, name: str, mode: Any) -> int:
    return FakeProvider(str(app / "providers" / f"{name}.sqlite"), mode, name=name).count()


async def _interrupts(client: Any, thread_id: str) -> list[dict[str, Any]]:
    state = await client.threads.get_state(thread_id)
    return list(state.get("interrupts") or [])


@pytest.mark.long
def test_approval_and_a_server_killed_mid_effect(app: Path) -> None:
    kill_after_email = FaultPlan("after_effect", tool="send_receipt", action="kill")
    server = Server(app, env=kill_after_email.to_env())
    try:
        asyncio.run(_approve_a_refund(server.url))
        assert _count(app, "payments", "dedupe") == 1
        thread_id = asyncio.run(_start_a_receipt(server.url, app))
        server.proc.wait(timeout=60)
        assert server.proc.returncode == -signal.SIGKILL, server.output()[-3000:]
    finally:
        server.stop()
    assert _count(app, "mail", "blind") == 1  # applied; the receipt was never recorded

    restarted = Server(app)
    try:
        asyncio.run(_resume_the_receipt(restarted.url, thread_id))
    finally:
        restarted.stop()
    assert _count(app, "mail", "blind") == 1
    assert _count(app, "payments", "dedupe") == 1
    # The refund's receipt, deferred onto the step's own write by whichever saver
    # instance the server ran it with, is in the ledger; so is the human's answer.
    with DurableSqliteSaver.from_conn_string(str(app / "agent.sqlite")) as saver:
        statuses = {r.tool: (r.status, r.attempts)
                    for thread in saver.thread_ids() for r in saver.effects(thread)}
    assert statuses == {"refund": (EffectStatus.APPLIED, 1),
                        "send_receipt": (EffectStatus.APPLIED, 1)}


async def _approve_a_refund(url: str) -> None:
    client = get_client(url=url)
    thread = await client.threads.create()
    await client.runs.wait(thread["thread_id"], "billing", durability="sync",
                           input={"messages": [{"role": "user", "content": "refund order 42"}]})
    [question] = await _interrupts(client, thread["thread_id"])
    assert question["value"]["tool_call_id"] == "call_refund"
    assert question["value"]["args"] == {"order": "42", "cents": 1500}
    result = await client.runs.wait(
        thread["thread_id"], "billing", durability="sync",
        command={"resume": {question["id"]: {"type": "approve"}}})
    assert await _interrupts(client, thread["thread_id"]) == []
    assert result["messages"][-1]["content"].startswith("Done:")


async def _start_a_receipt(url: str, app: Path) -> str:
    client = get_client(url=url)
    thread = await client.threads.create()
    _wait_for_a_flush(app, after=time.time())
    await client.runs.create(
        thread["thread_id"], "billing", durability="sync",
        input={"messages": [{"role": "user", "content": "receipt for order 7"}]})
    return str(thread["thread_id"])


def _wait_for_a_flush(app: Path, after: float, timeout: float = 30.0) -> None:
    """Wait until the dev server has saved its threads to disk.

    `langgraph dev` keeps threads and runs in memory and saves them every 10 s, so a
    thread created just before a SIGKILL is gone after the restart; its checkpoints and
    ledger are in our saver's file either way. A deployed server keeps them in its own
    database at once.
    """
    folder = app / ".langgraph_api"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if folder.exists() and any(f.stat().st_mtime > after for f in folder.iterdir()):
            return
        time.sleep(0.2)
    raise AssertionError("the dev server did not save its threads within 30 s")


async def _resume_the_receipt(url: str, thread_id: str) -> None:
    client = get_client(url=url)
    await client.runs.wait(thread_id, "billing", input=None, durability="sync")
    [question] = await _interrupts(client, thread_id)
    assert question["value"]["type"] == "effect_unknown"
    assert question["value"]["tool_call_id"] == "call_send_receipt"
    result = await client.runs.wait(
        thread_id, "billing", durability="sync",
        command={"resume": {question["id"]: {"type": "applied", "receipt": {"checked": True}}}})
    assert await _interrupts(client, thread_id) == []
    assert result["messages"][-1]["content"].startswith("Done:")


@pytest.mark.long
def test_a_run_cancelled_with_a_charge_on_its_way_does_not_charge_again(app: Path) -> None:
    server = Server(app, env={"BILLING_CARD_LATENCY": "3"})
    try:
        asyncio.run(_cancel_a_charge(server.url, app))
    finally:
        server.stop()
    assert _count(app, "cards", "lookup") == 1


async def _cancel_a_charge(url: str, app: Path) -> None:
    client = get_client(url=url)
    thread_id = (await client.threads.create())["thread_id"]
    run = await client.runs.create(
        thread_id, "billing", durability="sync",
        input={"messages": [{"role": "user", "content": "charge order 9"}]})
    _wait_for_the_intent(app, thread_id)  # the charge is on its way: 3 s to answer
    await client.runs.cancel(thread_id, run["run_id"], wait=True)
    assert _count(app, "cards", "lookup") == 0
    await client.runs.wait(thread_id, "billing", input=None, durability="sync")
    [question] = await _interrupts(client, thread_id)
    assert question["value"]["type"] == "effect_unknown", question
    assert "cancelled while the call was in flight" in question["value"]["error"]
    deadline = time.monotonic() + 30
    while _count(app, "cards", "lookup") == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)  # the cancelled run's request lands at the provider
    result = await client.runs.wait(
        thread_id, "billing", durability="sync",
        command={"resume": {question["id"]: {"type": "retry"}}})
    assert await _interrupts(client, thread_id) == []
    assert result["messages"][-1]["content"].startswith("Done:")


def _wait_for_the_intent(app: Path, thread_id: str, timeout: float = 30.0) -> None:
    """Wait until the ledger holds the thread's charge in flight (read-only, as the
    server writes the file)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            saver = DurableSqliteSaver.open_read_only(str(app / "agent.sqlite"))
        except GraphDurableError:
            saver = None  # the server has not created its tables yet
        if saver is not None:
            try:
                if any(r.status is EffectStatus.IN_FLIGHT for r in saver.effects(thread_id)):
                    return
            finally:
                saver.conn.close()
        time.sleep(0.1)
    raise AssertionError(f"no charge in flight in thread {thread_id!r} within {timeout} s")
