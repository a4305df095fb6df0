"""`python -m benchmarks.knockouts`: the guard with one part taken out, in a measuring
child that checks the part is really gone, against the whole guard."""

from __future__ import annotations

import pytest

from benchmarks import knockouts, turn_overhead
from benchmarks._runner import ROOT
from benchmarks.knockouts import KNOCKOUTS, NONE, costs, targets
from benchmarks.revisions import Round, measure


@pytest.mark.parametrize("name", sorted(KNOCKOUTS))
def test_what_each_knockout_replaces_is_still_in_the_guard(name: str) -> None:
    assert all(callable(found) for found in targets(name))


@pytest.mark.parametrize("name", [NONE, *sorted(KNOCKOUTS)])
def test_a_child_measures_the_guard_with_the_part_taken_out(name: str) -> None:
    # The child checks a turn first: its answers as before, and the ledger without
    # what the knockout takes out (or with every call applied, where it leaves them).
    one = measure(ROOT, name, 1, turns=2, repetitions=1, warmup=0, encrypted=False,
                  prelude=knockouts.prelude(name))
    assert one.revision == name and one.wall > 0 and one.guarded_cpu_ms > 0


def test_a_knockout_that_did_not_take_is_refused(tmp_path) -> None:
    agent = turn_overhead.build_guarded(str(tmp_path / "guarded.sqlite"), 1)
    try:
        knockouts._checked(NONE)(agent, 1)  # the whole guard: every call applied
        with pytest.raises(RuntimeError, match="expected 0 applied effects, got 1"):
            knockouts._checked("claim")(agent, 1)
    finally:
        agent.close()


def test_each_parts_cost_is_the_whole_guards_median_minus_its_own() -> None:
    def one(name: str, n_calls: int, wall: float, cpu: float) -> Round:
        return Round(name, n_calls, wall, cpu, stock_cpu_ms=6.0, guarded_cpu_ms=6.0 * cpu)

    rounds = [one(NONE, 1, 1.14, 1.13), one(NONE, 1, 1.16, 1.15), one(NONE, 1, 1.10, 1.11),
              one("claim", 1, 1.07, 1.08), one("claim", 1, 1.09, 1.06),
              one("claim", 1, 1.08, 1.07), one("receipts", 5, 1.15, 1.14)]
    lines = costs(rounds, [NONE, "claim", "receipts"])
    assert lines[1].split()[:4] == ["claim", "1", "+0.060", "+0.060"]
    assert len(lines) == 2  # no whole guard measured with 5 calls: no cost for receipts
