"""A looked-up tool that returns a `Command` is replayed as a Command after a crash.

The booking agent's `book` tool (`graph_durable.testing.scenarios.commands`) returns
`Command(update={"messages": [...], "booking": id}, goto="confirm")`, and the node it
goes to sends a second guarded write, `notify`. A child process is SIGKILLed in the
tool's crash window; a new process resumes the thread on the same database. If the
resume dropped the Command (a plain ToolMessage in its place), the graph would stop
after the tools step: no notification, no booking in the state. Every assertion is on
the providers' side, plus the state field only the Command sets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from graph_durable.testing import FakeProvider, FaultPlan
from graph_durable.testing.crash.child import run_child
from graph_durable.testing.scenarios.commands import build_booking_agent

SCENARIOS = {"sync": "graph_durable.testing.scenarios.commands:build_booking_agent",
             "async": "graph_durable.testing.scenarios.commands:build_booking_agent_async"}
THREAD = {"configurable": {"thread_id": "t"}}


def provider(tmp_path: Path, name: str) -> FakeProvider:
    return FakeProvider(str(tmp_path / f"{name}.sqlite"), "lookup", name=name)


def crash_and_resume(tmp_path: Path, driver: str, point: str, lookup: str
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Kill the run at `point` of the book call, resume it in a new process; return the
    resumed run's summary and the thread's final state values."""
    kwargs = {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path),
              "lookup": lookup}
    crashed = run_child(SCENARIOS[driver], kwargs, thread_id="t",
                        fault=FaultPlan(point, tool="book"))
    assert crashed.killed, crashed.stderr[-2000:]
    assert provider(tmp_path, "book").count() == 1
    assert provider(tmp_path, "notify").count() == 0

    resumed = run_child(SCENARIOS[driver], kwargs, thread_id="t", action="resume")
    assert resumed.done, resumed.summary
    values = build_booking_agent(**kwargs).graph.get_state(THREAD).values
    return resumed.summary, values


def assert_booked_and_confirmed_once(tmp_path: Path, summary: dict[str, Any],
                                     values: dict[str, Any]) -> None:
    books, notices = provider(tmp_path, "book"), provider(tmp_path, "notify")
    assert books.count() == 1 and len(books.requests()) == 1, books.requests()
    [booking] = books.effects()
    # The goto'd node ran: its own effect was applied once, with the booking the
    # Command's state update set.
    assert notices.count() == 1, (
        f"the goto to 'confirm' was dropped: notify applied {notices.count()} time(s); "
        f"messages {summary['messages']}")
    assert notices.effects()[0]["payload"] == {"booking": booking["receipt"]["id"]}
    assert values.get("booking") == booking["receipt"]["id"]
    [answer] = [m for m in summary["messages"] if m["type"] == "tool"
                and m["tool_call_id"] == "call_book"]
    assert answer["status"] == "success"
    assert summary["messages"][-1]["content"] == "Booked and confirmed."


@pytest.mark.crash
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_command_recorded_before_the_kill_is_replayed_with_its_update_and_goto(
        tmp_path: Path, driver: str) -> None:
    """Killed right after the receipt: the stored Command is replayed, not a ToolMessage
    rebuilt by the lookup (so its receipt cannot have waited for the step's commit)."""
    summary, values = crash_and_resume(tmp_path, driver, "after_receipt", lookup="receipt")
    assert_booked_and_confirmed_once(tmp_path, summary, values)


@pytest.mark.crash
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_lookup_that_returns_the_command_reconciles_with_it(tmp_path: Path,
                                                              driver: str) -> None:
    """Killed after the effect, before any receipt: only the lookup knows, and a lookup
    that returns the tool's Command has it used faithfully, made to answer the call."""
    summary, values = crash_and_resume(tmp_path, driver, "after_effect", lookup="command")
    assert_booked_and_confirmed_once(tmp_path, summary, values)
