"""The explorer: generated episodes, SIGKILLed in real processes, keep every invariant.

The long test runs episodes of the stable path classes: `QUICK_EPISODES` (150, about a
minute and a half on two cores, every stable shape and way of resuming) and
`EXPLORER_EPISODES` (default 300), both marked `sweep` (make test-sweeps, which CI runs),
to keep make test under ten minutes;
`GRAPH_DURABLE_EXPLORER_EPISODES` and `GRAPH_DURABLE_EXPLORER_SEED` change the sweep's
count and both runs' first seed. A failure prints each failing seed, a shrunk episode
and the commands that replay them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from graph_durable.testing import explore
from graph_durable.testing.explorer import replay
from graph_durable.testing.explorer.classes import BACKEND_PATHS
from graph_durable.testing.explorer.model import (
    ALL_PATHS,
    KNOWN_BUGS,
    RESUME_PATHS,
    RUNTIME_PATHS,
    STABLE_PATHS,
    Call,
    Crash,
    Episode,
    Resume,
    generate,
    resolve_paths,
)
from graph_durable.testing.faults import FaultPlan
from graph_durable.testing.crash.forkserver import ForkServer

pytestmark = pytest.mark.crash

EXPLORER_EPISODES = int(os.environ.get("GRAPH_DURABLE_EXPLORER_EPISODES", "300"))
QUICK_EPISODES = 150
EXPLORER_SEED = int(os.environ.get("GRAPH_DURABLE_EXPLORER_SEED", "1"))

SHAPES_OF_THIS_ROUND = (
    "subgraph", "subgraph_nested", "subgraph_send", "subgraph_refork", "create_agent",
    "tool_retry_outside", "model_retry", "tool_retry_inside", "error_tool_exception",
    "error_message", "error_validation", "artifact_result", "non_json_result",
    "command_result", "trimmed_history", "idless_messages", "hitl_before_guard",
    "hitl_after_guard", "fresh_call_ids", "lookup_cannot_tell", "guarded_node", "functional")
"""Classes whose draws come after every other (`explorer.model._shapes`)."""

MISDECLARED = {"mode": "blind", "policy": "idempotent", "approval": False, "retries": 0,
               "timeout": None}
"""A provider that does not dedupe, declared idempotent: a re-send applies it again."""


def planted_bug_episode() -> Episode:
    """One call to a misdeclared provider, killed once the effect is applied."""
    return Episode(seed=0, tools={"charge": dict(MISDECLARED)},
                   turns=[[Call("charge", "call_0_0", "x00")]],
                   crashes=[Crash("after_effect", "charge", 1, 0, Resume("plain"))])


def test_generation_is_deterministic_and_stays_in_its_paths() -> None:
    for seed in range(300):
        episode = generate(seed)
        assert generate(seed) == episode
        assert Episode.from_json(episode.to_json()) == episode
        assert episode.paths() <= STABLE_PATHS, seed
        assert 1 <= len(episode.turns) <= 3
        assert all(1 <= len(turn) <= 5 for turn in episode.turns)
    generated = set().union(*(generate(seed, ALL_PATHS).paths() for seed in range(600)))
    assert generated == ALL_PATHS - set(RUNTIME_PATHS)
    only_recover = set().union(*(generate(seed, {"recover"}).paths() for seed in range(100)))
    assert only_recover == {"recover"}
    # The shape classes draw on a generator of their own: without them, a seed's episode
    # is the one it was, a flat graph of plain tools.
    everyday = STABLE_PATHS - set(SHAPES_OF_THIS_ROUND)
    for seed in range(100):
        episode, plain = generate(seed, everyday), generate(seed, STABLE_PATHS)
        assert (episode.topology, episode.stack, episode.history) == ("flat", "", "")
        assert all(set(spec) <= {"mode", "policy", "approval", "retries", "timeout"}
                   for spec in episode.tools.values())
        assert [[c.id for c in t] for t in episode.turns] == [[c.id for c in t]
                                                               for t in plain.turns]


def test_path_classes_are_chosen_by_name() -> None:
    assert resolve_paths(None) == resolve_paths("stable") == STABLE_PATHS
    assert ALL_PATHS - set(KNOWN_BUGS) == STABLE_PATHS
    assert not set(BACKEND_PATHS) & ALL_PATHS  # named on their own, in neither group
    assert resolve_paths("stable,postgres") == STABLE_PATHS | {"postgres"}
    assert resolve_paths("all,postgres") == ALL_PATHS | {"postgres"}
    assert resolve_paths("all,-copy_both") == ALL_PATHS - {"copy_both"}
    assert resolve_paths("stable,time_travel") == STABLE_PATHS | {"time_travel"}
    assert resolve_paths(["reused_call_id"]) == {"reused_call_id", "plain"}
    with pytest.raises(ValueError, match="Unknown path class"):
        resolve_paths("teleport")


def test_fork_server_children_are_real_processes_killed_by_sigkill(tmp_path: Path) -> None:
    episode = planted_bug_episode()
    spec = {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path / "p"),
            "tools": episode.tools, "turns": episode.scenario_turns(), "thread_id": "t",
            "via": "start"}
    target = "graph_durable.testing.explorer.child:run_step"
    with ForkServer(["graph_durable.testing.explorer.child"]) as server:
        killed = server.run(target, spec, fault=FaultPlan("after_effect", "charge"))
        resumed = server.run(target, {**spec, "via": "plain"})
    assert killed.exitcode == -signal.SIGKILL and killed.killed and killed.result is None
    assert resumed.exitcode == 0 and resumed.result["done"], resumed.error


@pytest.mark.long
def test_the_explorer_detects_a_planted_bug(tmp_path: Path) -> None:
    result = replay(planted_bug_episode(), directory=str(tmp_path / "one"))
    assert not result.ok
    assert result.crashes == 1
    assert any(p.startswith("DUPLICATE charge applied key") for p in result.problems), \
        result.problems
    assert "EXACTLY-ONCE" in result.kinds
    # The same episode on a provider that honours the policy keeps every invariant.
    honest = planted_bug_episode()
    honest.tools["charge"]["mode"] = "dedupe"
    assert replay(honest, directory=str(tmp_path / "honest")).problems == []

    report = explore(8, 0, planted_bug=True, workers=2, directory=str(tmp_path / "random"))
    assert not report.ok
    failure = report.failures[0]
    assert "DUPLICATE" in {p.split(" ", 1)[0] for p in failure.problems}
    assert failure.shrunk is not None
    assert sum(len(t) for t in failure.shrunk.turns) <= sum(len(t) for t in failure.episode.turns)
    rendered = report.render()
    assert f"seed={failure.seed}" in rendered
    assert (f"python -m graph_durable.testing.explorer --seed {failure.seed} --episodes 1 "
            "--planted-bug") in rendered
    assert "replay shrunk: python -m graph_durable.testing.explorer --replay" in rendered


def test_postgres_episodes_are_drawn_only_when_asked_for_and_change_nothing_else() -> None:
    with_postgres = resolve_paths("stable,postgres")
    drawn = [generate(seed, with_postgres) for seed in range(200)]
    assert 60 <= sum(e.backend != "sqlite" for e in drawn) <= 140
    assert {e.backend for e in drawn} == {"sqlite", "postgres", "postgres_pool"}
    for seed, episode in enumerate(drawn):
        plain = generate(seed)
        assert plain.backend == "sqlite"
        assert episode.to_json() == plain.to_json().replace(
            '"backend":"sqlite"', f'"backend":"{episode.backend}"')
        assert Episode.from_json(episode.to_json()) == episode
    assert any("postgres" in e.paths() and "on PostgreSQL" in e.describe() for e in drawn)


@pytest.mark.long
def test_a_postgres_episode_runs_on_a_database_of_its_own(tmp_path: Path,
                                                          postgres_server) -> None:
    """The planted bug is found on `DurablePostgresSaver` and on the async saver, each on
    one connection and on a pool, and the failing episode's database is dumped beside
    its providers; an honest episode passes there; every database is dropped; no SQLite
    file is made."""
    import psycopg

    from graph_durable.testing.explorer.driver import run_episode

    def databases() -> set[str]:
        with psycopg.connect(postgres_server.conninfo) as conn:
            return {row[0] for row in conn.execute("SELECT datname FROM pg_database")}

    before = databases()
    with ForkServer(["graph_durable.testing.explorer.child"]) as server:
        for flavour, backend in (("sync", "postgres"), ("async", "postgres"),
                                 ("sync", "postgres_pool"), ("async", "postgres_pool")):
            episode = planted_bug_episode()
            episode.backend, episode.flavour = backend, flavour
            where = tmp_path / f"bug-{flavour}-{backend}"
            result = run_episode(episode, str(where), server, postgres=postgres_server)
            assert "EXACTLY-ONCE" in result.kinds, result.problems
            assert result.crashes == 1
            assert not (where / "agent.sqlite").exists()
            dump = (where / "agent.sql").read_text()  # the failing episode's database
            assert "CREATE TABLE public.effects" in dump and "gd-" in dump
            honest = planted_bug_episode()
            honest.backend, honest.flavour = backend, flavour
            honest.tools["charge"]["mode"] = "dedupe"
            result = run_episode(honest, str(tmp_path / f"honest-{flavour}-{backend}"), server,
                                 postgres=postgres_server)
            assert result.problems == []
    assert databases() == before  # each dropped once checked
    with pytest.raises(ValueError, match="--paths stable,postgres"):
        with ForkServer(["graph_durable.testing.explorer.child"]) as server:
            episode = planted_bug_episode()
            episode.backend = "postgres"
            run_episode(episode, str(tmp_path / "no-server"), server)


def test_the_command_line_replays_a_seed_and_an_episode(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "graph_durable.testing.explorer"]
    ok = subprocess.run([*command, "--seed", "7", "--episodes", "2", "--workers", "1"],
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "explorer: 2 episodes (seeds 7...8)" in ok.stdout
    assert "RuntimeWarning" not in ok.stderr
    failing = subprocess.run([*command, "--replay", planted_bug_episode().to_json()],
                             capture_output=True, text=True, timeout=300)
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "DUPLICATE" in failing.stdout


@pytest.mark.long
@pytest.mark.parametrize("episodes", [
    pytest.param(QUICK_EPISODES, marks=pytest.mark.sweep, id="quick"),
    pytest.param(EXPLORER_EPISODES, marks=pytest.mark.sweep, id="ci"),
])
def test_stable_paths_keep_every_invariant(tmp_path: Path, episodes: int) -> None:
    report = explore(episodes, EXPLORER_SEED, workers=2, directory=str(tmp_path))
    print(report.render())
    assert report.ok, report.render()
    assert report.episodes == episodes
    # The run did what it claims: crashes, pauses, refused malformed decisions, and
    # every stable way of resuming.
    assert report.crashes >= episodes // 2
    assert report.pauses >= episodes // 2
    assert report.malformed >= episodes // 20
    stable_resumes = set(RESUME_PATHS) & STABLE_PATHS
    assert stable_resumes <= set(report.vias), report.vias
    # ... and every stable shape: subgraphs, create_agent stacks, tools' answers.
    stable_shapes = set(SHAPES_OF_THIS_ROUND) & STABLE_PATHS
    assert stable_shapes <= set(report.classes), report.classes


@pytest.mark.long
@pytest.mark.sweep
def test_stable_paths_keep_every_invariant_on_postgres(tmp_path: Path) -> None:
    """Half of the episodes on the PostgreSQL savers (a throwaway server of the run's)."""
    episodes = QUICK_EPISODES // 2
    report = explore(episodes, EXPLORER_SEED + 100_000, paths="stable,postgres", workers=2,
                     directory=str(tmp_path))
    print(report.render())
    assert report.ok, report.render()
    assert report.episodes == episodes
    assert report.classes["postgres"] >= episodes // 4, report.classes
    assert report.crashes >= episodes // 2
