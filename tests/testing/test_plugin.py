"""The pytest plugin: `crash_matrix` tests run only with `--crash-matrix`; the fixture fails
a test with the report's table and differences."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def _ini(pytester: pytest.Pytester) -> None:
    # The inner runs do not see this project's pytest settings; pytest-asyncio wants one.
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")

MARKED = """
import pytest

@pytest.mark.crash_matrix
def test_sweep():
    assert False, "ran"

def test_plain():
    pass
"""

SWEEPS = """
import pytest

SCENARIO = "graph_durable.testing.scenarios.effects:build_effects_agent"
KWARGS = {"turns": [[["pay", "42"]]], "modes": {"pay": "blind"}}


def skip_everything(question, providers):
    return {"type": "skip", "message": "not checked"}


@pytest.mark.crash_matrix
def test_passes(crash_matrix):
    report = crash_matrix(SCENARIO, KWARGS, points=["after_effect"])
    assert report.ok and [row.label for row in report.rows] == ["after_effect(pay)#1"]
    assert report.rows[0].pauses == ["effect_unknown"]


@pytest.mark.crash_matrix
def test_fails_with_the_diff(crash_matrix):
    crash_matrix(SCENARIO, KWARGS, points=["after_effect"], resolver=skip_everything)
"""


def test_marked_tests_are_skipped_unless_asked_for(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(MARKED)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1, skipped=1)
    pytester.runpytest("-p", "no:cacheprovider", "--crash-matrix").assert_outcomes(
        passed=1, failed=1)


def test_the_marker_and_options_are_registered(pytester: pytest.Pytester) -> None:
    assert any("crash_matrix:" in line
               for line in pytester.runpytest("--markers").outlines)
    assert any("--crash-matrix-workers" in line
               for line in pytester.runpytest("--help").outlines)


@pytest.mark.crash
def test_the_fixture_sweeps_and_fails_on_a_mismatch(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SWEEPS)
    result = pytester.runpytest("-p", "no:cacheprovider", "--crash-matrix")
    result.assert_outcomes(passed=1, failed=1)
    output = "\n".join(result.outlines)
    assert "after_effect(pay)#1  mismatch" in output
    assert "ledger     call_0_0: skipped (fault-free run: applied)" in output
