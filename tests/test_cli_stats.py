"""`graph-durable stats`: the ledger's gauges from a shell, read-only, as a table or JSON;
exit 1 when an effect is unknown or orphaned."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from datetime import datetime
from pathlib import Path

from graph_durable import DurableSqliteSaver
from graph_durable.checkpointers.postgres import DurablePostgresSaver
from tests.checkpointers.test_stats import fill
from tests.test_cli import cli
from tests.test_gauges import with_checkpoint


def test_stats_json_on_a_read_only_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.sqlite"
    saver = DurableSqliteSaver(sqlite3.connect(path, check_same_thread=False))
    fill(saver)
    with_checkpoint(saver, "t1")
    saver.conn.close()
    before = path.read_bytes()
    os.chmod(path, stat.S_IRUSR)
    try:
        out = cli("stats", "--db", str(path), "--json")
    finally:
        os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
    assert out.returncode == 1, out.stderr  # an unknown effect and two orphans
    data = json.loads(out.stdout)
    assert data["effects"]["unknown"] == 1 and data["unknown"] == 1
    assert data["in_flight"] == 1 and data["questions_waiting"] == 2
    assert data["orphans"] == 2 and data["threads"] == 2
    datetime.fromisoformat(data["oldest_question_at"])  # ISO 8601, as every --json time
    datetime.fromisoformat(data["read_at"])
    assert path.read_bytes() == before

    table = cli("stats", "--db", str(path))
    assert "questions waiting: 2" in table.stdout and "orphans: 2" in table.stdout


def test_stats_exit_0_when_nothing_needs_a_person(tmp_path: Path) -> None:
    path = tmp_path / "agent.sqlite"
    DurableSqliteSaver(sqlite3.connect(path, check_same_thread=False)).setup()
    out = cli("stats", "--db", str(path), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["questions_waiting"] == 0 and data["oldest_question_at"] is None


def test_stats_on_postgresql(postgres_conninfo: str) -> None:
    from psycopg.conninfo import conninfo_to_dict

    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as saver:
        fill(saver)
    parts = conninfo_to_dict(postgres_conninfo)
    url = f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"
    out = cli("stats", "--db", url, "--json")
    assert out.returncode == 1, out.stderr
    data = json.loads(out.stdout)
    assert data["unknown"] == 1 and data["questions_waiting"] == 2 and data["orphans"] == 0
