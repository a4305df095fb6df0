"""Crash tests around approvals and decisions, sync and async, with real processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from graph_durable import DurableSqliteSaver
from graph_durable.testing import FakeProvider, FaultPlan
from graph_durable.testing.crash.child import run_child

pytestmark = pytest.mark.crash

FACTORIES = {
    "sync": "graph_durable.testing.scenarios.effects:build_effects_agent",
    "async": "graph_durable.testing.scenarios.effects:build_effects_agent_async",
}


def kwargs(tmp_path: Path, mode: str = "blind", **extra: Any) -> dict[str, Any]:
    return {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path),
            "turns": [[["pay", "42"]]], "modes": {"pay": mode}, "approvals": ["pay"], **extra}


def pay_provider(tmp_path: Path, mode: str = "blind") -> FakeProvider:
    return FakeProvider(str(tmp_path / "pay.sqlite"), mode)


def decision_events(tmp_path: Path) -> list[dict[str, Any]]:
    import sqlite3

    saver = DurableSqliteSaver(sqlite3.connect(tmp_path / "agent.sqlite", check_same_thread=False))
    return [e.data for e in saver.events("t") if e.kind in ("asked", "decision")]


@pytest.mark.parametrize("flavour", sorted(FACTORIES))
def test_worker_killed_while_waiting_then_a_new_process_approves(tmp_path, flavour) -> None:
    factory, kw = FACTORIES[flavour], kwargs(tmp_path)
    waiting = run_child(factory, kw, thread_id="t", hold=True)  # SIGKILLed while paused
    assert [q["type"] for q in waiting.interrupts] == ["tool_approval"]
    assert pay_provider(tmp_path).count() == 0

    approved = run_child(factory, kw, thread_id="t", action="review",
                         resume={"call_0_0": {"type": "approve"}})
    assert approved.summary["reviewed"] == ["call_0_0"]
    assert approved.done
    assert pay_provider(tmp_path).count() == 1


@pytest.mark.parametrize("flavour", sorted(FACTORIES))
def test_crash_after_the_decision_is_journaled_does_not_ask_again(tmp_path, flavour) -> None:
    factory, kw = FACTORIES[flavour], kwargs(tmp_path)
    assert run_child(factory, kw, thread_id="t").interrupts
    crashed = run_child(factory, kw, thread_id="t", action="decide",
                        resume={"call_0_0": {"type": "approve"}},
                        fault=FaultPlan("after_decision"))
    assert crashed.killed
    assert pay_provider(tmp_path).count() == 0

    resumed = run_child(factory, kw, thread_id="t", action="resume")
    assert resumed.done, resumed.summary  # no second question
    assert pay_provider(tmp_path).count() == 1
    kinds = [data.get("decision", {}).get("type") if "decision" in data else "asked"
             for data in decision_events(tmp_path)]
    assert kinds == ["asked", "approve"]


@pytest.mark.parametrize("flavour", sorted(FACTORIES))
@pytest.mark.parametrize("mode", ["dedupe", "lookup", "blind"])
def test_async_and_sync_crash_after_effect(tmp_path, flavour, mode) -> None:
    """The crash-window protocol is the same under ainvoke: no duplicate effect."""
    factory = FACTORIES[flavour]
    kw = kwargs(tmp_path, mode, approvals=[])
    assert run_child(factory, kw, thread_id="t",
                     fault=FaultPlan("after_effect", tool="pay")).killed
    resumed = run_child(factory, kw, thread_id="t", action="resume")
    provider = pay_provider(tmp_path, mode)
    assert provider.count() == 1
    if mode == "blind":
        assert [q["type"] for q in resumed.interrupts] == ["effect_unknown"]
        done = run_child(factory, kw, thread_id="t", action="review",
                         resume={"call_0_0": {"type": "applied", "receipt": {"id": "pay-1"}}})
        assert done.done and provider.count() == 1 and len(provider.requests()) == 1
    else:
        assert resumed.done
