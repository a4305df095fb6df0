"""One owner per thread: leases, fencing, flow versions, thread status and recover().

Process-level tests start real workers; unit tests at the bottom use one process.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from graph_durable import (
    FlowVersionMismatch,
    LeaseHeld,
    LeaseLost,
    flow_version_of,
    thread_status,
)
from graph_durable.testing import FakeProvider, FaultPlan
from graph_durable.testing.crash.child import run_child, start_child
from graph_durable.testing.crash.reads import trace_points
from graph_durable.testing.savers import SaverSpec, close_saver
from graph_durable.testing.scenarios.effects import EffectsAgent, build_effects_agent

EFFECTS = "graph_durable.testing.scenarios.effects:build_effects_agent"
PG_TABLES = {"writes": "checkpoint_writes"}
"""LangGraph's PostgreSQL names of its SQLite tables."""


def dump_tables(spec: SaverSpec | None, db_path: str, tables: list[str]) -> list[Any]:
    """Every row of each table, in a stable order, read with a connection of our own."""
    if spec is None:
        conn = sqlite3.connect(db_path)
        try:
            return [conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2, 3").fetchall()
                    for t in tables]
        finally:
            conn.close()
    import psycopg

    # A checkpoint's row and its blobs hold what SQLite's checkpoint column holds.
    pg_tables = [name for t in tables
                 for name in ([PG_TABLES.get(t, t)] if t != "checkpoints"
                              else ["checkpoints", "checkpoint_blobs"])]
    with psycopg.connect(spec["conninfo"]) as conn:
        return [conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2, 3").fetchall()
                for t in pg_tables]


@pytest.fixture
def scenario(tmp_path: Path, saver_spec: SaverSpec | None) -> Callable[..., dict[str, Any]]:
    """`scenario(mode, **extra)`: the effects agent's kwargs on this test's saver."""
    def make(mode: str = "lookup", **extra: Any) -> dict[str, Any]:
        return {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path),
                "turns": [[["pay", "42"]]], "modes": {"pay": mode}, "saver": saver_spec,
                **extra}

    return make


@pytest.fixture
def build() -> Iterator[Callable[..., EffectsAgent]]:
    """`build(**kwargs)`: the effects agent in this process; its saver closed after."""
    built: list[EffectsAgent] = []

    def make(**kwargs: Any) -> EffectsAgent:
        built.append(build_effects_agent(**kwargs))
        return built[-1]

    yield make
    for agent in built:
        close_saver(agent.saver)


def orphan(tmp_path: Path, kwargs: dict[str, Any], thread_id: str, point: str) -> None:
    assert run_child(EFFECTS, kwargs, thread_id=thread_id,
                     fault=FaultPlan(point, tool="pay")).killed


def crash_in_process(agent: EffectsAgent, thread_id: str, plan: FaultPlan) -> None:
    """Run a turn of `thread_id`, which `plan` makes raise `InjectedCrash` (in this
    process: the thread is left as a crash would leave it, but no process dies)."""
    from graph_durable.testing import InjectedCrash, arm, disarm

    arm(plan)
    try:
        with pytest.raises(InjectedCrash):
            agent.graph.invoke(agent.inputs, {"configurable": {"thread_id": thread_id}},
                               durability="sync")
    finally:
        disarm()


def orphan_in_process(build: Callable[..., EffectsAgent], kwargs: dict[str, Any],
                      thread_ids: list[str], plans: list[FaultPlan]) -> None:
    """Leave threads orphaned as a crash would (setup only; the races use real processes)."""
    agent = build(**kwargs)
    for n, thread_id in enumerate(thread_ids):
        crash_in_process(agent, thread_id, plans[n % len(plans)])
    assert {thread_status(agent.saver, t).status for t in thread_ids} == {"orphaned"}


def race_worker(kwargs_json: str, owner: str, schedule_json: str) -> None:
    """Run in a worker process: at each scheduled time, try to resume that thread."""
    import json

    agent = build_effects_agent(**json.loads(kwargs_json))
    for thread_id, start_at in json.loads(schedule_json):
        time.sleep(max(0.0, start_at - time.time()))
        try:
            with agent.saver.lease(thread_id, owner, ttl=10) as lease:
                status = thread_status(agent.saver, thread_id, ignore_owner=owner).status
                if status != "orphaned":  # came late: the other worker already finished it
                    print(json.dumps([thread_id, "late"]), flush=True)
                    continue
                agent.graph.invoke(None, lease.config, durability="sync")
            print(json.dumps([thread_id, "resumed"]), flush=True)
        except LeaseHeld:
            print(json.dumps([thread_id, "held"]), flush=True)


@pytest.mark.crash
@pytest.mark.sweep
def test_two_workers_resume_one_orphan_at_once_fifty_times(
        tmp_path: Path, scenario, build, make_saver) -> None:
    """Two worker processes try each of 50 orphans at the same instant."""
    import json
    import subprocess
    import sys

    kwargs = scenario("lookup", delays={"pay": 0.3})
    threads = [f"t{i:02d}" for i in range(50)]
    orphan_in_process(build, kwargs, threads, [FaultPlan("after_intent", action="raise"),
                                        FaultPlan("after_effect", action="raise")])
    base = time.time() + 4.0  # both workers are up and built by then
    schedule = json.dumps([[t, base + 1.0 * n] for n, t in enumerate(threads)])
    code = ("import sys; from tests.test_leases import race_worker; "
            "race_worker(sys.argv[1], sys.argv[2], sys.argv[3])")
    root = Path(__file__).resolve().parent.parent
    workers = [subprocess.Popen([sys.executable, "-c", code, json.dumps(kwargs), owner,
                                 schedule], cwd=root, stdout=subprocess.PIPE, text=True)
               for owner in ("w1", "w2")]
    outputs = [worker.communicate(timeout=180)[0] for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0]
    outcomes: dict[str, list[str]] = {}
    for output in outputs:
        for line in output.splitlines():
            thread_id, outcome = json.loads(line)
            outcomes.setdefault(thread_id, []).append(outcome)
    # Exactly one worker advances each thread; the other finds it held (the race) or,
    # if it started late on a loaded machine, already finished.
    assert sorted(outcomes) == threads
    assert all(sorted(o) in (["held", "resumed"], ["late", "resumed"])
               for o in outcomes.values()), outcomes
    races = sum(o.count("held") for o in outcomes.values())
    assert races >= 25, f"only {races} of 50 attempts overlapped; the test did not race"
    saver = make_saver()
    assert {thread_status(saver, t).status for t in threads} == {"done"}
    pay = FakeProvider(str(tmp_path / "pay.sqlite"), "lookup")
    assert pay.count() == 50 and set(pay.counts().values()) == {1}


@pytest.mark.crash
def test_zombie_worker_is_fenced_out(tmp_path: Path, scenario, make_saver) -> None:
    """A is frozen inside the tool past its ttl; B takes over; A's late writes are refused."""
    kwargs = scenario("lookup", delays={"pay": 1.0}, fencing=["pay"])
    saver = make_saver()
    zombie = start_child(EFFECTS, kwargs, thread_id="t", owner="A", ttl=1.0)
    deadline = time.time() + 30
    while not any(r.status.value == "in_flight" for r in saver.effects("t")):
        assert time.time() < deadline, "worker A never started its effect"
        time.sleep(0.02)
    # Its intent is durable; a moment later it is surely inside the tool's 1 s call (on
    # a loaded machine the intent's commit and the tool's start can be far apart).
    time.sleep(0.2)
    os.kill(zombie.pid, signal.SIGSTOP)  # inside the tool's 1 s call
    try:
        time.sleep(1.5)  # past A's ttl: its lease expires unrenewed
        taker = run_child(EFFECTS, kwargs, thread_id="t", action="resume", owner="B", ttl=10)
        assert taker.done, taker.summary
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
    late = zombie.wait()
    assert "lease_lost" in late.summary, late.summary

    pay = FakeProvider(str(tmp_path / "pay.sqlite"), "lookup")
    assert pay.count() == 1
    assert [r["outcome"] for r in pay.requests()] == ["applied", "fenced"]
    assert [r.status.value for r in saver.effects("t")] == ["applied"]
    owners = {e.owner for e in saver.events("t") if e.kind == "receipt"}
    assert owners == {"B"}
    assert late.summary["messages"] == taker.summary["messages"]
    assert late.summary["messages"][-1]["content"] == "All done."


@pytest.mark.crash
def test_recover_from_three_processes_finishes_sixty_orphans_once(
        tmp_path: Path, saver_spec, build, make_saver) -> None:
    points = ["before_intent", "after_intent", "after_effect", "after_receipt"]
    modes = {"pay": "lookup", "ship": "dedupe"}
    kwargs = {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path),
              "turns": [[["pay", "p"]], [["ship", "s"]]], "modes": modes,
              "saver": saver_spec}
    threads = [f"t{i:02d}" for i in range(60)]
    # Occurrence 1 crashes around the first effect (pay), 2 around the second (ship).
    plans = [FaultPlan(point, occurrence=occurrence, action="raise")
             for point in points for occurrence in (1, 2)]
    orphan_in_process(build, kwargs, threads, plans)
    saver = make_saver()
    assert {thread_status(saver, t).status for t in threads} == {"orphaned"}

    start_at = time.time() + 1.0
    sweepers = [start_child(EFFECTS, kwargs, thread_id="-", action="recover",
                            owner=f"sweeper-{n}", start_at=start_at, timeout=300)
                for n in range(3)]
    outcomes = [o for s in sweepers for o in s.wait().summary["recovered"]]
    resumed = [o["thread_id"] for o in outcomes if o["outcome"] == "resumed"]
    assert sorted(resumed) == threads  # each exactly once
    assert not [o for o in outcomes if o["outcome"] == "error"]
    assert {thread_status(saver, t).status for t in threads} == {"done"}
    for name, mode in modes.items():
        provider = FakeProvider(str(tmp_path / f"{name}.sqlite"), mode)
        assert provider.count() == 60 and set(provider.counts().values()) == {1}


@pytest.mark.crash
def test_a_slow_but_alive_tool_keeps_its_lease(tmp_path: Path, scenario) -> None:
    # The tool outlasts the rival's start on a loaded machine, not just one ttl.
    kwargs = scenario("lookup", delays={"pay": 8.0})
    trace = tmp_path / "worker.trace"
    worker = start_child(EFFECTS, kwargs, thread_id="t", owner="A", ttl=1.0,
                         trace_path=str(trace))
    deadline = time.monotonic() + 60
    while not any(p.point == "after_intent" for p in trace_points(str(trace), 0)):
        assert time.monotonic() < deadline, "the worker never reached its tool"
        time.sleep(0.05)
    time.sleep(1.5)  # past one ttl since the tool started: only renewal keeps the lease
    rival = run_child(EFFECTS, kwargs, thread_id="t", action="resume", owner="B", ttl=1.0)
    assert rival.summary.get("lease_held") == "A"
    result = worker.wait()
    assert result.done and "lease_lost" not in result.summary
    assert FakeProvider(str(tmp_path / "pay.sqlite"), "lookup").count() == 1


def test_flow_version_mismatch_writes_nothing(scenario, build, saver_spec, db_path) -> None:
    version = flow_version_of(build(**scenario()).graph)
    agent = build(**scenario(), flow_version=version)
    config = {"configurable": {"thread_id": "t"}}
    crash_in_process(agent, "t", FaultPlan("after_intent", action="raise"))

    def dump() -> list[Any]:
        return dump_tables(saver_spec, db_path, ["checkpoints", "writes", "effects",
                                                 "effect_events", "thread_flow_versions"])

    before = dump()
    assert before[-1][0][:2] == ("t", version)
    newer = build(**scenario(), flow_version="fv-new")
    with pytest.raises(FlowVersionMismatch) as info:
        newer.graph.invoke(None, config, durability="sync")
    assert (info.value.pinned, info.value.current) == (version, "fv-new")
    assert dump() == before

    allowed = build(**scenario(), flow_version="fv-new",
                                  compatible_flow_versions=[version])
    result = allowed.graph.invoke(None, config, durability="sync")
    assert result["messages"][-1].content == "All done."


def test_flow_version_changes_with_the_tools(scenario, build) -> None:
    one = build(**scenario())
    same = build(**scenario())
    other = build(**{**scenario(), "modes": {"pay": "lookup",
                                                                   "ship": "dedupe"}})
    assert flow_version_of(one.graph) == flow_version_of(same.graph)
    assert flow_version_of(one.graph) != flow_version_of(other.graph)


def test_lease_tokens_increase_and_stale_tokens_are_refused(scenario, build, make_saver) -> None:
    saver = make_saver()
    with saver.lease("t", "a", ttl=5) as first:
        with pytest.raises(LeaseHeld) as held:
            saver.acquire_lease("t", "b")
        assert held.value.holder == "a"
    with saver.lease("t", "b", ttl=5) as second:
        assert second.token == first.token + 1
        agent = build(**scenario())
        with pytest.raises(LeaseLost):
            agent.graph.invoke(agent.inputs, first.config, durability="sync")
        with pytest.raises(LeaseLost):  # no token at all while b holds it
            agent.graph.invoke(agent.inputs, {"configurable": {"thread_id": "t"}},
                               durability="sync")
    assert saver.effects("t") == []


def test_thread_status_names_each_state(scenario, build) -> None:
    from langgraph.types import Command

    agent = build(**scenario("blind"))
    config = {"configurable": {"thread_id": "t"}}
    crash_in_process(agent, "t", FaultPlan("after_effect", action="raise"))
    assert thread_status(agent.saver, "t").status == "orphaned"
    with agent.saver.lease("t", "me", ttl=5):
        assert thread_status(agent.saver, "t").status == "running"
    agent.graph.invoke(None, config, durability="sync")
    status = thread_status(agent.saver, "t")
    assert status.status == "needs_human" and status.pending == ("call_0_0",)
    agent.graph.invoke(Command(resume={"type": "skip"}), config, durability="sync")
    assert thread_status(agent.saver, "t").status == "done"


def test_a_lease_taken_over_from_a_stopped_worker_is_logged(make_saver, caplog) -> None:
    """An expired lease taken by another owner is a recovery decision: the log names the
    thread, both owners and the new fencing token. A released lease taken again is not."""
    import logging

    saver = make_saver()
    saver.acquire_lease("t", "worker-a", ttl=0.2)  # never released: worker-a stopped
    saver.release_lease(saver.acquire_lease("u", "worker-a", ttl=5))
    time.sleep(0.3)
    with caplog.at_level(logging.WARNING, logger="graph_durable"):
        taken = saver.acquire_lease("t", "worker-b", ttl=5)
        saver.acquire_lease("u", "worker-b", ttl=5)
    [record] = [r for r in caplog.records if "taken over" in r.getMessage()]
    assert (record.thread_id, record.owner, record.previous_owner, record.fencing_token) == (
        "t", "worker-b", "worker-a", taken.token)


def _slowed(saver: Any, *, released: str) -> tuple[Any, Any, list[bool]]:
    """Make `saver`'s renewal slow (0.3 s before it runs) and note, when the lease is
    released (by its method `released`), whether that renewal had ended: the events the
    renewal sets (entered, done) and the list of those notes."""
    import inspect
    import threading

    entered, done = threading.Event(), threading.Event()
    renew, release = saver.renew_lease, getattr(saver, released)
    renewal_ended_before_release: list[bool] = []

    def slow(lease: Any) -> bool:
        entered.set()
        time.sleep(0.3)
        try:
            return renew(lease)
        finally:
            done.set()

    if inspect.iscoroutinefunction(release):
        async def noted(lease: Any) -> None:
            renewal_ended_before_release.append(done.is_set())
            await release(lease)
    else:
        def noted(lease: Any) -> None:  # type: ignore[misc]
            renewal_ended_before_release.append(done.is_set())
            release(lease)

    saver.renew_lease = slow
    setattr(saver, released, noted)
    return entered, done, renewal_ended_before_release


def test_a_lease_block_ends_after_the_renewal_under_way(make_saver) -> None:
    """A renewal runs on its own thread. Leaving `saver.lease` waits for one under way
    before the lease is released, so the connection can be closed next: closing a SQLite
    connection while the renewal ran a statement on it crashed the process (SIGSEGV),
    about once in a thousand leases of a fraction of a second."""
    saver = make_saver()
    entered, done, ended_first = _slowed(saver, released="release_lease")
    with saver.lease("t", "worker-a", ttl=0.06):
        assert entered.wait(5)
    assert done.is_set()
    assert ended_first == [True]


async def test_an_async_lease_block_ends_after_the_renewal_under_way(amake_saver) -> None:
    """As above for `alease`, whose renewal may need the event loop the block exits on:
    it is waited for off the loop."""
    import asyncio

    saver = await amake_saver()
    if not hasattr(saver, "alease"):
        pytest.skip("a sync saver (here, for `ainvoke`) is leased with `lease`")
    entered, done, ended_first = _slowed(saver, released="arelease_lease")
    async with saver.alease("t", "worker-a", ttl=0.06):
        assert await asyncio.to_thread(entered.wait, 5)
    assert done.is_set()
    assert ended_first == [True]
