"""pytest plugin loaded into LangGraph's own test suites (see `graph_durable.testing.upstream`).

Set by the runner through the environment:

- `GRAPH_DURABLE_UPSTREAM_SIDE`: `stock` runs the suite as shipped; `ours` swaps
  graph_durable's savers in for the stock classes before any test module imports them
  (`SqliteSaver`, `AsyncSqliteSaver`, `PostgresSaver`, `AsyncPostgresSaver`; the
  shallow saver stays stock).
- `GRAPH_DURABLE_UPSTREAM_REPORT`: a JSON file the outcome of every test is written to.
- `GRAPH_DURABLE_UPSTREAM_FILTER`: `savers` keeps, of langgraph's tests, only those
  parametrised by a SQLite or PostgreSQL checkpointer (and drops the Redis cache, whose
  server the suites do not start).

The suites' PostgreSQL tests expect a server at a fixed port; the plugin starts a
throwaway one (`PostgresServer`, in `/dev/shm` where there is one and with `fsync`
off: the suites create a database per test, and none of them is about crashes) and points the suites' `DEFAULT_POSTGRES_URI`
and `DEFAULT_URI` at it.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest

SIDE = "GRAPH_DURABLE_UPSTREAM_SIDE"
REPORT = "GRAPH_DURABLE_UPSTREAM_REPORT"
FILTER = "GRAPH_DURABLE_UPSTREAM_FILTER"

# The checkpointer parameters of langgraph's conftest that are SQLite or PostgreSQL.
SAVER_PARAMS = frozenset({
    "sqlite", "sqlite_aes", "sqlite_aio", "postgres", "postgres_pipe", "postgres_pool",
    "postgres_aio", "postgres_aio_pipe", "postgres_aio_pool",
})

_outcomes: dict[str, dict[str, Any]] = {}
_server: Any = None


def swap_savers() -> None:
    """Bind the stock saver names to graph_durable's savers (ours subclass them)."""
    import langgraph.checkpoint.sqlite as sqlite_mod
    import langgraph.checkpoint.sqlite.aio as sqlite_aio_mod

    from graph_durable.checkpointers import AsyncDurableSqliteSaver, DurableSqliteSaver

    sqlite_mod.SqliteSaver = DurableSqliteSaver  # type: ignore[misc]
    sqlite_aio_mod.AsyncSqliteSaver = AsyncDurableSqliteSaver  # type: ignore[misc]
    import langgraph.checkpoint.postgres as pg_mod
    import langgraph.checkpoint.postgres.aio as pg_aio_mod

    from graph_durable.checkpointers.postgres import (
        AsyncDurablePostgresSaver,
        DurablePostgresSaver,
    )

    pg_mod.PostgresSaver = DurablePostgresSaver  # type: ignore[misc]
    pg_aio_mod.AsyncPostgresSaver = AsyncDurablePostgresSaver  # type: ignore[misc]


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Swap before the suite's conftest imports the saver names."""
    side = os.environ.get(SIDE, "stock")
    if side not in ("stock", "ours"):
        raise pytest.UsageError(f"{SIDE} must be 'stock' or 'ours', not {side!r}")
    if side == "ours":
        swap_savers()


def _base_uri() -> str:
    global _server
    if _server is None:
        from graph_durable.testing.postgres import PostgresServer

        shm = "/dev/shm"  # in memory: CREATE DATABASE ten times faster than on disk
        _server = PostgresServer(shm if os.path.isdir(shm) and os.access(shm, os.W_OK)
                                 else None).start()
        import psycopg

        # The suites create a database per test; nothing here is about crashes, so the
        # server need not flush to disk (this server only, removed at the end).
        with psycopg.connect(_server.conninfo, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET fsync = off")
            conn.execute("ALTER SYSTEM SET synchronous_commit = off")
            conn.execute("SELECT pg_reload_conf()")
    return f"postgres://postgres:postgres@127.0.0.1:{_server.port}/"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the saver-parametrised tests (when asked); point the suite at our server."""
    if os.environ.get(FILTER) == "savers":
        kept, dropped = [], []
        for item in items:
            params = getattr(getattr(item, "callspec", None), "params", {})
            savers = {v for k, v in params.items() if "checkpointer" in k}
            ok = bool(savers & SAVER_PARAMS) and params.get("cache") != "redis"
            (kept if ok else dropped).append(item)
        items[:] = kept
        config.hook.pytest_deselected(items=dropped)
    if os.environ.get(SIDE) == "ours":
        _check_swapped()
    if not items:
        return
    base = _base_uri()
    for name, module in list(sys.modules.items()):
        if name == "tests" or name.startswith("tests."):
            if hasattr(module, "DEFAULT_POSTGRES_URI"):
                module.DEFAULT_POSTGRES_URI = base
            if hasattr(module, "DEFAULT_URI"):
                module.DEFAULT_URI = base + "postgres?sslmode=disable"


_STOCK_NAMES = ("SqliteSaver", "AsyncSqliteSaver", "PostgresSaver", "AsyncPostgresSaver")


def _check_swapped() -> None:
    """Every saver name the suite's modules imported is ours (a swap made too late
    would silently compare stock with stock)."""
    from graph_durable.checkpointers._base import DurableSaverMixin

    for name, module in list(sys.modules.items()):
        if not (name == "tests" or name.startswith("tests.")):
            continue
        for attr in _STOCK_NAMES:
            cls = getattr(module, attr, None)
            if isinstance(cls, type) and not issubclass(cls, DurableSaverMixin):
                raise pytest.UsageError(
                    f"{name}.{attr} is still the stock saver: the swap came too late")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Record each test's outcome: passed, failed, skipped or error (setup/teardown)."""
    entry = _outcomes.setdefault(report.nodeid, {"outcome": "passed", "message": "",
                                                 "seconds": 0.0})
    entry["seconds"] += report.duration
    if report.passed:
        return
    if report.skipped:
        if entry["outcome"] == "passed":
            entry["outcome"] = "skipped"
        return
    outcome = "failed" if report.when == "call" else "error"
    if entry["outcome"] in ("passed", "skipped"):
        entry["outcome"] = outcome
        entry["message"] = _message(report)


def _message(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return " ".join(text.split())[:300]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the outcomes; stop the server."""
    global _server
    path = os.environ.get(REPORT)
    if path:
        with open(path, "w") as f:
            json.dump(_outcomes, f, indent=1, sort_keys=True)
    if _server is not None:
        _server.stop()
        _server = None
