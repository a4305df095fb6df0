"""LangGraph's `create_react_agent` (deprecated in favour of `create_agent`, still
shipped) takes a `ToolNode` as its tools: an `EffectGuardNode` guards them. A worker
SIGKILLed right after the charge resumes without a second one."""

from __future__ import annotations

import sqlite3
import warnings
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool

from graph_durable import DurableSqliteSaver, Effect, EffectGuardNode, current_effect
from graph_durable.testing import FakeProvider, FaultPlan
from graph_durable.testing.crash.child import run_child
from graph_durable.testing.models import ScriptedChatModel
from graph_durable.testing.scenarios.effects import EffectsAgent

CHARGE = {"name": "charge", "args": {"customer": "ana", "cents": 500}, "id": "call-1"}


def build_react_agent(db_path: str, provider_dir: str) -> EffectsAgent:
    """A `create_react_agent` agent whose tools are an `EffectGuardNode`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from langgraph.prebuilt import create_react_agent

    payments = FakeProvider(str(Path(provider_dir) / "payments.sqlite"), "dedupe")

    @tool
    def charge(customer: str, cents: int) -> dict[str, Any]:
        """Charge a customer, in cents."""
        return payments.apply(current_effect().key, {"customer": customer, "cents": cents})

    saver = DurableSqliteSaver(sqlite3.connect(db_path, check_same_thread=False))
    model = ScriptedChatModel(script=[AIMessage(content="", tool_calls=[CHARGE]),
                                      AIMessage(content="Charged.")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = create_react_agent(
            model, tools=EffectGuardNode([charge], effects={"charge": Effect(idempotent=True)}),
            checkpointer=saver)
    return EffectsAgent(graph=graph, saver=saver, providers={"payments": payments},
                        inputs={"messages": [HumanMessage("Charge Ana.")]})


@pytest.mark.crash
def test_a_react_agent_killed_after_the_charge_charges_once(tmp_path: Path) -> None:
    factory = "tests.test_create_react_agent:build_react_agent"
    kwargs = {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path)}
    payments = FakeProvider(str(tmp_path / "payments.sqlite"), "dedupe")
    assert run_child(factory, kwargs, thread_id="t",
                     fault=FaultPlan("after_effect", tool="charge")).killed
    assert payments.count() == 1
    resumed = run_child(factory, kwargs, thread_id="t", action="resume")
    assert resumed.done, resumed.summary
    assert payments.count() == 1
