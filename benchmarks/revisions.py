"""Two revisions of graph_durable side by side: did a change make the guard cheaper?

`turn_overhead` measures one revision against stock LangGraph. A change to the guard
moves its ratio by a hundredth or two, less than the ratio moves between runs a few
minutes apart on a shared 2-core machine, so "before" and "after" measured one after
the other tell little. This benchmark alternates them: each revision is checked out
into a temporary git worktree (or taken as it is, `WORKTREE`), and in each round a
child process per revision, in alternating order, times `turn_overhead`'s turn (stock
and guarded turns interleaved in one process, `durability="sync"`, sync SQLite) and
reports its ratio guarded / stock, wall and process CPU time. Every ratio is against
stock measured in the same process, so a drift of the machine between the two children
cancels out; the medians over the rounds are compared.

Run: `python -m benchmarks.revisions BASE [OTHER]` (`OTHER` defaults to `WORKTREE`:
this checkout, uncommitted changes included), e.g. `python -m benchmarks.revisions
HEAD~1 HEAD --calls 1 5 --rounds 8`; `--postgres` times `turn_overhead_postgres`'s turn
instead, on a throwaway server (PostgreSQL's binaries, as that benchmark finds them). Both revisions run with this virtualenv's
packages. Nothing is written to `results.md`: a difference of revisions is not a row
of the project's figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks._runner import ROOT

__all__ = ["WORKTREE", "Round", "checkout", "main", "measure", "resolved", "summary"]

WORKTREE = "WORKTREE"
"""The revision name of this checkout as it is, uncommitted changes included."""

_CHILD = r"""
import json, os, sys, tempfile, time
from benchmarks import turn_overhead as sqlite_bench

n_calls, turns, repetitions, warmup, encrypted, databases = json.loads(sys.argv[1])
with tempfile.TemporaryDirectory() as workdir:
    if databases is None:
        bench = sqlite_bench
        serde = bench._encrypted() if encrypted else None
        sides = {
            "stock": bench.build_stock(os.path.join(workdir, "stock.sqlite"), n_calls, serde),
            "guarded": bench.build_guarded(os.path.join(workdir, "guarded.sqlite"), n_calls,
                                           serde),
        }
    else:
        from benchmarks import turn_overhead_postgres as bench
        sides = {side: getattr(bench, f"build_{side}")(databases[side], n_calls)
                 for side in ("stock", "guarded")}
    for agent in sides.values():
        sqlite_bench._check(agent, n_calls)
        for _ in range(warmup):
            agent.turn()
    wall, cpu, per_turn = [], [], {"stock": [], "guarded": []}
    for _ in range(repetitions):
        spent = {name: [0.0, 0.0] for name in sides}
        for turn in range(turns):
            order = ("stock", "guarded") if turn % 2 == 0 else ("guarded", "stock")
            for name in order:
                wall0, cpu0 = time.perf_counter(), time.process_time()
                sides[name].turn()
                spent[name][0] += time.perf_counter() - wall0
                spent[name][1] += time.process_time() - cpu0
        wall.append(spent["guarded"][0] / spent["stock"][0])
        cpu.append(spent["guarded"][1] / spent["stock"][1])
        for name in sides:
            per_turn[name].append(spent[name][1] / turns * 1000)
    for agent in sides.values():
        agent.close()
import graph_durable
print(json.dumps({"wall": wall, "cpu": cpu, "cpu_ms": per_turn,
                  "code": [bench.__file__, graph_durable.__file__]}))
"""
"""Run in a revision's checkout: its `benchmarks.turn_overhead` builds both agents."""


@dataclass(frozen=True)
class Round:
    """One child's measurement: the medians of its repetitions."""

    revision: str
    n_calls: int
    wall: float
    """Guarded / stock, wall time."""
    cpu: float
    """Guarded / stock, process CPU time."""
    stock_cpu_ms: float
    guarded_cpu_ms: float


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout.strip()


def resolved(revision: str) -> str:
    """The commit `revision` names (`WORKTREE` as it is); git's own error if none."""
    return revision if revision == WORKTREE else _git("rev-parse", "--verify",
                                                      f"{revision}^{{commit}}")


@contextmanager
def checkout(revision: str, parent: Path) -> Iterator[Path]:
    """A directory holding `revision` (a temporary worktree; this checkout for
    `WORKTREE`), removed afterwards."""
    if revision == WORKTREE:
        yield ROOT
        return
    commit = resolved(revision)
    path = parent / commit
    _git("worktree", "add", "--detach", "--quiet", str(path), commit)
    try:
        yield path
    finally:
        _git("worktree", "remove", "--force", str(path))


@contextmanager
def _postgres() -> Iterator[Callable[[], dict[str, str]]]:
    """A throwaway PostgreSQL server (`graph_durable.testing.postgres`), stopped on exit;
    what it yields makes two new databases per call."""
    from graph_durable.testing.postgres import PostgresServer

    server = PostgresServer().start()
    made = itertools.count()
    try:
        yield lambda: {side: server.create_database(f"{side}_{next(made)}")
                       for side in ("stock", "guarded")}
    finally:
        server.stop()


def measure(tree: Path, revision: str, n_calls: int, *, turns: int, repetitions: int,
            warmup: int, encrypted: bool, databases: Mapping[str, str] | None = None,
            prelude: str = "") -> Round:
    """One child process on `tree`'s code: stock and guarded turns interleaved, on
    SQLite files of its own, or on the PostgreSQL `databases` (`{"stock": conninfo,
    "guarded": conninfo}`, new ones). `prelude`: code the child runs first (what
    `benchmarks.knockouts` takes out of the guard)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", prelude + _CHILD,
         json.dumps([n_calls, turns, repetitions, warmup, encrypted,
                     None if databases is None else dict(databases)])],
        cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{revision}: the measuring child failed:\n{done.stderr[-3000:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    strays = [path for path in found["code"] if not Path(path).resolve().is_relative_to(
        tree.resolve())]
    if strays:
        raise RuntimeError(f"{revision}: the child ran code from outside {tree}: {strays}")
    return Round(revision, n_calls, statistics.median(found["wall"]),
                 statistics.median(found["cpu"]), statistics.median(found["cpu_ms"]["stock"]),
                 statistics.median(found["cpu_ms"]["guarded"]))


def summary(rounds: Sequence[Round], revisions: Sequence[str]) -> list[str]:
    """The table: per revision and calls, the medians over the rounds and their spread,
    then what the second revision changes."""
    lines = [f"{'revision':<14}{'calls':>6}{'rounds':>8}{'wall ratio':>12}{'spread':>15}"
             f"{'CPU ratio':>11}{'stock CPU ms':>14}{'guarded CPU ms':>16}"]
    medians: dict[tuple[str, int], tuple[float, float]] = {}
    for n_calls in sorted({one.n_calls for one in rounds}):
        for revision in revisions:
            mine = [one for one in rounds if one.revision == revision and one.n_calls == n_calls]
            if not mine:
                continue
            walls = [one.wall for one in mine]
            wall, cpu = statistics.median(walls), statistics.median(one.cpu for one in mine)
            medians[revision, n_calls] = (wall, cpu)
            lines.append(
                f"{revision[:13]:<14}{n_calls:>6}{len(mine):>8}{wall:>12.3f}"
                f"{f'{min(walls):.3f}..{max(walls):.3f}':>15}{cpu:>11.3f}"
                f"{statistics.median(one.stock_cpu_ms for one in mine):>14.2f}"
                f"{statistics.median(one.guarded_cpu_ms for one in mine):>16.2f}")
    if len(revisions) == 2:
        base, other = revisions
        for n_calls in sorted({one.n_calls for one in rounds}):
            if (base, n_calls) in medians and (other, n_calls) in medians:
                (bw, bc), (ow, oc) = medians[base, n_calls], medians[other, n_calls]
                lines.append(f"{other[:13]} - {base[:13]}, {n_calls} call(s): wall {ow - bw:+.3f}, "
                             f"CPU {oc - bc:+.3f}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, alternate the revisions' children, print the table."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.revisions",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="a git revision (or WORKTREE)")
    parser.add_argument("other", nargs="?", default=WORKTREE,
                        help="a git revision, or WORKTREE (default): this checkout as it is")
    parser.add_argument("--calls", type=int, nargs="+", default=[1, 5],
                        help="tool calls per turn (default: 1 5)")
    parser.add_argument("--rounds", type=int, default=6, help="children per revision")
    parser.add_argument("--turns", type=int, default=150, help="turns per repetition")
    parser.add_argument("--repetitions", type=int, default=3,
                        help="repetitions in each child (its median is the round's)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed turns per side")
    parser.add_argument("--encrypted", action="store_true",
                        help="both sides with LangGraph's EncryptedSerializer")
    parser.add_argument("--postgres", action="store_true",
                        help="`turn_overhead_postgres`'s turn (sync PostgreSQL) on a "
                        "throwaway server, new databases for every child")
    args = parser.parse_args(argv)
    if args.postgres and args.encrypted:
        parser.error("--encrypted is for SQLite only")
    revisions = [args.base, args.other]
    try:
        commits = [resolved(revision) for revision in revisions]
    except RuntimeError as exc:
        parser.error(str(exc))
    if commits[0] == commits[1]:
        parser.error(f"{args.base} and {args.other} are the same commit: name two")
    rounds: list[Round] = []
    with ExitStack() as stack:
        parent = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gd-revisions-")))
        trees = {revision: stack.enter_context(checkout(revision, parent))
                 for revision in revisions}
        databases = stack.enter_context(_postgres()) if args.postgres else None
        for n_calls in args.calls:
            for index in range(args.rounds):
                for revision in revisions if index % 2 == 0 else revisions[::-1]:
                    one = measure(trees[revision], revision, n_calls, turns=args.turns,
                                  repetitions=args.repetitions, warmup=args.warmup,
                                  encrypted=args.encrypted,
                                  databases=None if databases is None else databases())
                    rounds.append(one)
                    print(f"  {revision[:13]} {n_calls} call(s), round {index + 1}: wall "
                          f"{one.wall:.3f}, CPU {one.cpu:.3f}", flush=True)
    print("\n".join(summary(rounds, revisions)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
