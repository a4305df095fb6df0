"""The graph-durable command, run as a real subprocess (and in-process for its tables):
reading never writes, every bad input is one line and a non-zero exit, and answering a
call resumes the thread or only journals the decision."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from graph_durable import DurableSqliteSaver
from graph_durable.testing import FakeProvider, FaultPlan, InjectedCrash, arm, disarm
from graph_durable.testing.crash.child import run_child
from graph_durable.testing.scenarios.effects import build_effects_agent

ROOT = Path(__file__).resolve().parent.parent


def cli_graph(saver: Any) -> Any:
    """--graph target: the scenario's graph, compiled on the CLI's saver."""
    agent = build_effects_agent(**json.loads(os.environ["CLI_SCENARIO"]))
    return agent.graph.builder.compile(checkpointer=saver)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "graph_durable.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, **(env or {})})


def _crashed_after_mail(tmp_path: Path, turns: list[Any], modes: dict[str, str]) -> Any:
    """The scenario agent on `tmp_path`, its thread `t` crashed after the mail applied."""
    kwargs = {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path),
              "turns": turns, "modes": modes}
    agent = build_effects_agent(**kwargs)
    arm(FaultPlan("after_effect", tool="mail", action="raise"))
    try:
        agent.graph.invoke(agent.inputs, {"configurable": {"thread_id": "t"}},
                           durability="sync")
    except InjectedCrash:
        pass
    finally:
        disarm()
    return agent, kwargs["db_path"], {"CLI_SCENARIO": json.dumps(kwargs)}


def test_cli_lists_recovers_and_decides(tmp_path: Path) -> None:
    _, db, env = _crashed_after_mail(tmp_path, [[["pay", "1"]], [["mail", "2"]]],
                                     {"pay": "lookup", "mail": "blind"})

    status = json.loads(cli("status", "--db", db, "--json").stdout)
    assert status == [{"thread": "t", "status": "orphaned", "reason": status[0]["reason"]}]
    effects = json.loads(cli("effects", "--db", db, "--json").stdout)
    assert [(e["tool"], e["status"]) for e in effects] == [("pay", "applied"),
                                                          ("mail", "in_flight")]

    swept = cli("recover", "--db", db, "--graph", "tests.test_cli:cli_graph",
                "--owner", "ops", "--json", env=env)
    assert swept.returncode == 0, swept.stderr
    assert json.loads(swept.stdout) == [{"thread": "t", "outcome": "resumed",
                                         "status": "needs_human", "error": None}]
    pending = json.loads(cli("pending", "--db", db, "--thread", "t", "--json", env=env).stdout)
    assert [(p["tool_call_id"], p["kind"]) for p in pending] == [("call_1_0", "unknown")]

    decided = cli("decide", "--db", db, "--graph", "tests.test_cli:cli_graph", "--thread",
                  "t", "--decisions", '{"call_1_0": {"type": "applied", "receipt": "ok"}}',
                  "--reviewer", "ana", env=env)
    assert decided.returncode == 0, decided.stderr
    assert "done" in decided.stdout
    events = json.loads(cli("events", "--db", db, "--thread", "t", "--json").stdout)
    assert any(e["kind"] == "decision" and '"ana"' in json.dumps(e["data"]) for e in events)
    assert all(e["at"].endswith("+00:00") for e in events)  # ISO 8601 times
    assert FakeProvider(str(tmp_path / "mail.sqlite"), "blind").count() == 1


def _waiting_thread(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A database whose thread `t` waits for a human about `call_0_0` (unknown)."""
    agent, db, env = _crashed_after_mail(tmp_path, [[["mail", "2"]]], {"mail": "blind"})
    agent.graph.invoke(None, {"configurable": {"thread_id": "t"}}, durability="sync")
    agent.saver.conn.close()
    return db, env


def _bytes_of(folder: Path) -> dict[str, bytes]:
    """Every file's bytes, but SQLite's shared-memory index and its empty WAL: a reader of
    a WAL database makes them, read-only or not, and they hold no data of the database."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())
            if p.is_file() and not p.name.endswith(("-shm", "-wal"))}


@pytest.mark.long
def test_bad_inputs_get_one_line_a_nonzero_exit_and_change_nothing(tmp_path: Path) -> None:
    import sqlite3

    db, env = _waiting_thread(tmp_path)
    graph = "tests.test_cli:cli_graph"
    plain = tmp_path / "plain-langgraph.sqlite"  # a LangGraph database without our ledger
    with sqlite3.connect(plain) as conn:
        conn.execute("CREATE TABLE checkpoints (thread_id TEXT)")
    not_db = tmp_path / "notes.txt"
    not_db.write_text("not a database")
    bad = [
        (["effects", "--db", str(tmp_path / "agnet.db")], 2, "no such file"),
        (["status", "--db", str(plain)], 2, "without graph_durable's ledger"),
        (["status", "--db", str(not_db)], 2, "not a SQLite database"),
        (["status", "--db", str(tmp_path / "missing-dir" / "a.sqlite")], 2, "no such file"),
        (["effects", "--db", db, "--status", "bogus"], 2, "not a status"),
        (["effects", "--db", db, "--thread", "nope"], 1, "'nope' has no checkpoint"),
        (["events", "--db", db, "--thread", "nope"], 1, "'nope' has no checkpoint"),
        (["pending", "--db", db, "--thread", "nope"], 1, "has no checkpoint"),
        (["show", "nope", "--db", db], 1, "has no checkpoint"),
        (["resolve", "t", "call_0_0", "--retry", "--db", db, "--graph", "no_such_module:graph"],
         2, "could not be loaded"),
        (["threads", "--db", db, "--status", "bogus"], 2, "not a status"),
        (["threads", "--db", db, "--since", "last tuesday"], 2, "neither a duration"),
        (["effects", "--db", db, "--bogus"], 2, "No such option"),
        (["show", "--db", db], 2, "Missing"),
        (["resolve", "t", "call_0_0", "--db", db, "--no-resume"], 2, "exactly one of"),
        (["resolve", "t", "call_0_0", "--retry", "--skip", "--db", db, "--no-resume"], 2,
         "exactly one of"),
        (["resolve", "t", "call_0_0", "--applied", "--db", db, "--no-resume"], 2,
         "needs --receipt"),
        (["resolve", "t", "call_0_0", "--applied", "--receipt", "{oops", "--db", db,
          "--no-resume"], 2, "not JSON"),
        (["resolve", "t", "call_0_0", "--retry", "--db", db], 2, "needs --graph"),
        (["approve", "t", "call_0_0", "--db", db, "--no-resume"], 2, "allows"),
        (["resolve", "t", "no_such_call", "--retry", "--db", db, "--no-resume"], 2,
         "not waiting for a decision"),
        (["edit", "t", "call_0_0", "--args", "[1]", "--db", db, "--no-resume"], 2,
         "JSON object"),
        (["recover", "--db", db, "--owner", "ops"], 2, "--graph module:attribute is needed"),
        (["decide", "--db", db, "--graph", graph, "--thread", "t", "--decisions", "not json"],
         2, "not JSON"),
        (["decide", "--db", db, "--graph", graph, "--thread", "t", "--decisions",
          '{"call_0_0": "approve"}'], 2, 'with a "type"'),
        (["decide", "--db", db, "--graph", graph, "--thread", "t", "--decisions",
          '{"call_0_0": {"approve": true}}'], 2, 'with a "type"'),
        (["decide", "--db", db, "--graph", graph, "--thread", "t", "--decisions",
          '{"call_0_0": {"type": "applied"}}'], 2, "without a 'receipt'"),
        (["decide", "--db", db, "--graph", graph, "--thread", "t", "--decisions",
          '{"call_0_0": {"type": "edit", "edited_action": {"args": {}}}}'], 2, "accepts"),
        (["status", "--db", "postgresql://nobody@127.0.0.1:1/none"], 2, "cannot reach"),
        (["status", "--db", "postgresql://ops:hunter2@127.0.0.1:1/none"], 2, "cannot reach"),
    ]
    before = _bytes_of(tmp_path)
    from concurrent.futures import ThreadPoolExecutor

    # Read-only or refused, none of them writes: run them two at a time (two cores).
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda one: cli(*one[0], env=env), bad))
    for (args, code, says), result in zip(bad, results, strict=True):
        lines = result.stderr.strip().splitlines()
        assert result.returncode == code, (args, result.stderr)
        assert len(lines) == 1 and says in lines[0] and "Traceback" not in result.stderr, (
            args, result.stderr)
        assert _bytes_of(tmp_path) == before, " ".join(args[-2:])  # nothing created or written
        assert "hunter2" not in result.stderr + result.stdout
    assert not (tmp_path / "agnet.db").exists()


def test_read_commands_leave_the_database_byte_for_byte_unchanged(tmp_path: Path) -> None:
    db, env = _waiting_thread(tmp_path)
    before = _bytes_of(tmp_path)
    for args in (["status", "--db", db], ["effects", "--db", db, "--thread", "t"],
                 ["events", "--db", db, "--json"], ["threads", "--db", db], ["show", "t", "--db", db],
                 ["pending", "--db", db], ["audit", "t", "--db", db]):
        result = cli(*args, env=env)
        assert result.returncode == 0, (args, result.stderr)
    pending = cli("pending", "--db", db, "--thread", "t", "--json", env=env)
    assert [p["tool_call_id"] for p in json.loads(pending.stdout)] == ["call_0_0"]
    assert _bytes_of(tmp_path) == before


def test_a_closed_pipe_ends_the_command_quietly(tmp_path: Path) -> None:
    db, _ = _waiting_thread(tmp_path)
    shell = subprocess.run(
        f"{sys.executable} -m graph_durable.cli events --db {db} --json | head -c 10",
        shell=True, cwd=ROOT, capture_output=True, text=True)
    assert shell.stdout and "Traceback" not in shell.stderr and "Broken" not in shell.stderr


def test_cli_reads_a_postgres_ledger_from_a_url(tmp_path: Path, postgres_conninfo: str) -> None:
    from psycopg.conninfo import conninfo_to_dict

    kwargs = {"db_path": str(tmp_path / "unused.sqlite"), "provider_dir": str(tmp_path),
              "ticket_mode": "blind", "email_mode": "blind", "postgres": postgres_conninfo}
    assert run_child("graph_durable.demo.ticket:build_ticket_agent", kwargs, thread_id="t",
                     fault=FaultPlan("after_effect", tool="create_ticket")).killed
    parts = conninfo_to_dict(postgres_conninfo)
    url = f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"

    status = cli("status", "--db", url, "--json")
    assert status.returncode == 0, status.stderr
    assert [(s["thread"], s["status"]) for s in json.loads(status.stdout)] == [
        ("t", "orphaned")]
    effects = json.loads(cli("effects", "--db", url, "--thread", "t", "--json").stdout)
    assert [(e["tool"], e["status"]) for e in effects] == [("create_ticket", "in_flight")]


def test_read_commands_never_add_a_ledger_to_a_postgres_database(postgres_conninfo: str) -> None:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(postgres_conninfo)
    url = f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"
    for command in ("status", "effects", "events"):
        result = cli(command, "--db", url)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and "not a graph_durable database" in result.stderr
    with psycopg.connect(postgres_conninfo) as conn:
        tables = conn.execute("SELECT count(*) FROM information_schema.tables "
                              "WHERE table_schema = current_schema()").fetchone()
    assert tables == (0,)


def test_an_encrypted_database_is_read_with_the_key_and_never_shown_as_garbage(
    tmp_path: Path,
) -> None:
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    from graph_durable.testing.scenarios.effects import _assemble

    key = "k" * 32
    db = str(tmp_path / "agent.sqlite")
    saver = DurableSqliteSaver(
        sqlite3.connect(db, check_same_thread=False),
        serde=EncryptedSerializer.from_pycryptodome_aes(key=key.encode()))
    agent = _assemble(saver, str(tmp_path), [[["mail", "secret-item"]]], {"mail": "dedupe"},
                      {})
    agent.graph.invoke(agent.inputs, {"configurable": {"thread_id": "t"}}, durability="sync")
    saver.conn.close()
    before = _bytes_of(tmp_path)

    sealed = cli("effects", "--db", db, "--json", env={"LANGGRAPH_AES_KEY": ""})
    assert sealed.returncode == 0, sealed.stderr
    [row] = json.loads(sealed.stdout)
    assert row["status"] == "applied" and row["receipt"] == "<encrypted>"
    events = cli("events", "--db", db, "--json")
    assert events.returncode == 0 and "secret-item" not in events.stdout
    # Entries that only name statuses stay readable; the rest is sealed.
    for event in json.loads(events.stdout):
        data = event["data"]
        assert data == "<encrypted>" or set(data) <= {"status", "tool", "tool_call_id",
                                                      "source", "attempt"}

    opened = cli("effects", "--db", db, "--json", env={"LANGGRAPH_AES_KEY": key})
    assert "secret-item" in json.dumps(json.loads(opened.stdout)[0]["receipt"])

    for env in ({}, {"LANGGRAPH_AES_KEY": "w" * 32}):
        status = cli("status", "--db", db, env={"LANGGRAPH_AES_KEY": "", **env})
        assert status.returncode == 2 and "Traceback" not in status.stderr
        assert status.stderr.count("\n") == 1 and "LANGGRAPH_AES_KEY" in status.stderr
    short = cli("status", "--db", db, env={"LANGGRAPH_AES_KEY": "short"})
    assert short.returncode == 2 and "16, 24, or 32 bytes" in short.stderr
    assert json.loads(cli("status", "--db", db, "--json",
                          env={"LANGGRAPH_AES_KEY": key}).stdout)[0]["status"] == "done"
    assert _bytes_of(tmp_path) == before


def test_json_is_nested_jsonl_is_a_line_each_and_version_prints(tmp_path: Path) -> None:
    _, db, _ = _crashed_after_mail(tmp_path, [[["mail", "2"]]], {"mail": "blind"})
    effects = json.loads(cli("effects", "--db", db, "--json").stdout)
    assert effects and all(isinstance(row["updated_at"], str) for row in effects)
    lines = cli("events", "--db", db, "--jsonl").stdout.splitlines()
    assert lines and all(isinstance(json.loads(line)["data"], dict) for line in lines)
    both = cli("events", "--db", db, "--json", "--jsonl")
    assert both.returncode == 2 and "not allowed with" in both.stderr
    version = cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("graph-durable ")
