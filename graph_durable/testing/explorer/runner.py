"""A randomized, model-based explorer: generated episodes, real crashes, invariants.

    report = explore(episodes=300, seed=1, workers=2)     # stable path classes
    assert report.ok, report.render()

    python -m graph_durable.testing.explorer --episodes 300 --seed 1
    python -m graph_durable.testing.explorer --minutes 30 --paths all   # soak

Where `crash_matrix` sweeps every fault point of one scenario, the explorer draws many
small scenarios: each episode (`model.generate`, deterministic given its seed)
is one to three model turns of one to five tool calls, on tools with mixed policies
(blind, looked up, idempotent, approval, read-only, retries, timeouts) whose providers
return, refuse (`NotApplied`), fail transiently (`Retryable`), raise, lose the answer or
answer slowly, and which report errors and shape results every way LangChain lets a
tool (`ToolException`, an error ToolMessage, a `ValidationError`; artifacts, non-JSON
values, a `Command` with a `goto`). The agent is built by
`scenario.build_explorer_agent`, a scenario factory a child process rebuilds by
name: a flat ToolNode graph (`add_messages`, or a trimming reducer with or without
message ids), the same graph as a subgraph (one or two levels down, or fanned out by
`Send`), or `create_agent` with `EffectGuardMiddleware` among retry middleware in either
order (`shapes`), or the same writes made by `guarded` functions outside
ToolNode: from a custom `StateGraph` node, or from the `@task`s of a functional-API
`@entrypoint` agent (`writes`). The thread runs in real child
processes forked from a pre-imported server (`crash.forkserver`, milliseconds each): a crash
is a SIGKILL at a fault point occurrence, after which the thread resumes along a
generated path (plain, async, `recover()` under leases, a `copy_thread` copy, a
checkpoint-id config, time travel, an `update_state` fork). Pauses are answered with
valid decisions, sometimes after a malformed one. After every episode
(`checks`): each logical call applied at most once at its provider, exactly
once when its thread finished and the call was not rejected, skipped or failed; the
ledger agrees with the providers; a finished thread's answers are the tools' own
(artifact, non-JSON value, Command) when replayed; every pause could be answered and
led to the end; nothing raised but graph_durable's documented errors, and those only
where documented (`MiddlewareOrderError` for a retry middleware listed after the guard,
after which the middleware is put in order and the thread goes on; `UnkeyableToolCall`
for requests without ids, which ends the thread with nothing sent).

Episode `i` of a run has seed `seed + i`. A failing episode is shrunk (a simpler
episode with the same kind of failure) and reported with its seed, the shrunk episode
and commands that replay either. `paths` restricts what is generated: `STABLE_PATHS`
by default, `ALL_PATHS` adds the classes of `KNOWN_BUGS`. Generation is deterministic
given the seed and the paths; a run is too when its calls run one at a time (most
episodes) and no timing decides (slow providers, lease expiry), so a replay
reproduces most failures but not every race.

PostgreSQL savers are generated when asked for (`--paths stable,postgres`: half the
episodes run on `DurablePostgresSaver` or `AsyncDurablePostgresSaver`, each on a
database of its own on a throwaway server started from the machine's binaries).

Not generated (yet): a batched `HumanInTheLoopMiddleware` (LangChain's
`{"decisions": [...]}`; the per-call one is, before and after the guard); an `update_state`
fork of a functional-API thread (an entrypoint has one node: the update leaves nothing to
run); guarded writes in a subgraph or a `Send` branch, or several per `@task`; sub-keys
(`current_effect().subkey`); a `Command` tool inside `create_agent`; forks or time
travel to a model step of a flat graph (the model asks again: new calls by design) and
`update_state` forks that change the calls; real models' fresh tool_call_ids on a
restarted subgraph (the script repeats its ids); two live workers
racing on one thread (frozen zombies, leases lost under a running tool); crashes inside
`copy_thread`, `update_state` or `recover`'s own bookkeeping, or anywhere but the named
fault points; more than two crashes per episode; lookups that raise ("cannot tell");
fencing providers; flow-version changes; retention (`prune`, `delete_thread`).

Size: this module is a little longer than the ~400 lines modules aim for, on purpose: a
sixth of it is this docstring, the explorer's one description; the rest is the run,
shrinking and replay of failures, and the command line, which all work on one
`ExplorerReport`.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from graph_durable.testing.explorer.model import (
    ALL_PATHS,
    KNOWN_BUGS,
    STABLE_PATHS,
    Episode,
    generate,
    resolve_paths,
)
from graph_durable.testing.crash.forkserver import ForkServer

if TYPE_CHECKING:
    from graph_durable.testing.explorer.driver import EpisodeResult

__all__ = [
    "ALL_PATHS",
    "KNOWN_BUGS",
    "STABLE_PATHS",
    "Episode",
    "ExplorerReport",
    "Failure",
    "explore",
    "generate",
    "main",
    "replay",
    "shrink",
]

PRELOAD = ["graph_durable.testing.explorer.child"]
"""What the fork server imports before forking: the child's module and LangGraph."""


@dataclass
class Failure:
    """A failing episode: its problems, a shrunk twin, and how to replay either."""

    seed: int
    episode: Episode
    problems: list[str]
    log: list[str]
    replay: str
    """A command that runs the episode again from its seed."""
    shrunk: Episode | None = None
    shrunk_result: EpisodeResult | None = None
    """The run of `shrunk`: its problems and processes."""
    directory: str | None = None
    paths: frozenset[str] = STABLE_PATHS

    @property
    def shrunk_replay(self) -> str | None:
        """A command that runs the shrunk episode."""
        if self.shrunk is None:
            return None
        return (f"python -m graph_durable.testing.explorer --replay "
                f"{shlex.quote(self.shrunk.to_json())}{_paths_option(self.paths)}")

    def render(self) -> str:
        """The failure as a person reads it."""
        lines = [f"FAILED episode seed={self.seed}"]
        lines += [f"  - {p.splitlines()[0]}" for p in self.problems[:8]]
        if len(self.problems) > 8:
            lines.append(f"  ... and {len(self.problems) - 8} more")
        shown = self.shrunk or self.episode
        title = "shrunk episode" if self.shrunk is not None else "episode (not shrunk)"
        lines.append(f"  {title}:")
        lines += [f"    {line}" for line in shown.describe().splitlines()]
        log = self.log
        if self.shrunk_result is not None:
            lines.append("  shrunk fails with: "
                         + self.shrunk_result.problems[0].splitlines()[0])
            log = self.shrunk_result.log
        lines.append("  processes: " + " | ".join(log[-12:]))
        lines.append(f"  replay: {self.replay}")
        if self.shrunk_replay:
            lines.append(f"  replay shrunk: {self.shrunk_replay}")
        if self.directory:
            lines.append(f"  files: {self.directory}")
        return "\n".join(lines)


@dataclass
class ExplorerReport:
    """What a run of the explorer did and found."""

    seed: int
    paths: frozenset[str]
    episodes: int = 0
    failures: list[Failure] = field(default_factory=list)
    duration: float = 0.0
    processes: int = 0
    crashes: int = 0
    pauses: int = 0
    malformed: int = 0
    vias: Counter[str] = field(default_factory=Counter)
    """How many processes ran each way (`start`, `decide`, `recover`, ...)."""
    classes: Counter[str] = field(default_factory=Counter)
    """How many episodes were generated with each path class."""
    sidesteps: Counter[str] = field(default_factory=Counter)
    """Known bugs of disabled classes met at run time and stepped around."""
    costs: Counter[str] = field(default_factory=Counter)
    """What the resumes cost, from the audits (`models` paid again, `replayed`,
    `reconciled`, `resent` effects)."""

    @property
    def ok(self) -> bool:
        """Whether every episode kept every invariant."""
        return not self.failures

    def render(self) -> str:
        """A summary, then each failure."""
        lines = [
            f"explorer: {self.episodes} episodes (seeds {self.seed}..."
            f"{self.seed + self.episodes - 1}) in {self.duration:.1f} s, "
            f"{self.processes} processes, {self.crashes} SIGKILLs, {self.pauses} pauses "
            f"answered, {self.malformed} malformed decisions refused; "
            f"{len(self.failures)} failing",
            "  paths: " + ", ".join(sorted(self.paths)),
            "  runs by way: " + ", ".join(f"{k} {v}" for k, v in sorted(self.vias.items())),
            f"  resumes cost: {self.costs['models']} model calls paid again; effects "
            f"{self.costs['replayed']} replayed, {self.costs['reconciled']} reconciled by "
            f"lookup, {self.costs['resent']} re-sent under their key",
        ]
        if self.sidesteps:
            lines.append("  known bugs met and stepped around: " + ", ".join(
                f"{k} {v}" for k, v in sorted(self.sidesteps.items())))
        lines += [failure.render() for failure in self.failures]
        return "\n".join(lines)


def _paths_option(paths: frozenset[str]) -> str:
    if paths == STABLE_PATHS:
        return ""
    if paths >= ALL_PATHS:
        return " --paths " + ",".join(["all", *sorted(paths - ALL_PATHS)])
    if paths > STABLE_PATHS:
        return " --paths stable," + ",".join(sorted(paths - STABLE_PATHS))
    return " --paths " + ",".join(sorted(paths))


def _replay_command(seed: int, paths: frozenset[str], planted_bug: bool) -> str:
    return (f"python -m graph_durable.testing.explorer --seed {seed} --episodes 1"
            + _paths_option(paths) + (" --planted-bug" if planted_bug else ""))


def shrink(episode: Episode, kinds: set[str], server: ForkServer, directory: str, *,
           paths: frozenset[str] = STABLE_PATHS, max_runs: int = 40,
           max_seconds: float = 120.0, postgres: Any = None
           ) -> tuple[Episode, EpisodeResult] | None:
    """A simpler episode that still breaks an invariant of one of `kinds`, and its run;
    `None` if no simplification fails so.

    Greedy: take the first one-step simplification (`Episode.simpler`) that still
    fails, repeat until none does or the budget is spent.
    """
    from graph_durable.testing.explorer.driver import run_episode

    deadline = time.monotonic() + max_seconds
    found: tuple[Episode, EpisodeResult] | None = None
    current, runs, progress = episode, 0, True
    while progress and runs < max_runs and time.monotonic() < deadline:
        progress = False
        for candidate in current.simpler():
            if runs >= max_runs or time.monotonic() >= deadline:
                break
            runs += 1
            where = os.path.join(directory, f"shrink-{runs:03d}")
            result = run_episode(candidate, where, server, paths=paths, postgres=postgres)
            shutil.rmtree(where, ignore_errors=True)
            if result.kinds & kinds:
                current, found, progress = candidate, (candidate, result), True
                break
    return found


@contextmanager
def _postgres(needed: bool) -> Iterator[Any]:
    """A throwaway PostgreSQL server for `postgres` episodes, stopped after the block
    (with every database on it); `None` when no episode needs one."""
    if not needed:
        yield None
        return
    from graph_durable.testing.postgres import PostgresServer

    with PostgresServer() as server:
        yield server


@contextmanager
def _servers(count: int, method: str) -> Iterator[list[ForkServer]]:
    servers: list[ForkServer] = []
    try:
        for _ in range(count):
            servers.append(ForkServer(PRELOAD, method=method))  # type: ignore[arg-type]
        yield servers
    finally:
        for server in servers:
            server.close()


def explore(episodes: int | None = 100, seed: int = 0, *,
            paths: str | Iterable[str] | None = None, minutes: float | None = None,
            workers: int = 2, shrink_failures: bool = True, planted_bug: bool = False,
            directory: str | None = None, method: str = "fork", progress: bool = False,
            max_failures: int = 10) -> ExplorerReport:
    """Run generated episodes (seeds `seed`, `seed + 1`, ...) and check each one.

    Args:
        episodes: How many episodes; `None` with `minutes` runs until time is up.
        seed: Seed of the first episode.
        paths: Path classes to generate (`resolve_paths`): stable ones by default.
        minutes: Stop starting episodes after this long (a soak).
        workers: Episodes at once (each with its own fork server).
        shrink_failures: Shrink each failing episode before reporting it.
        planted_bug: Generate a misdeclared provider (see `generate`): the run must fail.
        directory: Where episodes run; failing ones are kept there. A temporary folder
            by default, removed unless something failed.
        method: `fork` (a pre-imported server forks each child) or `spawn`.
        progress: Print a line per failing episode and a dot per 10 episodes to stderr.
        max_failures: Stop after this many failing episodes.
    """
    from graph_durable.testing.explorer.driver import EpisodeResult, run_episode

    chosen = resolve_paths(paths)
    if episodes is None and minutes is None:
        raise ValueError("explore() needs episodes, minutes, or both")
    base = directory or tempfile.mkdtemp(prefix="explorer-")
    report = ExplorerReport(seed, chosen)
    deadline = None if minutes is None else time.monotonic() + 60 * minutes
    started = time.monotonic()
    seeds = itertools.count(seed) if episodes is None else iter(range(seed, seed + episodes))
    lock = threading.Lock()

    def next_seed() -> int | None:
        with lock:
            if deadline is not None and time.monotonic() >= deadline:
                return None
            if len(report.failures) >= max_failures:
                return None
            return next(seeds, None)

    def work(server: ForkServer) -> None:
        while (episode_seed := next_seed()) is not None:
            episode = generate(episode_seed, chosen, planted_bug=planted_bug)
            where = os.path.join(base, f"episode-{episode_seed}")
            try:
                result = run_episode(episode, where, server, paths=chosen, postgres=postgres)
            except Exception as exc:  # the explorer's own failure: report it, go on
                result = EpisodeResult(episode, [f"EXPLORER {type(exc).__name__}: {exc}\n"
                                                 f"{traceback.format_exc()}"])
            failure = None
            if not result.ok:
                failure = Failure(episode_seed, episode, result.problems, result.log,
                                  _replay_command(episode_seed, chosen, planted_bug),
                                  directory=where, paths=chosen)
                try:
                    shrunk = shrink(episode, result.kinds, server, where, paths=chosen,
                                    postgres=postgres) if shrink_failures else None
                except Exception as exc:  # the explorer's own failure: report it unshrunk
                    failure.problems.append(f"EXPLORER shrinking failed: "
                                            f"{type(exc).__name__}: {exc}")
                    shrunk = None
                if shrunk is not None:
                    failure.shrunk, failure.shrunk_result = shrunk
            else:
                shutil.rmtree(where, ignore_errors=True)
            with lock:
                report.episodes += 1
                report.processes += result.processes
                report.crashes += result.crashes
                report.pauses += result.pauses
                report.malformed += result.malformed
                report.vias.update(result.vias)
                report.sidesteps.update(result.sidesteps)
                report.costs.update(result.costs)
                report.classes.update(episode.paths())
                if failure is not None:
                    report.failures.append(failure)
                if progress:
                    if failure is not None:
                        print(failure.render(), file=sys.stderr, flush=True)
                    elif report.episodes % 10 == 0:
                        print(".", end="", file=sys.stderr, flush=True)

    with _postgres("postgres" in chosen) as postgres, \
            _servers(max(1, workers), method) as servers:
        threads = [threading.Thread(target=work, args=(server,), daemon=True)
                   for server in servers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    report.failures.sort(key=lambda f: f.seed)
    report.duration = time.monotonic() - started
    if directory is None and report.ok:
        shutil.rmtree(base, ignore_errors=True)
    return report


def replay(episode: Episode, *, paths: str | Iterable[str] | None = None,
           directory: str | None = None, method: str = "fork") -> EpisodeResult:
    """Run one given episode (e.g. a shrunk one) and return its `EpisodeResult`."""
    from graph_durable.testing.explorer.driver import run_episode

    where = directory or tempfile.mkdtemp(prefix="explorer-replay-")
    with _postgres(episode.backend != "sqlite") as postgres, \
            _servers(1, method) as [server]:
        return run_episode(episode, where, server, paths=resolve_paths(paths),
                           postgres=postgres)


def main(argv: list[str] | None = None) -> int:
    """The command line: run episodes, print the report, exit 1 if any failed."""
    parser = argparse.ArgumentParser(
        prog="python -m graph_durable.testing.explorer",
        description="Generate agent episodes, crash them in real processes, check invariants.")
    parser.add_argument("--episodes", type=int, default=None,
                        help="episodes to run (default 100, or unlimited with --minutes)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first episode")
    parser.add_argument("--minutes", type=float, default=None, help="run for this long (soak)")
    parser.add_argument("--paths", default="stable",
                        help="path classes: stable (default), all, or names, '-name' to drop "
                             f"one; known bugs: {', '.join(sorted(KNOWN_BUGS)) or 'none'}")
    parser.add_argument("--workers", type=int, default=max(1, min(4, os.cpu_count() or 1)),
                        help="episodes at once (default: the CPUs, at most 4)")
    parser.add_argument("--planted-bug", action="store_true",
                        help="misdeclare a provider as idempotent (the run must fail)")
    parser.add_argument("--no-shrink", action="store_true", help="report failures unshrunk")
    parser.add_argument("--replay", metavar="EPISODE_JSON",
                        help="run this one episode (from a 'replay shrunk' line)")
    parser.add_argument("--spawn", action="store_true",
                        help="a new interpreter per child instead of forking (slow)")
    parser.add_argument("--directory", help="keep episodes here (failing ones are kept)")
    args = parser.parse_args(argv)
    method = "spawn" if args.spawn else "fork"
    if args.replay:
        episode = Episode.from_json(args.replay)
        print(episode.describe())
        result = replay(episode, paths=args.paths, directory=args.directory, method=method)
        print("\n".join(result.log))
        print("\n".join(result.problems) or "ok: every invariant held")
        return 0 if result.ok else 1
    episodes = args.episodes if args.episodes is not None else (
        None if args.minutes is not None else 100)
    report = explore(episodes, args.seed, paths=args.paths, minutes=args.minutes,
                     workers=args.workers, shrink_failures=not args.no_shrink,
                     planted_bug=args.planted_bug, directory=args.directory,
                     method=method, progress=True)
    print(file=sys.stderr)
    print(report.render())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
