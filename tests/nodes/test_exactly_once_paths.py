"""Exactly once on the paths beside the plain resume: copies run forward, stale workers,
legacy ledgers, timeouts with a lookup, unchanged edits, repeated calls, bad input.

Each test counts the provider's side. The crash tests of forks and time travel, which
kill a real process, are in `tests/test_crash_forks.py`.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.types import Command

from graph_durable import (
    DurableSqliteSaver,
    Effect,
    EffectStatus,
    InvalidDecision,
    current_effect,
    review,
)
from graph_durable.errors import UnkeyableToolCall
from graph_durable.ledger import key_of_encoded
from graph_durable.testing import FakeProvider, FaultPlan, InjectedCrash, arm, disarm
from tests.fakes import charge_tool
from tests.nodes.test_guard import CONFIG, build, call, ledger_serde, run


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "a.sqlite"


SERDE: list[Any] = [None]


@pytest.fixture(autouse=True, params=["plain", "sealed"])
def _ledger(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every path runs on a plain ledger and on one sealed by an encrypting serde."""
    SERDE[0] = ledger_serde(request.param)
    yield
    SERDE[0] = None


def open_saver(db: Path) -> DurableSqliteSaver:
    return DurableSqliteSaver(sqlite3.connect(db, check_same_thread=False), serde=SERDE[0])


@pytest.fixture(autouse=True)
def _disarm():
    yield
    disarm()


def crash_at(point: str, graph: Any, value: Any = None, config: dict = CONFIG) -> None:
    arm(FaultPlan(point, action="raise"))
    with pytest.raises(InjectedCrash):
        graph.invoke({"messages": [HumanMessage("go")]} if value is None else value, config,
                     durability="sync")
    disarm()


# -- copies ---------------------------------------------------------------------------------


@pytest.mark.parametrize("first", ["source", "copy"])
def test_a_copy_taken_before_the_tools_step_sends_a_blind_call_once(db, tmp_path, first) -> None:
    """Both threads run forward from a copy taken while the call was still to be sent."""
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "blind")
    saver = open_saver(db)
    graph = build(saver, [charge_tool(provider)], {}, call("charge", {"cents": 5}))
    crash_at("before_intent", graph)
    saver.copy_thread("t", "fork")
    order = ["t", "fork"] if first == "source" else ["fork", "t"]
    results = [graph.invoke(None, {"configurable": {"thread_id": thread}}, durability="sync")
               for thread in order]
    assert provider.count() == 1 and len(provider.requests()) == 1
    for result in results:
        assert result["messages"][-1].content == "done"
        assert result["messages"][2].content == "charged effect-1"
    assert [r.status for r in saver.effects("t") + saver.effects("fork")] == ["applied"] * 2
    [second_intent] = [e for e in saver.events(order[1]) if e.kind == "intent"]
    assert second_intent.data["inherited"] is True


@pytest.mark.parametrize("copy_when", ["mid_call", "before_claim"])
def test_a_copy_run_while_its_source_has_the_call_on_its_way_does_not_send_it(
        db, tmp_path, copy_when) -> None:
    """The source thread claimed a call and is still waiting for the provider when its
    copy runs the same call (copied with the source's open intent, or copied before and
    claiming it then, taking that intent over). A lookup finds nothing yet, but the
    attempt is alive elsewhere: the copy must not send it too. It asks a human, and once
    the source's call landed, the copy gets the source's receipt."""
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "lookup")
    entered, release = threading.Event(), threading.Event()

    @tool
    def charge(cents: int) -> str:
        """Charge; the source's call waits for the test before the provider applies it."""
        if current_effect().thread_id == "t":
            entered.set()
            assert release.wait(30)
        return f"charged {provider.apply(current_effect().key, {'cents': cents})['id']}"

    saver = open_saver(db)
    graph = build(saver, [charge], {"charge": Effect(lookup=provider.find)},
                  call("charge", {"cents": 5}))
    if copy_when == "before_claim":
        crash_at("before_intent", graph)
        saver.copy_thread("t", "fork")
    source = threading.Thread(target=lambda: graph.invoke(
        {"messages": [HumanMessage("go")]} if copy_when == "mid_call" else None, CONFIG,
        durability="sync"))
    source.start()
    try:
        assert entered.wait(30)
        if copy_when == "mid_call":
            saver.copy_thread("t", "fork")
        fork = {"configurable": {"thread_id": "fork"}}
        result = graph.invoke(None, fork, durability="sync")
        [question] = result["__interrupt__"]
        assert question.value["type"] == "effect_unknown"
        assert "thread 't' of the same family has this call in_flight" in question.value["error"]
        assert provider.count() == 0
    finally:
        release.set()
        source.join(30)
    assert provider.count() == 1
    result = graph.invoke(Command(resume={"type": "retry"}), fork, durability="sync")
    assert result["messages"][-1].content == "done"
    assert provider.count() == 1 and len(provider.requests()) == 1
    assert [r.status for r in saver.effects("t") + saver.effects("fork")] == ["applied"] * 2
    taken = [e for e in saver.events("fork") if e.kind == "attempt"][0]
    assert taken.data["reason"] == "in_flight in thread 't' of the same family"


def test_a_worker_that_ran_a_thread_sees_it_replaced_by_a_copy(db, tmp_path) -> None:
    """Worker 1 ran `dst`; worker 2 deleted it and copied into it a thread that crashed
    after an idempotent charge. Worker 1 resumes `dst` under the source's keys."""
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "dedupe")
    worker1, worker2 = open_saver(db), open_saver(db)
    tools, effects = [charge_tool(provider)], {"charge": Effect(idempotent=True)}
    graph1 = build(worker1, tools, effects, call("charge", {"cents": 5}))
    graph2 = build(worker2, tools, effects, call("charge", {"cents": 5}))
    dst = {"configurable": {"thread_id": "dst"}}
    graph1.invoke({"messages": [HumanMessage("other")]}, dst, durability="sync")
    crash_at("after_effect", graph2)  # thread "t": applied, receipt not durable
    worker2.delete_thread("dst")
    worker2.copy_thread("t", "dst")
    result = graph1.invoke(None, dst, durability="sync")
    assert result["messages"][-1].content == "done"
    keys = {request["key"] for request in provider.requests()}
    assert len(keys) == 2  # "dst"'s own first run, and the copied call under one key
    assert provider.count() == 2
    [copied] = [r for r in worker1.effects("dst") if r.key in {e.key for e in worker2.effects("t")}]
    assert copied.status is EffectStatus.APPLIED


# -- ledgers written before keys were anchored to the requesting message --------------------


def test_a_legacy_in_flight_effect_is_found_under_its_legacy_key(db, tmp_path) -> None:
    """An effect recorded by an older version (key from the task namespace) that was in
    flight at the upgrade is reconciled, not sent again under a new key."""
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "blind")
    saver = open_saver(db)
    graph = build(saver, [charge_tool(provider)], {}, call("charge", {"cents": 5}))
    crash_at("after_effect", graph)
    [record] = saver.effects("t")
    legacy = key_of_encoded("t", record.checkpoint_ns, record.tool_call_id, record.tool,
                            '{"cents":5}')
    assert legacy != record.key
    with sqlite3.connect(db) as conn:  # what an upgraded pre-anchor ledger holds
        conn.execute("UPDATE effects SET key = ? WHERE key = ?", (legacy, record.key))
        conn.execute("UPDATE effect_events SET key = ? WHERE key = ?", (legacy, record.key))
        conn.execute("INSERT INTO legacy_key_threads (thread_id) VALUES ('t')")
    result = run(build(open_saver(db), [charge_tool(provider)], {},
                       call("charge", {"cents": 5})), None)
    [question] = result["__interrupt__"]
    assert question.value["type"] == "effect_unknown" and question.value["key"] == legacy
    assert provider.count() == 1


def test_migration_lists_threads_with_effects_from_before(tmp_path) -> None:
    from graph_durable.checkpointers._schema import MIGRATIONS

    conn = sqlite3.connect(tmp_path / "old.sqlite")
    for script in MIGRATIONS[:3]:
        conn.executescript(script)
    conn.execute("INSERT INTO effects (thread_id, key, checkpoint_ns, tool_call_id, tool, args, "
                 "status, attempts, created_at, updated_at) VALUES ('old', 'gd-x', 'tools:1', "
                 "'c1', 'charge', '{}', 'in_flight', 1, 0, 0)")
    conn.executescript(MIGRATIONS[3])
    assert conn.execute("SELECT thread_id FROM legacy_key_threads").fetchall() == [("old",)]


# -- timeouts with a lookup -----------------------------------------------------------------


def test_a_timeout_with_a_lookup_never_sends_while_the_attempt_may_land(db, tmp_path) -> None:
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "lookup")
    saver = open_saver(db)

    @tool
    def charge(cents: int) -> str:
        """Charge; the first attempt is slow and lands after the guard gave up."""
        effect = current_effect()
        if effect.attempt == 1:
            time.sleep(1.0)
        return f"charged {provider.apply(effect.key, {'cents': cents})['id']}"

    graph = build(saver, [charge], {"charge": Effect(lookup=provider.find, timeout=0.3)},
                  call("charge", {"cents": 5}))
    result = run(graph)
    [question] = result["__interrupt__"]
    assert question.value["type"] == "effect_unknown"
    assert "may still land" in question.value["error"]
    # A retry while the abandoned attempt still runs here is refused, not sent.
    result = graph.invoke(Command(resume={"type": "retry"}), CONFIG, durability="sync")
    assert "still running" in result["__interrupt__"][0].value["error"]
    time.sleep(1.2)
    assert provider.count() == 1  # the abandoned attempt landed
    result = graph.invoke(Command(resume={"type": "retry"}), CONFIG, durability="sync")
    assert result["messages"][-1].content == "done"
    assert provider.count() == 1 and len(provider.requests()) == 1
    receipt = [e for e in saver.events("t") if e.kind == "receipt"]
    assert receipt[0].data["source"] == "lookup"  # the retry looked the key up first


async def test_async_timeout_with_a_lookup_does_not_resend(tmp_path) -> None:
    import asyncio

    import aiosqlite

    from graph_durable import AsyncDurableSqliteSaver

    provider = FakeProvider(str(tmp_path / "p.sqlite"), "lookup")

    @tool
    async def charge(cents: int) -> str:
        """Charge, slowly; the provider applies even when the caller gave up."""
        key = current_effect().key
        await asyncio.shield(asyncio.to_thread(_late_apply, provider, key))
        return "charged"

    async with aiosqlite.connect(tmp_path / "a.sqlite") as conn:
        saver = AsyncDurableSqliteSaver(conn, serde=SERDE[0])
        graph = build(saver, [charge], {"charge": Effect(lookup=provider.find, timeout=0.3)},
                      call("charge", {"cents": 5}))
        result = await graph.ainvoke({"messages": [HumanMessage("go")]}, CONFIG,
                                     durability="sync")
        [question] = result["__interrupt__"]
        assert question.value["type"] == "effect_unknown"
        await asyncio.sleep(1.0)
        assert provider.count() == 1


def _late_apply(provider: FakeProvider, key: str) -> None:
    time.sleep(0.8)
    provider.apply(key, {})


# -- decisions ------------------------------------------------------------------------------


def test_an_edit_with_unchanged_args_acts_as_approve(db, tmp_path) -> None:
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "blind")
    saver = open_saver(db)
    graph = build(saver, [charge_tool(provider)], {"charge": Effect(approval=True)},
                  call("charge", {"cents": 5}))
    run(graph)
    edit = {"type": "edit", "edited_action": {"name": "charge", "args": {"cents": 5}}}
    result = graph.invoke(Command(resume=edit), CONFIG, durability="sync")
    assert result["messages"][-1].content == "done"
    assert provider.count() == 1
    [record] = saver.effects("t")
    assert record.status is EffectStatus.APPLIED


def test_resume_keys_of_mixed_types_are_refused_cleanly(db, tmp_path) -> None:
    """LangGraph itself rejects a non-string key when it reads the resume map; the
    guard's matching (also used by `review` and the CLI) refuses it as a decision."""
    from graph_durable.nodes.decisions import match_decisions

    provider = FakeProvider(str(tmp_path / "p.sqlite"), "blind")
    saver = open_saver(db)
    graph = build(saver, [charge_tool(provider)], {"charge": Effect(approval=True)},
                  call("charge", {"cents": 5}))
    run(graph)
    asked = saver.effects("t")
    with pytest.raises(InvalidDecision, match="keyed by interrupt id or tool_call_id") as refused:
        match_decisions({7: {"type": "approve"}, "zz": {"type": "approve"}}, asked, "t")
    assert refused.value.thread_id == "t"
    assert review(graph, CONFIG).pending[0].tool_call_id == "c1"


# -- the same call twice, and calls without an id -------------------------------------------


@pytest.mark.parametrize("mode", ["blind", "dedupe"])
def test_the_same_call_twice_in_one_message_is_one_effect(db, tmp_path, mode) -> None:
    provider = FakeProvider(str(tmp_path / "p.sqlite"), mode)
    saver = open_saver(db)

    @tool
    def charge(cents: int) -> str:
        """Charge."""
        receipt = provider.apply(current_effect().key, {"cents": cents})
        return f"charged {receipt['id']}"

    policy = {"charge": Effect(idempotent=True)} if mode == "dedupe" else {}
    twice = call("charge", {"cents": 5})
    graph = build(saver, [charge], policy, twice, dict(twice))
    result = run(graph)
    assert "__interrupt__" not in result
    answers = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert [m.content for m in answers] == ["charged effect-1"] * 2
    assert provider.count() == 1 and len(provider.requests()) == 1
    assert [r.status for r in saver.effects("t")] == [EffectStatus.APPLIED]


def test_a_tool_call_without_an_id_is_refused_before_anything_is_written(db, tmp_path) -> None:
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "blind")
    saver = open_saver(db)
    graph = build(saver, [charge_tool(provider)], {}, call("charge", {"cents": 5}))
    graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync",
                 interrupt_before=["tools"])
    state = graph.get_state(CONFIG)
    message = state.values["messages"][-1]
    broken = AIMessage(content="", id=message.id,
                       tool_calls=[{"name": "charge", "args": {"cents": 5}, "id": None}])
    broken.tool_calls[0]["id"] = None
    graph.update_state(CONFIG, {"messages": [broken]})
    with pytest.raises(UnkeyableToolCall, match="tool_call_id None"):
        graph.invoke(None, CONFIG, durability="sync")
    assert saver.effects() == [] and provider.count() == 0
