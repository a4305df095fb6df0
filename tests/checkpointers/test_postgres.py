"""DurablePostgresSaver on a real PostgreSQL server started by the tests."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import psycopg
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from psycopg.rows import dict_row

from graph_durable import Effect, EffectGuardNode, current_effect
from graph_durable.checkpointers._schema import PG_MIGRATIONS, statements
from graph_durable.checkpointers.postgres import DurablePostgresSaver
from graph_durable.errors import FlowVersionMismatch, IllegalTransition, LeaseHeld, LeaseLost
from graph_durable.ledger import EffectStatus, IntentWrite, TransitionWrite
from graph_durable.testing import FakeProvider, FaultPlan, InjectedCrash, arm, disarm
from graph_durable.testing.models import ScriptedChatModel
from tests.checkpointers.test_conformance import _assert_all_passed
from tests.checkpointers.test_ledger_sqlite import assert_the_deferred_receipt_is_dropped

S = EffectStatus


def connect(conninfo: str) -> psycopg.Connection:
    return psycopg.Connection.connect(conninfo, autocommit=True, prepare_threshold=0,
                                      row_factory=dict_row)


@pytest.fixture
def saver(postgres_conninfo: str):
    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as saver:
        yield saver


@pytest.fixture(autouse=True)
def _disarm():
    yield
    disarm()


def intent(thread_id: str = "t", key: str = "k1") -> IntentWrite:
    return IntentWrite(key=key, thread_id=thread_id, checkpoint_ns="tools:x",
                       tool_call_id=f"c-{key}", tool="pay", args={"cents": 5},
                       status=S.IN_FLIGHT)


def put_checkpoint(saver: DurablePostgresSaver, thread_id: str, config: Any = None) -> dict:
    config = config or {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    return saver.put(config, empty_checkpoint(), {"step": 0}, {})


async def test_passes_all_eight_conformance_capabilities(postgres_server) -> None:
    counter = itertools.count()

    @checkpointer_test(name="DurablePostgresSaver")
    async def factory():
        conninfo = postgres_server.create_database(f"gd_conformance_{next(counter)}")
        with DurablePostgresSaver.from_conn_string(conninfo) as saver:
            yield saver

    _assert_all_passed(await validate(factory))


def test_ledger_transitions_are_journaled_and_illegal_ones_write_nothing(saver) -> None:
    claimed = saver.claim_many([intent(key="k1"), intent(key="k2")])
    assert [created for _, created in claimed] == [True, True]
    assert saver.claim(intent(key="k1"))[1] is False
    [record] = saver.apply(TransitionWrite(thread_id="t", key="k1", to=S.APPLIED,
                                           kind="receipt", receipt={"id": 7}, result="ok"))
    assert record.status is S.APPLIED and record.receipt == {"id": 7}
    assert saver.stored_result("t", "k1") == "ok"
    before = (saver.effects(), saver.events())
    with pytest.raises(IllegalTransition, match="applied; it cannot become in_flight"):
        saver.apply(TransitionWrite(thread_id="t", key="k1", to=S.IN_FLIGHT, kind="attempt",
                                    bump_attempts=True))
    assert (saver.effects(), saver.events()) == before
    assert [(e.key, e.kind) for e in saver.events("t")] == [
        ("k1", "intent"), ("k2", "intent"), ("k1", "receipt")]
    seqs = [e.seq for e in saver.events()]
    assert seqs == sorted(seqs)


def test_a_deferred_receipt_commits_with_the_threads_next_write(saver) -> None:
    saver.claim(intent())
    saver.apply(TransitionWrite(thread_id="t", key="k1", to=S.APPLIED, kind="receipt",
                                receipt={"id": 1}, result="ok", defer=True))
    assert saver.effect("k1", "t").status is S.IN_FLIGHT
    put_checkpoint(saver, "t")
    assert saver.effect("k1", "t").status is S.APPLIED
    assert saver.stored_result("t", "k1") == "ok"


def test_retention_keeps_or_deletes_the_ledger_with_the_thread(saver) -> None:
    put_checkpoint(saver, "src")
    saver.claim(intent("src", key="k1"))
    saver.copy_thread("src", "dst")
    assert saver.effect("k1", "dst").status is S.IN_FLIGHT
    assert saver.get_tuple({"configurable": {"thread_id": "dst", "checkpoint_ns": ""}})
    saver.prune(["src"])
    assert len(saver.effects("src")) == 1
    saver.delete_thread("src")
    assert saver.effects("src") == [] and saver.events("src") == []
    assert [r.thread_id for r in saver.effects()] == ["dst"]


def test_a_lease_fences_writes_from_another_connection(saver, postgres_conninfo) -> None:
    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as other:
        lease = other.acquire_lease("t", "worker-a", ttl=60)
        with pytest.raises(LeaseLost):
            put_checkpoint(saver, "t")
        with pytest.raises(LeaseLost):
            saver.claim(intent())
        assert saver.effects() == [] and list(saver.list(None)) == []
        stored = put_checkpoint(saver, "t", {"configurable": {
            **lease.config["configurable"], "checkpoint_ns": ""}})
        assert saver.get_tuple(stored) is not None
        with pytest.raises(LeaseHeld):
            saver.acquire_lease("t", "worker-b", ttl=60)
        other.release_lease(lease)
    assert saver.acquire_lease("t", "worker-b", ttl=60).token == lease.token + 1


def test_concurrent_claims_of_one_key_record_one_intent(postgres_conninfo) -> None:
    """Two connections claim the same keys at once: each key is created exactly once."""
    results: list[list[bool]] = []
    barrier = threading.Barrier(2)

    def claim() -> None:
        with DurablePostgresSaver.from_conn_string(postgres_conninfo) as saver:
            saver.setup()
            barrier.wait()
            claimed = saver.claim_many([intent(key=f"k{i}") for i in range(20)])
            results.append([created for _, created in claimed])

    workers = [threading.Thread(target=claim) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    assert len(results) == 2
    assert [a + b for a, b in zip(*results)] == [1] * 20
    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as saver:
        assert len(saver.effects("t")) == 20
        assert len([e for e in saver.events("t") if e.kind == "intent"]) == 20


def test_flow_version_mismatch_writes_nothing(postgres_conninfo) -> None:
    with DurablePostgresSaver.from_conn_string(postgres_conninfo, flow_version="v1") as v1:
        put_checkpoint(v1, "t")
    with DurablePostgresSaver.from_conn_string(postgres_conninfo, flow_version="v2") as v2:
        before = list(v2.list(None))
        with pytest.raises(FlowVersionMismatch, match="'v1'"):
            put_checkpoint(v2, "t")
        assert list(v2.list(None)) == before


def test_the_guard_runs_on_postgres_and_replays_after_a_crash(saver, tmp_path) -> None:
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "blind", name="p")

    @tool
    def send(to: str) -> dict:
        """Send."""
        return provider.apply(current_effect().key, {"to": to})

    calls = [{"name": "send", "args": {"to": to}, "id": f"c{i}"} for i, to in enumerate("xyz")]
    model = ScriptedChatModel(script=[AIMessage(content="", tool_calls=calls),
                                      AIMessage(content="done")])
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
    builder.add_node("tools", EffectGuardNode([send], effects={"send": Effect()}))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "t"}}

    arm(FaultPlan("after_receipt", action="raise"))
    with pytest.raises(InjectedCrash):
        graph.invoke({"messages": [HumanMessage("go")]}, config, durability="sync")
    disarm()
    result = graph.invoke(None, config, durability="sync")
    assert result["messages"][-1].content == "done"
    assert [m.tool_call_id for m in result["messages"] if isinstance(m, ToolMessage)] == [
        "c0", "c1", "c2"]
    assert provider.count() == 3 and len(provider.requests()) == 3
    assert [r.status for r in saver.effects("t")] == [S.APPLIED] * 3


async def test_the_guard_runs_under_ainvoke_on_postgres(saver, tmp_path) -> None:
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "dedupe", name="p")

    @tool
    async def send(to: str) -> dict:
        """Send."""
        return provider.apply(current_effect().key, {"to": to})

    calls = [{"name": "send", "args": {"to": "x"}, "id": "c1"}]
    model = ScriptedChatModel(script=[AIMessage(content="", tool_calls=calls),
                                      AIMessage(content="done")])

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", EffectGuardNode([send], effects={"send": Effect(idempotent=True)}))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    graph = builder.compile(checkpointer=saver)
    result = await graph.ainvoke({"messages": [HumanMessage("go")]},
                                 {"configurable": {"thread_id": "t"}}, durability="sync")
    assert result["messages"][-1].content == "done"
    assert [r.status for r in await saver.aeffects("t")] == [S.APPLIED]
    assert provider.count() == 1


def test_setup_applies_every_migration_once(postgres_conninfo) -> None:
    for _ in range(2):
        with DurablePostgresSaver.from_conn_string(postgres_conninfo) as saver:
            saver.setup()
    with connect(postgres_conninfo) as conn:
        rows = conn.execute("SELECT v FROM graph_durable_migrations ORDER BY v").fetchall()
    assert [row["v"] for row in rows] == list(range(len(PG_MIGRATIONS)))


def test_migration_scripts_split_outside_dollar_quoted_bodies() -> None:
    script = "CREATE TABLE a (x INT); CREATE FUNCTION f() AS $fn$ BEGIN x; y; END $fn$; SELECT 1"
    assert statements(script) == [
        "CREATE TABLE a (x INT)", "CREATE FUNCTION f() AS $fn$ BEGIN x; y; END $fn$", "SELECT 1"]


def test_a_copy_of_a_crashed_thread_replays_its_sources_receipt(saver, tmp_path) -> None:
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "blind", name="p")

    @tool
    def send(to: str) -> str:
        """Send."""
        provider.apply(current_effect().key, {"to": to})
        return f"sent to {to}"

    model = ScriptedChatModel(script=[
        AIMessage(content="", tool_calls=[{"name": "send", "args": {"to": "x"}, "id": "c1"}]),
        AIMessage(content="done")])
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
    builder.add_node("tools", EffectGuardNode([send]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    graph = builder.compile(checkpointer=saver)
    arm(FaultPlan("after_receipt", action="raise"))
    with pytest.raises(InjectedCrash):
        graph.invoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": "t"}},
                     durability="sync")
    disarm()
    saver.copy_thread("t", "fork")
    result = graph.invoke(None, {"configurable": {"thread_id": "fork"}}, durability="sync")
    assert result["messages"][-1].content == "done"
    assert provider.count() == 1
    assert saver.key_thread("fork") == "t"


def test_a_rolled_back_write_keeps_its_deferred_receipt_while_another_commits(
        postgres_conninfo) -> None:
    """On a pool two transactions run at once, each taking its own thread's deferred
    receipt: the one that rolls back puts its receipt back, whatever the other does."""
    from psycopg_pool import ConnectionPool

    with ConnectionPool(postgres_conninfo, min_size=2, max_size=2, open=True, kwargs={
            "autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}) as pool:
        saver = DurablePostgresSaver(pool)
        for thread_id in ("t1", "t2"):
            saver.claim(intent(thread_id))
            saver.apply(TransitionWrite(thread_id=thread_id, key="k1", to=S.APPLIED,
                                        kind="receipt", receipt={}, result="ok", defer=True))
        config = {"configurable": {"thread_id": "t1", "checkpoint_ns": "", "checkpoint_id": "1"}}
        with pytest.raises(RuntimeError, match="abandoned"):
            with saver._txn("t2"):  # a write to t2 that fails after its fence
                saver.put_writes(config, [("x", 1)], "task")
                raise RuntimeError("abandoned")
        assert saver.effect("k1", "t1").status is S.APPLIED
        assert saver.effect("k1", "t2").status is S.IN_FLIGHT
        saver.put_writes({"configurable": {**config["configurable"], "thread_id": "t2"}},
                         [("x", 1)], "task")
        assert saver.effect("k1", "t2").status is S.APPLIED


def test_a_receipt_another_write_carries_rides_on_every_write_until_one_commits(
        postgres_conninfo, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """On a pool two writes of one thread may commit in another order than they began.
    A task's own write (`b`) begins after its call's receipt was deferred, while another
    write (`a`) that has taken the receipt is still under way: `b` carries it too, so
    the receipt is stored when `b` commits, whether `a` commits after it or never; the
    later carrier changes nothing and warns of nothing, and the receipt is sealed once."""
    from psycopg_pool import ConnectionPool

    from tests.test_secrets import CountingAes

    with ConnectionPool(postgres_conninfo, min_size=2, max_size=2, open=True, kwargs={
            "autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}) as pool:
        serde = CountingAes()
        saver = DurablePostgresSaver(pool, serde=serde)
        config = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "1"}}
        plan = saver._one_trip_plan
        for ending in ("never commits", "commits later"):
            saver.delete_thread("t")
            saver.claim(intent())  # and the thread's flow pin is known: writes go in one trip
            saver.apply(TransitionWrite(thread_id="t", key="k1", to=S.APPLIED,
                                        kind="receipt", receipt={}, result="ok", defer=True))
            serde.sealed = 0
            planned, release = threading.Event(), threading.Event()
            writer_a: list[threading.Thread] = []

            def paused(*args: Any, **kwargs: Any) -> Any:
                made = plan(*args, **kwargs)
                if threading.current_thread() in writer_a and made[0]:
                    planned.set()
                    assert release.wait(10)
                    if ending == "never commits":
                        raise RuntimeError("a crashed before its commit")
                return made

            failed: list[BaseException] = []

            def write_a() -> None:
                try:
                    saver.put_writes(config, [("x", 1)], "a")
                except RuntimeError as exc:
                    failed.append(exc)

            monkeypatch.setattr(saver, "_one_trip_plan", paused)
            writer_a.append(threading.Thread(target=write_a))
            writer_a[0].start()
            assert planned.wait(10), failed
            caplog.clear()
            saver.put_writes(config, [("y", 2)], "b")  # the task's own write commits first
            assert saver.effect("k1", "t").status is S.APPLIED
            release.set()
            writer_a[0].join(10)
            assert [str(exc) for exc in failed] == (
                ["a crashed before its commit"] if ending == "never commits" else [])
            saver.put_writes(config, [("z", 3)], "c")  # nothing left to carry
            assert [e.kind for e in saver.events("t")] == ["intent", "receipt"]
            assert "dropped" not in caplog.text
            assert serde.sealed == 1  # carried by both, sealed by the first
            assert saver._deferred == {} and saver._encoded == {}


def _write_the_steps_own_then_die(conninfo: str) -> None:
    """The child of the test below: a pool of two; another write (`a`) takes the
    thread's deferred receipt and is held before it sends anything; the step's own write
    (`b`) commits; then the process is SIGKILLed, `a` never committed."""
    import os
    import signal

    from psycopg_pool import ConnectionPool

    with ConnectionPool(conninfo, min_size=2, max_size=2, open=True, kwargs={
            "autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}) as pool:
        saver = DurablePostgresSaver(pool)
        config = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "1"}}
        saver.claim(intent())
        saver.apply(TransitionWrite(thread_id="t", key="k1", to=S.APPLIED, kind="receipt",
                                    receipt={"id": 1}, result="ok", defer=True))
        holding, plan = threading.Event(), saver._one_trip_plan

        def held(*args: Any, **kwargs: Any) -> Any:
            made = plan(*args, **kwargs)
            if threading.current_thread().name == "a" and made[0]:
                holding.set()
                threading.Event().wait()  # until the process dies
            return made

        saver._one_trip_plan = held  # type: ignore[method-assign]
        threading.Thread(target=saver.put_writes, args=(config, [("x", 1)], "a"),
                         name="a", daemon=True).start()
        assert holding.wait(30)
        saver.put_writes(config, [("y", 2)], "b")
        os.kill(os.getpid(), signal.SIGKILL)


def test_a_process_killed_after_a_steps_write_keeps_the_receipt_another_write_took(
        postgres_conninfo) -> None:
    """Killed for real: the step's own write (`b`) committed while another write that
    had taken its call's receipt (`a`) had not. The restarted process finds `b`'s writes
    and the receipt, so the task is not run again and its effect reads as applied (not
    `in_flight` forever)."""
    import subprocess
    import sys
    from pathlib import Path

    child = subprocess.run(
        [sys.executable, "-c", "import sys; from tests.checkpointers.test_postgres import "
         "_write_the_steps_own_then_die as die; die(sys.argv[1])", postgres_conninfo],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120)
    assert child.returncode == -9, child.stderr
    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as saver:
        stored = saver.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": "",
                                                   "checkpoint_id": "1"}})
        assert stored is None  # no checkpoint: the writes are read from their table
        with saver._cursor() as cur:
            cur.execute("SELECT task_id FROM checkpoint_writes WHERE thread_id = 't'")
            assert sorted(row["task_id"] for row in cur.fetchall()) == ["b"]
        assert saver.effect("k1", "t").status is S.APPLIED
        assert [e.kind for e in saver.events("t")] == ["intent", "receipt"]


def test_a_steps_claim_and_a_write_carrying_receipts_are_one_round_trip_each(saver) -> None:
    """The server's fence and the statements go out together, as one transaction: a
    claim of several intents (one of them known), and a checkpoint carrying two deferred
    receipts."""
    from graph_durable.testing.pg_trace import round_trips

    known, _ = saver.claim(intent(key="k0"))
    with round_trips(saver.conn) as claim:
        claimed = saver.claim_many([intent(key="k1"), intent(key="k0"), intent(key="k2")])
    assert claim.count == 1
    assert [(record.key, created) for record, created in claimed] == [
        ("k1", True), ("k0", False), ("k2", True)]
    assert claimed[1][0] == saver.effect("k0", "t") and claimed[1][0].created_at == known.created_at
    for key in ("k1", "k2"):
        saver.apply(TransitionWrite(thread_id="t", key=key, to=S.APPLIED, kind="receipt",
                                    receipt={"id": key}, result="ok", defer=True))
    with round_trips(saver.conn) as put:
        put_checkpoint(saver, "t")
    assert put.count == 1
    assert {r.key: r.status for r in saver.effects("t")} == {
        "k0": S.IN_FLIGHT, "k1": S.APPLIED, "k2": S.APPLIED}
    assert [(e.key, e.kind) for e in saver.events("t")] == [
        ("k0", "intent"), ("k1", "intent"), ("k2", "intent"), ("k1", "receipt"),
        ("k2", "receipt")]


def test_receipts_carried_together_are_one_statement_and_each_judged_alone(
        saver, postgres_conninfo, caplog: pytest.LogCaptureFixture) -> None:
    """A step's deferred receipts ride on the next checkpoint in one statement: each
    moves its effect if the lifecycle allows it (one settled meanwhile is dropped, the
    others stored), and the journal keeps their order."""
    from graph_durable.testing.pg_trace import round_trips

    keys = ["k1", "k2", "k3", "k4"]
    saver.claim_many([intent(key=key) for key in keys])
    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as other:
        other.apply(TransitionWrite(thread_id="t", key="k3", to=S.FAILED, kind="failure",
                                    error="declined"))
    for key in keys:
        saver.apply(TransitionWrite(thread_id="t", key=key, to=S.APPLIED, kind="receipt",
                                    receipt={"id": key}, result=f"ok {key}", defer=True))
    alone = put_checkpoint(saver, "u")  # nothing carried: LangGraph's statements only
    with round_trips(saver.conn) as bare:
        put_checkpoint(saver, "u", alone)
    with caplog.at_level("WARNING", logger="graph_durable"), round_trips(saver.conn) as put:
        put_checkpoint(saver, "t")
    sent = [sum(kind == "Execute" for kind in trip) for trip in (*put.sent, *bare.sent)]
    assert put.count == 1 and sent[0] == sent[-1] + 1  # the four receipts: one statement
    assert "Deferred receipt of effect 'k3' in thread 't' dropped" in caplog.text
    assert {r.key: r.status for r in saver.effects("t")} == {
        "k1": S.APPLIED, "k2": S.APPLIED, "k3": S.FAILED, "k4": S.APPLIED}
    assert [saver.effect(key, "t").receipt for key in ("k1", "k2", "k4")] == [
        {"id": "k1"}, {"id": "k2"}, {"id": "k4"}]
    assert saver.stored_result("t", "k4") == "ok k4"
    assert [(e.key, e.kind) for e in saver.events("t")] == [
        *((key, "intent") for key in keys), ("k3", "failure"), ("k1", "receipt"),
        ("k2", "receipt"), ("k4", "receipt")]


AWKWARD = ["", "NULL", "null", 'say "hi"', "back\\slash", "{braces}, commas",
           "  spaces\tand\nlines ", "é ü 中文 😀", "\\\"", "%s %b ?"]
"""Texts an array in PostgreSQL's text format must quote or escape (and a lone word
NULL), sent through the binary arrays of a step's claim and its carried receipts."""


def test_a_steps_claim_and_carried_receipts_keep_awkward_texts_whole(saver) -> None:
    """A step's claim (`CLAIM_STEP`) and the receipts carried on its checkpoint
    (`carried_transitions`) send their values as arrays: every text comes back as it
    went, in args, tool names, namespaces, call ids, receipts, errors and results."""
    intents = [IntentWrite(key=f"k{index}", thread_id="t", checkpoint_ns=f"tools:{text}",
                           tool_call_id=f"c-{text}-{index}", tool=f"pay {text}",
                           args={"note": text, text: [text, None, 1.5]}, status=S.IN_FLIGHT)
               for index, text in enumerate(AWKWARD)]
    claimed = saver.claim_many(intents)
    assert [created for _, created in claimed] == [True] * len(AWKWARD)
    for index, text in enumerate(AWKWARD):
        saver.apply(TransitionWrite(thread_id="t", key=f"k{index}", to=S.APPLIED,
                                    kind="receipt", receipt={"id": text, "at": [text]},
                                    result=f"ok {text}", defer=True))
    put_checkpoint(saver, "t")
    for index, text in enumerate(AWKWARD):
        record = saver.effect(f"k{index}", "t")
        assert (record.checkpoint_ns, record.tool_call_id, record.tool, record.args) == (
            f"tools:{text}", f"c-{text}-{index}", f"pay {text}",
            {"note": text, text: [text, None, 1.5]})
        assert record.status is S.APPLIED and record.receipt == {"id": text, "at": [text]}
        assert saver.stored_result("t", f"k{index}") == f"ok {text}"
    assert [(e.key, e.kind) for e in saver.events("t")] == [
        *((f"k{index}", "intent") for index in range(len(AWKWARD))),
        *((f"k{index}", "receipt") for index in range(len(AWKWARD)))]


@pytest.mark.parametrize("encoding", ["UTF8", "LATIN1"])
def test_texts_arrays_are_dumped_whole_in_the_connections_encoding(
        postgres_conninfo: str, encoding: str) -> None:
    """`Texts`, the lists of text a claim and its carried receipts send, is dumped in
    binary by a dumper of its own, in the client encoding: every value comes back as it
    went, NULLs, empty lists and texts the text format must quote included."""
    from psycopg.adapt import PyFormat

    from graph_durable.checkpointers.postgres._arrays import Texts, TextsDumper

    values = AWKWARD if encoding == "UTF8" else [text for text in AWKWARD
                                                 if text.isascii()] + ["é à ü"]
    with psycopg.Connection.connect(postgres_conninfo, autocommit=True) as conn:
        conn.execute(f"SET client_encoding TO '{encoding}'")
        assert conn.adapters.get_dumper(Texts, PyFormat.BINARY) is TextsDumper
        for texts in (values, [None, *values, None], [], [None], ["x"]):
            for placeholder in ("%b", "%s"):
                row = conn.execute(f"SELECT {placeholder}::text[], cardinality("
                                   f"{placeholder}::text[])", (Texts(texts), Texts(texts)))
                assert row.fetchone() == (texts, len(texts))


def test_a_deferred_receipt_the_lifecycle_no_longer_allows_is_dropped(
        saver, postgres_conninfo, caplog: pytest.LogCaptureFixture) -> None:
    saver.claim(intent())
    saver.apply(TransitionWrite(thread_id="t", key="k1", to=S.APPLIED, kind="receipt",
                                receipt={"id": 1}, result="ok", defer=True))
    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as other:
        other.apply(TransitionWrite(thread_id="t", key="k1", to=S.FAILED, kind="failure",
                                    error="declined"))
    assert_the_deferred_receipt_is_dropped(saver, put_checkpoint, caplog)
    assert "failed; it cannot become applied" in caplog.text


def test_a_fence_refused_on_the_server_commits_nothing_and_says_why(
        saver, postgres_conninfo) -> None:
    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as other:
        lease = other.acquire_lease("t", "worker-b", ttl=30)
        with pytest.raises(LeaseLost, match="worker-b"):
            saver.claim_many([intent(key="k1"), intent(key="k2")])
        with pytest.raises(LeaseLost, match="worker-b"):
            put_checkpoint(saver, "t")
        other.release_lease(lease)
    assert saver.effects("t") == [] and saver.events("t") == []
    assert list(saver.list({"configurable": {"thread_id": "t"}})) == []


def test_the_fenced_claim_records_what_the_claim_before_it_recorded(saver) -> None:
    """`graph_durable_claim_step` (migration 16, through migration 10's
    `graph_durable_fenced_claim`) keeps `graph_durable_claim`'s rules (migration 8): the
    same intents claimed on two copied threads, one through each,
    leave the same effects, journal entries, answers and key-scheme pin. (Keys embed the
    key thread, so each family has keys of its own here too.)"""
    from psycopg.rows import tuple_row

    from graph_durable.checkpointers.postgres import _sql as _pg

    def family(name: str) -> list[IntentWrite]:
        """A thread copied to `name`, which claims one intent of its own; the source then
        records an applied, a rejected and a skipped effect. The intents `name` claims."""
        src = f"src-{name}"
        put_checkpoint(saver, src)
        saver.copy_thread(src, name)
        saver.claim(IntentWrite(key=f"{name}-known", thread_id=name, checkpoint_ns="tools:x",
                                tool_call_id="c-known", tool="pay", args={"cents": 5},
                                status=S.IN_FLIGHT))
        asked = IntentWrite(key=f"{name}-rejected", thread_id=src, checkpoint_ns="tools:x",
                            tool_call_id="c-rejected", tool="pay", args={"cents": 5},
                            status=S.AWAITING_APPROVAL)
        saver.claim_many([intent(src, f"{name}-applied"), asked,
                          intent(src, f"{name}-skipped")])
        for key, to, kind, extra in (
                ("applied", S.APPLIED, "receipt", {"receipt": {"id": 1}, "result": "ok"}),
                ("rejected", S.REJECTED, "decision", {"decision": {"type": "reject"}}),
                ("skipped", S.UNKNOWN, "outcome", {"error": "timeout"}),
                ("skipped", S.SKIPPED, "decision", {"decision": {"type": "skip"}})):
            saver.apply(TransitionWrite(thread_id=src, key=f"{name}-{key}", to=to, kind=kind,
                                        **extra))
        return [IntentWrite(key=f"{name}-{key}", thread_id=name, checkpoint_ns="tools:y",
                            tool_call_id=f"c-{key}", tool="pay", args={"cents": 5},
                            status=S.IN_FLIGHT, key_scheme="hmac-sha256")
                for key in ("known", "applied", "rejected", "skipped", "new", "new")]

    before_fencing = "SELECT * FROM graph_durable_claim(" + ", ".join(["%s"] * 13) + ")"
    answers = {}
    for name, sql in (("a", _pg.CLAIM_STEP), ("b", before_fencing)):
        planned = [saver._plan_intent(one, (None, None))[1:] for one in family(name)]
        _, params = _pg.claim_call(name, planned, (None, None))
        with saver.conn.cursor(row_factory=tuple_row) as cur:
            cur.execute("SELECT graph_durable_fence(%s, NULL)", (name,))
            rows = cur.execute(sql, params if sql is _pg.CLAIM_STEP else params[:13]
                               ).fetchall()
        answers[name] = [(record.key[2:], record.status, created) for record, created
                         in saver._claimed_rows(planned, rows)]

    def stored(name: str) -> tuple[Any, ...]:
        effects = [(r.key[2:], r.status, r.receipt, r.attempts, r.checkpoint_ns)
                   for r in saver.effects(name)]
        events = [(e.key[2:], e.kind, e.data) for e in saver.events(name)]
        with saver.conn.cursor(row_factory=tuple_row) as cur:
            pin = cur.execute("SELECT scheme FROM thread_key_schemes WHERE thread_id = %s",
                              (f"src-{name}",)).fetchall()
        return effects, events, pin

    assert answers["a"] == answers["b"]
    assert [(key, created) for key, _, created in answers["a"]] == [
        ("known", False), ("applied", False), ("rejected", True), ("skipped", False),
        ("new", True), ("new", False)]
    assert [status for _, status, _ in answers["a"]][1:4] == [S.APPLIED, S.IN_FLIGHT,
                                                             S.UNKNOWN]
    assert stored("a") == stored("b")
    assert stored("a")[2] == [("hmac-sha256",)]


def test_a_claim_carrying_a_deferred_receipt_fences_before_the_receipt(saver) -> None:
    """The fenced claim fences its own transaction, but a deferred receipt goes before
    it: with a stale token the fence refuses both, and the receipt is kept."""
    lease = saver.acquire_lease("t", "worker-1", ttl=60)
    saver.claim(intent(key="k1"), lease.config)
    saver.apply(TransitionWrite(thread_id="t", key="k1", to=S.APPLIED, kind="receipt",
                                receipt={"id": 1}, result="ok", defer=True), lease.config)
    saver.release_lease(lease)
    with pytest.raises(LeaseLost):
        saver.claim_many([intent(key="k2")], lease.config)
    assert [(r.key, r.status) for r in saver.effects("t")] == [("k1", S.IN_FLIGHT)]
    later = saver.acquire_lease("t", "worker-2", ttl=60)
    saver.claim_many([intent(key="k2")], later.config)
    assert [(r.key, r.status) for r in saver.effects("t")] == [
        ("k1", S.APPLIED), ("k2", S.IN_FLIGHT)]
    assert [(e.key, e.kind) for e in saver.events("t")] == [
        ("k1", "intent"), ("k1", "receipt"), ("k2", "intent")]
