"""`python -m graph_durable.demo` kills the agent mid-effect, resumes it, and proves each
effect happened exactly once (run as a real subprocess, as `make demo` does)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from graph_durable.testing.faults import ENV_FAULTS, ENV_TRACE


def run_demo(workdir: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in (ENV_FAULTS, ENV_TRACE)}
    return subprocess.run(
        [sys.executable, "-m", "graph_durable.demo", "--dir", str(workdir)],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=300,
    )


def lines_matching(pattern: str, output: str) -> list[str]:
    return [line for line in output.splitlines() if re.fullmatch(pattern, line.strip())]


@pytest.mark.long
@pytest.mark.crash
def test_demo_kills_resumes_and_counts_each_effect_once(tmp_path: Path) -> None:
    workdir = tmp_path / "run"
    proc = run_demo(workdir, tmp_path)
    out = proc.stdout

    assert proc.returncode == 0, out + proc.stderr
    assert "\033[" not in out  # no colour when stdout is not a terminal
    # The child was killed, leaving an intent without receipt and one ticket.
    assert lines_matching(r"child exit code -9: killed by SIGKILL", out)
    assert lines_matching(r"create_ticket\s+in_flight\s+1\s+gd-\S+\s+\(none\)", out)
    assert lines_matching(r"ticket provider already holds 1 ticket\(s\)", out)
    # The resumed process recovered the ticket's receipt by lookup and finished.
    assert lines_matching(r"child exit code 0, thread finished: True", out)
    assert lines_matching(r"#\d+\s+create_ticket\s+receipt\s+source=lookup status=applied.*", out)
    assert lines_matching(r"create_ticket\s+applied\s+1\s+gd-\S+\s+ticket-1", out)
    assert lines_matching(r"send_email\s+applied\s+1\s+gd-\S+\s+email-1", out)
    # Each provider applied exactly one effect, under one key.
    assert len(lines_matching(r"ticket\s+gd-\S+\s+1 effect", out)) == 1
    assert len(lines_matching(r"email\s+gd-\S+\s+1 effect", out)) == 1
    assert not lines_matching(r"(ticket|email)\s+gd-\S+\s+\d+ effects", out)
    # The cancel closed the ticket once and left the email; the audit counts the re-run.
    assert lines_matching(r"create_ticket\s+compensated", out)
    assert lines_matching(r"send_email\s+left in place", out)
    assert lines_matching(r"ticket provider closed 1 ticket\(s\); emails sent: 1", out)
    assert lines_matching(r"nodes run again: tools \(\w+\); model calls: 2, repeated: 0", out)
    assert lines_matching(r"compensated: create_ticket\(call_ticket\)", out)
    # A second thread waits for a person, its blind email sent once; stock LangGraph
    # opened the ticket twice.
    assert lines_matching(r"resumed: the email's outcome is unknown; the mail API holds 1 "
                          r"email\(s\) for it, and nothing was re-sent", out)
    assert lines_matching(r"killed after the ticket, resumed: the ticket provider holds 2 "
                          r"tickets .*", out)
    # The commands it prints work as printed: the resolve finishes the waiting thread.
    [resolve] = [line.strip() for line in out.splitlines() if "graph-durable resolve" in line]
    words = shlex.split(resolve)
    env = dict(os.environ)
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words[0] == "graph-durable"
    resolved = subprocess.run([sys.executable, "-m", "graph_durable.cli", *words[1:], "--json"],
                              capture_output=True, text=True, cwd=tmp_path, env=env)
    assert resolved.returncode == 0, resolved.stderr
    assert json.loads(resolved.stdout)[0]["status"] == "done"
    assert out.rstrip().splitlines()[-1] == (
        "OK: killed mid-effect, resumed, and every effect happened exactly once."
    )
    assert (workdir / "agent.sqlite").exists()


def test_demo_refuses_to_wipe_a_directory_it_did_not_create(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    proc = run_demo(tmp_path, tmp_path)
    assert proc.returncode != 0
    assert "refusing to wipe" in proc.stderr
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_the_demo_tools_take_the_arguments_their_signatures_name(tmp_path: Path) -> None:
    # Their argument models are written out (built once at import, not inferred at each
    # build); they must say what inferring them from the signatures would.
    from langchain_core.tools import tool

    from graph_durable.demo.ticket import build_ticket_agent

    agent = build_ticket_agent(str(tmp_path / "agent.sqlite"), str(tmp_path / "providers"))
    tools = agent.graph.nodes["tools"].bound.tools_by_name
    assert sorted(tools) == ["create_ticket", "send_email"]
    for name, built in tools.items():
        inferred = tool(built.func)
        assert built.tool_call_schema.model_json_schema() == \
            inferred.tool_call_schema.model_json_schema(), name
        assert built.args == inferred.args and built.description == inferred.description
