"""`crash_matrix`: kill a scenario at every fault point, in real processes, and compare.

    report = crash_matrix("graph_durable.demo.ticket:build_ticket_agent",
                          {"ticket_mode": "blind", "email_mode": "blind"})
    assert report.ok, report.failures()
    print(report)                      # one row per crash point: outcome, effects, pauses

How a sweep works. The scenario first runs without faults, in child processes that
record every fault point they reach: a `CrashPoint` is a point, its tool, its occurrence
within the process, and its phase (how many pauses had been answered). Then, for each
point, the scenario runs again in a fresh folder: the child is SIGKILLed there, new
children resume until the thread finishes or pauses, and the resolver answers pauses.
A crash before the input's first checkpoint starts the thread again, as a client whose
request was never acknowledged sends it again. With `pairs`, each crash is also
followed by a second one at each point the first resuming process reaches: a crash
during recovery. The first crash of a pair runs once for all its pairs: once its
process is killed and gone, the point's run copies the database and provider files it
left, and each pair resumes a copy in new processes, killed at its second point, then
resumed to the end. A point's pairs start as soon as the point's run is done. Every run
is compared with the fault-free one:

- final graph state: messages as `child.summarize` shows them, JSON contents with
  sorted keys, effect keys (`gd-...`) and receipt ids renamed by order of appearance
  (keys hash task ids, which LangGraph derives from time-based checkpoint ids);
- ledger: final status per tool_call_id;
- provider effects: per provider and operation, as many as in the fault-free run, and
  no key applied more often than there (else: a duplicate).

Scenario protocol. `scenario` is `"module:attribute"`: a module-level factory (sync or
`async def`) called as `factory(db_path=..., provider_dir=..., **kwargs)` with JSON
kwargs, returning an object with `.graph` (compiled with a durable SQLite saver on
`db_path`, or on the saver spec `saver=` it is given when the sweep has a `database`)
and `.inputs`. Every `FakeProvider` it uses keeps its file in `provider_dir`
as `<name>.sqlite`: the sweep counts effects there, and resolvers look keys up there.
`demo.ticket.build_ticket_agent`, `testing.scenarios.effects.build_effects_agent` and
`testing.scenarios.extra.build_create_agent` follow it.

Resolver. `resolver(question, providers) -> decision` answers one interrupt value;
`providers` maps file names to the scenario's providers (opened to read). The default,
`default_resolver`, approves every `tool_approval` and settles an `effect_unknown`
from the provider's own records, as a human would on the provider's dashboard:
`applied` with the stored receipt if the key is there, else `retry` (same key).

Provider faults (`FakeProvider.script_faults`) through the guard, with `Effect(timeout=t)`;
each row is a test in `tests/testing/test_provider_faults.py`:

| fault                            | provider         | outcome                               |
|----------------------------------|------------------|---------------------------------------|
| slow, answers within `t`         | any              | `applied`, one effect                 |
| permanent (`NotApplied`)         | any              | `failed`, error ToolMessage, none     |
| hang, no answer within `t`       | blind            | `unknown`: `effect_unknown` interrupt |
| hang                             | lookup / dedupe  | `unknown`, then lookup finds nothing  |
|                                  |                  | / re-send, same key: `applied`        |
| transient (`Retryable`)          | any, `retries>0` | retried, same key: `applied`          |
| transient, more than `retries`   | any              | `failed` (certainly not applied)      |
| lost: applied, answer lost       | lookup           | `unknown`, found by lookup: `applied` |
| lost                             | dedupe           | `unknown`, re-sent, deduplicated:     |
|                                  |                  | `applied`, one effect                 |
| lost                             | blind            | `unknown`: `effect_unknown` interrupt |

A slow answer, a permanent failure and a timeout thus end `applied`, `failed` and
`unknown`: only the first surely happened, only the second surely did not.

Size: this module is longer than the ~400 lines modules aim for, on purpose. It is one
algorithm, the sweep: running one schedule (its children, the fork servers they come
from, the files a first crash leaves for its pairs) and the sweep over points and pairs
share the private `_Case` and `_Run` records and are read together; what stands apart
lives apart (`reads` for what a run left, `report` for what a sweep reports, `child`
for what a child does).
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from graph_durable.faults import FaultPlan
from graph_durable.testing.crash.child import PRELOAD, ChildResult, child_spec, run_child
from graph_durable.testing.crash.forkserver import ForkServer
from graph_durable.testing.crash.reads import (
    provider_effects,
    providers_in,
    read_only,
    resume_costs,
    snapshot_of,
    thread_started,
    trace_points,
)
from graph_durable.testing.crash.report import (
    CrashPoint,
    CrashReport,
    CrashRow,
    Progress,
    Reference,
    compare,
)
from graph_durable.testing.faults import FAULT_POINTS
from graph_durable.testing.providers import FakeProvider

__all__ = [
    "GUARD_POINTS",
    "SAVER_POINTS",
    "CrashPoint",
    "CrashReport",
    "CrashRow",
    "Reference",
    "Resolver",
    "crash_matrix",
    "default_resolver",
    "reference_run",
    "run_schedule",
]

GUARD_POINTS = ("before_intent", "after_intent", "after_decision", "after_effect",
                "after_receipt")
"""Fault points of the effect guard (around intents, decisions, effects, receipts)."""
SAVER_POINTS = tuple(point for point in FAULT_POINTS if point not in GUARD_POINTS)
"""Fault points of the durable saver (around checkpoint and pending-write puts)."""

Resolver = Callable[[dict[str, Any], Mapping[str, FakeProvider]], dict[str, Any]]
"""`resolver(interrupt_value, providers) -> decision`: how a sweep answers a pause."""

PointFilter = Iterable[str] | Callable[[CrashPoint], bool] | None
PairFilter = bool | Callable[[CrashPoint, CrashPoint], bool]


def default_resolver(question: dict[str, Any],
                     providers: Mapping[str, FakeProvider]) -> dict[str, Any]:
    """Approve approvals; settle an unknown outcome from the provider's own records.

    `effect_unknown` -> `applied` with the stored receipt if some provider holds an
    effect under the question's key, else `retry` (nothing was applied, re-send).
    """
    kind = question.get("type") if isinstance(question, dict) else None
    if kind in ("tool_approval", "effect_approval"):
        return {"type": "approve"}
    if kind == "effect_unknown":
        for provider in providers.values():
            for effect in provider.effects():
                if effect["key"] == question["key"]:
                    return {"type": "applied", "receipt": effect["receipt"]}
        return {"type": "retry"}
    raise ValueError(f"default_resolver cannot answer interrupt {question!r}; pass resolver=")


# -- running one schedule ------------------------------------------------------------------


@dataclass(frozen=True)
class _Case:
    scenario: str
    kwargs: dict[str, Any]
    directory: str
    thread_id: str
    resolver: Resolver
    timeout: float
    max_runs: int

    @property
    def provider_dir(self) -> str:
        return self.kwargs["provider_dir"]


@dataclass
class _Run:
    summary: dict[str, Any] = field(default_factory=dict)
    questions: list[Any] = field(default_factory=list)
    fired: int = 0
    processes: list[tuple[bool, list[CrashPoint]]] = field(default_factory=list)
    first_crash: _FirstCrash | None = None


@dataclass(frozen=True)
class _FirstCrash:
    """A run right after its first crash, the killed process gone: a copy of its
    database and provider files, and how far it had come. Every pair that begins with
    this crash resumes from a copy of it, so the crash runs once, not once per pair."""

    directory: str
    phase: int
    questions: tuple[Any, ...]
    processes: tuple[tuple[bool, tuple[CrashPoint, ...]], ...]


def _case(scenario: str, kwargs: Mapping[str, Any] | None, directory: str, thread_id: str,
          resolver: Resolver, timeout: float, max_runs: int) -> _Case:
    os.makedirs(directory, exist_ok=True)
    return _Case(scenario, {**(kwargs or {}), **_paths(directory)}, directory, thread_id,
                 resolver, timeout, max_runs)


_LOCAL = threading.local()
"""`server`: the `ForkServer` this sweep thread forks its children from, if any."""


def _preload(scenario: str) -> list[str]:
    """What a sweep's fork servers import: everything a child run of `scenario` uses."""
    return ["graph_durable.testing.crash.child", *PRELOAD, scenario.partition(":")[0]]


@contextmanager
def _fork_servers(scenario: str, count: int) -> Iterator[queue.Queue[ForkServer]]:
    """`count` fork servers with the scenario's module to preload (one per sweep
    thread). Their children come from this process's launcher, or start a new
    interpreter each where they cannot be forked (see `launcher`)."""
    servers: queue.Queue[ForkServer] = queue.Queue()
    made = [ForkServer(_preload(scenario)) for _ in range(count)]
    try:
        for server in made:
            servers.put(server)
        yield servers
    finally:
        for server in made:
            server.close()


def _with_server(servers: queue.Queue[ForkServer], work: Callable[[], Any]) -> Any:
    server = servers.get()
    _LOCAL.server = server
    try:
        return work()
    finally:
        _LOCAL.server = None
        servers.put(server)


def _run_child(case: _Case, action: str, decisions: Any, fault: FaultPlan | None,
               trace: str) -> ChildResult:
    """One child run: forked from this thread's server, else a new interpreter."""
    server: ForkServer | None = getattr(_LOCAL, "server", None)
    if server is None:
        return run_child(case.scenario, case.kwargs, thread_id=case.thread_id,
                         action=action, resume=decisions,  # type: ignore[arg-type]
                         fault=fault, trace_path=trace, timeout=case.timeout)
    spec = child_spec(case.scenario, case.kwargs, thread_id=case.thread_id,
                      action=action, resume=decisions)  # type: ignore[arg-type]
    outcome = server.run("graph_durable.testing.crash.child:run_spec",
                         {"spec": spec, "fault": asdict(fault) if fault else None,
                          "trace_path": trace}, timeout=case.timeout)
    where = f"child run of {case.scenario} (thread {case.thread_id!r}, {action})"
    if outcome.killed:
        return ChildResult(outcome.exitcode, True, {}, outcome.stderr)
    if outcome.exitcode == -signal.SIGALRM:
        raise TimeoutError(f"{where} did not finish within {case.timeout} s and was "
                           f"killed:\n{outcome.stderr}")
    if outcome.result is None:
        raise RuntimeError(f"{where} failed with exit code {outcome.exitcode}:\n"
                           f"{outcome.error or outcome.stderr}")
    return ChildResult(outcome.exitcode, False, outcome.result, outcome.stderr)


def _drive(case: _Case, schedule: Sequence[CrashPoint], run: _Run, *,
           keep: bool = False, after: _FirstCrash | None = None) -> None:
    """Run the scenario to its end, crashing as scheduled and answering every pause.

    The head of `schedule` is armed in every process from its phase on until it fires;
    the next crash is then armed from the first resuming process on. With `keep`, the
    files left by the first crash are copied aside (`run.first_crash`); with `after`,
    the run starts from such a copy, its first crash (the head of `schedule`) done.
    """
    pending = list(schedule)
    action, decisions, phase = "start", None, 0
    if after is not None:
        _copy_files(_paths(after.directory), case.kwargs)
        pending.pop(0)
        run.processes = [(killed, list(points)) for killed, points in after.processes]
        run.questions, run.fired, phase = list(after.questions), 1, after.phase
        action = _next_after_crash(case)
    for n in range(len(run.processes), case.max_runs):
        armed = pending[0] if pending and phase >= pending[0].phase else None
        trace = os.path.join(case.directory, f"trace-{n}.jsonl")
        result = _run_child(case, action, decisions, armed.plan() if armed else None, trace)
        run.processes.append((result.killed, trace_points(trace, phase)))
        if result.killed:
            if armed is None:
                raise RuntimeError(f"child {n} was SIGKILLed, but no crash was armed")
            pending.pop(0)
            run.fired += 1
            if keep and run.fired == 1:
                run.first_crash = _keep_first_crash(case, run, phase)
            action, decisions = _next_after_crash(case), None
        elif result.interrupts:
            providers = providers_in(case.provider_dir)
            decisions = {q["tool_call_id"]: case.resolver(q, providers)
                         for q in result.interrupts}
            run.questions.extend(result.interrupts)
            action, phase = "review", phase + 1
        else:
            run.summary = result.summary
            return
    raise RuntimeError(
        f"thread {case.thread_id!r} of {case.scenario} did not finish within {case.max_runs} "
        f"processes (questions answered: {run.questions}); check the resolver's decisions")


def _paths(directory: str) -> dict[str, str]:
    return {"db_path": os.path.join(directory, "agent.sqlite"),
            "provider_dir": os.path.join(directory, "providers")}


def _copy_files(source: Mapping[str, str], target: Mapping[str, str]) -> None:
    """Copy a run's database (with its `-wal`, `-shm` or `-journal`) and provider folder.

    Only between processes: no connection has the files open, so a plain copy is the
    database as the next process would find it.
    """
    db, to_db = source["db_path"], target["db_path"]
    folder, stem = os.path.split(db)
    os.makedirs(os.path.dirname(to_db) or ".", exist_ok=True)
    for name in os.listdir(folder or "."):
        if name == stem or (name.startswith(stem + "-")
                            and name.removeprefix(stem) in ("-wal", "-shm", "-journal")):
            shutil.copyfile(os.path.join(folder, name), to_db + name.removeprefix(stem))
    if os.path.isdir(source["provider_dir"]):
        shutil.copytree(source["provider_dir"], target["provider_dir"], dirs_exist_ok=True)


def _keep_first_crash(case: _Case, run: _Run, phase: int) -> _FirstCrash:
    directory = os.path.join(case.directory, "first-crash")
    _copy_files(case.kwargs, _paths(directory))
    return _FirstCrash(directory, phase, tuple(run.questions),
                       tuple((killed, tuple(points)) for killed, points in run.processes))


def _next_after_crash(case: _Case) -> str:
    """`resume`, or `start` again if the crash came before the input was checkpointed.

    A client whose request was never acknowledged sends it again; resuming a thread
    with no checkpoint has nothing to resume.
    """
    return "resume" if thread_started(case.kwargs, case.thread_id) else "start"


def reference_run(scenario: str, kwargs: Mapping[str, Any] | None = None, *, directory: str,
                  thread_id: str = "t", resolver: Resolver = default_resolver,
                  timeout: float = 60.0, max_runs: int = 12) -> Reference:
    """Run `scenario` without faults (pauses answered by `resolver`), recording its points.

    Raises:
        RuntimeError, TimeoutError: the fault-free run itself fails.
    """
    started = time.monotonic()
    case = _case(scenario, kwargs, directory, thread_id, resolver, timeout, max_runs)
    run = _Run()
    _drive(case, (), run)
    points = tuple(p for _, reached in run.processes for p in reached)
    pauses = tuple(q.get("type", "?") if isinstance(q, dict) else "?" for q in run.questions)
    with read_only(case.kwargs) as saver:
        snapshot = snapshot_of(case.kwargs, case.thread_id, run.summary, saver)
    return Reference(snapshot, points, pauses, time.monotonic() - started)


def run_schedule(scenario: str, schedule: Sequence[CrashPoint],
                 kwargs: Mapping[str, Any] | None = None, *, reference: Reference,
                 directory: str, thread_id: str = "t", resolver: Resolver = default_resolver,
                 timeout: float = 60.0, max_runs: int = 12) -> CrashRow:
    """Run `scenario` in a fresh `directory`, crashing as `schedule` says; compare.

    The first crash fires in the process of its phase; each further crash is armed from
    the process that resumes after the previous one. Never raises for a failing run: the
    row's outcome is `error` and `diff` says why.
    """
    case = _case(scenario, kwargs, directory, thread_id, resolver, timeout, max_runs)
    return _run_schedule(case, schedule, reference).row


@dataclass
class _Ran:
    row: CrashRow
    first_crash: _FirstCrash | None = None


def _run_schedule(case: _Case, schedule: Sequence[CrashPoint], reference: Reference, *,
                  keep: bool = False, after: _FirstCrash | None = None) -> _Ran:
    """`run_schedule` on `case`; `keep` and `after` as `_drive` takes them."""
    started = time.monotonic()
    run = _Run()
    row = CrashRow(tuple(schedule), "ok")
    with ExitStack() as stack:
        saver = None
        try:
            _drive(case, schedule, run, keep=keep, after=after)
            # One reader for the ledger and the audit: a sweep opens one per run, and
            # opening a database costs more than these reads.
            saver = stack.enter_context(read_only(case.kwargs))
            snapshot = snapshot_of(case.kwargs, case.thread_id, run.summary, saver)
        except Exception as exc:  # a failing run is a row of the report, not an abort
            row.outcome, row.diff = "error", f"{type(exc).__name__}: {exc}"
            # Still count duplicates: a run may fail after having repeated an effect.
            snapshot = replace(reference.snapshot, counts=provider_effects(case.provider_dir)[0])
        row.audit = resume_costs(case.kwargs, case.thread_id, saver)
    lines, row.duplicates = compare(reference.snapshot, snapshot)
    if row.outcome == "ok" and lines:
        row.outcome, row.diff = "mismatch", "\n".join(lines)
    elif row.duplicates:
        row.diff += "\n" + "\n".join(line for line in lines if line.startswith("DUPLICATE"))
    row.effects = snapshot.totals()
    killed = [i for i, (was_killed, _) in enumerate(run.processes) if was_killed]
    if killed and killed[0] + 1 < len(run.processes):
        row.recovery = tuple(run.processes[killed[0] + 1][1])
    row.questions, row.runs, row.fired = run.questions, len(run.processes), run.fired
    row.duration = time.monotonic() - started
    return _Ran(row, run.first_crash)


# -- the sweep -----------------------------------------------------------------------------


def _wanted(point: CrashPoint, points: PointFilter) -> bool:
    if points is None:
        return True
    if callable(points):
        return bool(points(point))
    return point.point in set(points)


def crash_matrix(
    scenario: str,
    kwargs: Mapping[str, Any] | None = None,
    *,
    points: PointFilter = None,
    pairs: PairFilter = False,
    resolver: Resolver = default_resolver,
    thread_id: str = "t",
    directory: str | os.PathLike[str] | None = None,
    workers: int = 1,
    timeout: float = 60.0,
    max_runs: int = 12,
    progress: bool = True,
    database: Callable[[str], Mapping[str, Any]] | None = None,
) -> CrashReport:
    """Crash `scenario` at every fault point it reaches (and pairs of them); compare.

    Args:
        scenario: `module:attribute` of the scenario factory (see the module docstring).
        kwargs: JSON keyword arguments for the factory, besides `db_path`/`provider_dir`.
        points: Which points to crash at: fault point names, or a predicate on
            `CrashPoint`; every point reached by default.
        pairs: Also crash a second time, at each point the first resuming process
            reaches: `True` for every such pair, or a predicate `(first, second) ->
            bool`; the second point must pass `points` too. Pairs multiply the cost
            (a resumed run reaches about as many points as the rest of the run), though
            each costs only the processes after its first crash.
        resolver: Answers pauses (see `default_resolver`).
        thread_id: Thread the scenario runs in.
        directory: Where each run gets its own folder; a temporary folder, removed if
            the sweep passes, by default.
        workers: Runs at once (each is its own process and folder).
        timeout: Seconds one child process may take.
        max_runs: Child processes one run may start before it counts as an error.
        progress: Draw a progress bar on stderr.
        database: A fresh database for each run, given the run's folder: a saver spec
            (`graph_durable.testing.savers.SaverSpec`, e.g. a new PostgreSQL database)
            passed to the scenario as `saver=` (SQLite on the run's folder if omitted).
            Not with `pairs`, whose runs copy the files of their first crash.

    Raises:
        RuntimeError, TimeoutError: the fault-free run itself fails.
        ValueError: `database` with `pairs`.
    """
    if database is not None and pairs:
        raise ValueError("crash_matrix(pairs=...) copies each first crash's SQLite files; "
                         "it cannot copy a database given by database=. Sweep single "
                         "points on it, or pairs on SQLite.")
    started = time.monotonic()

    def kwargs_for(directory: str) -> Mapping[str, Any] | None:
        if database is None:
            return kwargs
        return {**(kwargs or {}), "saver": dict(database(directory))}

    base = os.fspath(directory) if directory is not None else tempfile.mkdtemp(
        prefix="crash-matrix-")
    options = {"thread_id": thread_id, "resolver": resolver, "timeout": timeout,
               "max_runs": max_runs}
    bar = Progress(0, progress)
    # Children fork from servers that imported LangGraph and the scenario once, so a
    # child starts in milliseconds instead of a new interpreter's second or two.
    with _fork_servers(scenario, max(1, workers)) as servers:
        reference_dir = os.path.join(base, "reference")
        reference = _with_server(servers, lambda: reference_run(
            scenario, kwargs_for(reference_dir), directory=reference_dir,
            **options))  # type: ignore[arg-type]

        def one(schedule: tuple[CrashPoint, ...], directory: str,
                after: _FirstCrash | None = None) -> _Ran:
            case = _case(scenario, kwargs_for(directory), directory,
                         **options)  # type: ignore[arg-type]
            return _with_server(servers, lambda: _run_schedule(
                case, schedule, reference, keep=bool(pairs) and after is None, after=after))

        def pairs_of(row: CrashRow) -> list[tuple[CrashPoint, ...]]:
            first = row.schedule[0]
            return [(first, second) for second in row.recovery if _wanted(second, points)
                    and (pairs is True or pairs(first, second))]  # type: ignore[operator]

        singles = [(p,) for p in reference.points if _wanted(p, points)]
        firsts: list[CrashRow | None] = [None] * len(singles)
        seconds: dict[int, list[CrashRow | None]] = {}
        bar.total = len(singles)
        # One queue for points and pairs: a point's pairs start as soon as it is done
        # (from the copy its first crash left), so no worker waits for the others.
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            running = {pool.submit(one, schedule, os.path.join(base, f"{i + 1:04d}")): (i, -1)
                       for i, schedule in enumerate(singles)}
            while running:
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    i, j = running.pop(future)
                    ran = future.result()
                    bar.step(ran.row)
                    if j >= 0:
                        seconds[i][j] = ran.row
                        continue
                    firsts[i] = ran.row
                    if not pairs:
                        continue
                    schedules = pairs_of(ran.row)
                    seconds[i] = [None] * len(schedules)
                    bar.total += len(schedules)
                    for j, schedule in enumerate(schedules):
                        folder = os.path.join(base, f"{i + 1:04d}-{j + 1:03d}")
                        running[pool.submit(one, schedule, folder, ran.first_crash)] = (i, j)
        rows = [row for row in firsts if row is not None] + [
            row for i in sorted(seconds) for row in seconds[i] if row is not None]
    bar.close()
    report = CrashReport(scenario, reference, rows, time.monotonic() - started, base)
    if directory is None and report.ok:
        shutil.rmtree(base, ignore_errors=True)
        report.directory = None
    return report
