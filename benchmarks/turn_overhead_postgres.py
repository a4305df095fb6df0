"""Overhead of the effect guard on one agent turn on PostgreSQL: stock LangGraph vs graph_durable.

The turn of `benchmarks.turn_overhead` (model -> tools -> model on a fresh thread, run
with `durability="sync"`), with PostgreSQL checkpointers instead of SQLite ones:

- stock:   LangGraph `ToolNode` + `langgraph.checkpoint.postgres.PostgresSaver`
- guarded: `graph_durable.EffectGuardNode` +
           `graph_durable.checkpointers.postgres.DurablePostgresSaver`,
           the tool declared `Effect(idempotent=True)` and reading `current_effect().key`

A throwaway PostgreSQL server is started from the machine's own binaries
(`graph_durable.testing.postgres.PostgresServer`: a fresh cluster in a temporary folder,
listening on 127.0.0.1, `fsync` and `synchronous_commit` on) and stopped at the end.
Each variant gets its own database per scenario and one connection opened as LangGraph
expects (`autocommit=True, prepare_threshold=0, row_factory=dict_row`); `setup()` runs on
both savers before timing. Script, tools, checks, warm-up, turn-by-turn interleaving,
repetitions and the reported medians are those of `turn_overhead` (same `BENCH_TURNS`
and `BENCH_WARMUP` knobs). The project sets no target for PostgreSQL: the ratio
guarded/stock is printed and recorded without one. The server's processes share the
machine's CPUs with the benchmark, so on a small machine the figures include that
contention, for both variants alike.

Needs psycopg and langgraph-checkpoint-postgres (`pip install 'graph-durable[postgres]'`)
and PostgreSQL's server binaries (`initdb`, `pg_ctl`, `postgres`; found as
`PostgresServer` finds them, or named by `GRAPH_DURABLE_PG_BIN`); without them the
benchmark is skipped with a message.

Run: `python -m benchmarks turn_overhead_postgres`
(or `python -m benchmarks.turn_overhead_postgres`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks._runner import (
    BenchmarkSkipped,
    Comparison,
    missing_packages,
    package_version,
    report,
    run_main,
)
from benchmarks.turn_overhead import (
    REPETITIONS,
    TURNS,
    WARMUP,
    Agent,
    _announce,
    _compile,
    _guarded_node,
    _stock_node,
    _tool_calls,
    compare,
)
from graph_durable.testing.postgres import ENV_BIN, PostgresServer, find_postgres_bin

__all__ = ["SCENARIOS", "build_guarded", "build_stock", "main", "measure_scenario"]

SCENARIOS: dict[int, float | None] = {1: None, 5: None}
"""Tool calls per turn -> target ratio guarded/stock (none set for PostgreSQL)."""

_MODULES = ("psycopg", "langgraph.checkpoint.postgres")
"""What the PostgreSQL path imports (graph_durable's `postgres` extra)."""


def _require_postgres() -> None:
    """Raise `BenchmarkSkipped` unless the PostgreSQL packages and binaries are here."""
    missing = missing_packages(*_MODULES)
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
    repetitions: int = REPETITIONS,
    turns: int = TURNS,
    warmup: int = WARMUP,
    progress: Callable[[str], None] | None = print,
) -> Comparison:
    """Time stock and guarded turns with `n_calls` tool calls each, interleaved.

    Each variant runs on a new database of `server`.
    """
    stock = build_stock(server.create_database(f"stock_{n_calls}"), n_calls)
    guarded = build_guarded(server.create_database(f"guarded_{n_calls}"), n_calls)
    return compare(stock, guarded, n_calls, scenario=f"postgres turn, {_tool_calls(n_calls)}",
                   target=target, repetitions=repetitions, turns=turns, warmup=warmup,
                   progress=progress)


def _server_version(server: PostgresServer) -> str:
    """`15.10`: the running server's version."""
    import psycopg

    with psycopg.connect(server.conninfo) as conn:
        number = conn.info.server_version  # e.g. 150010
    return f"{number // 10000}.{number % 10000}"


def main() -> list[Comparison]:
    """Run every scenario, print the table and append the rows to `results.md`."""
    _require_postgres()
    comparisons: list[Comparison] = []
    with _postgres_server() as server:
        versions = {
            "postgres": _server_version(server),
            "psycopg": package_version("psycopg"),
            "langgraph-checkpoint-postgres": package_version("langgraph-checkpoint-postgres"),
        }
        for n_calls, target in SCENARIOS.items():
            _announce(n_calls)
            comparisons.append(measure_scenario(server, n_calls, target=target))
    report("turn overhead on PostgreSQL: guarded (EffectGuardNode + DurablePostgresSaver) "
           "vs stock (ToolNode + PostgresSaver), durability='sync'", comparisons,
           benchmark="turn_overhead_postgres", extra_versions=versions)
    return comparisons


if __name__ == "__main__":
    raise SystemExit(run_main(main))
