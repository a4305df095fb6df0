"""A sweep's children fork from a server that imported what they run, so none imports.

A module a child imports costs every child again (its server never has it): with
hundreds of children per sweep, that is seconds. A library release that starts to
import something lazily on a graph's first invoke fails here; add the module to
`graph_durable.testing.crash.child.PRELOAD`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from graph_durable.testing.crash.child import child_spec
from graph_durable.testing.crash.matrix import _preload
from graph_durable.testing.crash.forkserver import ForkServer

pytestmark = pytest.mark.crash

TICKET = "graph_durable.demo.ticket:build_ticket_agent"


def test_a_child_run_of_the_demo_imports_nothing_its_server_had_not(tmp_path: Path) -> None:
    kwargs = {"db_path": str(tmp_path / "agent.sqlite"),
              "provider_dir": str(tmp_path / "providers")}
    with ForkServer([*_preload(TICKET), "tests.testing._fork_probe"]) as server:
        for action in ("start", "resume"):
            spec = child_spec(TICKET, kwargs, thread_id="t", action=action)
            outcome = server.run("tests.testing._fork_probe:modules_imported_by",
                                 {"spec": spec})
            assert outcome.error is None, outcome.error
            assert outcome.result == [], (action, outcome.result)


def test_a_child_that_dies_below_python_leaves_its_stack() -> None:
    with ForkServer(["tests.testing._fork_probe"]) as server:
        outcome = server.run("tests.testing._fork_probe:crash_below_python", {})
    assert outcome.exitcode == -11, outcome
    assert "Fatal Python error: Segmentation fault" in outcome.stderr, outcome.stderr
    assert "crash_below_python" in outcome.stderr, outcome.stderr
