"""Damage contained: one damaged row of thread `A` in a database of three threads waiting
for approval, on SQLite and PostgreSQL. Every view lists `B` and `C` and names `A` as
`damaged`; `check` names the row; resuming `A` raises `LedgerDamaged` before anything is
sent; `B` and `C` resume and finish."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.types import Command

from graph_durable import LedgerDamaged, find_orphans, inbox, recover, thread_status
from graph_durable.cli import main
from graph_durable.operators.notebook import Inbox
from graph_durable.testing.savers import close_saver
from graph_durable.testing.scenarios.effects import EffectsAgent, build_effects_agent

THREADS = ("A", "B", "C")
APPROVE = Command(resume={"call_0_0": {"type": "approve"}})

# What each kind of damage writes into thread A, and where `check` finds it:
# (table, column). `newer` is a row a newer release wrote: a status this one does not
# know, in a database whose schema is newer than the one this release knows.
LATER = time.time() + 10 * 366 * 86400
DAMAGE: dict[str, tuple[list[str], str, str]] = {
    "status": (["UPDATE effects SET status = 'bogus' WHERE thread_id = 'A'"],
               "effects", "status"),
    "json": (["UPDATE effects SET args = '{not json' WHERE thread_id = 'A'"],
             "effects", "args"),
    "event": (["UPDATE effect_events SET data = '[1, 2' WHERE thread_id = 'A' "
               "AND kind = 'asked'"], "effect_events", "data"),
    "lease": ([f"INSERT INTO thread_leases (thread_id, owner, token, expires_at, acquired_at) "
               f"VALUES ('A', 'restored-from-backup', 7, {LATER}, 0)"],
              "thread_leases", "expires_at"),
    "newer": (["INSERT INTO graph_durable_migrations (v, applied_at) VALUES (99, 0)",
               "UPDATE effects SET status = 'held_for_audit' WHERE thread_id = 'A'"],
              "effects", "status"),
    "checkpoint": ([], "checkpoints", "checkpoint"),  # per engine, below
}
CHECKPOINT_DAMAGE = {
    "sqlite": "UPDATE checkpoints SET checkpoint = X'05' WHERE thread_id = 'A'",
    "postgres": "UPDATE checkpoints SET checkpoint = '5'::jsonb WHERE thread_id = 'A'",
}


class Database:
    """The agent, a way to write raw SQL into its database, and its CLI address."""

    def __init__(self, agent: EffectsAgent, engine: str, execute: Callable[[str], None],
                 db: str) -> None:
        self.agent, self.engine, self.execute, self.db = agent, engine, execute, db

    def damage(self, kind: str) -> None:
        statements, _, _ = DAMAGE[kind]
        for sql in statements or [CHECKPOINT_DAMAGE[self.engine]]:
            self.execute(sql)


# PostgreSQL's runs are marked `backends` (make test-sweeps, which CI runs) to keep make
# test under ten minutes.
@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.backends)])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """Three threads, each waiting for approval of one charge, on the engine named."""
    db_path = str(tmp_path / "agent.sqlite")
    spec: Any = None
    if request.param == "postgres":
        from psycopg.conninfo import conninfo_to_dict

        conninfo = request.getfixturevalue("postgres_conninfo")
        spec = {"backend": "postgres", "conninfo": conninfo}
        parts = conninfo_to_dict(conninfo)
        db = f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"
    else:
        db = db_path
    agent = build_effects_agent(db_path, str(tmp_path), [[["charge", "1"]]],
                                {"charge": "blind"}, saver=spec, approvals=["charge"])
    for thread in THREADS:
        agent.graph.invoke(agent.inputs, _config(thread), durability="sync")

    def execute(sql: str) -> None:
        if spec is None:
            with sqlite3.connect(db_path) as conn:
                conn.execute(sql)
        else:
            import psycopg

            with psycopg.connect(spec["conninfo"], autocommit=True) as conn:
                conn.execute(sql)

    yield Database(agent, request.param, execute, db)
    close_saver(agent.saver)


def _config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main([*args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_one_damaged_row_is_named_everywhere_and_the_other_threads_run(
    database: Database, kind: str, capsys: pytest.CaptureFixture[str],
) -> None:
    saver, graph = database.agent.saver, database.agent.graph
    assert saver.check().ok, saver.check().damage
    database.damage(kind)
    _, table, column = DAMAGE[kind]

    # `check` names the row, and nothing else of the three threads.
    report = saver.check()
    named = [d for d in report.damage if d.kind == "row"]
    assert [(d.thread_id, d.table, d.column) for d in named] == [("A", table, column)]
    if kind == "newer":
        assert [d.kind for d in report.damage if d.kind != "row"] == ["schema"]
        assert "newer graph_durable" in named[0].problem
    code, out, _ = _cli(capsys, "check", "--db", database.db, "--json")
    assert code == 1 and json.loads(out)["damaged_threads"] == ["A"]

    # Views: B and C as they are, A damaged with the row named.
    statuses = {t: thread_status(saver, t) for t in THREADS}
    assert {t: s.status for t, s in statuses.items()} == {
        "A": "damaged", "B": "waiting", "C": "waiting"}
    assert f"column {column}" in statuses["A"].reason
    items = {(i.thread_id, i.kind) for i in inbox(saver)}
    assert items == {("A", "damaged"), ("B", "approval"), ("C", "approval")}
    assert [(o.thread_id, o.outcome) for o in recover(graph, saver, "sweeper")] == [
        ("A", "damaged")]
    assert find_orphans(saver) == []
    box = Inbox(graph, saver)
    assert sorted(box.threads) == ["B", "C"] and list(box.damaged) == ["A"]
    listed = {"effects": saver.effects(), "effect_events": saver.events()}
    for name, rows in listed.items():
        assert {"B", "C"} <= {r.thread_id for r in rows}
        assert [d.thread_id for d in rows.damaged] == (["A"] if name == table else [])

    # The CLI's read commands: exit 3 when they passed damage by.
    for command in (["threads"], ["status"], ["pending"], ["show", "A"]):
        code, out, err = _cli(capsys, *command, "--db", database.db, "--json")
        assert code == 3, (command, err)
        assert "damaged" in out and "graph-durable check" in err
        if command[0] != "show":
            assert {"B", "C"} <= {row["thread"] for row in json.loads(out)}
    for command, reads in ((["effects"], "effects"), (["events"], "effect_events")):
        code, out, _ = _cli(capsys, *command, "--db", database.db, "--json")
        rows = json.loads(out)
        assert {"B", "C"} <= {row["thread"] for row in rows}
        assert code == (3 if table == reads else 0)
        assert [r["thread"] for r in rows if r.get("status", r.get("kind")) == "damaged"] == (
            ["A"] if table == reads else [])

    # Resuming A raises before anything is sent; B and C finish.
    charges = database.agent.providers["charge"]
    # (A damaged journal entry: the approval answers the question it records.)
    with pytest.raises(LedgerDamaged) as raised:
        graph.invoke(APPROVE, _config("A"), durability="sync")
    assert raised.value.thread_id == "A" and raised.value.column == column
    assert "graph-durable check" in str(raised.value)
    assert charges.count() == 0
    if kind == "event":  # its rows readable: the approval was not recorded
        assert [(r.status.value, r.decision) for r in saver.effects("A")] == [
            ("awaiting_approval", None)]
    for thread in ("B", "C"):
        done = graph.invoke(APPROVE, _config(thread), durability="sync")
        assert done["messages"][-1].content == "All done."
    assert charges.count() == 2
    assert {thread_status(saver, t).status for t in ("B", "C")} == {"done"}


def test_a_healthy_database_checks_clean_and_the_cli_says_so(
    database: Database, capsys: pytest.CaptureFixture[str],
) -> None:
    report = database.agent.saver.check()
    assert report.ok and report.damage == [] and report.rows["effects"] == 3
    assert report.engine == ("postgresql" if database.engine == "postgres" else "sqlite")
    code, out, _ = _cli(capsys, "check", "--db", database.db)
    assert code == 0 and "no damage found" in out
    code, out, err = _cli(capsys, "check", "--url", database.db, "--json")
    if database.engine == "postgres":
        assert code == 0 and json.loads(out)["ok"] is True
        assert json.loads(out)["database"] == "postgresql://" + database.db.rpartition("@")[2]
    else:
        assert code == 2 and "--url" in err and out == ""


def test_a_schema_newer_than_this_release_is_said_and_its_threads_still_run(
    database: Database, caplog: pytest.LogCaptureFixture,
) -> None:
    """A newer release migrated the database (as during a rolling upgrade): a saver set
    up on it says so once, `check` reports the schema, and the threads run on."""
    from graph_durable.checkpointers.postgres import DurablePostgresSaver
    from graph_durable.checkpointers.sqlite import DurableSqliteSaver

    database.execute("INSERT INTO graph_durable_migrations (v, applied_at) VALUES (99, 0)")
    opened = DurablePostgresSaver if database.engine == "postgres" else DurableSqliteSaver
    with caplog.at_level(logging.WARNING, logger="graph_durable"):
        with opened.from_conn_string(database.db) as saver:
            saver.setup()
            report = saver.check()
    said = [r.getMessage() for r in caplog.records if "ledger schema" in r.getMessage()]
    assert len(said) == 1 and "version 99, newer than this graph_durable knows" in said[0]
    assert [d.kind for d in report.damage] == ["schema"]
    done = database.agent.graph.invoke(APPROVE, _config("B"), durability="sync")
    assert done["messages"][-1].content == "All done."
    assert database.agent.providers["charge"].count() == 1



@pytest.mark.parametrize("runs_from", ["known", "newer", "stale"])
def test_a_newer_schema_that_says_this_release_runs_on_it_is_no_finding(
    database: Database, runs_from: str, caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A newer release whose migrations leave the database as this release uses it (an
    index added or dropped) records so (`runs_from`): this release then runs on it
    without a warning, and `check` finds nothing. A `runs_from` newer than this release,
    or one recorded for another schema, is said as a newer schema is."""
    from graph_durable.checkpointers._schema import (
        MIGRATIONS, PG_MIGRATIONS, PG_RUNS_FROM, SQLITE_RUNS_FROM, runs_from_value)
    from graph_durable.checkpointers.postgres import DurablePostgresSaver
    from graph_durable.checkpointers.sqlite import DurableSqliteSaver

    postgres = database.engine == "postgres"
    opened = DurablePostgresSaver if postgres else DurableSqliteSaver
    with opened.from_conn_string(database.db) as saver:  # what this release recorded
        saver.setup()
        [(recorded,)] = saver.conn.execute(
            "SELECT value FROM ledger_meta WHERE name = 'runs_from'").fetchall() if not postgres \
            else [tuple(row.values()) for row in saver.conn.execute(
                "SELECT value FROM ledger_meta WHERE name = 'runs_from'").fetchall()]
    assert json.loads(recorded) == {
        "schema": len(PG_MIGRATIONS if postgres else MIGRATIONS) - 1,
        "runs_from": PG_RUNS_FROM if postgres else SQLITE_RUNS_FROM}

    known = len(PG_MIGRATIONS if postgres else MIGRATIONS) - 1
    # A newer release at schema 99 that this one runs on, one it does not, and a row
    # left for an older schema (a release that migrated later did not write one).
    value = {"known": (99, known), "newer": (99, 99), "stale": (known, known)}[runs_from]
    database.execute("INSERT INTO graph_durable_migrations (v, applied_at) VALUES (99, 0)")
    database.execute(f"UPDATE ledger_meta SET value = '{runs_from_value(*value)}' "
                     "WHERE name = 'runs_from'")
    with caplog.at_level(logging.WARNING, logger="graph_durable"):
        with opened.from_conn_string(database.db) as saver:
            saver.setup()
            report = saver.check()
    said = [r.getMessage() for r in caplog.records if "ledger schema" in r.getMessage()]
    code, out, _ = _cli(capsys, "check", "--db", database.db, "--json")
    if runs_from == "known":
        assert said == [] and report.ok and report.schema == (99, known)
        assert code == 0 and json.loads(out)["ok"] is True
    else:
        assert len(said) == 1 and [d.kind for d in report.damage] == ["schema"]
        assert code == 1
    done = database.agent.graph.invoke(APPROVE, _config("B"), durability="sync")
    assert done["messages"][-1].content == "All done."
    assert database.agent.providers["charge"].count() == 1