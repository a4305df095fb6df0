"""The explorer's scenario: an agent built from a generated episode, rebuildable by name.

`build_explorer_agent(db_path, provider_dir, tools, turns)` builds a ReAct-style graph
(scripted model -> `EffectGuardNode` -> model) whose every argument is JSON, so a child
process rebuilds the same graph on the same database and providers (the scenario
protocol of `graph_durable.testing.crash`). `build_explorer_agent_async` is its twin on
`AsyncDurableSqliteSaver`, for `ainvoke`. A `db_path` that is a libpq connection
string (a `postgres` episode's, `is_postgres`) builds them on `DurablePostgresSaver` and
`AsyncDurablePostgresSaver` instead (on one connection, or with `pool` on psycopg's
connection pool of `POOL_SIZE`).

- `tools`: `{name: spec}`. A spec is `{"mode": ..., "policy": ..., "approval": bool,
  "retries": int, "timeout": float | None}`. `mode` is the `FakeProvider` contract
  (`dedupe`, `lookup`, `blind`) or `read` for a read-only tool without a provider;
  `policy` is what the graph declares: `idempotent`, `lookup`, `blind` (`Effect()`) or
  `read_only`; `approval` is a bool or `"odd"` (a predicate: `odd_items`). A policy
  the provider does not honour (`idempotent` on a `blind` provider) is a
  misconfiguration the explorer must catch.
  A spec may add how the tool reports errors (`errors`), what it returns (`result`)
  and how its lookup misbehaves (`lookup_faults`): see `shapes`.
- `turns`: per model turn, the calls of its AIMessage: `{"tool", "id", "item", "n"}`.
  `item` names the logical call: the tool writes with `operation=item`, so a provider
  counts each logical call's effects apart, and faults are scripted per item.
- `topology`, `stack`, `history`, `fresh_ids`: where the tools sit and how the
  messages are kept (`shapes`; the defaults build the graph above);
  `guarded_node` and `functional` make the same writes through `guarded` functions,
  from a custom node or functional-API tasks (`writes`; `sequential` runs a
  functional agent's tool tasks one at a time).

Write tools return the provider's receipt (`{"id", "key", "item", "n"}`), which becomes
the ToolMessage content, so a test can read back under which key a call was applied.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import Any

import aiosqlite
from langchain_core.messages import HumanMessage
from langchain_core.tools import StructuredTool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from graph_durable.checkpointers.sqlite import AsyncDurableSqliteSaver
from graph_durable.checkpointers.sqlite import DurableSqliteSaver
from graph_durable.nodes import EffectGuardNode
from graph_durable.policy import Effect
from graph_durable.testing.explorer.model import HANG_SECONDS, SLOW_SECONDS
from graph_durable.testing.explorer.shapes import (
    BRANCHES,
    SUBGRAPHS,
    TrimmedState,
    branch_of,
    build_create_agent,
    followup_node,
    lookup_of,
    model_view,
    script_for,
    trimmed_agent,
    write_tool,
    wrap_in_parent,
)
from graph_durable.testing.explorer.writes import GUARDED_TOPOLOGIES, build_guarded_agent
from graph_durable.testing.models import ScriptedChatModel
from graph_durable.testing.scenarios.forks import _with_fresh_ids as with_fresh_ids
from graph_durable.testing.providers import FakeProvider
from graph_durable.testing.scenarios.effects import EffectsAgent

__all__ = [
    "build_explorer_agent",
    "build_explorer_agent_async",
    "is_postgres",
    "odd_items",
    "open_providers",
    "script_for",
]



def open_providers(provider_dir: str, tools: dict[str, dict[str, Any]]
                   ) -> dict[str, FakeProvider]:
    """The providers of the write tools, by tool name (files `<name>.sqlite`)."""
    os.makedirs(provider_dir, exist_ok=True)
    return {
        name: FakeProvider(os.path.join(provider_dir, f"{name}.sqlite"), spec["mode"],
                           name=name, slow_seconds=SLOW_SECONDS, hang_seconds=HANG_SECONDS)
        for name, spec in tools.items() if spec["mode"] != "read"
    }


def odd_items(tool_call: dict[str, Any]) -> bool:
    """Approval predicate `"odd"`: calls whose item ends in an odd digit need approval."""
    return str(tool_call["args"].get("item", "0"))[-1] in "13579"


def _policy(spec: dict[str, Any], provider: FakeProvider | None) -> Effect:
    kind = spec["policy"]
    if kind == "read_only":
        return Effect(read_only=True)
    approval = odd_items if spec.get("approval") == "odd" else bool(spec.get("approval"))
    options = {"approval": approval, "retries": int(spec.get("retries", 0)),
               "timeout": spec.get("timeout")}
    if kind == "idempotent":
        return Effect(idempotent=True, **options)
    if kind == "lookup":
        assert provider is not None
        return Effect(lookup=lookup_of(provider), **options)
    return Effect(**options)


def _read_tool(name: str) -> StructuredTool:
    def read(item: str, n: int) -> dict[str, Any]:
        return {"read": item, "n": n}

    async def aread(item: str, n: int) -> dict[str, Any]:
        return read(item, n)

    return StructuredTool.from_function(read, coroutine=aread, name=name,
                                        description=f"Read one item from {name}.")


def _assemble(saver: Any, provider_dir: str, tools: dict[str, dict[str, Any]],
              turns: list[list[dict[str, Any]]], topology: str = "flat",
              stack: str = "", history: str = "", fresh_ids: bool = False,
              sequential: bool = True, is_async: bool = False) -> EffectsAgent:
    providers = open_providers(provider_dir, tools)
    node_tools = [write_tool(providers[name], tools[name]) if name in providers
                  else _read_tool(name) for name in tools]
    effects = {name: _policy(spec, providers.get(name)) for name, spec in tools.items()}
    inputs = {"messages": [HumanMessage("Go.")]}
    if topology in GUARDED_TOPOLOGIES:
        graph = build_guarded_agent(saver, providers, effects, script_for(turns), topology,
                                    is_async, sequential)
        return EffectsAgent(graph=graph, saver=saver, providers=providers, inputs=inputs)
    if topology == "create_agent":
        approvals = [name for name, spec in tools.items() if spec.get("approval")]
        if stack.startswith("hitl"):  # asked by HumanInTheLoopMiddleware instead
            effects = {name: _policy({**spec, "approval": False}, providers.get(name))
                       for name, spec in tools.items()}
        graph = build_create_agent(saver, turns, node_tools, effects, stack, approvals)
        return EffectsAgent(graph=graph, saver=saver, providers=providers, inputs=inputs)
    scripts = {branch: script_for(turns, branch) for branch in ("", *BRANCHES)}
    model = ScriptedChatModel(script=scripts[""])
    commands = {name for name, spec in tools.items() if spec.get("result") == "command"}

    def agent(state: MessagesState) -> dict[str, Any]:
        seen = model_view(state["messages"])
        script = scripts[branch_of(seen)]
        answer = model.model_copy(update={"script": script}).invoke(seen)
        return {"messages": [with_fresh_ids(answer) if fresh_ids else answer]}

    def after_tools(state: Any) -> str:
        # A command result's `goto` leads to `followup`; nothing else goes on then.
        for message in reversed(state["messages"]):
            if message.type != "tool":
                break
            if message.name in commands and message.additional_kwargs.get("command"):
                return END
        return "agent"

    builder = StateGraph(TrimmedState if history else MessagesState)  # type: ignore[arg-type]
    builder.add_node("agent", trimmed_agent(scripts[""], history == "idless") if history
                     else agent)
    builder.add_node("tools", EffectGuardNode(node_tools, effects=effects))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    if commands:
        builder.add_node("followup", followup_node)
        builder.add_conditional_edges("tools", after_tools, ["agent", END])
        builder.add_edge("followup", "tools")
    else:
        builder.add_edge("tools", "agent")
    if topology in SUBGRAPHS:
        builder = wrap_in_parent(builder, topology)
    return EffectsAgent(graph=builder.compile(checkpointer=saver), saver=saver,
                        providers=providers, inputs=inputs)


def explorer_serde(sealed: bool) -> Any:
    """The serde of an episode's savers: LangGraph's AES `EncryptedSerializer` (which
    seals the ledger too) when `sealed`, else the default."""
    if not sealed:
        return None
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    return EncryptedSerializer.from_pycryptodome_aes(key=b"explorer-key-0123456789abcdef!!!")


def is_postgres(database: str) -> bool:
    """Whether an episode's database is a libpq connection string (a `postgres`
    episode's), not a SQLite file."""
    return database.startswith(("host=", "postgresql://", "postgres://"))


@contextmanager
def explorer_saver(db_path: str, sealed: bool) -> Iterator[Any]:
    """A durable saver on an episode's database (a `DurableSqliteSaver` on its file, or a
    `DurablePostgresSaver` on its connection string) with the episode's serde, closed
    after the block."""
    if is_postgres(db_path):
        from graph_durable.checkpointers.postgres import DurablePostgresSaver

        with DurablePostgresSaver.from_conn_string(
                db_path, serde=explorer_serde(sealed)) as saver:
            yield saver
        return
    with closing(sqlite3.connect(db_path, check_same_thread=False)) as conn:
        yield DurableSqliteSaver(conn, serde=explorer_serde(sealed))


_PG_OPTIONS = {"autocommit": True, "prepare_threshold": 0}
POOL_SIZE = 4
"""Connections of a `postgres_pool` episode's pool (the step's parallel calls, the
run's own writes and the guard's reads each take one)."""


def build_explorer_agent(db_path: str, provider_dir: str, tools: dict[str, dict[str, Any]],
                         turns: list[list[dict[str, Any]]], sealed: bool = False,
                         topology: str = "flat", stack: str = "", history: str = "",
                         fresh_ids: bool = False, sequential: bool = True,
                         pool: bool = False) -> EffectsAgent:
    """Build the episode's agent on a `DurableSqliteSaver` (a `DurablePostgresSaver` when
    `db_path` is a connection string: on one connection, or on a `ConnectionPool` with
    `pool`; see the module docstring). `saver.conn` is closed when the child is done."""
    if is_postgres(db_path):
        from psycopg import Connection
        from psycopg.rows import dict_row

        from graph_durable.checkpointers.postgres import DurablePostgresSaver

        if pool:
            from psycopg_pool import ConnectionPool

            conn: Any = ConnectionPool(db_path, min_size=1, max_size=POOL_SIZE, open=True,
                                       kwargs={**_PG_OPTIONS, "row_factory": dict_row})
        else:
            conn = Connection.connect(db_path, row_factory=dict_row, **_PG_OPTIONS)
        saver: Any = DurablePostgresSaver(conn, serde=explorer_serde(sealed))
    else:
        saver = DurableSqliteSaver(sqlite3.connect(db_path, check_same_thread=False),
                                   serde=explorer_serde(sealed))
    return _assemble(saver, provider_dir, tools, turns, topology, stack, history, fresh_ids,
                     sequential)


async def build_explorer_agent_async(db_path: str, provider_dir: str,
                                     tools: dict[str, dict[str, Any]],
                                     turns: list[list[dict[str, Any]]],
                                     sealed: bool = False, topology: str = "flat",
                                     stack: str = "", history: str = "",
                                     fresh_ids: bool = False,
                                     sequential: bool = True,
                                     pool: bool = False) -> EffectsAgent:
    """`build_explorer_agent` on an `AsyncDurableSqliteSaver` (an
    `AsyncDurablePostgresSaver` on a connection string, or on an `AsyncConnectionPool`
    with `pool`; same arguments)."""
    if is_postgres(db_path):
        from psycopg import AsyncConnection
        from psycopg.rows import dict_row

        from graph_durable.checkpointers.postgres import AsyncDurablePostgresSaver

        if pool:
            from psycopg_pool import AsyncConnectionPool

            conn: Any = AsyncConnectionPool(db_path, min_size=1, max_size=POOL_SIZE,
                                            open=False,
                                            kwargs={**_PG_OPTIONS, "row_factory": dict_row})
            await conn.open()
        else:
            conn = await AsyncConnection.connect(db_path, row_factory=dict_row,
                                                 **_PG_OPTIONS)
        saver: Any = AsyncDurablePostgresSaver(conn, serde=explorer_serde(sealed))
    else:
        saver = AsyncDurableSqliteSaver(aiosqlite.connect(db_path),
                                        serde=explorer_serde(sealed))
    return _assemble(saver, provider_dir, tools, turns, topology, stack, history, fresh_ids,
                     sequential, is_async=True)
