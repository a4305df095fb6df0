"""The throwaway PostgreSQL server used by tests of the PostgreSQL path."""

from __future__ import annotations

import os

import psycopg
import pytest

from graph_durable.testing.postgres import PostgresServer


def test_server_runs_queries_and_keeps_a_table(postgres_conninfo: str) -> None:
    with psycopg.connect(postgres_conninfo) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL)")
        conn.execute("INSERT INTO items VALUES (1, 'one'), (2, 'two')")
    with psycopg.connect(postgres_conninfo) as conn:  # a new connection sees the commit
        rows = conn.execute("SELECT id, name FROM items ORDER BY id").fetchall()
    assert rows == [(1, "one"), (2, "two")]


def test_server_keeps_durability_defaults(postgres_conninfo: str) -> None:
    with psycopg.connect(postgres_conninfo) as conn:
        assert conn.execute("SHOW fsync").fetchone() == ("on",)
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)


def test_created_databases_are_isolated(postgres_server: PostgresServer) -> None:
    first = postgres_server.create_database("gd_isolation_a")
    second = postgres_server.create_database("gd_isolation_b")
    assert first != second
    with psycopg.connect(first) as conn:
        name = conn.execute("SELECT current_database()").fetchone()
        assert name == ("gd_isolation_a",)
        conn.execute("CREATE TABLE only_in_a (x int)")
    with psycopg.connect(second) as conn:
        name = conn.execute("SELECT current_database()").fetchone()
        assert name == ("gd_isolation_b",)
        found = conn.execute("SELECT to_regclass('only_in_a')").fetchone()
        assert found == (None,)


def test_drop_database_closes_its_sessions_and_frees_it(postgres_server: PostgresServer) -> None:
    conninfo = postgres_server.create_database("gd_dropped")
    left_open = psycopg.connect(conninfo)  # a session a killed test would leave behind
    postgres_server.drop_database("gd_dropped")
    with psycopg.connect(postgres_server.conninfo) as conn:
        found = conn.execute("SELECT count(*) FROM pg_database WHERE datname = 'gd_dropped'")
        assert found.fetchone() == (0,)
    with pytest.raises(psycopg.OperationalError):
        left_open.execute("SELECT 1")
    left_open.close()
    postgres_server.drop_database("gd_dropped")  # a missing database is not an error


def test_stop_stops_the_server_and_removes_its_folder() -> None:
    server = PostgresServer()
    server.stop()  # stopping a server never started is a no-op
    with server:
        conninfo = server.conninfo
        data_dir = server.data_dir
        assert server.running
        assert os.path.isdir(data_dir)
        with psycopg.connect(conninfo) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    assert not server.running
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(conninfo, connect_timeout=5)
    assert not os.path.exists(data_dir)
    assert not os.path.exists(os.path.dirname(data_dir))
    server.stop()  # idempotent
    server.stop()


def test_a_server_whose_owner_was_killed_is_swept_by_the_next_start() -> None:
    """pytest killed by a signal runs no atexit hook: the next server started in the
    same base folder stops the orphan and removes its folder."""
    import os
    import signal
    import subprocess
    import sys

    import psycopg

    import shutil
    import tempfile
    from pathlib import Path

    base = Path(tempfile.mkdtemp(prefix="gd-sweep-"))  # short: socket paths are short
    os.chmod(base, 0o755)
    try:
        _sweep_test(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _sweep_test(base) -> None:
    import os
    import signal
    import subprocess
    import sys
    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from graph_durable.testing.postgres import PostgresServer\n"
         f"s = PostgresServer({str(base)!r}).start()\n"
         "print(s.port, s.data_dir, flush=True)\n"
         "time.sleep(600)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        port, data_dir = owner.stdout.readline().split()
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(30)
    orphan = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    with psycopg.connect(orphan, connect_timeout=5) as conn:  # left running
        conn.execute("SELECT 1")
    with PostgresServer(str(base)) as server:
        assert server.port != int(port)
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(orphan, connect_timeout=5)
        assert not os.path.exists(os.path.dirname(data_dir))
        assert [p.name for p in base.iterdir()] == [os.path.basename(
            os.path.dirname(server.data_dir))]
