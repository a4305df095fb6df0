"""The operator's commands: threads, the inbox (`pending`), `show`, and answering one call
with approve / reject / edit / resolve, resuming the thread or only journaling
(`--no-resume`). Real subprocesses on real SQLite files; the providers' own counts say
whether an effect was sent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any

import pytest

from graph_durable.cli import main
from graph_durable.cli._commands import EFFECT_STATUSES, THREAD_STATUSES
from graph_durable.ledger import EffectStatus
from graph_durable.operators.recovery import Status
from graph_durable.testing import FakeProvider, FaultPlan, InjectedCrash, arm, disarm
from graph_durable.testing.scenarios.effects import build_effects_agent

ROOT = Path(__file__).resolve().parent.parent
GRAPH = "tests.test_cli:cli_graph"


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT
        ) -> subprocess.CompletedProcess:
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "graph_durable.cli", *args], cwd=cwd,
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": pythonpath, **(env or {})})


def ok(result: subprocess.CompletedProcess) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout) if result.stdout.lstrip().startswith(("[", "{")) else None


def _bytes_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())
            if p.is_file() and not p.name.endswith(("-shm", "-wal"))}


def _database(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """Two threads on one file: `pay-1` waits for approval of its payment; `mail-1` was
    killed after its blind mail went out and asks whether it happened."""
    kwargs = {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path),
              "turns": [[["pay", "1"]], [["mail", "2"]]],
              "modes": {"pay": "dedupe", "mail": "blind"}, "approvals": ["pay"]}
    agent = build_effects_agent(**kwargs)
    agent.graph.invoke(agent.inputs, {"configurable": {"thread_id": "pay-1"}}, durability="sync")
    # mail-1: approve the payment at once, crash after the mail, resume to ask.
    config = {"configurable": {"thread_id": "mail-1"}}
    agent.graph.invoke(agent.inputs, config, durability="sync")
    from graph_durable import review

    arm(FaultPlan("after_effect", tool="mail", action="raise"))
    try:
        review(agent.graph, config).approve("call_0_0").resume()
    except InjectedCrash:
        pass
    finally:
        disarm()
    agent.graph.invoke(None, config, durability="sync")
    agent.saver.conn.close()
    return kwargs["db_path"], {"CLI_SCENARIO": json.dumps(kwargs)}


def test_the_listed_statuses_are_the_librarys() -> None:
    assert THREAD_STATUSES == typing.get_args(Status)
    assert EFFECT_STATUSES == tuple(s.value for s in EffectStatus)


@pytest.mark.long
def test_the_inbox_lists_every_waiting_call_across_threads_without_a_graph(tmp_path: Path) -> None:
    db, _ = _database(tmp_path)
    before = _bytes_of(tmp_path)

    inbox = ok(cli("pending", "--db", db, "--json"))
    assert [(i["thread"], i["tool_call_id"], i["kind"], i["tool"]) for i in inbox] == [
        ("pay-1", "call_0_0", "approval", "pay"), ("mail-1", "call_1_0", "unknown", "mail")]
    approval, unknown = inbox
    assert approval["description"] and approval["key"].startswith("gd-")
    assert unknown["attempts"] == 1 and "stopped" in unknown["error"]
    assert all(i["asked_at"].endswith("+00:00") and i["created_at"] for i in inbox)
    assert ok(cli("pending", "--db", db, "--thread", "mail-1", "--json"))[0]["tool"] == "mail"

    threads = {t["thread"]: t for t in ok(cli("threads", "--db", db, "--json"))}
    assert {t: (r["status"], r["pending"], r["lease"]) for t, r in threads.items()} == {
        "pay-1": ("waiting", 1, None), "mail-1": ("needs_human", 1, None)}
    assert all(r["last_activity"].endswith("+00:00") for r in threads.values())
    assert "call_1_0" in threads["mail-1"]["reason"]
    assert [t["thread"] for t in ok(cli("threads", "--db", db, "--status", "needs_human",
                                        "--json"))] == ["mail-1"]
    assert len(ok(cli("threads", "--db", db, "--limit", "1", "--json"))) == 1
    assert ok(cli("threads", "--db", db, "--since", "2099-01-01", "--json")) == []
    assert len(ok(cli("threads", "--db", db, "--since", "1h", "--json"))) == 2

    shown = ok(cli("show", "mail-1", "--db", db, "--json"))
    assert shown["status"] == "needs_human" and shown["pending"][0]["tool_call_id"] == "call_1_0"
    kinds = [e["kind"] for e in shown["events"]]
    assert kinds[:2] == ["intent", "asked"] and "unknown" in kinds
    assert all(e["at"].endswith("+00:00") for e in shown["events"])
    table = cli("show", "mail-1", "--db", db)
    assert "needs_human" in table.stdout and "graph-durable resolve mail-1 call_1_0" in table.stdout
    assert _bytes_of(tmp_path) == before


def test_approve_with_no_resume_journals_and_recover_sends_it_once(tmp_path: Path) -> None:
    db, env = _database(tmp_path)
    pay = FakeProvider(str(tmp_path / "pay.sqlite"), "dedupe")
    count = pay.count()  # mail-1's payment

    answered = ok(cli("approve", "pay-1", "call_0_0", "--db", db, "--no-resume",
                      "--reviewer", "ana", "--json"))
    assert answered[0]["resumed"] is False and answered[0]["status"] == "orphaned"
    assert pay.count() == count, "--no-resume sends nothing"
    assert [i["thread"] for i in ok(cli("pending", "--db", db, "--json"))] == ["mail-1"]
    again = cli("approve", "pay-1", "call_0_0", "--db", db, "--no-resume")
    assert again.returncode == 2 and "not waiting for a decision" in again.stderr

    swept = ok(cli("recover", "--db", db, "--graph", GRAPH, "--owner", "ops", "--json", env=env))
    assert swept == [{"thread": "pay-1", "outcome": "resumed", "status": "done", "error": None}]
    assert pay.count() == count + 1
    events = ok(cli("events", "--db", db, "--thread", "pay-1", "--json"))
    decision = [e for e in events if e["kind"] == "decision"]
    assert decision and decision[0]["data"]["decision"]["reviewer"] == "ana"


def test_resolve_applied_resumes_with_the_graph_and_sends_nothing(tmp_path: Path) -> None:
    db, env = _database(tmp_path)
    mail = FakeProvider(str(tmp_path / "mail.sqlite"), "blind")
    assert mail.count() == 1
    [sent] = mail.effects()

    done = ok(cli("resolve", "mail-1", "call_1_0", "--applied", "--receipt",
                  json.dumps(sent["receipt"]), "--db", db, "--graph", GRAPH, "--json", env=env))
    assert done[0]["resumed"] is True and done[0]["status"] == "done"
    assert mail.count() == 1
    [effect] = ok(cli("effects", "--db", db, "--thread", "mail-1", "--tool", "mail", "--json"))
    assert effect["status"] == "applied" and effect["receipt"] == sent["receipt"]


def test_edit_sends_the_edited_call_and_a_bad_edit_changes_nothing(tmp_path: Path) -> None:
    db, env = _database(tmp_path)
    pay = FakeProvider(str(tmp_path / "pay.sqlite"), "dedupe")
    count = pay.count()
    before = _bytes_of(tmp_path)
    for extra in (["--no-resume"], ["--graph", GRAPH]):
        bad = cli("edit", "pay-1", "call_0_0", "--args", '{"item": 5}', "--db", db, *extra,
                  env=env)
        assert bad.returncode == 2, bad.stderr
        assert bad.stderr.count("\n") == 1 and "item" in bad.stderr, bad.stderr
        assert _bytes_of(tmp_path) == before

    ok(cli("edit", "pay-1", "call_0_0", "--args", '{"item": "1-corrected"}', "--db", db,
           "--graph", GRAPH, "--json", env=env))
    assert pay.count() == count + 1
    assert pay.effects()[-1]["payload"] == {"item": "1-corrected"}


def test_reject_with_a_message_sends_nothing(tmp_path: Path) -> None:
    db, env = _database(tmp_path)
    pay = FakeProvider(str(tmp_path / "pay.sqlite"), "dedupe")
    count = pay.count()
    done = ok(cli("reject", "pay-1", "call_0_0", "-m", "wrong customer", "--db", db,
                  "--graph", GRAPH, "--json", env=env))
    assert done[0]["status"] == "done" and pay.count() == count
    [effect] = ok(cli("effects", "--db", db, "--thread", "pay-1", "--tool", "pay", "--json"))
    assert effect["status"] == "rejected"


def test_a_graph_compiled_elsewhere_runs_on_db_and_the_cwd_is_importable(tmp_path: Path) -> None:
    """`--graph app:graph` from the app's own folder, compiled there on another saver:
    the command still reads and writes `--db`."""
    db, env = _database(tmp_path)
    app = tmp_path / "myapp"
    app.mkdir()
    (app / "agent.py").write_text(textwrap.dedent("""
        import json, os
        from langgraph.checkpoint.memory import InMemorySaver
        from graph_durable.testing.scenarios.effects import build_effects_agent

        kwargs = json.loads(os.environ["CLI_SCENARIO"])
        kwargs["db_path"] = os.path.join(os.path.dirname(__file__), "elsewhere.sqlite")
        graph = build_effects_agent(**kwargs).graph.builder.compile(checkpointer=InMemorySaver())
    """))
    pay = FakeProvider(str(tmp_path / "pay.sqlite"), "dedupe")
    count = pay.count()
    done = cli("approve", "pay-1", "call_0_0", "--db", db, "--graph", "agent:graph", "--json",
               env=env, cwd=app)
    assert ok(done)[0]["status"] == "done"
    assert pay.count() == count + 1


def test_tables_fit_the_terminal_and_are_plain_when_piped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    db, _ = _database(tmp_path)
    assert main(["pending", "--db", db]) == 0
    piped = capsys.readouterr().out
    assert "\x1b[" not in piped and "call_1_0" in piped and "…" not in piped

    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    for command in (["pending"], ["threads"], ["effects"], ["events"], ["show", "mail-1"]):
        assert main([*command, "--db", db]) == 0
        out = capsys.readouterr().out
        plain = [line for line in out.splitlines() if line.strip()]
        width = max(len(_strip_ansi(line)) for line in plain)
        assert width <= 100, (command, width, out)
    assert main(["threads", "--db", db]) == 0
    coloured = capsys.readouterr().out
    assert "\x1b[" in coloured and "needs_human" in _strip_ansi(coloured)


def _strip_ansi(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_the_status_names_the_unknown_call_and_the_pending_approval(tmp_path: Path) -> None:
    agent = build_effects_agent(str(tmp_path / "agent.sqlite"), str(tmp_path),
                                turns=[[["pay", "1"], ["mail", "2"]]],
                                modes={"pay": "dedupe", "mail": "blind"}, approvals=["pay"])
    config = {"configurable": {"thread_id": "t"}}
    arm(FaultPlan("after_effect", tool="mail", action="raise"))
    try:
        agent.graph.invoke(agent.inputs, config, durability="sync")
    except InjectedCrash:
        pass
    finally:
        disarm()
    agent.graph.invoke(None, config, durability="sync")
    from graph_durable import thread_status

    status = thread_status(agent.saver, "t")
    assert status.status == "needs_human"
    assert "call_0_1" in status.reason and "approval of ['call_0_0']" in status.reason
    assert set(status.pending) == {"call_0_0", "call_0_1"}


HITL = {"tools": {"charge": {"mode": "blind", "policy": "blind", "approval": True,
                             "retries": 0, "timeout": None}},
        "turns": [[{"tool": "charge", "id": "c1", "item": "x00", "n": 0}]],
        "topology": "create_agent", "stack": "hitl_before_guard"}


def hitl_graph(saver: Any) -> Any:
    """--graph target: create_agent with HumanInTheLoopMiddleware before the guard."""
    from graph_durable.testing.explorer.scenario import build_explorer_agent

    kwargs = json.loads(os.environ["CLI_HITL"])
    return build_explorer_agent(**kwargs).graph.builder.compile(checkpointer=saver)


def test_pending_lists_a_question_of_hitl_and_approve_answers_it_by_resuming(
        tmp_path: Path) -> None:
    from graph_durable.testing.explorer.scenario import build_explorer_agent

    kwargs = {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path / "p"),
              **HITL}
    agent = build_explorer_agent(**kwargs)
    agent.graph.invoke(agent.inputs, {"configurable": {"thread_id": "t"}}, durability="sync")
    db = kwargs["db_path"]
    [item] = ok(cli("pending", "--db", db, "--json"))
    assert (item["tool_call_id"], item["kind"], item["key"], item["args"]) == (
        "c1", "approval", "", {"item": "x00", "n": 0})
    refused = cli("approve", "t", "c1", "--db", db, "--no-resume")
    assert refused.returncode != 0 and "HumanInTheLoopMiddleware" in refused.stderr
    charges = FakeProvider(str(tmp_path / "p" / "charge.sqlite"), "blind", name="charge")
    assert charges.count() == 0
    env = {"CLI_HITL": json.dumps(kwargs)}
    [row] = ok(cli("approve", "t", "c1", "--db", db, "--graph",
                   "tests.test_cli_operators:hitl_graph", "--json", env=env))
    assert row["resumed"] and row["status"] == "done", row
    assert charges.count() == 1 and ok(cli("pending", "--db", db, "--json")) == []
