"""Compensation in process: `compensate()` on one effect, `cancel()` of a thread, and the
rules that keep both honest (checked on the providers' side). The crash proofs are in
`test_compensation_crash.py`."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import StructuredTool

from graph_durable import (
    Compensation,
    DurableSqliteSaver,
    Effect,
    EffectStatus,
    InvalidDecision,
    ThreadCancelled,
    cancel,
    compensate,
    current_effect,
    review,
    thread_status,
)
from graph_durable.testing.models import ScriptedChatModel
from graph_durable.testing.providers import FakeProvider
from graph_durable.testing.scenarios.effects import react_graph
from graph_durable.testing.scenarios.saga import SAGA_THREAD, assemble_saga_agent, saga_providers

S = EffectStatus
CONFIG = {"configurable": {"thread_id": SAGA_THREAD}}


def saga_agent(tmp_path: Path, refund_mode: str = "dedupe", close_mode: str = "lookup"):
    saver = DurableSqliteSaver(sqlite3.connect(tmp_path / "agent.sqlite", check_same_thread=False))
    return assemble_saga_agent(saver, saga_providers(str(tmp_path), refund_mode, close_mode))


def test_compensate_undoes_one_applied_effect_once_and_refuses_a_second_time(tmp_path) -> None:
    agent = saga_agent(tmp_path)
    agent.graph.invoke(agent.inputs, CONFIG, durability="sync")
    record = compensate(agent.graph, agent.saver, SAGA_THREAD, "call_charge", reviewer="ana")
    assert record.status is S.COMPENSATED
    refunds = agent.providers["refunds"]
    assert refunds.count() == 1 and refunds.effects()[0]["payload"] == {"charge": "charge-1"}
    with pytest.raises(InvalidDecision, match="compensated already. Nothing was changed"):
        compensate(agent.graph, agent.saver, SAGA_THREAD, "call_charge")
    assert refunds.count() == 1
    # The ticket stays; the journal says who asked for the refund, before it was sent.
    assert agent.saver.effects(SAGA_THREAD)[1].status is S.APPLIED
    undo = next(r for r in agent.saver.effects(SAGA_THREAD) if r.tool == "refund")
    [intent] = [e for e in agent.saver.events(SAGA_THREAD, undo.key) if e.kind == "intent"]
    assert intent.data["decision"] == {"type": "compensate", "reviewer": "ana"}
    assert intent.data["compensates"] == record.key


def test_cancel_undoes_newest_first_and_the_thread_never_runs_again(tmp_path) -> None:
    agent = saga_agent(tmp_path)
    agent.graph.invoke(agent.inputs, CONFIG, durability="sync")
    report = cancel(agent.graph, agent.saver, SAGA_THREAD, owner="ops")
    assert report.outcome == "cancelled"
    assert [r.tool for r in report.compensated] == ["open_ticket", "charge"]
    closures, refunds = agent.providers["closures"], agent.providers["refunds"]
    undone = [e.data["by"] for e in agent.saver.events(SAGA_THREAD) if e.kind == "compensated"]
    assert undone == ["close_ticket", "refund"]  # a saga: the newest effect is undone first
    status = thread_status(agent.saver, SAGA_THREAD)
    assert status.status == "cancelled" and "'ops'" in status.reason
    with pytest.raises(ThreadCancelled, match="was cancelled by 'ops'"):
        agent.graph.invoke({"messages": [HumanMessage("again")]}, CONFIG, durability="sync")
    with pytest.raises(ThreadCancelled):
        with agent.saver.lease(SAGA_THREAD, "worker-2"):
            pass
    again = cancel(agent.graph, agent.saver, SAGA_THREAD, owner="ops-2")  # nothing twice
    assert [r.tool for r in again.compensated] == ["open_ticket", "charge"]
    assert refunds.count() == 1 and closures.count() == 1


def test_cancel_without_compensate_leaves_effects_in_place_and_rejects_unsent_calls(
        tmp_path) -> None:
    charges = FakeProvider(str(tmp_path / "charges.sqlite"), "lookup", name="charge")

    def charge(cents: int) -> dict[str, Any]:
        return charges.apply(current_effect().key, {"cents": cents})

    model = ScriptedChatModel(script=[
        AIMessage(content="", tool_calls=[{"name": "charge", "id": "c1", "args": {"cents": 1}},
                                          {"name": "wire", "id": "c2", "args": {"cents": 2}}]),
        AIMessage(content="done")])
    tools = [StructuredTool.from_function(charge, name="charge", description="Charge."),
             StructuredTool.from_function(charge, name="wire", description="Wire.")]
    graph = _graph(tmp_path, model, tools, {"charge": Effect(lookup=charges.find),
                                           "wire": Effect(approval=True)})
    graph.invoke({"messages": [HumanMessage("pay")]}, CONFIG, durability="sync")
    assert [p.tool_call_id for p in review(graph, CONFIG).pending] == ["c2"]
    report = cancel(graph, graph.checkpointer, SAGA_THREAD, compensate=False)
    assert [r.tool_call_id for r in report.left_in_place] == ["c1"]
    assert [(r.tool_call_id, r.status) for r in report.withdrawn] == [("c2", S.REJECTED)]
    assert charges.count() == 1
    assert review(graph, CONFIG).pending == []


def _saver(tmp_path: Path) -> DurableSqliteSaver:
    return DurableSqliteSaver(sqlite3.connect(tmp_path / "agent.sqlite", check_same_thread=False))


def _graph(tmp_path: Path, model: Any, tools: list[Any], effects: dict[str, Effect]) -> Any:
    return react_graph(model, tools, effects, _saver(tmp_path))


def _unknown_graph(tmp_path: Path, *, lookup: bool = True,
                   can_tell: threading.Event | None = None) -> Any:
    """The graph of `_unknown_charge` (a charge that raises; a lookup that cannot tell
    until `can_tell` is set, and then finds nothing)."""
    return _unknown_parts(tmp_path, lookup=lookup, can_tell=can_tell)[0]


def _unknown_charge(tmp_path: Path, *, lookup: bool):
    """A thread paused on a charge whose outcome is unknown (the call raised, and the
    lookup could not tell at the time)."""
    can_tell = threading.Event()
    graph, refunds = _unknown_parts(tmp_path, lookup=lookup, can_tell=can_tell)
    graph.invoke({"messages": [HumanMessage("pay")]}, CONFIG, durability="sync")
    [pending] = review(graph, CONFIG).pending
    assert pending.kind == "unknown"
    return graph, refunds, can_tell


def _unknown_parts(tmp_path: Path, *, lookup: bool, can_tell: threading.Event | None):
    refunds = FakeProvider(str(tmp_path / "refunds.sqlite"), "dedupe", name="refund")
    if can_tell is None:
        can_tell = threading.Event()
        can_tell.set()

    def find(key: str) -> Any:
        if not can_tell.is_set():
            raise TimeoutError("the provider's search is down")
        return None

    return unknown_charge_graph(_saver(tmp_path), refunds, find if lookup else None), refunds


def unknown_charge_graph(saver: Any, refunds: FakeProvider,
                         find: Callable[[str], Any] | None = None) -> Any:
    """A graph on `saver` whose one `charge` (call `c1`) raises, so its outcome is
    unknown (`find` its lookup, if any); its compensation refunds through `refunds`."""
    def charge(cents: int) -> dict[str, Any]:
        raise ConnectionError("connection reset")

    undo = Compensation(lambda record, receipt: refunds.apply(current_effect().key, {}),
                        effect=Effect(idempotent=True), name="refund")
    model = ScriptedChatModel(script=[
        AIMessage(content="", tool_calls=[{"name": "charge", "id": "c1", "args": {"cents": 5}}]),
        AIMessage(content="done")])
    tool = StructuredTool.from_function(charge, name="charge", description="Charge.")
    return react_graph(model, [tool], {"charge": Effect(lookup=find, compensate=undo)}, saver)


def test_compensating_an_unknown_effect_a_lookup_finds_absent_undoes_nothing(tmp_path) -> None:
    graph, refunds, can_tell = _unknown_charge(tmp_path, lookup=True)
    can_tell.set()
    record = compensate(graph, graph.checkpointer, SAGA_THREAD, "c1", reviewer="ana")
    assert record.status is S.SKIPPED
    assert refunds.count() == 0 and refunds.requests() == []
    events = graph.checkpointer.events(SAGA_THREAD, record.key)
    assert [e.kind for e in events][-2:] == ["decision", "resolved"]
    assert "a lookup found no effect" in events[-1].data["reason"]
    # The paused step goes on with that answer; nothing is asked again.
    graph.invoke(None, CONFIG, durability="sync")
    assert review(graph, CONFIG).pending == []
    messages = graph.get_state(CONFIG).values["messages"]
    assert "nothing to undo" in messages[-2].content


def test_an_unknown_effect_without_a_lookup_is_compensated_only_on_a_humans_receipt(
        tmp_path) -> None:
    graph, refunds, _ = _unknown_charge(tmp_path, lookup=False)
    with pytest.raises(InvalidDecision, match="has no lookup: give receipt="):
        compensate(graph, graph.checkpointer, SAGA_THREAD, "c1")
    assert graph.checkpointer.effects(SAGA_THREAD)[0].status is S.UNKNOWN
    record = compensate(graph, graph.checkpointer, SAGA_THREAD, "c1",
                        receipt={"id": "charge-9"}, reviewer="ana")
    assert record.status is S.COMPENSATED and refunds.count() == 1
    graph.invoke(None, CONFIG, durability="sync")
    assert "Applied, then undone by refund" in graph.get_state(CONFIG).values["messages"][-2].content


def test_a_policy_without_compensation_is_refused_and_nothing_changes(tmp_path) -> None:
    agent = saga_agent(tmp_path)
    agent.graph.invoke(agent.inputs, CONFIG, durability="sync")
    before = agent.saver.events(SAGA_THREAD)
    with pytest.raises(InvalidDecision, match="has no compensation"):
        compensate(agent.graph, agent.saver, SAGA_THREAD, "call_charge",
                   effects={"charge": Effect()})
    with pytest.raises(InvalidDecision, match="has no effect for tool call 'nope'"):
        compensate(agent.graph, agent.saver, SAGA_THREAD, "nope")
    assert agent.saver.events(SAGA_THREAD) == before


def test_a_compensation_that_fails_for_certain_is_a_humans_question_then_retried(
        tmp_path) -> None:
    agent = saga_agent(tmp_path, refund_mode="lookup")
    agent.graph.invoke(agent.inputs, CONFIG, durability="sync")
    refunds = agent.providers["refunds"]
    refunds.script_faults("permanent")
    record = compensate(agent.graph, agent.saver, SAGA_THREAD, "call_charge")
    assert record.status is S.COMPENSATION_FAILED and "refused" in (record.error or "")
    assert thread_status(agent.saver, SAGA_THREAD).status == "done"
    record = compensate(agent.graph, agent.saver, SAGA_THREAD, "call_charge")  # a new try
    assert record.status is S.COMPENSATED and refunds.count() == 1
    undos = [r for r in agent.saver.effects(SAGA_THREAD) if r.tool == "refund"]
    assert sorted(r.status.value for r in undos) == ["applied", "failed"]
    assert len({r.key for r in undos}) == 2


def test_two_workers_cancelling_at_once_on_postgres_run_one_saga(
        tmp_path, postgres_conninfo) -> None:
    psycopg = pytest.importorskip("psycopg")
    from graph_durable.checkpointers.postgres import DurablePostgresSaver

    providers = saga_providers(str(tmp_path), "lookup", "lookup")
    savers = [DurablePostgresSaver(psycopg.connect(postgres_conninfo, autocommit=True))
              for _ in range(3)]
    savers[0].setup()
    agents = [assemble_saga_agent(saver, providers) for saver in savers]
    agents[0].graph.invoke(agents[0].inputs, CONFIG, durability="sync")
    start = threading.Barrier(2)
    reports: list[Any] = []

    def worker(agent: Any, name: str) -> None:
        start.wait()
        reports.append(cancel(agent.graph, agent.saver, SAGA_THREAD, owner=name))

    threads = [threading.Thread(target=worker, args=(agents[i], f"w{i}")) for i in (1, 2)]
    for one in threads:
        one.start()
    for one in threads:
        one.join(60)
    assert sorted(r.outcome for r in reports) in (["cancelled", "cancelled"],
                                                  ["cancelled", "held_elsewhere"])
    assert providers["refunds"].count() == 1 and providers["closures"].count() == 1
    owners = {e.owner for e in savers[0].events(SAGA_THREAD) if e.kind == "compensated"}
    assert len(owners) == 1  # one worker ran the saga
    assert thread_status(savers[0], SAGA_THREAD).status == "cancelled"


def test_the_cli_cancels_a_thread_and_compensates_one_effect(tmp_path, monkeypatch, capsys
                                                            ) -> None:
    from graph_durable.cli import main

    agent = saga_agent(tmp_path)
    agent.graph.invoke(agent.inputs, CONFIG, durability="sync")
    monkeypatch.setenv("GRAPH_DURABLE_SAGA_DIR", str(tmp_path))
    db = str(tmp_path / "agent.sqlite")
    graph = "graph_durable.testing.scenarios.saga:graph_on"
    assert main(["compensate", "--db", db, "--graph", graph, "--thread", SAGA_THREAD,
                 "--call", "call_ticket", "--receipt", "not json"]) == 2
    assert "--receipt is not JSON" in capsys.readouterr().err
    assert main(["compensate", "--db", db, "--graph", graph, "--thread", SAGA_THREAD,
                 "--call", "call_ticket", "--json"]) == 0
    [row] = __import__("json").loads(capsys.readouterr().out)
    assert row["status"] == "compensated" and row["tool"] == "open_ticket"
    assert main(["cancel", "--db", db, "--graph", graph, "--thread", SAGA_THREAD,
                 "--owner", "ops", "--json"]) == 0
    rows = __import__("json").loads(capsys.readouterr().out)
    assert [(r["tool"], r["outcome"]) for r in rows] == [("open_ticket", "compensated"),
                                                         ("charge", "compensated")]
    assert agent.providers["refunds"].count() == 1 and agent.providers["closures"].count() == 1
    assert main(["status", "--db", db, "--thread", SAGA_THREAD]) == 0
    assert "cancelled" in capsys.readouterr().out


def test_review_compensates_a_pending_unknown_effect_and_the_thread_goes_on(tmp_path) -> None:
    graph, refunds, _ = _unknown_charge(tmp_path, lookup=False)
    pending = review(graph, CONFIG)
    pending.compensate("c1", receipt={"id": "charge-7"}, reviewer="ana")
    assert pending.pending == [] and [i.tool_call_id for i in pending.settled] == ["c1"]
    pending.resume()
    assert refunds.count() == 1 and review(graph, CONFIG).pending == []
    assert graph.checkpointer.effects(SAGA_THREAD)[0].status is S.COMPENSATED
    assert graph.get_state(CONFIG).values["messages"][-1].content == "done"


def test_the_cli_decides_compensate_on_a_pending_unknown_effect(tmp_path, capsys,
                                                               monkeypatch) -> None:
    """`decide` takes `{"type": "compensate"}` beside the other decisions."""
    from graph_durable.cli import main

    graph, refunds, can_tell = _unknown_charge(tmp_path, lookup=True)
    can_tell.set()  # the lookup now answers: no such charge
    graph.checkpointer.conn.close()
    module = tmp_path / "unknown_charge_app.py"
    module.write_text(
        "from pathlib import Path\n"
        "from tests.test_compensation import _unknown_graph\n"
        f"graph = _unknown_graph(Path({str(tmp_path)!r}))\n")
    monkeypatch.chdir(tmp_path)  # --graph finds modules in the working directory
    code = main(["decide", "--db", str(tmp_path / "agent.sqlite"), "--graph",
                 "unknown_charge_app:graph", "--thread", SAGA_THREAD, "--decisions",
                 '{"c1": {"type": "compensate"}}', "--reviewer", "ana"])
    assert code == 0, capsys.readouterr().err
    assert refunds.count() == 0  # the lookup found no charge: nothing to undo
    with DurableSqliteSaver.from_conn_string(str(tmp_path / "agent.sqlite")) as saver:
        [record] = saver.effects(SAGA_THREAD)
        assert record.status is S.SKIPPED
        assert thread_status(saver, SAGA_THREAD).status == "done"


def test_a_compensation_whose_outcome_is_open_is_settled_by_a_humans_receipt(tmp_path) -> None:
    agent = saga_agent(tmp_path, refund_mode="blind")
    agent.graph.invoke(agent.inputs, CONFIG, durability="sync")
    refunds = agent.providers["refunds"]
    refunds.script_faults("lost")  # the refund lands, the answer does not
    record = compensate(agent.graph, agent.saver, SAGA_THREAD, "call_charge")
    assert record.status is S.COMPENSATION_UNKNOWN and "unknown" in (record.error or "")
    assert refunds.count() == 1
    # Blind: nothing can tell, so compensating again without a word sends nothing.
    again = compensate(agent.graph, agent.saver, SAGA_THREAD, "call_charge")
    assert again.status is S.COMPENSATION_UNKNOWN and refunds.count() == 1
    [sent] = refunds.effects()
    record = compensate(agent.graph, agent.saver, SAGA_THREAD, "call_charge",
                        receipt=sent["receipt"], reviewer="ana")
    assert record.status is S.COMPENSATED and refunds.count() == 1  # not sent again
    undo = next(r for r in agent.saver.effects(SAGA_THREAD) if r.tool == "refund")
    assert undo.status is S.APPLIED and undo.receipt == sent["receipt"]


def test_compensating_again_retries_an_open_compensation_under_its_key(tmp_path) -> None:
    agent = saga_agent(tmp_path, refund_mode="lookup")
    agent.graph.invoke(agent.inputs, CONFIG, durability="sync")
    refunds, charges = agent.providers["refunds"], agent.providers["charges"]
    can_tell = threading.Event()

    def find(key: str) -> Any:
        if not can_tell.is_set():
            raise TimeoutError("the refunds search is down")
        return refunds.find(key)

    effects = {"charge": Effect(lookup=charges.find, compensate=Compensation(
        lambda record, receipt: refunds.apply(current_effect().key, {"charge": receipt["id"]}),
        effect=Effect(lookup=find), name="refund"))}
    refunds.script_faults("hang")  # no answer, nothing applied
    refunds.hang_seconds = 0.0
    record = compensate(agent.graph, agent.saver, SAGA_THREAD, "call_charge", effects=effects)
    assert record.status is S.COMPENSATION_UNKNOWN and refunds.count() == 0
    can_tell.set()
    record = compensate(agent.graph, agent.saver, SAGA_THREAD, "call_charge", effects=effects)
    assert record.status is S.COMPENSATED and refunds.count() == 1
    assert len({e["key"] for e in refunds.requests()}) == 1  # one compensating call, one key
    undo = next(r for r in agent.saver.effects(SAGA_THREAD) if r.tool == "refund")
    assert [e.kind for e in agent.saver.events(SAGA_THREAD, undo.key)][-3:] == [
        "decision", "attempt", "receipt"]


def _raising_refund(refunds: FakeProvider, charges: FakeProvider, error: Exception,
                    find: Any = None, **policy: Any) -> dict[str, Effect]:
    """Policies whose refund applies, then raises `error` (unless it is `NotApplied`,
    which is raised before anything is applied)."""
    from graph_durable import NotApplied

    def undo(record: Any, receipt: Any) -> Any:
        if isinstance(error, NotApplied):
            raise error
        refunds.apply(current_effect().key, {"charge": receipt["id"]})
        raise error

    return {"charge": Effect(lookup=charges.find, compensate=Compensation(
        undo, effect=Effect(lookup=find, **policy), name="refund"))}


def test_an_undo_that_raises_is_compensation_unknown_then_its_lookup_settles_it(
        tmp_path) -> None:
    agent = saga_agent(tmp_path, refund_mode="lookup")
    agent.graph.invoke(agent.inputs, CONFIG, durability="sync")
    refunds = agent.providers["refunds"]
    can_tell = threading.Event()

    def find(key: str) -> Any:
        if not can_tell.is_set():
            raise TimeoutError("the refunds search is down")
        return refunds.find(key)

    effects = _raising_refund(refunds, agent.providers["charges"],
                              ConnectionError("reset after sending"), find)
    record = compensate(agent.graph, agent.saver, SAGA_THREAD, "call_charge", effects=effects)
    assert record.status is S.COMPENSATION_UNKNOWN  # not failed: the refund may have landed
    assert "lookup failed" in (record.error or "") and refunds.count() == 1
    assert thread_status(agent.saver, SAGA_THREAD).status == "done"
    report = cancel(agent.graph, agent.saver, SAGA_THREAD, owner="ops", effects=effects)
    assert [r.tool for r in report.needs_human] == ["charge"]  # still nobody can tell
    assert "its outcome is unknown" in thread_status(agent.saver, SAGA_THREAD).reason
    can_tell.set()
    record = compensate(agent.graph, agent.saver, SAGA_THREAD, "call_charge", effects=effects)
    assert record.status is S.COMPENSATED and refunds.count() == 1  # found, not sent again
    undo = next(r for r in agent.saver.effects(SAGA_THREAD) if r.tool == "refund")
    assert undo.status is S.APPLIED and undo.receipt == refunds.find(undo.key)
    kinds = [e.kind for e in agent.saver.events(SAGA_THREAD, record.key)]
    assert kinds.count("compensation_unknown") == 1 and kinds[-1] == "compensated"


def test_a_blind_undo_whose_outcome_is_unknown_is_sent_again_only_on_a_humans_retry(
        tmp_path) -> None:
    agent = saga_agent(tmp_path, refund_mode="blind")
    agent.graph.invoke(agent.inputs, CONFIG, durability="sync")
    refunds = agent.providers["refunds"]
    refunds.script_faults("hang")  # no answer, nothing applied
    refunds.hang_seconds = 0.0
    record = compensate(agent.graph, agent.saver, SAGA_THREAD, "call_charge")
    assert record.status is S.COMPENSATION_UNKNOWN and refunds.count() == 0
    with pytest.raises(InvalidDecision, match="retry=True is a human's word"):
        compensate(agent.graph, agent.saver, SAGA_THREAD, "call_ticket", retry=True)
    record = compensate(agent.graph, agent.saver, SAGA_THREAD, "call_charge", retry=True,
                        reviewer="ana")
    assert record.status is S.COMPENSATED and refunds.count() == 1
    assert len({e["key"] for e in refunds.requests()}) == 1  # the same key, sent again


def test_an_undo_raising_not_applied_is_still_compensation_failed(tmp_path) -> None:
    from graph_durable import NotApplied

    agent = saga_agent(tmp_path, refund_mode="lookup")
    agent.graph.invoke(agent.inputs, CONFIG, durability="sync")
    refunds = agent.providers["refunds"]
    effects = _raising_refund(refunds, agent.providers["charges"],
                              NotApplied("card closed"), refunds.find)
    record = compensate(agent.graph, agent.saver, SAGA_THREAD, "call_charge", effects=effects)
    assert record.status is S.COMPENSATION_FAILED and "card closed" in (record.error or "")
    assert refunds.count() == 0


def test_a_compensation_is_a_span_and_a_counted_outcome(tmp_path, otel) -> None:
    """The undo is observed like any guarded call: a span of kind `compensation` with
    the undo as its child span, and the outcome counted by tool."""
    spans, metrics = otel
    agent = saga_agent(tmp_path)
    agent.graph.invoke(agent.inputs, CONFIG, durability="sync")
    compensate(agent.graph, agent.saver, SAGA_THREAD, "call_charge")
    finished = spans.get_finished_spans()
    [undo] = [s for s in finished if s.name == "guarded_call refund"]
    assert undo.attributes["graph_durable.call.kind"] == "compensation"
    assert undo.attributes["graph_durable.effect.outcome"] == "compensated"
    assert undo.attributes["graph_durable.tool_call_id"] == "compensate:call_charge"
    assert [s.name for s in finished if s.parent is not None
            and s.parent.span_id == undo.context.span_id] == ["undo"]
    counts = {(dict(p.attributes)["graph_durable.tool"], dict(p.attributes)[
        "graph_durable.effect.outcome"]): p.value
        for r in metrics.get_metrics_data().resource_metrics for sc in r.scope_metrics
        for m in sc.metrics if m.name == "graph_durable.calls" for p in m.data.data_points}
    assert counts[("refund", "compensated")] == 1
