"""An agent whose payments tool comes from an MCP server (`mcp_server`), loaded with
`langchain-mcp-adapters` into `create_agent`: the tool's code is not the agent's, so its
key reaches the server only as the argument `Effect(key_arg=...)` names. Needs the `mcp`
and `agents` extras.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import aiosqlite
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langchain_mcp_adapters.client import MultiServerMCPClient

from graph_durable.checkpointers.sqlite import AsyncDurableSqliteSaver
from graph_durable.nodes import EffectGuardMiddleware
from graph_durable.nodes.key_delivery import key_header_interceptor
from graph_durable.policy import Effect
from graph_durable.testing.models import ScriptedChatModel
from graph_durable.testing.providers import FakeProvider
from graph_durable.testing.scenarios.effects import EffectsAgent

__all__ = ["CHARGE", "build_mcp_agent", "payments_tools"]

CHARGE = {"name": "charge", "args": {"customer": "ana", "cents": 500}, "id": "call-charge"}
"""The one call the scripted model asks for."""


async def payments_tools(provider_dir: str, http_port: int | None = None) -> list[Any]:
    """The tools of a payments server (`mcp_server`) started over stdio, its charges kept
    in `<provider_dir>/payments.sqlite`; or of one already serving streamable HTTP on
    `http_port`, given each call's key in an `Idempotency-Key` header
    (`key_header_interceptor`)."""
    if http_port is not None:
        client = MultiServerMCPClient(
            {"payments": {"url": f"http://127.0.0.1:{http_port}/mcp",
                          "transport": "streamable_http"}},
            tool_interceptors=[key_header_interceptor()])
        return await client.get_tools()
    client = MultiServerMCPClient({"payments": {
        "command": sys.executable,
        "args": ["-m", "graph_durable.testing.scenarios.mcp_server",
                 os.path.join(provider_dir, "payments.sqlite")],
        "transport": "stdio",
    }})
    return await client.get_tools()


async def build_mcp_agent(db_path: str, provider_dir: str, key_arg: str | None = None,
                          idempotent: bool = True, http_port: int | None = None
                          ) -> EffectsAgent:
    """`create_agent` over the payments server's tools on an `AsyncDurableSqliteSaver` at
    `db_path`, `charge` guarded as `Effect(idempotent=idempotent, key_arg=key_arg)`
    (with `http_port`, on the HTTP server there, the key sent as a header). Its model
    asks for one charge (`CHARGE`), then says it is done."""
    os.makedirs(provider_dir, exist_ok=True)
    payments = FakeProvider(os.path.join(provider_dir, "payments.sqlite"), "dedupe",
                            name="payments")
    saver = AsyncDurableSqliteSaver(aiosqlite.connect(db_path))
    model = ScriptedChatModel(script=[AIMessage(content="", tool_calls=[CHARGE]),
                                      AIMessage(content="Charged.")])
    guard = EffectGuardMiddleware({"charge": Effect(idempotent=idempotent, key_arg=key_arg)})
    graph = create_agent(model, tools=await payments_tools(provider_dir, http_port),
                         middleware=[guard], checkpointer=saver)
    return EffectsAgent(graph=graph, saver=saver, providers={"payments": payments},
                        inputs={"messages": [HumanMessage("Charge Ana 5 euros.")]})
