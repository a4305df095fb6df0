"""The audit of a resume, against a hand count of a scripted crash in real processes.

The saga agent (`graph_durable.testing.scenarios.saga`, run `audited`) asks the model,
charges (a provider that can be looked up), asks the model, opens a ticket, asks the
model. Scripted:

1. the first run is SIGKILLed after the charge reached its provider, before its receipt;
2. the first resume is SIGKILLed after the second model call answered, before the
   model's step saved its writes;
3. the second resume runs to the end.

By hand: run 1 made 1 model call and sent the charge; resume 1 ran the tools node again,
found the charge by lookup, and made 1 model call, none repeated; resume 2 ran the model's
node again and paid that model call a second time (2 calls, 1 repeated), then sent the
ticket. Nothing reached a provider twice.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graph_durable import DurableSqliteSaver, cancel
from graph_durable.cli import main
from graph_durable.testing import FaultPlan
from graph_durable.testing.crash.forkserver import ForkServer
from graph_durable.testing.scenarios.saga import SAGA_THREAD, build_saga_agent

STEP = "graph_durable.testing.scenarios.saga:saga_step"


@pytest.fixture(scope="module")
def crashed_twice(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("audit")
    kwargs = {"db_path": str(folder / "agent.sqlite"), "provider_dir": str(folder)}
    with ForkServer(["graph_durable.testing.scenarios.saga"]) as server:
        assert server.run(STEP, {**kwargs, "action": "run"},
                          fault=FaultPlan("after_effect", "charge")).killed
        # The resume saves the tools step's writes first, then the model's: the second.
        assert server.run(STEP, {**kwargs, "action": "resume"},
                          fault=FaultPlan("before_put_writes", occurrence=2)).killed
        done = server.run(STEP, {**kwargs, "action": "resume"})
        assert done.exitcode == 0, done
    return folder


@pytest.mark.crash
def test_the_audit_of_a_scripted_crash_matches_the_hand_count(crashed_twice: Path) -> None:
    with DurableSqliteSaver.from_conn_string(str(crashed_twice / "agent.sqlite")) as saver:
        audit = saver.audit(SAGA_THREAD)
    first, resume1, resume2 = audit.runs
    assert (first.model_calls, first.model_calls_repeated, first.nodes_rerun) == (1, 0, [])
    assert first.sent == ["charge(call_charge)"] and first.reconciled == []
    assert [n.split()[0] for n in resume1.nodes_rerun] == ["tools"]
    assert (resume1.model_calls, resume1.model_calls_repeated) == (1, 0)
    assert resume1.reconciled == ["charge(call_charge)"] and resume1.sent == []
    assert [n.split()[0] for n in resume2.nodes_rerun] == ["agent"]
    assert (resume2.model_calls, resume2.model_calls_repeated) == (2, 1)
    assert resume2.sent == ["open_ticket(call_ticket)"]
    assert audit.sent_more_than_once == []
    assert sum(r.model_calls_repeated or 0 for r in audit.runs) == 1  # the token bill


@pytest.mark.crash
def test_the_audit_shows_compensations_and_the_cli_prints_it(crashed_twice: Path,
                                                              capsys) -> None:
    agent = build_saga_agent(str(crashed_twice / "agent.sqlite"), str(crashed_twice))
    report = cancel(agent.graph, agent.saver, SAGA_THREAD, owner="ops")
    assert len(report.compensated) == 2
    audit = agent.saver.audit(SAGA_THREAD)
    assert audit.runs[-1].compensated == ["open_ticket(call_ticket)", "charge(call_charge)"]
    assert "<table" in audit._repr_html_()
    db = str(crashed_twice / "agent.sqlite")
    assert main(["audit", "--db", db, "--thread", SAGA_THREAD]) == 0
    out = capsys.readouterr().out
    assert "resume 2" in out and "model calls: 2, repeated: 1" in out
    assert main(["audit", "--db", db, "--thread", SAGA_THREAD, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [run["model_calls_repeated"] for run in data["runs"]] == [0, 0, 1]
    assert data["runs"][0]["started_at"].endswith("+00:00")
    assert main(["audit", "--db", db, "--thread", "nope"]) == 1


def test_a_thread_run_without_the_run_log_still_gets_its_effects_audited(tmp_path) -> None:
    agent = build_saga_agent(str(tmp_path / "agent.sqlite"), str(tmp_path))
    agent.graph.invoke(agent.inputs, {"configurable": {"thread_id": SAGA_THREAD}},
                       durability="sync")
    [run] = agent.saver.audit(SAGA_THREAD).runs
    assert run.run_id is None and run.model_calls is None
    assert run.sent == ["charge(call_charge)", "open_ticket(call_ticket)"]


async def test_a_sync_model_call_under_ainvoke_is_logged_on_the_savers_loop(tmp_path) -> None:
    """Under `ainvoke`, a sync node's model call reaches the run log through a sync
    callback manager, which runs `AsyncRunLog`'s coroutine on a loop of its own in
    another thread; the async saver's lock and connection were used from there (explorer
    seed 921015, async: a child hung until its timeout, its log saying a lock "is bound
    to a different event loop"). The run log hands such writes to the saver's loop."""
    import asyncio

    import aiosqlite
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.graph import START, MessagesState, StateGraph

    from graph_durable.checkpointers.sqlite import AsyncDurableSqliteSaver
    from graph_durable.operators.audit import AsyncRunLog, run_log
    from graph_durable.testing.models import ScriptedChatModel

    saver = AsyncDurableSqliteSaver(aiosqlite.connect(str(tmp_path / "a.sqlite")))
    model = ScriptedChatModel(script=[AIMessage("hi", id="m1")])

    def agent(state: MessagesState) -> dict:  # sync: LangGraph runs it on a worker thread
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState).add_node("agent", agent).add_edge(START, "agent")
    graph = graph.compile(checkpointer=saver)
    foreign: list[bool] = []
    record = saver.arecord_task_run

    async def watched(*args):
        foreign.append(asyncio.get_running_loop() is not saver.loop)
        await record(*args)

    saver.arecord_task_run = watched  # type: ignore[method-assign]
    log = run_log(saver)
    assert isinstance(log, AsyncRunLog)
    async with saver.conn:
        await graph.ainvoke({"messages": [HumanMessage("go")]},
                            {"configurable": {"thread_id": "t"}, "callbacks": [log]},
                            durability="sync")
        for _ in range(50):  # writes handed to the loop are not awaited by the call
            if sorted(kind for *_, kind, _ in await saver.atask_runs("t")) == ["model", "node"]:
                break
            await asyncio.sleep(0.01)
        kinds = sorted(kind for *_, kind, _ in await saver.atask_runs("t"))
    assert foreign and not any(foreign), "the saver was used from another event loop"
    assert kinds == ["model", "node"]
