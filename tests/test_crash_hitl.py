"""Crash tests of `HumanInTheLoopMiddleware` listed before `EffectGuardMiddleware` (the
safe order), with real processes: a call approved through it and killed after its charge
is charged once, however the question asked again is answered."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from graph_durable import DurableSqliteSaver, review
from graph_durable.operators.orphans import ANSWERED_WITHOUT_GUARD
from graph_durable.testing import FakeProvider, FaultPlan
from graph_durable.testing.crash.child import load_factory, run_child

pytestmark = pytest.mark.crash

FACTORY = "graph_durable.testing.explorer.scenario:build_explorer_agent"
CHARGE = {"mode": "blind", "policy": "blind", "approval": True, "retries": 0, "timeout": None}
EDIT = {"type": "edit", "edited_action": {"name": "charge", "args": {"item": "x00", "n": 1}}}


def kwargs(tmp_path: Path) -> dict[str, Any]:
    return {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path / "p"),
            "tools": {"charge": CHARGE},
            "turns": [[{"tool": "charge", "id": "c1", "item": "x00", "n": 0}]],
            "topology": "create_agent", "stack": "hitl_before_guard"}


def charges(tmp_path: Path) -> FakeProvider:
    return FakeProvider(str(tmp_path / "p" / "charge.sqlite"), "blind", name="charge")


@pytest.mark.parametrize("again", ["approve", "edit", "reject"])
def test_a_call_approved_through_hitl_and_killed_after_its_charge_is_charged_once(
        tmp_path, again) -> None:
    """Seeds 1013, 1028 (`hitl_asked_again`): HumanInTheLoopMiddleware keeps its answer
    nowhere a resumed run reads, so it asks again. An approval or an edit this time
    reaches the charge already sent (the call keeps its key): its outcome is unknown to
    the ledger, so the guard asks about that, and nothing is sent a second time. A
    rejection answers the model without reaching the guard: the charge sent is then an
    orphaned intent, listed to be settled."""
    kw = kwargs(tmp_path)
    [asked] = run_child(FACTORY, kw, thread_id="t").interrupts
    assert asked["type"] == "tool_approval" and "key" not in asked
    killed = run_child(FACTORY, kw, thread_id="t", action="review",
                       resume={"c1": {"type": "approve"}},
                       fault=FaultPlan("after_effect", tool="charge"))
    assert killed.killed and charges(tmp_path).count() == 1
    [again_asked] = run_child(FACTORY, kw, thread_id="t", action="resume").interrupts
    assert again_asked["type"] == "tool_approval" and "key" not in again_asked
    decision = {"approve": {"type": "approve"}, "edit": EDIT,
                "reject": {"type": "reject", "message": "no"}}[again]
    answered = run_child(FACTORY, kw, thread_id="t", action="review", resume={"c1": decision})
    assert not answered.killed
    assert charges(tmp_path).count() == 1
    [sent] = charges(tmp_path).effects()
    saver = DurableSqliteSaver(sqlite3.connect(tmp_path / "agent.sqlite",
                                               check_same_thread=False))
    [record] = saver.effects("t")
    assert record.key == sent["key"] and record.args == {"item": "x00", "n": 0}
    if again == "reject":
        assert answered.done
        agent = load_factory(FACTORY)(**kw)
        [orphan] = review(agent.graph, {"configurable": {"thread_id": "t"}}).orphans
        assert orphan.key == sent["key"]
        assert orphan.reason == ANSWERED_WITHOUT_GUARD  # says what happened, and why
        return
    [unknown] = answered.interrupts
    assert (unknown["type"], unknown["key"]) == ("effect_unknown", sent["key"])
    done = run_child(FACTORY, kw, thread_id="t", action="review",
                     resume={"c1": {"type": "applied", "receipt": sent["receipt"]}})
    assert done.done and charges(tmp_path).count() == 1
