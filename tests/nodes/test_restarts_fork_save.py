"""A guarded call in a subgraph that a run from a checkpoint id restarted reads where the
run's fork came from; LangGraph saves that fork checkpoint in the background."""

from __future__ import annotations

from pathlib import Path

import pytest

from graph_durable.testing import FakeProvider, FaultPlan, InjectedCrash, arm, disarm
from tests.nodes.test_guarded_writes import _SlowForkSaves

CONFIG = {"configurable": {"thread_id": "t"}}


@pytest.mark.parametrize("is_async", [False, True])
async def test_a_restarted_subgraph_whose_fork_is_saved_late_keeps_the_charge_key(
        tmp_path: Path, is_async: bool) -> None:
    """Killed after the charge, the thread is run from `get_state().config`: the subgraph
    restarts, and its charge must take the key of the earlier run's. The run's fork
    checkpoint, saved in the background (as a busy PostgreSQL pool does), was read before
    it was stored: no fork was found, the charge took a new key and was sent again."""
    from graph_durable.testing.scenarios.subgraphs import (
        build_subgraph_charge_agent,
        build_subgraph_charge_agent_async,
    )

    charges = FakeProvider(str(tmp_path / "charge.sqlite"), "blind", name="charge")
    if is_async:
        agent = await build_subgraph_charge_agent_async(str(tmp_path / "a.sqlite"),
                                                        str(tmp_path), "blind")
    else:
        agent = build_subgraph_charge_agent(str(tmp_path / "a.sqlite"), str(tmp_path),
                                            "blind")
    _SlowForkSaves(agent.saver)
    arm(FaultPlan("after_effect", tool="charge", action="raise"))
    try:
        with pytest.raises(InjectedCrash):
            if is_async:
                await agent.graph.ainvoke(agent.inputs, CONFIG, durability="sync")
            else:
                agent.graph.invoke(agent.inputs, CONFIG, durability="sync")
    finally:
        disarm()
    assert charges.count() == 1
    if is_async:
        latest = (await agent.graph.aget_state(CONFIG)).config
        await agent.graph.ainvoke(None, latest, durability="sync")
        await agent.saver.conn.close()
    else:
        agent.graph.invoke(None, agent.graph.get_state(CONFIG).config, durability="sync")
        agent.saver.conn.close()
    assert charges.count() == 1, f"sent again: {charges.requests()}"
