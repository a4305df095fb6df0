"""Matching this run's resume value to the questions a task asked, and checking it
first: which answers the task reads (addressed by interrupt id, bare, or under the
task's own LangGraph id of earlier releases), which are stale, and the journal entries
of the decisions it carries.

`read_decisions(task, ...)` is a generator yielding the saver reads it needs (`Read`), which
the sync and async drivers perform; everything else here is pure.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Mapping
from typing import Any

from graph_durable._langgraph import (
    CONFIG_KEY_RESUME_MAP,
    CONFIG_KEY_SCRATCHPAD,
    CONFIG_KEY_TASK_ID,
    INTERRUPT,
)
from graph_durable._langgraph import interrupt_id as _interrupt_id
from graph_durable.errors import InvalidDecision
from graph_durable.ledger import EffectRecord, TransitionWrite, WriteBatch
from graph_durable.nodes.decisions import (
    check_answers,
    check_decision,
    match_decisions,
    refuse_stale,
)
from graph_durable.nodes.interrupts import interrupt_id_for
from graph_durable.nodes.protocol import Read
from graph_durable.nodes.task import Task
from graph_durable.policy import Effect

__all__ = [
    "decision_batch",
    "read_decisions",
    "guard_asked_under",
    "legacy_answer",
    "peek_resume",
    "stale_ids",
]


def legacy_answer(conf: Mapping[str, Any]) -> tuple[str, Any] | None:
    """`(interrupt_id, value)` of the answer a resume map addresses to one of the task's
    own LangGraph interrupt ids, which LangGraph appended last to the scratchpad's
    answers; `None` if it addresses none.

    Whose question that id names is not known here: a guard of an earlier release asked
    under it (one interrupt per task), but so does any `interrupt()` of the task, such
    as a per-call `HumanInTheLoopMiddleware` listed before the guard, which has taken
    the answer by the time the guard runs. The caller asks the checkpoint (see
    `guard_asked_under`).
    """
    scratchpad = conf.get(CONFIG_KEY_SCRATCHPAD)
    resume_map = conf.get(CONFIG_KEY_RESUME_MAP) or {}
    if scratchpad is None or not scratchpad.resume or not resume_map:
        return None
    ns = str(conf.get("checkpoint_ns", ""))
    last = scratchpad.resume[-1]
    for interrupt_id in (_interrupt_id(ns, len(scratchpad.resume) - 1), _interrupt_id(ns, 0)):
        if interrupt_id in resume_map and resume_map[interrupt_id] is last:
            return interrupt_id, last
    return None



def peek_resume(conf: Mapping[str, Any], asked: list[EffectRecord],
                 legacy_id: str | None = None) -> Any:
    """The resume value offered to this task's guard, read without consuming it.

    - the answers a resume map addresses to the interrupts of the `asked` calls, as
      `{key: decision}` (LangGraph's own routing never sees these ids: it hands the map
      to every task in its config);
    - else a bare resume value (a decision, `{tool_call_id: decision}`, or LangChain's
      `{"decisions": [...]}`), which LangGraph lets through when one interrupt is pending;
    - else the value a map addressed to the task's own LangGraph interrupt id, if that
      id (`legacy_id`) is the one the guard asked under (pending interrupts of earlier
      releases, one per task). An answer addressed to another question under a LangGraph
      id (a `HumanInTheLoopMiddleware` before the guard) never answers the guard's.

    LangGraph stores a resume value once `interrupt()` returns it, so a value that turns
    out malformed would be replayed forever; peeking lets the guard validate first. The
    scratchpad's earlier answers are those of the tools' own `interrupt()` calls.
    """
    scratchpad = conf.get(CONFIG_KEY_SCRATCHPAD)
    if scratchpad is None:
        return None
    ns = str(conf.get("checkpoint_ns", ""))
    resume_map = conf.get(CONFIG_KEY_RESUME_MAP) or {}
    addressed = {record.key: resume_map[interrupt_id]
                 for record in asked
                 if (interrupt_id := interrupt_id_for(ns, record.key)) in resume_map}
    if addressed:
        return addressed
    bare = scratchpad.get_null_resume(False)
    if bare is not None:
        return bare
    legacy = legacy_answer(conf)
    if legacy is None or legacy[0] != legacy_id:
        return None
    return legacy[1]



def guard_asked_under(pending: Any, task_id: Any, interrupt_id: str,
                       asked: list[EffectRecord]) -> bool:
    """Whether the question pending under `interrupt_id` in the checkpoint tuple
    `pending` (the task's last interrupt) is the guard's: its value names the key of
    one of the `asked` effects."""
    keys = {record.key for record in asked}
    for owner, channel, value in getattr(pending, "pending_writes", None) or ():
        if owner != task_id or channel != INTERRUPT:
            continue
        for interrupt in value if isinstance(value, list | tuple) else (value,):
            question = getattr(interrupt, "value", None)
            if (getattr(interrupt, "id", None) == interrupt_id and isinstance(question, dict)
                    and question.get("key") in keys):
                return True
    return False



def stale_ids(task: Task, asked: list[EffectRecord]) -> set[str]:
    """Ids in this run's resume map that name no question this task asks now (they may
    be other tasks' questions, or this task's answered ones)."""
    resume_map = task.conf.get(CONFIG_KEY_RESUME_MAP) or {}
    if not resume_map:
        return set()
    return set(resume_map) - {interrupt_id_for(task.checkpoint_ns, r.key) for r in asked}



def _answers(task: Task, record: EffectRecord, ids: set[str]) -> bool:
    """Whether one of `ids` was the question this task asked about `record`, now settled."""
    return (record.checkpoint_ns == task.checkpoint_ns and not record.asked
            and interrupt_id_for(task.checkpoint_ns, record.key) in ids)



def decision_batch(task: Task, asked: list[Any], resume: Any,
                    tools: Mapping[str, Any] | None,
                    policy_for: Callable[[str], Effect]) -> WriteBatch | None:
    """The journal entries of the decisions `resume` carries (`None`: it answers none
    of this task's questions). Calls it does not answer stay asked."""
    decisions = match_decisions(resume, asked, task.thread_id, tools=tools)
    if not decisions:
        return None
    now = time.time()
    return WriteBatch(
        task.thread_id,
        tuple(
            TransitionWrite(
                thread_id=task.thread_id, key=record.key, to=record.status,
                kind="decision", decision={**decisions[record.key], "decided_at": now},
                asked=False, data={"decision": decisions[record.key]},
                redact=policy_for(record.tool).redact,
            )
            for record in asked if record.key in decisions
        ),
        resume_at=task.resume_at(),
        resume_value=resume,
    )



class _TakenInRun:
    """The questions whose answers a task of this process took from one resume map: the
    run that map belongs to (every task of a run is handed the same map object). Kept
    for the most recent maps only, each beside a reference to it (so that its `id` is
    not reused while it is kept) and a copy of what it held: a caller that resumes again
    with the same map object, answers added or changed (a notebook gathering them), starts
    another run, whose answers are checked anew."""

    def __init__(self, kept: int = 256) -> None:
        self._kept = kept
        self._taken: OrderedDict[int, tuple[Any, Any, set[str]]] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, resume_map: Any, interrupt_ids: set[str]) -> None:
        with self._lock:
            entry = self._taken.get(id(resume_map))
            if entry is None or not _same_run(entry, resume_map):
                entry = self._taken[id(resume_map)] = (resume_map, _held(resume_map), set())
                while len(self._taken) > self._kept:
                    self._taken.popitem(last=False)
            entry[2].update(interrupt_ids)

    def __call__(self, resume_map: Any, interrupt_id: str) -> bool:
        with self._lock:
            entry = self._taken.get(id(resume_map))
            return entry is not None and _same_run(entry, resume_map) and interrupt_id in entry[2]


def _held(resume_map: Any) -> Any:
    """A copy of what `resume_map` holds, to tell a later change of it."""
    try:
        return copy.deepcopy(resume_map)
    except Exception:  # noqa: BLE001 - answers that cannot be copied: compared as they are
        return dict(resume_map) if isinstance(resume_map, Mapping) else resume_map


def _same_run(entry: tuple[Any, Any, set[str]], resume_map: Any) -> bool:
    try:
        return entry[0] is resume_map and bool(entry[1] == resume_map)
    except Exception:  # noqa: BLE001 - answers that cannot be compared: another run
        return False


_taken_in_run = _TakenInRun()


def _taken_again(events: list[Any], answer: Any) -> bool:
    """Whether `answer` is the decision a call last took (its journal, `events`) before
    it was asked about again."""
    kinds = [e.kind for e in events]
    if "decision" not in kinds or not isinstance(answer, Mapping):
        return False
    last = len(kinds) - 1 - kinds[::-1].index("decision")
    decided = events[last].data.get("decision") or {}
    return "asked" in kinds[last:] and all(decided.get(k) == v for k, v in answer.items())



def _answers_to_check(task: Task, thread: list[EffectRecord], tools: Mapping[str, Any] | None
                      ) -> Generator[Read, Any, dict[str, EffectRecord]]:
    """The thread's questions, by interrupt id, whose answers in this run's resume map the
    task checks: its own, and the other tasks' but for answers they already took.

    A task that ran earlier in this run may have taken its answer, sent its call and
    asked about it again (an unknown outcome) under the same interrupt id: the answer it
    took is not checked against the new question. Taken in this run, not in an earlier
    one (seed 731088: an `approve` taken before, sent again to the question that
    followed, is an invalid answer that this run's task of that question refuses, so
    every task refuses the set). Its journal is read only for an answer that does not
    fit."""
    resume_map = task.conf.get(CONFIG_KEY_RESUME_MAP) or {}
    questions = {}
    for record in thread:
        interrupt_id = interrupt_id_for(record.checkpoint_ns, record.key)
        if not record.asked:
            continue
        answer = resume_map.get(interrupt_id)
        if (record.checkpoint_ns != task.checkpoint_ns and answer is not None
                and not _fits(answer, record, tools)
                and _taken_in_run(resume_map, interrupt_id)):
            events = yield Read("events", (task.thread_id, record.key))
            if _taken_again(events, answer):
                continue
        questions[interrupt_id] = record
    return questions



def _fits(answer: Any, record: EffectRecord, tools: Mapping[str, Any] | None) -> bool:
    try:
        check_decision(answer, record, "", (tools or {}).get(record.tool))
    except InvalidDecision:
        return False
    return True



def read_decisions(task: Task, tools: Mapping[str, Any] | None,
               policy_for: Callable[[str], Effect]) -> Generator[Read, Any, WriteBatch | None]:
    """The journal entries of the decisions this run's resume value carries for the
    task's questions (`None`: none), after checking every answer it holds; the sync and
    async drivers perform its reads.

    Each task of a step (`create_agent`'s calls, the branches of a `Send`) is handed the
    whole resume map, and may be the first of them to run: it checks the answers the map
    addresses to the other tasks' questions as well as its own, so that every task
    refuses a set with one invalid answer, and none of the set is recorded or sent.
    The journal of each call answered is read before its decision is recorded: one
    damaged entry stops the run, as a damaged ledger row does."""
    asked = yield Read("asked_in_task", (task.thread_id, task.checkpoint_ns))
    questions = {interrupt_id_for(task.checkpoint_ns, r.key): r for r in asked}
    stale = stale_ids(task, asked)
    if stale:
        thread = yield Read("effects", (task.thread_id,))
        settled = [r for r in thread if _answers(task, r, stale)]
        if settled:
            events = yield Read("events", (task.thread_id, settled[0].key))
            raise refuse_stale(settled[0], events, task.thread_id)
        questions = yield from _answers_to_check(task, thread, tools)
    check_answers(task.conf.get(CONFIG_KEY_RESUME_MAP) or {}, questions, task.thread_id,
                  tools)
    legacy = legacy_answer(task.conf) if asked else None
    where = task.pending_at() if legacy is not None else None
    legacy_id = None
    if where is not None:
        pending = yield Read("get_tuple", (where,))
        if guard_asked_under(pending, task.conf.get(CONFIG_KEY_TASK_ID), legacy[0], asked):
            legacy_id = legacy[0]
    resume = peek_resume(task.conf, asked, legacy_id) if asked else None
    batch = None if resume is None else decision_batch(task, asked, resume, tools, policy_for)
    if batch is not None:
        for write in batch.writes:
            # The journal of each question answered (what was asked, and decided before):
            # an entry that cannot be read raises `LedgerDamaged` here, before the
            # answer is recorded or anything sent.
            yield Read("events", (task.thread_id, write.key))
        _taken_in_run.add(task.conf.get(CONFIG_KEY_RESUME_MAP) or resume, {
            interrupt_id_for(task.checkpoint_ns, write.key) for write in batch.writes})
    return batch
