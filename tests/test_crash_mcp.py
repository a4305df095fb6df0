"""An MCP tool gets its key: a payments server (FastMCP over stdio, started by
`langchain-mcp-adapters` for each call) dedupes charges by `idempotency_key`. The worker
is SIGKILLed right after the server applied a charge and a new process resumes the
thread: one charge, because the guard filled the argument the policy names
(`Effect(key_arg="idempotency_key")`) with the same key both times. The model is never
shown that argument, and the same tool guarded without naming it is refused before
anything is sent (it would have charged twice).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langchain_mcp_adapters", reason="needs the mcp extra")

from graph_durable import AsyncDurableSqliteSaver  # noqa: E402
from graph_durable.testing import FakeProvider, FaultPlan  # noqa: E402
from graph_durable.testing.crash.child import run_child  # noqa: E402
from graph_durable.testing.scenarios.mcp import build_mcp_agent  # noqa: E402

pytestmark = pytest.mark.crash

AGENT = "graph_durable.testing.scenarios.mcp:build_mcp_agent"


def _kwargs(tmp_path: Path, **options: Any) -> dict[str, Any]:
    return {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path), **options}


def _payments(tmp_path: Path) -> FakeProvider:
    return FakeProvider(str(tmp_path / "payments.sqlite"), "dedupe")


def _ledger(tmp_path: Path) -> list[Any]:
    async def read() -> list[Any]:
        async with AsyncDurableSqliteSaver.from_conn_string(str(tmp_path / "agent.sqlite")) as saver:
            return await saver.aeffects("t")

    return asyncio.run(read())


def test_a_worker_killed_after_the_server_charged_resumes_without_a_second_charge(
    tmp_path: Path,
) -> None:
    kwargs = _kwargs(tmp_path, key_arg="idempotency_key")
    crashed = run_child(AGENT, kwargs, thread_id="t",
                        fault=FaultPlan("after_effect", tool="charge"))
    assert crashed.killed
    payments = _payments(tmp_path)
    assert payments.count() == 1
    [(key, charges)] = payments.counts().items()
    assert not key.startswith("unkeyed-")  # the server was given a key

    resumed = run_child(AGENT, kwargs, thread_id="t", action="resume")
    assert resumed.done, resumed.summary
    assert payments.counts() == {key: 1}, "the resumed worker charged again"
    [record] = _ledger(tmp_path)
    assert record.key == key and record.status.value == "applied"
    assert "idempotency_key" not in record.args


def test_without_key_arg_the_same_tool_is_refused_before_anything_is_sent(
    tmp_path: Path,
) -> None:
    with pytest.raises(RuntimeError, match="UndeliveredKey: .*key_arg='idempotency_key'"):
        run_child(AGENT, _kwargs(tmp_path), thread_id="t")
    assert _payments(tmp_path).count() == 0
    assert _ledger(tmp_path) == []


async def test_the_model_is_never_shown_the_key_argument(tmp_path: Path) -> None:
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage, HumanMessage

    from graph_durable import Effect, EffectGuardMiddleware
    from graph_durable.testing.models import ScriptedChatModel
    from graph_durable.testing.scenarios.mcp import CHARGE, payments_tools

    tools = await payments_tools(str(tmp_path))
    [charge] = tools
    assert "idempotency_key" in charge.args  # the server's own schema has it
    model = ScriptedChatModel(script=[AIMessage(content="", tool_calls=[CHARGE]),
                                      AIMessage(content="Charged.")])
    guard = EffectGuardMiddleware({"charge": Effect(idempotent=True, key_arg="idempotency_key")})
    async with AsyncDurableSqliteSaver.from_conn_string(str(tmp_path / "agent.sqlite")) as saver:
        agent = create_agent(model, tools=tools, middleware=[guard], checkpointer=saver)
        await agent.ainvoke({"messages": [HumanMessage("Charge Ana.")]},
                            {"configurable": {"thread_id": "t"}}, durability="sync")
        [record] = await saver.aeffects("t")
    [shown] = model.bound_tools
    assert set(shown["function"]["parameters"]["properties"]) == {"customer", "cents"}
    assert _payments(tmp_path).counts() == {record.key: 1}


@pytest.fixture
def http_server(tmp_path: Path) -> Any:
    """The payments server on streamable HTTP (127.0.0.1), taking keys as a header."""
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "graph_durable.testing.scenarios.mcp_server",
         str(tmp_path / "payments.sqlite"), "--http", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, "no MCP server"
            time.sleep(0.1)
    yield port
    server.terminate()
    server.wait(timeout=10)


def test_an_http_mcp_server_gets_the_key_in_a_header_and_charges_once(
    tmp_path: Path, http_server: int
) -> None:
    kwargs = _kwargs(tmp_path, http_port=http_server)
    crashed = run_child(AGENT, kwargs, thread_id="t",
                        fault=FaultPlan("after_effect", tool="charge"))
    assert crashed.killed
    payments = _payments(tmp_path)
    [(key, _)] = payments.counts().items()
    assert not key.startswith("unkeyed-")  # the header carried the key

    resumed = run_child(AGENT, kwargs, thread_id="t", action="resume")
    assert resumed.done, resumed.summary
    assert payments.counts() == {key: 1}
    [record] = _ledger(tmp_path)
    assert record.key == key and record.status.value == "applied"
