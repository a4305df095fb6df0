"""`python -m benchmarks.revisions`: two revisions' ratios, each against stock measured
in its own process, compared by their medians over the rounds."""

from __future__ import annotations

import subprocess

import pytest

from benchmarks import revisions
from benchmarks._runner import ROOT
from benchmarks.revisions import WORKTREE, Round, checkout, summary


def _round(revision: str, n_calls: int, wall: float, cpu: float) -> Round:
    return Round(revision, n_calls, wall, cpu, stock_cpu_ms=6.0, guarded_cpu_ms=6.0 * cpu)


def test_the_summary_compares_the_medians_of_each_revisions_rounds() -> None:
    rounds = [
        _round("base", 1, 1.20, 1.19), _round("base", 1, 1.10, 1.12),
        _round("base", 1, 1.16, 1.15),
        _round("new", 1, 1.12, 1.11), _round("new", 1, 1.30, 1.28),
        _round("new", 1, 1.13, 1.14),
        _round("base", 5, 1.25, 1.24), _round("new", 5, 1.21, 1.22),
    ]
    lines = summary(rounds, ["base", "new"])
    by_start = {tuple(line.split()[:2]): line.split() for line in lines[1:] if
                not line.startswith("new -")}
    assert by_start["base", "1"][2:5] == ["3", "1.160", "1.100..1.200"]
    assert by_start["new", "1"][2:5] == ["3", "1.130", "1.120..1.300"]
    assert by_start["new", "1"][5] == "1.140"
    assert "new - base, 1 call(s): wall -0.030, CPU -0.010" in lines
    assert "new - base, 5 call(s): wall -0.040, CPU -0.020" in lines


def test_a_revision_is_checked_out_apart_and_removed_after(tmp_path) -> None:
    with checkout("HEAD", tmp_path) as tree:
        assert (tree / "graph_durable" / "__init__.py").is_file()
        assert tree != ROOT
        listed = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"],
                                capture_output=True, text=True, check=True).stdout
        assert str(tree) in listed
    assert not tree.exists()
    listed = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"],
                            capture_output=True, text=True, check=True).stdout
    assert str(tree) not in listed
    with checkout(WORKTREE, tmp_path) as tree:
        assert tree == ROOT


def test_a_child_measures_its_own_revisions_turns(tmp_path) -> None:
    with checkout("HEAD", tmp_path) as tree:
        one = revisions.measure(tree, "HEAD", 1, turns=2, repetitions=1, warmup=0,
                                encrypted=False)
    assert one.revision == "HEAD" and one.n_calls == 1
    assert one.wall > 0 and one.cpu > 0 and one.guarded_cpu_ms > 0 < one.stock_cpu_ms


def test_a_child_running_other_code_than_its_revisions_is_refused(tmp_path) -> None:
    # A tree whose benchmarks are this checkout's and which holds no graph_durable: the
    # child imports the installed package, which is not the tree's code.
    package = tmp_path / "elsewhere" / "benchmarks"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"__path__.append({str(ROOT / 'benchmarks')!r})\n")
    elsewhere = package.parent
    with pytest.raises(RuntimeError, match="ran code from outside"):
        revisions.measure(elsewhere, "nowhere", 1, turns=1, repetitions=1, warmup=0,
                          encrypted=False)


def test_an_unknown_revision_is_refused_with_gits_own_words(tmp_path) -> None:
    with pytest.raises(RuntimeError, match="no-such-revision-anywhere"):
        with checkout("no-such-revision-anywhere", tmp_path):
            pass
    with pytest.raises(SystemExit):
        revisions.main(["HEAD~0", "HEAD"])  # one commit, two names


def test_a_child_measures_the_postgres_turn_on_the_databases_it_is_given(
        postgres_server) -> None:
    databases = {side: postgres_server.create_database(f"revisions_{side}")
                 for side in ("stock", "guarded")}
    try:
        one = revisions.measure(ROOT, WORKTREE, 1, turns=2, repetitions=1, warmup=0,
                                encrypted=False, databases=databases)
        assert one.wall > 0 and one.cpu > 0
        from psycopg import connect

        with connect(databases["guarded"]) as conn:  # the guarded side wrote its ledger
            [(applied,)] = conn.execute(
                "SELECT COUNT(*) FROM effects WHERE status = 'applied'").fetchall()
        assert applied >= 2  # the check's turn, then the timed ones
    finally:
        for side in databases:
            postgres_server.drop_database(f"revisions_{side}")
