"""The graph-durable command: status, effects, events, pending, decide, recover."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from graph_durable.testing import FakeProvider, FaultPlan, InjectedCrash, arm, disarm
from graph_durable.testing.child import run_child
from graph_durable.testing.scenarios import build_effects_agent

ROOT = Path(__file__).resolve().parent.parent


def cli_graph(saver: Any) -> Any:
    """--graph target: the scenario's graph, compiled on the CLI's saver."""
    agent = build_effects_agent(**json.loads(os.environ["CLI_SCENARIO"]))
    return agent.graph.builder.compile(checkpointer=saver)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "graph_durable.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, **(env or {})})


def test_cli_lists_recovers_and_decides(tmp_path: Path) -> None:
    kwargs = {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path),
              "turns": [[["pay", "1"]], [["mail", "2"]]],
              "modes": {"pay": "lookup", "mail": "blind"}}
    agent = build_effects_agent(**kwargs)
    arm(FaultPlan("after_effect", tool="mail", action="raise"))
    try:
        agent.graph.invoke(agent.inputs, {"configurable": {"thread_id": "t"}},
                           durability="sync")
    except InjectedCrash:
        pass
    finally:
        disarm()
    db = kwargs["db_path"]
    env = {"CLI_SCENARIO": json.dumps(kwargs)}

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
    pending = json.loads(cli("pending", "--db", db, "--graph", "tests.test_cli:cli_graph",
                             "--thread", "t", "--json", env=env).stdout)
    assert [(p["tool_call_id"], p["kind"]) for p in pending] == [("call_1_0", "unknown")]

    decided = cli("decide", "--db", db, "--graph", "tests.test_cli:cli_graph", "--thread",
                  "t", "--decisions", '{"call_1_0": {"type": "applied", "receipt": "ok"}}',
                  "--reviewer", "ana", env=env)
    assert decided.returncode == 0, decided.stderr
    assert "done" in decided.stdout
    events = json.loads(cli("events", "--db", db, "--thread", "t", "--json").stdout)
    assert any(e["kind"] == "decision" and '"ana"' in e["data"] for e in events)
    assert FakeProvider(str(tmp_path / "mail.sqlite"), "blind").count() == 1


def test_cli_reports_errors_without_a_traceback(tmp_path: Path) -> None:
    result = cli("status", "--db", str(tmp_path / "none.sqlite"), "--thread", "nope")
    assert result.returncode == 2
    assert "no checkpoint" in result.stderr and "Traceback" not in result.stderr


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
