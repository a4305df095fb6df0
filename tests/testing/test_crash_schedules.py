"""Random crash schedules on an agent with five effects (hypothesis, derandomized).

A schedule is one to three crashes: the first in the first process, each next one in
the process that resumes after the previous crash (a crash during recovery). Whatever
the schedule, no provider may hold a duplicate and the thread must end as the
fault-free run did.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from graph_durable.testing.crash.matrix import (
    SAVER_POINTS,
    CrashPoint,
    Reference,
    reference_run,
    run_schedule,
)

pytestmark = pytest.mark.crash

SCENARIO = "graph_durable.testing.scenarios.effects:build_effects_agent"
KWARGS = {
    "turns": [[["a", "1"], ["b", "2"]], [["c", "3"]], [["d", "4"], ["e", "5"]]],
    "modes": {"a": "dedupe", "b": "lookup", "c": "blind", "d": "lookup", "e": "dedupe"},
}
CALL_POINTS = ("before_intent", "after_intent", "after_effect", "after_receipt")

crashes = st.one_of(
    # A guard point is reached once per call and process.
    st.builds(CrashPoint, st.sampled_from(CALL_POINTS), st.sampled_from(sorted(KWARGS["modes"]))),
    # The fault-free run reaches each saver point 8 or 9 times.
    st.builds(CrashPoint, st.sampled_from(SAVER_POINTS), st.none(), st.integers(1, 9)),
)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    return reference_run(SCENARIO, KWARGS, directory=str(tmp_path_factory.mktemp("reference")))


def test_the_scenario_has_five_effects(reference: Reference) -> None:
    assert reference.snapshot.totals() == dict.fromkeys("abcde", 1)
    assert len(reference.points) > 40


@pytest.mark.sweep  # schedules of crashes: a sweep (make test-sweeps, which CI runs)
@settings(derandomize=True, max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(schedule=st.lists(crashes, min_size=1, max_size=3))
def test_no_schedule_duplicates_an_effect_or_changes_the_outcome(
        reference: Reference, tmp_path_factory: pytest.TempPathFactory,
        schedule: list[CrashPoint]) -> None:
    directory: Path = tmp_path_factory.mktemp("schedule")
    row = run_schedule(SCENARIO, schedule, KWARGS, reference=reference,
                       directory=str(directory))
    note(f"{row.label}: {row.outcome}, crashed {row.fired}/{len(schedule)}, "
         f"pauses {row.pauses}, {row.runs} processes")
    assert row.duplicates == 0, row.diff
    assert row.outcome == "ok", f"{row.label}\n{row.diff}"
    assert row.effects == reference.snapshot.totals()
