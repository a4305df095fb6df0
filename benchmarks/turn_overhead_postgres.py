"""Overhead of the effect guard on one agent turn on PostgreSQL: stock LangGraph vs graph_durable.

The turn of `benchmarks.turn_overhead` (model -> tools -> model on a fresh thread, run
with `durability="sync"`), with PostgreSQL checkpointers instead of SQLite ones:

- stock:   LangGraph `ToolNode` + `langgraph.checkpoint.postgres.PostgresSaver`
- guarded: `graph_durable.EffectGuardNode` +
           `graph_durable.checkpointers.postgres.DurablePostgresSaver`,
           the tool declared `Effect(idempotent=True)` and reading `current_effect().key`
- floor:   stock's `ToolNode` on `DurablePostgresSaver`, committing one row per call in
           one statement before the calls run: the saver's fenced writes plus the one
           durable commit of intents that no guard recording intent first can skip

A throwaway PostgreSQL server is started from the machine's own binaries
(`graph_durable.testing.postgres.PostgresServer`: a fresh cluster in a temporary folder,
listening on 127.0.0.1, `fsync` and `synchronous_commit` on) and stopped at the end.
Each variant gets its own database per scenario and one connection opened as LangGraph
expects (`autocommit=True, prepare_threshold=0, row_factory=dict_row`); `setup()` runs on
both savers before timing. Script, tools, checks, warm-up, turn-by-turn interleaving,
repetitions and the reported medians are those of `turn_overhead` (same `BENCH_TURNS`
and `BENCH_WARMUP` knobs). The project's target is guarded/stock <= 1.25. The server's
processes share the machine's CPUs with the benchmark, so on a small machine the figures
include that contention, for both variants alike.

The async rows run the same turn with `graph.ainvoke` (an async model node and async
tools, so nothing but the savers' own work leaves the event loop), on one
`AsyncConnection` per variant opened the same way:

- stock:   LangGraph `ToolNode` + `langgraph.checkpoint.postgres.aio.AsyncPostgresSaver`
- guarded: `EffectGuardNode` + `AsyncDurablePostgresSaver` (fenced writes, server-clock
           leases, the ledger)

The event loop runs in a thread of its own for the whole benchmark; the harness's turn
hands each `ainvoke` to it and waits (the same hand-off for both variants). The target
is the same, guarded/stock <= 1.25.

Needs psycopg and langgraph-checkpoint-postgres (`pip install 'graph-durable[postgres]'`)
and PostgreSQL's server binaries (`initdb`, `pg_ctl`, `postgres`; found as
`PostgresServer` finds them, or named by `GRAPH_DURABLE_PG_BIN`); without them the
benchmark is skipped with a message.

Run: `python -m benchmarks turn_overhead_postgres`
(or `python -m benchmarks.turn_overhead_postgres`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.prebuilt import ToolNode

from benchmarks._runner import (
    BenchmarkSkipped,
    Comparison,
    Timing,
    missing_packages,
    package_version,
    report,
    run_main,
)
from benchmarks.turn_overhead import (
    TIMING,
    Agent,
    _builder,
    _compile,
    _guarded_node,
    _stock_node,
    _stock_tool,
    _tool_calls,
    compare,
    each_scenario,
)
from graph_durable.testing.postgres import ENV_BIN, PostgresServer, find_postgres_bin

T = TypeVar("T")

__all__ = [
    "ASYNC_SCENARIOS",
    "AsyncAgent",
    "SCENARIOS",
    "build_guarded",
    "build_guarded_async",
    "build_stock",
    "build_stock_async",
    "main",
    "measure_async_scenario",
    "measure_floor",
    "measure_scenario",
]

SCENARIOS: dict[int, float | None] = {1: 1.25, 5: 1.25}
"""Tool calls per turn -> target ratio guarded/stock of the sync savers."""

ASYNC_SCENARIOS: dict[int, float | None] = {1: 1.25, 5: 1.25}
"""Tool calls per turn -> target ratio guarded/stock of the async savers."""

_MODULES = ("psycopg", "langgraph.checkpoint.postgres")
"""What the PostgreSQL path imports (graph_durable's `postgres` extra)."""


def _require_postgres(*modules: str) -> None:
    """Raise `BenchmarkSkipped` unless the PostgreSQL packages (and `modules`) and
    binaries are here."""
    missing = missing_packages(*_MODULES, *modules)
    if missing:
        raise BenchmarkSkipped(
            f"{', '.join(missing)} not installed (the PostgreSQL checkpointers need them): "
            "install graph_durable's postgres extra, `pip install 'graph-durable[postgres]'`"
        )
    if find_postgres_bin() is None:
        raise BenchmarkSkipped(
            "no PostgreSQL server binaries (initdb, pg_ctl, postgres) found: install the "
            f"PostgreSQL server (e.g. `apt-get install postgresql`) or set {ENV_BIN} to "
            "the directory holding them"
        )


@contextmanager
def _postgres_server() -> Iterator[PostgresServer]:
    """A started throwaway server, stopped on exit; `BenchmarkSkipped` if it cannot start."""
    try:
        server = PostgresServer().start()
    except RuntimeError as exc:  # binaries unusable, root without a postgres user, ...
        raise BenchmarkSkipped(f"could not start a PostgreSQL server here: {exc}") from exc
    try:
        yield server
    finally:
        server.stop()


def _connect(conninfo: str) -> Any:
    """A psycopg connection opened as LangGraph's `PostgresSaver` expects."""
    from psycopg import Connection
    from psycopg.rows import dict_row

    return Connection.connect(conninfo, autocommit=True, prepare_threshold=0,
                              row_factory=dict_row)


def build_stock(conninfo: str, n_calls: int) -> Agent:
    """LangGraph's `ToolNode` with LangGraph's `PostgresSaver` on database `conninfo`."""
    from langgraph.checkpoint.postgres import PostgresSaver

    conn = _connect(conninfo)
    saver = PostgresSaver(conn)
    saver.setup()
    return _compile("stock", _stock_node(), saver, conn, n_calls)


def build_guarded(conninfo: str, n_calls: int) -> Agent:
    """graph_durable's `EffectGuardNode` with `DurablePostgresSaver` on database `conninfo`."""
    from graph_durable.checkpointers.postgres import DurablePostgresSaver

    conn = _connect(conninfo)
    saver = DurablePostgresSaver(conn)
    saver.setup()
    return _compile("guarded", _guarded_node(), saver, conn, n_calls)


def measure_scenario(
    server: PostgresServer,
    n_calls: int,
    *,
    target: float | None,
    timing: Timing = TIMING,
) -> Comparison:
    """Time stock and guarded turns with `n_calls` tool calls each, interleaved.

    Each variant runs on a new database of `server`.
    """
    stock = build_stock(server.create_database(f"stock_{n_calls}"), n_calls)
    guarded = build_guarded(server.create_database(f"guarded_{n_calls}"), n_calls)
    return compare(stock, guarded, n_calls, scenario=f"postgres turn, {_tool_calls(n_calls)}",
                   target=target, timing=timing)


class _PostgresFloorNode(ToolNode):
    """Stock's `ToolNode` that first commits one row per tool call, in one durable
    statement on its saver's connection, before the calls run: on PostgreSQL, the least
    a guard that records intent before the effect adds to a turn (one round trip and
    one commit), as `turn_overhead.FloorToolNode` on SQLite."""

    FLOOR_TABLE = "benchmark_floor_intents"

    def __init__(self, saver: Any) -> None:
        super().__init__([_stock_tool()])
        self._saver = saver
        with saver.lock:
            saver.conn.execute(f"CREATE TABLE IF NOT EXISTS {self.FLOOR_TABLE} "
                               "(key TEXT PRIMARY KEY, tool_call_id TEXT NOT NULL)")

    def _func(self, input: Any, config: RunnableConfig, runtime: Any) -> Any:
        tool_calls, _ = self._parse_input(input)
        thread_id = config["configurable"]["thread_id"]
        rows = [(f"{thread_id}|{call['id']}", call["id"]) for call in tool_calls]
        marks = ", ".join(["(%s, %s)"] * len(rows))
        with self._saver.lock:  # autocommit: the statement is its own transaction
            self._saver.conn.execute(
                f"INSERT INTO {self.FLOOR_TABLE} (key, tool_call_id) VALUES {marks}",
                [value for row in rows for value in row])
        return super()._func(input, config, runtime)


def measure_floor(
    server: PostgresServer,
    n_calls: int,
    *,
    timing: Timing = TIMING,
) -> Comparison:
    """Time stock turns against `_PostgresFloorNode` on `DurablePostgresSaver`: the
    saver's fenced writes and one durable commit of intents, without the guard."""
    from graph_durable.checkpointers.postgres import DurablePostgresSaver

    stock = build_stock(server.create_database(f"stock_floor_{n_calls}"), n_calls)
    conn = _connect(server.create_database(f"floor_{n_calls}"))
    saver = DurablePostgresSaver(conn)
    saver.setup()
    floor = _compile("floor", _PostgresFloorNode(saver), saver, conn, n_calls)
    return compare(stock, floor, n_calls,
                   scenario=f"postgres turn, {_tool_calls(n_calls)}, floor: durable saver "
                            "+ ToolNode + one durable commit per tools step",
                   target=None, timing=timing)


# -- the async savers ----------------------------------------------------------------------


class _Loop:
    """An event loop running in a daemon thread; `run(coro)` waits for its result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name="benchmark-event-loop")
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


@dataclass
class AsyncAgent(Agent):
    """An `Agent` whose turn is `graph.ainvoke` on the event loop of `runner`; `conn` is
    an `AsyncConnection` or an `AsyncConnectionPool`, closed on that loop."""

    runner: _Loop | None = None

    def turn(self) -> dict[str, Any]:
        """Run one turn (model -> tools -> model) on a fresh thread_id, on the loop."""
        assert self.runner is not None
        self.last_thread_id = f"{self.name}-{next(self._threads)}"
        config = {"configurable": {"thread_id": self.last_thread_id}}
        return self.runner.run(self.graph.ainvoke(self.inputs, config, durability="sync"))

    def close(self) -> None:
        """Close the connection (or pool) on its loop."""
        assert self.runner is not None
        self.runner.run(self.conn.close())  # type: ignore[arg-type]


def compile_async(name: str, saver: Any, conn: Any, n_calls: int, runner: _Loop) -> AsyncAgent:
    """The turn of `turn_overhead` with an async model node and an async tool: stock
    (`ToolNode`) or guarded (`EffectGuardNode`, the tool idempotent), by `name`."""
    node = _guarded_node(True) if name == "guarded" else _stock_node(True)
    graph = _builder(node, n_calls, asynchronous=True).compile(checkpointer=saver)
    return AsyncAgent(name=name, graph=graph, conn=conn, saver=saver, runner=runner)


async def _aconnect(conninfo: str) -> Any:
    from psycopg import AsyncConnection
    from psycopg.rows import dict_row

    return await AsyncConnection.connect(conninfo, autocommit=True, prepare_threshold=0,
                                         row_factory=dict_row)


def _build_async(name: str, saver_type: Any, conninfo: str, n_calls: int, runner: _Loop
                 ) -> AsyncAgent:
    async def build() -> AsyncAgent:
        conn = await _aconnect(conninfo)
        saver = saver_type(conn)
        await saver.setup()
        return compile_async(name, saver, conn, n_calls, runner)

    return runner.run(build())


def build_stock_async(conninfo: str, n_calls: int, runner: _Loop) -> AsyncAgent:
    """`ToolNode` with LangGraph's `AsyncPostgresSaver` on database `conninfo`."""
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    return _build_async("stock", AsyncPostgresSaver, conninfo, n_calls, runner)


def build_guarded_async(conninfo: str, n_calls: int, runner: _Loop) -> AsyncAgent:
    """`EffectGuardNode` with `AsyncDurablePostgresSaver` on database `conninfo`."""
    from graph_durable.checkpointers.postgres import AsyncDurablePostgresSaver

    return _build_async("guarded", AsyncDurablePostgresSaver, conninfo, n_calls, runner)


def measure_async_scenario(
    server: PostgresServer,
    n_calls: int,
    runner: _Loop,
    *,
    target: float | None,
    timing: Timing = TIMING,
) -> Comparison:
    """`measure_scenario` with the async savers and `ainvoke`."""
    stock = build_stock_async(server.create_database(f"astock_{n_calls}"), n_calls, runner)
    guarded = build_guarded_async(server.create_database(f"aguarded_{n_calls}"), n_calls,
                                  runner)
    return compare(stock, guarded, n_calls,
                   scenario=f"postgres async turn, {_tool_calls(n_calls)}", target=target,
                   timing=timing)


def _server_version(server: PostgresServer) -> str:
    """`15.10`: the running server's version."""
    import psycopg

    with psycopg.connect(server.conninfo) as conn:
        number = conn.info.server_version  # e.g. 150010
    return f"{number // 10000}.{number % 10000}"


def main() -> list[Comparison]:
    """Run every scenario, print the table and append the rows to `results.md`."""
    _require_postgres()
    with _postgres_server() as server:
        versions = {
            "postgres": _server_version(server),
            "psycopg": package_version("psycopg"),
            "langgraph-checkpoint-postgres": package_version("langgraph-checkpoint-postgres"),
        }
        comparisons = [
            *each_scenario(SCENARIOS, lambda n_calls, target: measure_scenario(
                server, n_calls, target=target)),
            *each_scenario(SCENARIOS, lambda n_calls, _: measure_floor(server, n_calls)),
        ]
        runner = _Loop()
        try:
            comparisons += each_scenario(
                ASYNC_SCENARIOS, lambda n_calls, target: measure_async_scenario(
                    server, n_calls, runner, target=target),
                what="async savers, ainvoke:")
        finally:
            runner.stop()
    report("turn overhead on PostgreSQL: guarded (EffectGuardNode + DurablePostgresSaver, "
           "async: AsyncDurablePostgresSaver) vs stock (ToolNode + PostgresSaver, async: "
           "AsyncPostgresSaver), durability='sync'", comparisons,
           benchmark="turn_overhead_postgres", extra_versions=versions)
    return comparisons


if __name__ == "__main__":
    raise SystemExit(run_main(main))
