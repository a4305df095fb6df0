"""`ledger_meta`'s `runs_from` row: which releases run on a database, written by the
release that migrated it (see `_schema.RUNS_FROM`; what readers make of it is in
`tests/test_damage.py`)."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import psycopg
import pytest

from graph_durable.checkpointers import AsyncDurableSqliteSaver, DurableSqliteSaver
from graph_durable.checkpointers._schema import (
    MIGRATIONS,
    PG_MIGRATIONS,
    PG_RUNS_FROM,
    SQLITE_RUNS_FROM,
    runs_from_value,
    runs_on,
)
from graph_durable.checkpointers.postgres import AsyncDurablePostgresSaver, DurablePostgresSaver

_READ = "SELECT value FROM ledger_meta WHERE name = %s"


def _sqlite_row(path: Path, name: str = "runs_from") -> str | None:
    with closing(sqlite3.connect(path)) as conn:
        row = conn.execute(_READ.replace("%s", "?"), (name,)).fetchone()
    return None if row is None else row[0]


def _postgres_row(conninfo: str) -> str | None:
    with psycopg.connect(conninfo) as conn:
        row = conn.execute(_READ, ("runs_from",)).fetchone()
    return None if row is None else row[0]


SQLITE_ROW = {"schema": len(MIGRATIONS) - 1, "runs_from": SQLITE_RUNS_FROM}
POSTGRES_ROW = {"schema": len(PG_MIGRATIONS) - 1, "runs_from": PG_RUNS_FROM}


def test_a_sync_sqlite_saver_records_which_releases_run_on_what_it_migrated(
        tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite"
    with DurableSqliteSaver.from_conn_string(str(path)) as saver:
        saver.setup()
    assert json.loads(_sqlite_row(path) or "null") == SQLITE_ROW


async def test_an_async_sqlite_saver_records_which_releases_run_on_what_it_migrated(
        tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite"
    async with AsyncDurableSqliteSaver.from_conn_string(str(path)) as saver:
        await saver.setup()
    assert json.loads(_sqlite_row(path) or "null") == SQLITE_ROW


def test_a_sync_postgres_saver_records_which_releases_run_on_what_it_migrated(
        postgres_conninfo: str) -> None:
    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as saver:
        saver.setup()
    assert json.loads(_postgres_row(postgres_conninfo) or "null") == POSTGRES_ROW


async def test_an_async_postgres_saver_records_which_releases_run_on_what_it_migrated(
        postgres_conninfo: str) -> None:
    async with AsyncDurablePostgresSaver.from_conn_string(postgres_conninfo) as saver:
        await saver.setup()
    assert json.loads(_postgres_row(postgres_conninfo) or "null") == POSTGRES_ROW


def test_a_setup_that_migrates_nothing_leaves_a_newer_releases_row(tmp_path: Path) -> None:
    """A database a newer release migrated, missing its key secret (so this release's
    setup has something to write): the key secret is stored, the newer release's row
    is not overwritten with this release's."""
    path = tmp_path / "a.sqlite"
    with DurableSqliteSaver.from_conn_string(str(path)) as saver:
        saver.setup()
    newer = runs_from_value(99, 97)
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("INSERT INTO graph_durable_migrations (v, applied_at) VALUES (99, 0)")
        conn.execute("UPDATE ledger_meta SET value = ? WHERE name = 'runs_from'", (newer,))
        conn.execute("DELETE FROM ledger_meta WHERE name = 'key_secret'")
        conn.commit()
    with DurableSqliteSaver.from_conn_string(str(path)) as saver:
        saver.setup()
    assert _sqlite_row(path, "key_secret") is not None
    assert _sqlite_row(path) == newer


@pytest.mark.parametrize("value", [
    None, "", "not json", "[]", "99", '{"schema": 99}', '{"runs_from": 5}',
    '{"schema": 99, "runs_from": 1e999}', '{"schema": Infinity, "runs_from": 5}',
    '{"schema": 99.0, "runs_from": 5}', '{"schema": "99", "runs_from": 5}',
    '{"schema": 99, "runs_from": true}', "[" * 100_000 + "]" * 100_000,
    '{"schema": 98, "runs_from": 5}', '{"schema": 99, "runs_from": 10}',
])
def test_a_row_this_release_cannot_read_or_is_not_named_in_says_it_cannot_run(
        value: str | None) -> None:
    assert runs_on(value, 99, 9) is False


def test_a_row_for_the_databases_schema_that_names_this_release_says_it_runs() -> None:
    assert runs_on(runs_from_value(99, 9), 99, 9) is True
    assert runs_on(runs_from_value(99, 3), 99, 9) is True
