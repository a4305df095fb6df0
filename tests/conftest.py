"""Shared fixtures: a real PostgreSQL server for tests of the PostgreSQL path.

`postgres_server` starts one server per test session from the machine's binaries (see
`graph_durable.testing.postgres`); `postgres_conninfo` gives each test a fresh database
on it. The binaries are required: without them the fixtures fail, they do not skip.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from graph_durable.testing.postgres import ENV_BIN, PostgresServer, find_postgres_bin

_database_numbers = itertools.count(1)


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
def postgres_conninfo(postgres_server: PostgresServer) -> str:
    """libpq connection string of a new, empty database for this test."""
    return postgres_server.create_database(f"gd_test_{next(_database_numbers)}")
