"""Overhead of the effect guard on one agent turn: stock LangGraph vs graph_durable.

A turn is model -> tools -> model on a fresh thread, run with `durability="sync"`:

- stock:   LangGraph `ToolNode` + `langgraph.checkpoint.sqlite.SqliteSaver`
- guarded: `graph_durable.EffectGuardNode` + `graph_durable.DurableSqliteSaver`,
           the tool declared `Effect(idempotent=True)` and reading `current_effect().key`

The `durable saver + ToolNode` rows run stock's `ToolNode` on `DurableSqliteSaver`:
what the saver alone costs (its fence, flow pin and group commit), apart from the
guard's ledger work. The `floor` rows add to them the one thing no design that records
intent before the effect can skip: one more durable commit per tools step, holding a
row per call, before the calls run (`FloorToolNode`). What the guard costs above the
floor is its own work: keys, the ledger's rows and journal, receipts, the protocol. The `encrypted` rows give both savers LangGraph's `EncryptedSerializer` (AES), which
also seals everything the ledger keeps about a call. The `async` rows run the same turn
with `ainvoke`, an async model node and an async tool, on LangGraph's `AsyncSqliteSaver`
(stock) and `graph_durable.AsyncDurableSqliteSaver` (guarded), both on aiosqlite; they
also count the round trips each turn makes through aiosqlite's worker thread (every
statement, fetch, commit and cursor is one), printed under the table.

Both use file-backed SQLite databases in a temporary directory, the same
`ScriptedChatModel` script (one AIMessage with 1 or 5 tool calls, then a final answer)
and the same trivial write tool. After a warm-up, stock and guarded turns alternate one
by one (A B, B A, ...) for `REPETITIONS` x `TURNS` turns each; the median over the
repetitions of the mean time per turn is reported, with the ratio guarded/stock against
its target (printed, not asserted).

Run: `python -m benchmarks turn_overhead` (or `python -m benchmarks.turn_overhead`).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sqlite3
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from benchmarks._runner import Comparison, Timing, report
from graph_durable import (
    AsyncDurableSqliteSaver,
    DurableSqliteSaver,
    Effect,
    EffectGuardNode,
    current_effect,
)
from graph_durable.checkpointers._base import DurableSaverMixin
from graph_durable.testing.models import ScriptedChatModel

__all__ = [
    "REPETITIONS",
    "SCENARIOS",
    "TIMING",
    "TURNS",
    "WARMUP",
    "Agent",
    "AsyncAgent",
    "build_async_guarded",
    "build_async_stock",
    "build_guarded",
    "FloorToolNode",
    "build_sqlite",
    "build_stock",
    "compare",
    "each_scenario",
    "main",
    "measure_async_scenario",
    "measure_saver_alone",
    "measure_scenario",
]

TOOL_NAME = "record_note"

SCENARIOS: dict[int, float] = {1: 1.10, 5: 1.15}
"""Tool calls per turn -> target ratio guarded/stock (sync, async and encrypted alike)."""

REPETITIONS = 7
"""Timed repetitions per scenario; the median repetition is reported."""

TURNS = int(os.environ.get("BENCH_TURNS", "150"))
"""Turns per variant in one repetition (override with the `BENCH_TURNS` environment variable)."""

WARMUP = int(os.environ.get("BENCH_WARMUP", "10"))
"""Untimed turns per variant before timing starts."""

TIMING = Timing(REPETITIONS, TURNS, WARMUP)
"""The timing of every comparison here, unless one is given."""

USER_MESSAGE = "Please record these notes."


def _provider_write(note: str, key: str | None) -> str:
    """The 'external write' both tools perform: trivial, so the overhead is all we see.

    A real provider would dedupe by `key`; the stock tool has no key to give.
    """
    return f"recorded {note!r}"


def _script(n_calls: int) -> list[AIMessage]:
    """One AIMessage asking for `n_calls` tool calls, then the final answer."""
    calls = [
        {"name": TOOL_NAME, "args": {"note": f"note {i}"}, "id": f"call_{i}", "type": "tool_call"}
        for i in range(n_calls)
    ]
    return [AIMessage(content="", tool_calls=calls), AIMessage(content="All notes recorded.")]


def _stock_tool() -> BaseTool:
    @tool(TOOL_NAME)
    def record_note(note: str) -> str:
        """Record a note (a trivial external write)."""
        return _provider_write(note, None)

    return record_note


def _guarded_tool() -> BaseTool:
    @tool(TOOL_NAME)
    def record_note(note: str) -> str:
        """Record a note (a trivial external write, keyed for the provider to dedupe)."""
        return _provider_write(note, current_effect().key)

    return record_note


def _async_stock_tool() -> BaseTool:
    @tool(TOOL_NAME)
    async def record_note(note: str) -> str:
        """Record a note (a trivial external write)."""
        return _provider_write(note, None)

    return record_note


def _async_guarded_tool() -> BaseTool:
    @tool(TOOL_NAME)
    async def record_note(note: str) -> str:
        """Record a note (a trivial external write, keyed for the provider to dedupe)."""
        return _provider_write(note, current_effect().key)

    return record_note


def _stock_node(asynchronous: bool = False) -> ToolNode:
    """LangGraph's `ToolNode` with the stock tool."""
    return ToolNode([_async_stock_tool() if asynchronous else _stock_tool()])


def _guarded_node(asynchronous: bool = False) -> EffectGuardNode:
    """graph_durable's `EffectGuardNode` with the guarded tool, declared idempotent."""
    return EffectGuardNode([_async_guarded_tool() if asynchronous else _guarded_tool()],
                           effects={TOOL_NAME: Effect(idempotent=True)})


class FloorToolNode(ToolNode):
    """Stock's `ToolNode` that first commits one row per tool call, in one durable
    transaction on its saver's connection, before the calls run: the least a guard
    that records intent before the effect must add to a turn (the floor)."""

    FLOOR_TABLE = "benchmark_floor_intents"

    def __init__(self, tools: list[BaseTool], saver: DurableSqliteSaver) -> None:
        super().__init__(tools)
        self._saver = saver
        with saver.lock:
            saver.conn.execute(f"CREATE TABLE IF NOT EXISTS {self.FLOOR_TABLE} "
                               "(key TEXT PRIMARY KEY, tool_call_id TEXT NOT NULL)")
            saver.conn.commit()

    def _func(self, input: Any, config: RunnableConfig, runtime: Any) -> Any:
        tool_calls, _ = self._parse_input(input)
        thread_id = config["configurable"]["thread_id"]
        with self._saver.lock:
            cur = self._saver.conn.cursor()
            try:
                cur.execute("BEGIN IMMEDIATE")
                cur.executemany(
                    f"INSERT INTO {self.FLOOR_TABLE} (key, tool_call_id) VALUES (?, ?)",
                    [(f"{thread_id}|{call['id']}", call["id"]) for call in tool_calls])
                self._saver.conn.commit()
            finally:
                cur.close()
        return super()._func(input, config, runtime)


def _tool_calls(n_calls: int) -> str:
    """`1 tool call`, `5 tool calls`: the end of a scenario's name."""
    return f"{n_calls} tool call{'s' if n_calls > 1 else ''}"


class _Connection(Protocol):
    """A database connection an `Agent` owns (sqlite3 or psycopg)."""

    def close(self) -> None: ...


@dataclass
class Agent:
    """A compiled agent on its own database; `turn()` runs one turn on a new thread."""

    name: str
    graph: Any
    conn: _Connection
    saver: BaseCheckpointSaver
    inputs: dict[str, Any] = field(
        default_factory=lambda: {"messages": [HumanMessage(USER_MESSAGE)]}
    )
    last_thread_id: str | None = None
    _threads: itertools.count[int] = field(default_factory=itertools.count)

    def _next_config(self) -> dict[str, Any]:
        self.last_thread_id = f"{self.name}-{next(self._threads)}"
        return {"configurable": {"thread_id": self.last_thread_id}}

    def turn(self) -> dict[str, Any]:
        """Run one turn (model -> tools -> model) on a fresh thread_id."""
        return self.graph.invoke(self.inputs, self._next_config(), durability="sync")

    def applied(self, thread_id: str | None = None) -> int:
        """How many effects `thread_id` (by default the last turn's thread) holds as
        applied (a durable saver)."""
        assert isinstance(self.saver, DurableSaverMixin)
        return len(self.saver.effects(thread_id or self.last_thread_id, status="applied"))

    def close(self) -> None:
        """Close the database connection."""
        self.conn.close()


class _CountingQueue:
    """Stands in for an aiosqlite connection's request queue and counts its requests:
    each is one round trip to the connection's worker thread and back."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue
        self.count = 0

    def put_nowait(self, item: Any) -> None:
        self.count += 1
        self.queue.put_nowait(item)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.queue, name)


@dataclass
class AsyncAgent(Agent):
    """An `Agent` run with `ainvoke` on `loop` (an aiosqlite connection and saver)."""

    loop: asyncio.AbstractEventLoop | None = None
    round_trips: _CountingQueue | None = None

    def turn(self) -> dict[str, Any]:
        """Run one turn (model -> tools -> model) on a fresh thread_id, with `ainvoke`."""
        assert self.loop is not None
        return self.loop.run_until_complete(
            self.graph.ainvoke(self.inputs, self._next_config(), durability="sync"))

    def round_trips_per_turn(self, turns: int = 20) -> float:
        """Mean aiosqlite round trips of one turn, over `turns` turns."""
        assert self.round_trips is not None
        before = self.round_trips.count
        for _ in range(turns):
            self.turn()
        return (self.round_trips.count - before) / turns

    def applied(self, thread_id: str | None = None) -> int:
        """`Agent.applied`, read on the agent's loop (not running between turns)."""
        assert self.loop is not None and isinstance(self.saver, AsyncDurableSqliteSaver)
        return len(self.loop.run_until_complete(
            self.saver.aeffects(thread_id or self.last_thread_id, status="applied")))

    def close(self) -> None:
        assert self.loop is not None
        self.loop.run_until_complete(self.conn.close())  # type: ignore[func-returns-value]


def _builder(tools_node: ToolNode, n_calls: int, *, asynchronous: bool = False
             ) -> StateGraph:
    model = ScriptedChatModel(script=_script(n_calls))

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    async def aagent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", aagent if asynchronous else agent)
    builder.add_node("tools", tools_node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder


def _compile(
    name: str, tools_node: ToolNode, saver: BaseCheckpointSaver, conn: _Connection,
    n_calls: int,
) -> Agent:
    graph = _builder(tools_node, n_calls).compile(checkpointer=saver)
    return Agent(name=name, graph=graph, conn=conn, saver=saver)


def _encrypted() -> Any:
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    return EncryptedSerializer.from_pycryptodome_aes(key=b"benchmark-key-0123456789abcdef!!")


def build_sqlite(name: str, db_path: str, n_calls: int, saver_type: type[SqliteSaver],
                 tools_node: ToolNode, serde: Any = None) -> Agent:
    """An agent named `name`: `tools_node` on a `saver_type` saver on `db_path`."""
    conn = sqlite3.connect(db_path, check_same_thread=False)
    saver = saver_type(conn, serde=serde)
    saver.setup()
    return _compile(name, tools_node, saver, conn, n_calls)


def build_stock(db_path: str, n_calls: int, serde: Any = None) -> Agent:
    """LangGraph's `ToolNode` with LangGraph's `SqliteSaver` on `db_path`."""
    return build_sqlite("stock", db_path, n_calls, SqliteSaver, _stock_node(), serde)


def build_guarded(db_path: str, n_calls: int, serde: Any = None) -> Agent:
    """graph_durable's `EffectGuardNode` with `DurableSqliteSaver` on `db_path`."""
    return build_sqlite("guarded", db_path, n_calls, DurableSqliteSaver, _guarded_node(),
                        serde)


def _build_async(name: str, db_path: str, n_calls: int, loop: asyncio.AbstractEventLoop,
                 saver_type: type[AsyncSqliteSaver]) -> AsyncAgent:
    import aiosqlite

    async def open_saver() -> tuple[Any, AsyncSqliteSaver]:
        conn = await aiosqlite.connect(db_path)
        saver = saver_type(conn)
        await saver.setup()
        return conn, saver

    conn, saver = loop.run_until_complete(open_saver())
    counter = conn._tx = _CountingQueue(conn._tx)
    node = _guarded_node(True) if name == "guarded" else _stock_node(True)
    graph = _builder(node, n_calls, asynchronous=True).compile(checkpointer=saver)
    return AsyncAgent(name=name, graph=graph, conn=conn, saver=saver, loop=loop,
                      round_trips=counter)


def build_async_stock(db_path: str, n_calls: int, loop: asyncio.AbstractEventLoop
                      ) -> AsyncAgent:
    """LangGraph's `ToolNode` with LangGraph's `AsyncSqliteSaver` on `db_path`, on `loop`."""
    return _build_async("stock", db_path, n_calls, loop, AsyncSqliteSaver)


def build_async_guarded(db_path: str, n_calls: int, loop: asyncio.AbstractEventLoop
                        ) -> AsyncAgent:
    """graph_durable's `EffectGuardNode` with `AsyncDurableSqliteSaver` on `db_path`."""
    return _build_async("guarded", db_path, n_calls, loop, AsyncDurableSqliteSaver)


def _check(agent: Agent, n_calls: int, applied_left: int | None = None) -> None:
    """Fail loudly if a turn does not do what the benchmark claims to measure
    (`applied_left`: the applied effects a guarded turn leaves, `n_calls` by default)."""
    messages = agent.turn()["messages"]
    tool_messages = [m for m in messages if isinstance(m, ToolMessage)]
    if len(tool_messages) != n_calls or any(m.status != "success" for m in tool_messages):
        raise RuntimeError(f"{agent.name}: expected {n_calls} successful tool messages, "
                           f"got {tool_messages!r}")
    if not (isinstance(messages[-1], AIMessage) and not messages[-1].tool_calls):
        raise RuntimeError(f"{agent.name}: the turn did not end with the final answer")
    if isinstance(agent.saver, DurableSaverMixin) and agent.name == "guarded":
        applied, expected = agent.applied(), n_calls if applied_left is None else applied_left
        if applied != expected:
            raise RuntimeError(f"guarded: expected {expected} applied effects, got {applied}")


def compare(
    stock: Agent,
    guarded: Agent,
    n_calls: int,
    *,
    scenario: str,
    target: float | None,
    timing: Timing = TIMING,
    note: str = "",
) -> Comparison:
    """Check both agents, time their turns interleaved, then close them."""
    try:
        _check(stock, n_calls)
        _check(guarded, n_calls)
        if isinstance(stock, AsyncAgent) and isinstance(guarded, AsyncAgent):
            note = (f"aiosqlite round trips per turn: stock "
                    f"{stock.round_trips_per_turn():.1f}, guarded "
                    f"{guarded.round_trips_per_turn():.1f}")
        samples = timing.interleave({"stock": stock.turn, "guarded": guarded.turn})
    finally:
        stock.close()
        guarded.close()
    stock_ms, guarded_ms = ([s * 1000 for s in samples[side]] for side in ("stock", "guarded"))
    return Comparison.of_samples(scenario, stock_ms, guarded_ms, target=target, note=note)


def measure_scenario(
    workdir: str,
    n_calls: int,
    *,
    target: float | None,
    timing: Timing = TIMING,
    encrypted: bool = False,
) -> Comparison:
    """Time stock and guarded turns with `n_calls` tool calls each, interleaved (both
    encrypted with `encrypted`)."""
    serde, tag = (_encrypted(), "-encrypted") if encrypted else (None, "")
    stock = build_stock(os.path.join(workdir, f"stock-{n_calls}{tag}.sqlite"), n_calls, serde)
    guarded = build_guarded(os.path.join(workdir, f"guarded-{n_calls}{tag}.sqlite"), n_calls,
                            serde)
    suffix = ", encrypted" if encrypted else ""
    return compare(stock, guarded, n_calls, scenario=f"turn, {_tool_calls(n_calls)}{suffix}",
                   target=target, timing=timing)


def measure_saver_alone(
    workdir: str,
    n_calls: int,
    *,
    floor: bool = False,
    timing: Timing = TIMING,
) -> Comparison:
    """Time stock turns against the same `ToolNode` on `DurableSqliteSaver`: what the
    saver alone costs (fence, flow pin, group commit), apart from the guard's ledger.
    With `floor`, the node is `FloorToolNode`: the saver and the one durable commit of
    intents that no guard can skip, without the guard."""
    tag = "floor" if floor else "alone"
    stock = build_stock(os.path.join(workdir, f"stock-{n_calls}-{tag}.sqlite"), n_calls)
    conn = sqlite3.connect(os.path.join(workdir, f"saver-{n_calls}-{tag}.sqlite"),
                           check_same_thread=False)
    saver = DurableSqliteSaver(conn)
    saver.setup()
    node = FloorToolNode([_stock_tool()], saver) if floor else _stock_node()
    what = ("floor: durable saver + ToolNode + one durable commit per tools step" if floor
            else "durable saver + ToolNode (no guard)")
    return compare(stock, _compile(tag, node, saver, conn, n_calls), n_calls,
                   scenario=f"turn, {_tool_calls(n_calls)}, {what}",
                   target=None, timing=timing)


def measure_async_scenario(
    workdir: str,
    n_calls: int,
    *,
    target: float | None,
    timing: Timing = TIMING,
) -> Comparison:
    """Time stock and guarded `ainvoke` turns with `n_calls` tool calls each, interleaved,
    both on one event loop."""
    loop = asyncio.new_event_loop()
    try:
        stock = build_async_stock(os.path.join(workdir, f"stock-{n_calls}-async.sqlite"),
                                  n_calls, loop)
        guarded = build_async_guarded(
            os.path.join(workdir, f"guarded-{n_calls}-async.sqlite"), n_calls, loop)
        return compare(stock, guarded, n_calls,
                       scenario=f"turn, {_tool_calls(n_calls)}, async", target=target,
                       timing=timing)
    finally:
        loop.close()


def _announce(n_calls: int) -> None:
    """Say what is about to be timed for `n_calls` tool calls per turn."""
    print(f"{n_calls} tool call(s) per turn: {WARMUP} warm-up turns, then "
          f"{REPETITIONS} x {TURNS} turns per variant, interleaved turn by turn",
          flush=True)


def each_scenario(scenarios: Mapping[int, float | None],
                  measure: Callable[[int, float | None], Comparison], *,
                  what: str = "") -> list[Comparison]:
    """`measure(n_calls, target)` of every scenario, each announced first (after `what`)."""
    comparisons = []
    for n_calls, target in scenarios.items():
        print(what, end=" " if what else "")
        _announce(n_calls)
        comparisons.append(measure(n_calls, target))
    return comparisons


def main() -> list[Comparison]:
    """Run every scenario, print the table and append the rows to `results.md`."""
    with tempfile.TemporaryDirectory(prefix="graph-durable-bench-") as workdir:
        comparisons = [
            *each_scenario(SCENARIOS, lambda n_calls, target: measure_scenario(
                workdir, n_calls, target=target)),
            *each_scenario(SCENARIOS, lambda n_calls, _: measure_saver_alone(workdir, n_calls)),
            *each_scenario(SCENARIOS, lambda n_calls, _: measure_saver_alone(
                workdir, n_calls, floor=True)),
            *each_scenario(SCENARIOS, lambda n_calls, target: measure_async_scenario(
                workdir, n_calls, target=target)),
        ]
        try:
            import Crypto  # noqa: F401  (pycryptodome, for LangGraph's AES serializer)
        except ImportError:
            print("encrypted rows skipped: pip install 'graph-durable[encryption]'")
        else:
            comparisons += each_scenario(SCENARIOS, lambda n_calls, target: measure_scenario(
                workdir, n_calls, target=target, encrypted=True))
    report("turn overhead: guarded (EffectGuardNode + DurableSqliteSaver, or "
           "AsyncDurableSqliteSaver) vs stock (ToolNode + SqliteSaver, or AsyncSqliteSaver), "
           "durability='sync'", comparisons,
           benchmark="turn_overhead")
    return comparisons


if __name__ == "__main__":
    main()
