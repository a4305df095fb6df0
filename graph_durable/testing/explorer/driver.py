"""Drive one explorer episode through real child processes, then check its invariants.

`run_episode(episode, directory, server)` scripts the episode's provider faults, then
runs the thread in children of a `ForkServer`: each child is one invocation (start,
resume one way or another, decide), armed with the next crash of the episode. After a
SIGKILL the thread is resumed the way the crash says; a pause is answered by a reviewer
that, like a person with the provider's dashboard, approves, edits or rejects approvals
and settles unknown outcomes from the provider's records, sometimes after first trying
a malformed decision (which must raise `InvalidDecision` and change nothing). Once every
thread has finished (or cannot), `checks.check_episode` checks the invariants.

Size: this module is longer than the ~400 lines modules aim for, on purpose: it is one
loop, an episode's invocations with the crash, resume way and answer of each, and the
helpers that loop alone calls; the reviewer's answers (`reviewer`), the children
(`child`) and the invariants (`checks`) already live apart.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from graph_durable.ledger import answered
from graph_durable.testing.explorer.checks import (
    check_episode,
    ledger_snapshot,
    provider_effects,
)
from graph_durable.testing.explorer.child import DOCUMENTED_ERRORS
from graph_durable.testing.explorer.model import STABLE_PATHS, Crash, Episode, Resume
from graph_durable.testing.explorer.reviewer import APPROVALS, Reviewer, by_interrupt_id
from graph_durable.testing.explorer.scenario import explorer_saver, is_postgres, open_providers
from graph_durable.testing.explorer.shapes import (
    LOOKUP_FAULTS,
    SAFE_ORDER,
    SUBGRAPHS,
    UNSAFE_STACKS,
)
from graph_durable.testing.crash.forkserver import ForkServer

__all__ = ["EpisodeResult", "run_episode"]

STEP = "graph_durable.testing.explorer.child:run_step"
LEASE_TTL = 0.4
MAX_PROCESSES = 80
ALLOWED_WHEN_LEASED = ("LeaseHeld", "LeaseLost")
DOCUMENTED = {error.__name__ for error in DOCUMENTED_ERRORS}


@dataclass
class EpisodeResult:
    """What one episode did, and the invariants it broke."""

    episode: Episode
    problems: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    """One line per child process: how it ran and how it ended."""
    processes: int = 0
    crashes: int = 0
    """Crashes that fired (SIGKILLs)."""
    vias: list[str] = field(default_factory=list)
    """How each process ran (`start`, `decide`, a resume path, `restart`...)."""
    pauses: int = 0
    malformed: int = 0
    """Malformed decisions refused as they must be."""
    sidesteps: Counter[str] = field(default_factory=Counter)
    """Known bugs met at run time and stepped around, by path class."""
    costs: Counter[str] = field(default_factory=Counter)
    """What the resumes cost, from the audit of each thread (`models` paid again,
    `replayed`, `reconciled`, `resent`; as `CrashRow.audit`)."""
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether every invariant held."""
        return not self.problems

    @property
    def kinds(self) -> set[str]:
        """The kinds of broken invariants (`DUPLICATE`, `LEDGER`, ...)."""
        return {problem.split(" ", 1)[0] for problem in self.problems}


class _Stop(Exception):
    """An episode that cannot go on; the message is its problem line."""


class _Refused(Exception):
    """A thread graph_durable refused to run, as documented for its setup."""

    def __init__(self, message: str, thread_id: str) -> None:
        super().__init__(message)
        self.thread_id = thread_id


class _Run:
    """One episode in progress: its threads, crashes still to fire, and pauses so far."""

    def __init__(self, episode: Episode, directory: str, server: ForkServer,
                 timeout: float, classes: frozenset[str], database: str | None = None) -> None:
        self.episode = episode
        self.classes = classes
        self.server = server
        self.timeout = timeout
        self.files = {"db_path": database or os.path.join(directory, "agent.sqlite"),
                      "provider_dir": os.path.join(directory, "providers"),
                      "sealed": episode.sealed}
        self.output = os.path.join(directory, "children.log")
        self.result = EpisodeResult(episode)
        self.reviewer = Reviewer(episode, self.files["provider_dir"])
        self.crashes: list[Crash] = list(episode.crashes)
        self.stack = episode.stack
        """The middleware list the next children run with: an unsafe one, once refused,
        is put in the safe order (`shapes.SAFE_ORDER`), as its owner would."""
        self.after = episode.after
        self.phase = 0
        self.threads = ["t"]
        self.finished: list[str] = []
        self.abandoned: list[str] = []
        self.refused: list[str] = []
        """The abandoned threads a documented refusal stopped."""
        self.queue: list[str] = []
        self.dead_lease_until = 0.0
        """When the lease of the last process killed holding one has surely expired;
        until then another process is refused (`LeaseHeld`, or `LeaseLost` without a
        lease)."""

    def run(self) -> None:
        providers = open_providers(self.files["provider_dir"], self.episode.tools)
        for item, (tool, faults) in self.episode.faults().items():
            providers[tool].script_faults(*faults, operation=item)  # type: ignore[arg-type]
        for tool, spec in self.episode.tools.items():
            if spec.get("lookup_faults"):
                providers[tool].script_faults(  # type: ignore[arg-type]
                    *(LOOKUP_FAULTS[f] for f in spec["lookup_faults"]), operation="find")
        thread_id, how = "t", Resume("start")
        while True:
            try:
                self.drive(thread_id, how)
            except _Refused as refused:
                # Refused as documented for the episode's setup (a requesting message
                # without an id, an edit of a call under a shared id): the thread stops, and what it left is checked.
                self.abandoned.append(refused.thread_id)
                self.refused.append(refused.thread_id)
                self.result.log.append(f"refused as documented: {refused}")
            if not self.queue:
                return
            thread_id, how = self.queue.pop(0), Resume("plain")

    def child(self, thread_id: str, how: Resume, *, crashable: bool = True,
              **extra: Any) -> tuple[Crash | None, dict[str, Any]]:
        """Run one child process: `(the crash that killed it, or None; its report)`."""
        armed = self.crashes[0] if (crashable and self.crashes
                                    and self.phase >= self.crashes[0].phase) else None
        via, flavour = how.via, self.episode.flavour
        if via == "async":
            via, flavour = "plain", "async"
        spec = {**self.files, "tools": self.episode.tools,
                "turns": self.episode.scenario_turns(), "thread_id": thread_id, "via": via,
                "pick": how.pick, "flavour": flavour, "sequential": self.episode.sequential,
                "topology": self.episode.topology, "stack": self.stack,
                "history": self.episode.history, "fresh_ids": self.episode.fresh_ids,
                "pool": self.episode.backend == "postgres_pool", **extra}
        if self.episode.leased or via == "recover":
            spec["lease"] = {"owner": f"worker-{self.result.processes}", "ttl": LEASE_TTL}
        outcome = self.server.run(STEP, spec, fault=armed.plan() if armed else None,
                                  timeout=self.timeout, output_path=self.output)
        self.result.processes += 1
        self.result.vias.append(how.via)
        if outcome.killed:
            if armed is None:
                raise _Stop(f"CHILD {how.via} on {thread_id} was SIGKILLed, no crash armed")
            self.crashes.pop(0)
            self.result.crashes += 1
            if "lease" in spec:
                self.dead_lease_until = time.monotonic() + LEASE_TTL + 0.05
            self.result.log.append(f"{how.via} on {thread_id}: SIGKILL at {armed.point}"
                                   f"{' of ' + armed.tool if armed.tool else ''} "
                                   f"#{armed.occurrence}")
            return armed, {}
        if outcome.result is None:
            details = outcome.error or outcome.stderr[-1500:] or "(no output)"
            last = [line for line in details.splitlines() if line.strip()][-1:] or [""]
            raise _Stop(f"CHILD {how.via} on {thread_id} failed outside the graph's run "
                        f"(exit code {outcome.exitcode}): {last[0]}\n{details}")
        report = outcome.result
        raised = report.get("raised")
        self.result.log.append(
            f"{report['via']} on {thread_id}: next={report['next']} "
            f"pending={[i['value'].get('tool_call_id') for i in report['interrupts']]}"
            + (f" raised {raised['type']}: {raised['message'][:300]}" if raised else ""))
        # A question of the guard names the call the model asks now (a restarted
        # subgraph's model may have given it a new tool_call_id). A guarded write
        # outside ToolNode is named by its write (`name#n`), which no model asks for.
        writes = self.episode.topology in ("guarded_node", "functional")
        stray = [i["value"]["tool_call_id"] for i in report["interrupts"]
                 if "key" in i["value"] and not writes
                 and i["value"].get("tool_call_id") not in report.get("asked_calls", ())]
        if stray:
            raise _Stop(f"QUESTION {thread_id}: interrupts name tool calls {stray} that no "
                        "model message of the thread asks now")
        return None, report

    def copy(self, thread_id: str, how: Resume) -> str:
        """Copy `thread_id` (`saver.copy_thread`) and return the copy's id."""
        target = f"{thread_id}-copy{len(self.threads)}"
        with explorer_saver(self.files["db_path"], self.episode.sealed) as saver:
            saver.copy_thread(thread_id, target)
        self.result.log.append(f"{how.via} {thread_id} -> {target}")
        self.result.vias.append(how.via)
        self.threads.append(target)
        if how.via == "copy_both":
            self.queue.append(thread_id)
        else:
            self.abandoned.append(thread_id)
        return target

    def drive(self, thread_id: str, how: Resume) -> None:
        """Run `thread_id` to its end: crash as planned, resume, answer every pause."""
        stalls, repeats, extra, asked = 0, 0, {}, None
        while self.result.processes < MAX_PROCESSES:
            if how.via in ("copy_thread", "copy_both"):
                thread_id, how = self.copy(thread_id, how), Resume()
            crash, report = self.child(thread_id, how, **extra)
            extra = {}
            if crash is not None:
                how, stalls = crash.then, 0
                continue
            how = Resume()
            if self._refused(report) or not report["checkpointed"]:
                stalls += 1  # a dead worker's lease; or killed before the input was saved
            elif report["interrupts"]:
                waiting = self.undecided(thread_id, report)
                if waiting is None:
                    how, stalls = Resume("recover"), stalls + 1
                    continue
                pending_in_graph = len(report["interrupts"])
                in_graph = report["interrupts"]
                report["interrupts"] = waiting
                repeats = repeats + 1 if report["interrupts"] == asked else 0
                if repeats >= 3:
                    raise _Stop(f"STRANDED {thread_id}: answering "
                                f"{[i['value']['tool_call_id'] for i in asked or []]} asks "
                                "the same again")
                asked, stalls = report["interrupts"], 0
                self.phase += 1
                self.result.pauses += 1
                still = self.try_malformed(thread_id, asked)
                if not still:
                    how = Resume()  # settled meanwhile (a task that ran unanswered)
                    continue
                decisions: Any = self.reviewer.decide(still, in_graph)
                if len(decisions) > 1 and self.reviewer.rounds % 3 == 0:
                    # A partial answer: the calls left out stay pending, asked again.
                    decisions = dict(list(decisions.items())[:len(decisions) // 2])
                style = "raw" if self.episode.reviewer.get("raw") else "review"
                hitl = any("key" not in i["value"] for i in asked)
                if style == "raw":
                    # LangGraph takes another form only while one interrupt is pending;
                    # LangChain's HumanInTheLoopMiddleware reads no tool_call_id map.
                    # A functional-API agent's `@task`s each save their question, and
                    # `get_state()` may show fewer than LangGraph counts as pending (a
                    # bare value is refused when several are): there, by id only.
                    alone = pending_in_graph == 1 and self.episode.topology != "functional"
                    form = self.reviewer.rounds % 3 if alone else 0
                    form = 0 if hitl and form == 2 else form
                    if form == 0:  # keyed by interrupt id: LangGraph's form, always taken
                        decisions = by_interrupt_id(decisions, asked)
                    elif form == 1:  # a bare decision: one call is pending
                        [decisions] = decisions.values()
                    # form 2: {tool_call_id: decision}, taken while one call is pending
                how, extra = Resume("decide"), {"decisions": decisions, "style": style}
            elif not report["done"]:
                stalls += 1  # a dead worker's lease has not expired yet, or a stuck thread
                self.wait_for_dead_lease()
                if report["via"] == "recover" and not self.misjudged(thread_id, report):
                    how = Resume("recover")
            elif self.after is not None:
                how, self.after = self.after, None
            else:
                self.finished.append(thread_id)
                return
            if stalls > 4:
                raise _Stop(f"STRANDED {thread_id} stops at {report.get('next')} with nothing "
                            "pending, and resuming does not move it")
        raise _Stop(f"STRANDED {thread_id} did not finish within {MAX_PROCESSES} processes")

    def _refused(self, report: dict[str, Any]) -> bool:
        """Whether the run raised what a leased run may raise; raises `_Stop` otherwise."""
        raised = report.get("raised")
        for outcome in report.get("recovered", []):
            if outcome.get("error"):  # recover() reports what the resume raised
                name = outcome["error"].split(":", 1)[0]
                raised = raised or {"type": name, "message": outcome["error"],
                                    "documented": name in DOCUMENTED, "traceback": ""}
        if raised is None:
            return False
        # A lease this short may also expire under a live worker (LeaseLost): the
        # documented way to stop it; what it leaves behind is checked like any crash.
        leased_run = self.episode.leased or report["via"] == "recover"
        lease_expired = raised["type"] == "LeaseLost" and leased_run
        dead_worker = (raised["type"] in ALLOWED_WHEN_LEASED
                       and time.monotonic() < self.dead_lease_until + 0.5)
        if lease_expired or dead_worker:
            self.wait_for_dead_lease()
            return True
        if raised["type"] == "MiddlewareOrderError" and self.stack in UNSAFE_STACKS:
            # The documented refusal of an unsafe order: fix the order, run again.
            self.result.log.append(f"refused as documented ({raised['type']}); the "
                                   f"middleware put in order: {SAFE_ORDER[self.stack]}")
            self.stack = SAFE_ORDER[self.stack]
            return True
        if raised["type"] == "UnkeyableToolCall" and self.refused_as_documented():
            raise _Refused(f"{raised['type']}: {raised['message'][:300]}", report["thread_id"])
        documented = "documented" if raised["documented"] else "undocumented"
        raise _Stop(f"EXCEPTION ({documented}) {raised['type']} in {report['via']}: "
                    f"{raised['message'][:600]}"
                    + ("" if raised["documented"] else f"\n{raised['traceback']}"))

    def refused_as_documented(self) -> bool:
        """Whether the episode's setup may be refused with `UnkeyableToolCall`: requesting
        messages without ids, or a call `HumanInTheLoopMiddleware` edited under a
        tool_call_id that several calls of its message share (it could be any of them)."""
        return self.episode.history == "idless" or (
            self.stack.startswith("hitl") and "duplicate_call_id" in self.episode.paths())

    def known_bug(self, path_class: str, problem: str) -> bool:
        """Report a known bug met at run time if its class is enabled (`False`), else
        count it and tell the caller to step around it (`True`)."""
        if path_class in self.classes:
            if problem and problem not in self.result.problems:
                self.result.problems.append(problem)
            return False
        self.result.sidesteps[path_class] += 1
        self.result.log.append(f"stepped around known bug {path_class}")
        return True

    def undecided(self, thread_id: str, report: dict[str, Any]
                  ) -> list[dict[str, Any]] | None:
        """The pending interrupts still waiting for an answer, or `None` when every one
        has a decision journaled before a crash.

        A partial answer leaves some calls decided and others asked; a run killed after
        journaling leaves decided calls pending in the checkpoint: only the others are
        answered. When all are decided the thread is orphaned, which is right only while
        the killed worker's lease holds it (`recover()` passed it by as
        `held_elsewhere`): the driver waits for the lease and recovers again. After a run
        that did resume the thread it is a bug: the decisions were lost.

        A saved question the ledger has since asked anew (seed 10410: an approved call
        found `unknown` by a run killed before its interrupt was saved) is answered too,
        as `review` reads it (`ledger.answered`): resuming asks the new question.
        """
        interrupts = report["interrupts"]
        with explorer_saver(self.files["db_path"], self.episode.sealed) as saver:
            records = [saver.effect(i["value"]["key"], thread_id) if "key" in i["value"]
                       else None for i in interrupts]
        waiting = [i for i, r in zip(interrupts, records, strict=True)
                   if not answered(r, "approval" if i["value"].get("type") in APPROVALS
                                   else "unknown")]
        if waiting:
            return waiting
        outcomes = [o.get("outcome") for o in report.get("recovered", [])]
        if report["via"] == "recover" and "resumed" not in outcomes:
            self.result.log.append(f"recover passed {thread_id} by ({outcomes}): the dead "
                                   "worker's lease still held it")
            self.wait_for_dead_lease()
            return None
        raise _Stop(f"ASKED-TWICE {thread_id}: {[r.tool_call_id for r in records if r]} "
                    f"pending again after a {report['via']} run although their decisions "
                    "were journaled before it; a new answer would be ignored")

    def misjudged(self, thread_id: str, report: dict[str, Any]) -> bool:
        """Whether to run an unfinished thread with nothing pending, which `recover()`
        passed over, plainly: `thread_status` misjudges it (not `orphaned`, and no live
        lease), or a documented refusal of an unsafe middleware order failed it and the
        order is now fixed."""
        from graph_durable.operators.recovery import thread_status

        with explorer_saver(self.files["db_path"], self.episode.sealed) as saver:
            status = thread_status(saver, thread_id)
        if status.status in ("orphaned", "running"):
            return False
        if (status.status == "failed" and self.refused_as_documented()
                and "UnkeyableToolCall" in (status.reason or "")):
            # recover() leaves a thread refused as documented alone: it is failed.
            raise _Refused(f"recover: {status.reason[:300]}", thread_id)
        if (status.status == "failed" and self.stack in UNSAFE_STACKS
                and "MiddlewareOrderError" in (status.reason or "")):
            # The documented refusal of an unsafe order, met by the run recover()
            # resumed (which then leaves the failed thread to a person): fix the order,
            # run the thread again.
            self.result.log.append("refused as documented (MiddlewareOrderError, in a run "
                                   f"recover() resumed); the middleware put in order: "
                                   f"{SAFE_ORDER[self.stack]}")
            self.stack = SAFE_ORDER[self.stack]
            return True
        self.known_bug("recover_misjudged", (
            f"STATUS {thread_id} has not finished and nothing is pending (next="
            f"{report['next']}), but thread_status says {status.status} ({status.reason}), "
            "so recover() never resumes it"))
        return True

    def wait_for_dead_lease(self) -> None:
        """Sleep until the lease of a killed process has expired."""
        time.sleep(max(0.0, self.dead_lease_until - time.monotonic()))

    def snapshot(self, keys: set[str] | None = None) -> list[Any]:
        """The ledger's records and events and the providers' effects (under `keys`
        only, if given), as plain data."""
        records, events = ledger_snapshot(self.files["db_path"], self.episode.sealed)
        effects = provider_effects(self.files["provider_dir"], self.episode.tools)
        every = records + events + effects
        return every if keys is None else [x for x in every if x["key"] in keys]

    def try_malformed(self, thread_id: str, interrupts: list[dict[str, Any]]
                      ) -> list[dict[str, Any]]:
        """Maybe answer with a malformed decision first: it must change nothing. Returns
        the interrupts still to answer (a task of its own that ran again unanswered may
        have settled its call)."""
        if any("key" not in i["value"] for i in interrupts):
            return interrupts  # LangChain's HumanInTheLoopMiddleware checks its answers
        payload = self.reviewer.malformed(interrupts)
        if payload is None:
            return interrupts
        self.wait_for_dead_lease()
        keys = None
        if self.episode.topology in ("subgraph_send", "create_agent", "functional"):
            # Each call of create_agent or of a functional-API agent, each Send branch,
            # is a task of its own: one that holds a decision journaled earlier may go
            # on. The calls asked about, all answered in the set, must stay as they were.
            keys = {i["value"]["key"] for i in interrupts}
        before = self.snapshot(keys)
        _, report = self.child(thread_id, Resume("decide"), crashable=False,
                               decisions=payload, style="malformed")
        raised = report.get("raised") or {}
        if raised.get("type") not in ("InvalidDecision", "RefusedDecision"):
            raise _Stop(f"MALFORMED decision {payload} was not refused with InvalidDecision: "
                        f"{raised.get('type', 'accepted')} {raised.get('message', '')[:300]}")
        after = self.snapshot(keys)
        if after != before:
            changed = [x for x in after if x not in before]
            raise _Stop(f"MALFORMED decision {payload} was refused but changed the ledger or "
                        f"a provider: {str(changed)[:600]}")
        keys = keys or {i["value"]["key"] for i in interrupts}
        asked = [i for i in interrupts if i["value"]["key"] in keys]
        if [i for i in report["interrupts"] if i["value"]["key"] in keys] != asked:
            raise _Stop(f"MALFORMED decision {payload} was refused but the pending interrupts "
                        f"changed from {interrupts} to {report['interrupts']}")
        self.result.malformed += 1
        pending = {i["value"]["key"] for i in report["interrupts"]}
        return [i for i in interrupts if i["value"]["key"] in pending]


def run_episode(episode: Episode, directory: str, server: ForkServer, *,
                paths: frozenset[str] = STABLE_PATHS, timeout: float = 60.0,
                postgres: Any = None) -> EpisodeResult:
    """Run `episode` in `directory` (created) with children of `server`; check it.

    `paths` are the path classes enabled: a known bug that shows only at run time
    (`RUNTIME_BUGS`) is reported when its class is enabled, else stepped around
    (counted in `EpisodeResult.sidesteps`). A `postgres` episode runs on a database of
    its own on `postgres` (a started `graph_durable.testing.postgres.PostgresServer`),
    dropped once the episode is checked; a failing one's is dumped first into
    `directory` (`agent.sql`, `pg_dump`), kept with the folder.
    """
    os.makedirs(directory, exist_ok=True)
    started = time.monotonic()
    if episode.backend == "sqlite":
        return _checked_run(episode, directory, server, timeout, paths, started)
    if postgres is None:
        raise ValueError(f"episode {episode.seed} runs on PostgreSQL and no server was "
                         "given: run the explorer with --paths stable,postgres, which "
                         "starts one from the machine's binaries")
    name = f"episode_{episode.seed}_{uuid.uuid4().hex[:8]}"
    database = postgres.create_database(name)
    passed = False
    try:
        result = _checked_run(episode, directory, server, timeout, paths, started, database)
        passed = result.ok
        return result
    finally:
        if not passed:  # kept beside the episode's providers, as a SQLite file is
            postgres.dump_database(name, os.path.join(directory, "agent.sql"))
        postgres.drop_database(name)


def _checked_run(episode: Episode, directory: str, server: ForkServer, timeout: float,
                 paths: frozenset[str], started: float, database: str | None = None
                 ) -> EpisodeResult:
    run = _Run(episode, directory, server, timeout, frozenset(paths), database)
    try:
        run.run()
    except _Stop as stop:
        run.result.problems.append(str(stop))
    run.result.problems += check_episode(
        run.files["db_path"], run.files["provider_dir"], episode.tools, run.threads,
        run.finished, run.abandoned,
        forked=bool({"time_travel", "update_state"} & set(run.result.vias)),
        sealed=episode.sealed, one_request_per_item=episode.topology in SUBGRAPHS,
        refused=run.refused)
    run.result.costs.update(_resume_costs(run.files["db_path"], run.threads, episode.sealed))
    run.result.duration = time.monotonic() - started
    return run.result


def _resume_costs(db_path: str, threads: Any, sealed: bool) -> Counter[str]:
    """The audit of every thread of an episode, added up."""
    costs: Counter[str] = Counter()
    if not (is_postgres(db_path) or os.path.exists(db_path)):
        return costs
    with explorer_saver(db_path, sealed) as saver:
        for thread_id in threads:
            try:
                runs = saver.audit(thread_id).runs
            except Exception:  # an episode that failed may leave a thread unreadable
                continue
            costs["models"] += sum(r.model_calls_repeated or 0 for r in runs)
            for name in ("replayed", "reconciled", "resent"):
                costs[name] += sum(len(getattr(r, name)) for r in runs)
    return costs
