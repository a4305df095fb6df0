"""Crash sweeps: SIGKILL real processes at every fault point of a scenario, resume, compare.

Each sweep first runs its scenario without faults, then once per point it reached, killed
there, resumed by new processes, pauses answered by `default_resolver`. Every row must end
with the fault-free run's final state and ledger, and no provider may hold a duplicate.

Which sweeps, since a child process costs about a second:

- ticket agent, blind providers: every point (each crash window shows there);
- ticket agent, dedupe and lookup providers: the effect-guard points; saver points only
  decide whether LangGraph replays a step, which does not depend on the provider;
- ticket agent, lookup providers: pairs whose second crash hits the interrupted call
  again while the first resuming process recovers it (`pairs=True` would also crash
  at the later call's points: 28 pairs instead of 12; every point with every
  point it leads to would be 568);
- three parallel calls, one needing approval: every point, before and after approval;
- `create_agent` with the middleware (one task per call): every point; approvals are
  the same protocol as in the parallel scenario, so it runs without one;
- a stock `ToolNode`, no guard, pairs of `before_put_writes`: a pair resumes from a copy
  of the files its first crash left, and must still find the duplicates a crash during
  recovery adds.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from graph_durable.testing.crash.matrix import GUARD_POINTS, CrashPoint, CrashReport, crash_matrix
from graph_durable.testing.crash.forkserver import ForkServer

pytestmark = pytest.mark.crash

TICKET = "graph_durable.demo.ticket:build_ticket_agent"
EFFECTS = "graph_durable.testing.scenarios.effects:build_effects_agent"
CREATE_AGENT = "graph_durable.testing.scenarios.extra:build_create_agent"
STOCK = "graph_durable.testing.scenarios.extra:build_stock_agent"
WORKERS = 2


def ticket(mode: str) -> dict[str, str]:
    return {"ticket_mode": mode, "email_mode": mode}


def assert_clean(report: CrashReport) -> None:
    """No row differs from the fault-free run, no duplicate, every crash really happened."""
    print(report)  # the table, shown with -s or when a test fails
    assert report.ok, report.render()
    assert report.duplicates == 0
    assert report.rows and all(row.fired == len(row.schedule) for row in report.rows)
    assert all(row.effects == report.reference.snapshot.totals() for row in report.rows)


def test_ticket_blind_every_point_pauses_instead_of_duplicating(
        crash_matrix: Callable[..., CrashReport]) -> None:
    # Dogfoods the pytest plugin's fixture (which fails the test on a report not ok).
    report = crash_matrix(TICKET, ticket("blind"), workers=WORKERS)
    assert_clean(report)
    assert len(report.rows) == len(report.reference.points) >= 30
    # An intent without a receipt, at a provider that can neither dedupe nor be asked,
    # is unknown: the thread pauses. Everywhere else nothing is ambiguous.
    paused = {row.label: row.pauses for row in report.rows if row.pauses}
    assert paused == {
        f"{point}({tool})#1": ["effect_unknown"]
        for tool in ("create_ticket", "send_email") for point in ("after_intent", "after_effect")
    }
    # What the resumes cost (the audit): a model call is paid again only where the model's
    # step had not saved its writes; a receipt recorded before the crash is replayed.
    costs = {row.label: row.audit for row in report.rows}
    repaid = {label for label, audit in costs.items() if audit.get("models")}
    # Killed before the model's step saved its writes, the model runs again; whether a
    # crash just before the next checkpoint also loses them depends on when the saver's
    # group commit flushed. Crashes inside the tools step never re-run the model.
    assert {"before_put_writes#2", "before_put_writes#4", "before_put_writes#6"} <= repaid
    assert all(label.startswith(("before_put", "after_put")) for label in repaid), repaid
    assert costs["after_receipt(create_ticket)#1"]["replayed"] == 1
    assert costs["after_intent(send_email)#1"]["resent"] == 1  # the resolver's retry
    assert f"{sum(a.get('models', 0) for a in costs.values())} model calls paid again" in (
        report.summary())


def test_ticket_dedupe_every_guard_point() -> None:
    report = crash_matrix(TICKET, ticket("dedupe"), points=GUARD_POINTS, workers=WORKERS)
    assert_clean(report)
    assert len(report.rows) == 8 and not any(row.pauses for row in report.rows)


def during_its_own_recovery(first: CrashPoint, second: CrashPoint) -> bool:
    """The second crash hits the call the first one interrupted, while it recovers."""
    return first.tool == second.tool


@pytest.mark.long
def test_ticket_lookup_every_guard_point_and_pair() -> None:
    report = crash_matrix(TICKET, ticket("lookup"), points=GUARD_POINTS,
                          pairs=during_its_own_recovery, workers=WORKERS)
    assert_clean(report)
    pairs = [row for row in report.rows if len(row.schedule) == 2]
    assert len(report.rows) - len(pairs) == 8 and len(pairs) >= 10
    # The recovering process itself dies after re-sending the ticket it looked up in vain.
    assert (CrashPoint("after_intent", "create_ticket"),
            CrashPoint("after_effect", "create_ticket")) in {row.schedule for row in pairs}
    assert not any(row.pauses for row in report.rows)


@pytest.mark.long
def test_three_parallel_calls_one_needing_approval() -> None:
    kwargs = {"turns": [[["alpha", "a"], ["beta", "b"], ["gamma", "c"]]],
              "modes": {"alpha": "dedupe", "beta": "lookup", "gamma": "blind"},
              "approvals": ["gamma"]}
    report = crash_matrix(EFFECTS, kwargs, workers=WORKERS)
    assert_clean(report)
    assert report.reference.pauses == ("tool_approval",)
    assert {p.phase for p in report.reference.points} == {0, 1}  # before and after approval
    assert all("tool_approval" in row.pauses for row in report.rows)
    # gamma is blind: killed between its approved intent and its receipt, it pauses again.
    assert report.rows[[row.label for row in report.rows].index(
        "p1:after_intent(gamma)#1")].pauses == ["tool_approval", "effect_unknown"]


@pytest.mark.long
def test_create_agent_with_the_middleware_one_task_per_call() -> None:
    kwargs = {"turns": [[["alpha", "a"], ["beta", "b"]]],
              "modes": {"alpha": "lookup", "beta": "blind"}}
    report = crash_matrix(CREATE_AGENT, kwargs, workers=WORKERS)
    assert_clean(report)
    assert report.reference.snapshot.ledger == {"call_0_0": "applied", "call_0_1": "applied"}
    # Each call is its own task and only the blind one can pause. It does when the kill
    # hits its own window, and may when the kill hits its sibling's while it is in flight.
    assert {q["name"] for row in report.rows for q in row.questions} == {"beta"}
    paused = {row.label for row in report.rows if row.pauses}
    assert {"after_intent(beta)#1", "after_effect(beta)#1"} <= paused


def test_pairs_on_a_stock_tool_node_find_the_duplicates_of_a_crash_during_recovery(
        monkeypatch: pytest.MonkeyPatch) -> None:
    forks: dict[str, list[str]] = {}  # a run's folder -> its children's actions, in order
    run = ForkServer.run

    def counted(self: ForkServer, target: str, kwargs: dict, **options: object) -> object:
        folder = os.path.basename(os.path.dirname(kwargs["spec"]["kwargs"]["db_path"]))
        forks.setdefault(folder, []).append(kwargs["spec"]["action"])
        return run(self, target, kwargs, **options)

    monkeypatch.setattr(ForkServer, "run", counted)
    report = crash_matrix(STOCK, {"turns": [[["pay", "42"]]]}, points=["before_put_writes"],
                          pairs=True, workers=WORKERS, progress=False)
    print(report)
    singles = [row for row in report.rows if len(row.schedule) == 1]
    pairs = [row for row in report.rows if len(row.schedule) == 2]
    assert len(singles) == 4 and len(pairs) >= 8
    assert all(row.fired == len(row.schedule) for row in report.rows)
    # Killed after the tool ran and before the tools step saved its writes, the resume
    # runs the tool again: one duplicate...
    tools_step = CrashPoint("before_put_writes", occurrence=3)
    duplicates = {row.schedule: row.duplicates for row in report.rows}
    assert duplicates[(tools_step,)] == 1
    # ...and killed there again while it recovers, a third effect, which only the copy
    # of the first crash's provider file still counts.
    assert duplicates[(tools_step, CrashPoint("before_put_writes", occurrence=1))] == 2
    assert report.duplicates == sum(duplicates.values()) >= 6
    # A pair's first crash ran once, in its point's run: the fault-free run, every
    # point's processes, and each pair's processes after its first crash.
    assert sum(map(len, forks.values())) == 1 + sum(row.runs for row in singles) + sum(
        row.runs - 1 for row in pairs)
    # A pair resumes the files its point's run had right after the crash, so its first
    # child does what that run's second child did: `resume`, or `start` again when the
    # kill came before the input checkpoint landed (LangGraph saves it in the background
    # while the first step runs, so either can happen at the first write).
    pair_folders = [folder for folder in forks if "-" in folder]
    assert len(pair_folders) == len(pairs)
    for folder in pair_folders:
        assert forks[folder][0] == forks[folder.split("-")[0]][1], (folder, forks)
