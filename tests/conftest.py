"""Shared fixtures: real PostgreSQL servers, and every durable saver to run tests on.

`postgres_server` starts one server per test session from the machine's binaries (see
`graph_durable.testing.postgres`); `postgres_conninfo` gives each test a fresh database
on it. The binaries are required: without them the fixtures fail, they do not skip.

`saver_backend` parametrises a test over every durable saver
(`graph_durable.testing.savers.BACKENDS`): SQLite, PostgreSQL, and async PostgreSQL on
a pool (those two marked `backends`). A test opens its savers with `make_saver` (sync use) or `amake_saver` (on the
test's event loop), and passes `saver_spec` to scenario factories a child process runs.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from graph_durable.testing.postgres import ENV_BIN, PostgresServer, find_postgres_bin
from graph_durable.testing.savers import (
    BACKENDS,
    SaverSpec,
    aclose_saver,
    aopen_saver,
    close_saver,
    open_saver,
)

_database_numbers = itertools.count(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked `long` run first (else in their order): `make test` hands tests to
    its workers one at a time, so a long one started last would run on alone."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A running PostgreSQL server shared by the whole session, stopped at its end."""
    if find_postgres_bin() is None:
        pytest.fail(
            "PostgreSQL server binaries (initdb, pg_ctl, postgres) are required for "
            f"these tests and none were found: install PostgreSQL or set {ENV_BIN} to "
            "the directory holding them.", pytrace=False)
    with PostgresServer() as server:
        yield server


@pytest.fixture
def postgres_conninfo(postgres_server: PostgresServer) -> Iterator[str]:
    """libpq connection string of a new, empty database for this test, dropped after it
    (a full run creates hundreds, about 8 MB each)."""
    name = f"gd_test_{next(_database_numbers)}"
    yield postgres_server.create_database(name)
    postgres_server.drop_database(name)


@pytest.fixture(params=[backend if backend == "sqlite" else
                        pytest.param(backend, marks=pytest.mark.backends)
                        for backend in BACKENDS])
def saver_backend(request: pytest.FixtureRequest) -> str:
    """The durable saver this run of the test is on (one run per backend). The runs on
    PostgreSQL are marked `backends`: `make test-sweeps` runs them (CI runs both), so
    that `make test` stays under ten minutes; PostgreSQL's own tests stay in it."""
    return request.param


@pytest.fixture
def saver_spec(saver_backend: str, request: pytest.FixtureRequest) -> SaverSpec | None:
    """This test's database for `saver_backend`, as scenario factories take it (`None`:
    SQLite on the scenario's `db_path`)."""
    if saver_backend == "sqlite":
        return None
    return {"backend": saver_backend,  # type: ignore[typeddict-item]
            "conninfo": request.getfixturevalue("postgres_conninfo")}


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    """The SQLite database of this test (unused on PostgreSQL)."""
    return str(tmp_path / "agent.sqlite")


@pytest.fixture
def make_saver(saver_spec: SaverSpec | None, db_path: str) -> Iterator[Callable[..., Any]]:
    """`make_saver(**kwargs)`: a new saver on this test's database, for sync use; each
    call opens another (as another process would); all are closed after the test."""
    opened: list[Any] = []

    def make(**kwargs: Any) -> Any:
        saver = open_saver(saver_spec, db_path, **kwargs)
        opened.append(saver)
        return saver

    yield make
    for saver in reversed(opened):
        close_saver(saver)


@pytest.fixture
async def amake_saver(saver_spec: SaverSpec | None, db_path: str
                      ) -> AsyncIterator[Callable[..., Any]]:
    """`await amake_saver(**kwargs)`: a new saver on this test's database, on the test's
    event loop (for `ainvoke`); all are closed after the test."""
    opened: list[Any] = []

    async def make(**kwargs: Any) -> Any:
        saver = await aopen_saver(saver_spec, db_path, **kwargs)
        opened.append(saver)
        return saver

    yield make
    for saver in reversed(opened):
        await aclose_saver(saver)


@pytest.fixture
def otel() -> Iterator[tuple[Any, Any]]:
    """`(spans, metrics)`: the OpenTelemetry SDK's in-memory span exporter and metric
    reader, which guarded calls report to for the test (`telemetry.configure`)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from graph_durable import telemetry

    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    metrics = InMemoryMetricReader()
    telemetry.configure(tracer_provider=tracer_provider,
                        meter_provider=MeterProvider(metric_readers=[metrics]))
    yield spans, metrics
    telemetry.configure()
