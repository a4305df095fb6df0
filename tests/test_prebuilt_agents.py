"""Prebuilt agent frameworks under the guard: a deep agent (deepagents), a supervisor
(langgraph-supervisor) and a swarm (langgraph-swarm), each SIGKILLed right after the
charge reached the provider (on each provider mode) or right after a human's approval
was journaled, then resumed in a new process: one charge every time, and an `unknown`
pause for a blind provider. A guarded tool run outside any guard (deepagents' default
`general-purpose` subagent, which gets the main agent's tools but not its middleware)
says so. Needs the `prebuilt` extra; marker `prebuilt` (in the sweeps CI runs).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepagents", reason="needs the prebuilt extra")
pytest.importorskip("langgraph_supervisor", reason="needs the prebuilt extra")
pytest.importorskip("langgraph_swarm", reason="needs the prebuilt extra")

from langchain_core.messages import HumanMessage  # noqa: E402

from graph_durable import DurableSqliteSaver, EffectGuardMiddleware  # noqa: E402
from graph_durable.nodes.tripwire import UnguardedToolWarning  # noqa: E402
from graph_durable.testing import FakeProvider, FaultPlan  # noqa: E402
from graph_durable.testing.crash.child import run_child  # noqa: E402
from graph_durable.testing.scenarios.prebuilt import CHARGE, RuleModel, _policy  # noqa: E402

pytestmark = [pytest.mark.prebuilt, pytest.mark.crash]

FRAMEWORKS = {"deepagents": "build_deep_agent", "supervisor": "build_supervisor",
              "swarm": "build_swarm"}


def _factory(framework: str) -> str:
    return f"graph_durable.testing.scenarios.prebuilt:{FRAMEWORKS[framework]}"


def _ledger(tmp_path: Path) -> dict[str, str]:
    with DurableSqliteSaver.from_conn_string(str(tmp_path / "agent.sqlite")) as saver:
        return {r.tool: r.status.value for r in saver.effects("t") if r.tool == "charge"}


@pytest.mark.parametrize("mode", ["dedupe", "lookup", "blind"])
@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_killed_after_the_charge_resumes_without_a_second_one(
    tmp_path: Path, framework: str, mode: str
) -> None:
    kwargs = {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path),
              "mode": mode}
    payments = FakeProvider(str(tmp_path / "payments.sqlite"), mode)
    crashed = run_child(_factory(framework), kwargs, thread_id="t",
                        fault=FaultPlan("after_effect", tool="charge"))
    assert crashed.killed and payments.count() == 1

    resumed = run_child(_factory(framework), kwargs, thread_id="t", action="resume")
    assert payments.count() == 1, f"{framework} charged again after the kill"
    if mode == "blind":
        [question] = resumed.interrupts
        assert question["type"] == "effect_unknown" and question["name"] == "charge"
        assert _ledger(tmp_path) == {"charge": "unknown"}
    else:
        assert resumed.done, resumed.summary
        assert _ledger(tmp_path) == {"charge": "applied"}


@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_killed_right_after_the_approval_was_journaled_charges_once(
    tmp_path: Path, framework: str
) -> None:
    kwargs = {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path),
              "mode": "blind", "approval": True}
    payments = FakeProvider(str(tmp_path / "payments.sqlite"), "blind")
    asked = run_child(_factory(framework), kwargs, thread_id="t")
    [question] = asked.interrupts
    assert question["type"] == "tool_approval" and payments.count() == 0

    killed = run_child(_factory(framework), kwargs, thread_id="t", action="decide",
                       resume={"type": "approve"}, fault=FaultPlan("after_decision"))
    assert killed.killed and payments.count() == 0
    resumed = run_child(_factory(framework), kwargs, thread_id="t", action="resume")
    assert resumed.done, resumed.summary
    assert payments.count() == 1 and _ledger(tmp_path) == {"charge": "applied"}


class _Delegator(RuleModel):
    """The deep agent's model: delegates the charge to its `general-purpose` subagent
    (`task`), which runs on the same model and charges."""

    def answer(self, messages: list[Any]) -> Any:
        from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

        answered = {m.name for m in messages if isinstance(m, ToolMessage)}
        delegated = any(isinstance(m, HumanMessage) and m.content == DELEGATED for m in messages)
        name = "charge" if delegated else "task"
        if name in answered:
            return AIMessage(content="Done.", id=f"msg-{name}-done")
        args = CHARGE["args"] if delegated else {"description": DELEGATED,
                                                 "subagent_type": "general-purpose"}
        return AIMessage(content="", id=f"msg-{name}", tool_calls=[
            {"name": name, "args": args, "id": f"call-{name}"}])


DELEGATED = "Charge Ana 5 euros."


def test_a_deep_agents_default_subagent_running_a_guarded_tool_unguarded_says_so(
    tmp_path: Path,
) -> None:
    import sqlite3

    from deepagents import create_deep_agent
    from langchain_core.tools import tool

    payments = FakeProvider(str(tmp_path / "payments.sqlite"), "blind")

    @tool
    def charge(customer: str, cents: int) -> dict[str, Any]:
        """Charge a customer, in cents (a tool that does not read its key)."""
        return payments.apply(f"{customer}-{cents}", {"customer": customer, "cents": cents})

    saver = DurableSqliteSaver(sqlite3.connect(str(tmp_path / "agent.sqlite"),
                                               check_same_thread=False))
    agent = create_deep_agent(
        model=_Delegator(calls=[]), tools=[charge], checkpointer=saver,
        middleware=[EffectGuardMiddleware({"charge": _policy(payments, False)})])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        agent.invoke({"messages": [HumanMessage("Charge Ana.")]},
                     {"configurable": {"thread_id": "t"}}, durability="sync")
    assert payments.count() == 1  # it ran, in the subagent, with no ledger
    assert "charge" not in {r.tool for r in saver.effects("t")}  # never in the ledger
    unguarded = [w for w in caught if issubclass(w.category, UnguardedToolWarning)]
    assert unguarded and "'charge'" in str(unguarded[0].message)
    assert "general-purpose" in str(unguarded[0].message)


def test_each_example_of_the_prebuilt_agents_page_runs_as_written(tmp_path: Path) -> None:
    import re
    import subprocess
    import sys

    page = (Path(__file__).resolve().parents[1] / "docs" / "how-to" / "prebuilt-agents.md")
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    assert len(blocks) == 3
    for n, code in enumerate(blocks):
        folder = tmp_path / f"example-{n}"
        folder.mkdir()
        (folder / "example.py").write_text(code)
        ran = subprocess.run([sys.executable, "example.py"], cwd=folder, capture_output=True,
                             text=True, timeout=120)
        assert ran.returncode == 0, ran.stderr
        promised = re.findall(r"print\(.*\)\s+# (.+)", code)[-1]
        assert ran.stdout.strip().splitlines()[-1] == promised.strip()


def test_deepagents_interrupt_on_beside_the_guard_charges_once_when_approved(
    tmp_path: Path,
) -> None:
    import sqlite3

    from deepagents import create_deep_agent
    from langgraph.types import Command

    payments = FakeProvider(str(tmp_path / "payments.sqlite"), "dedupe")
    from graph_durable.testing.scenarios.prebuilt import _charge_tool

    saver = DurableSqliteSaver(sqlite3.connect(str(tmp_path / "agent.sqlite"),
                                               check_same_thread=False))
    agent = create_deep_agent(
        model=RuleModel(calls=[CHARGE], label="deep"), tools=[_charge_tool(payments)],
        middleware=[EffectGuardMiddleware({"charge": _policy(payments, False)})],
        interrupt_on={"charge": True}, checkpointer=saver)
    config = {"configurable": {"thread_id": "t"}}
    agent.invoke({"messages": [HumanMessage("Charge Ana.")]}, config, durability="sync")
    assert agent.get_state(config).interrupts and payments.count() == 0
    agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config, durability="sync")
    assert payments.count() == 1
    assert {r.tool: r.status.value for r in saver.effects("t")} == {"charge": "applied"}
