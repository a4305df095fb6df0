"""The guard core shared by `EffectGuardNode` and `EffectGuardMiddleware`.

One implementation of the protocol (`protocol.run_call`), two drivers (sync, async),
and the task-level step that turns a resume value into journaled decisions.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import hashlib
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.errors import GraphBubbleUp, GraphInterrupt
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command, Interrupt

from graph_durable._langgraph import (
    CONFIG_KEY_CHECKPOINT_MAP,
    CONFIG_KEY_CHECKPOINTER,
    CONFIG_KEY_DURABILITY,
    CONFIG_KEY_RESUME_MAP,
    CONFIG_KEY_SCRATCHPAD,
    CONFIG_KEY_TASK_ID,
    INTERRUPT,
)
from graph_durable._langgraph import interrupt_id as _interrupt_id
from graph_durable.checkpointers._base import actor_of, durable_saver
from graph_durable.errors import (
    DurabilityError,
    InvalidDecision,
    MiddlewareOrderError,
    NotDurableCheckpointer,
)
from graph_durable.leases import active_lease, check_fence
from graph_durable.ledger import (
    EffectRecord,
    EffectStatus,
    Keying,
    TransitionWrite,
    WriteBatch,
)
from graph_durable.nodes.anchor import call_anchor, requested_args
from graph_durable.nodes.context import _CURRENT, EffectContext
from graph_durable.nodes.decisions import (
    RefusedDecision,
    check_answers,
    check_decision,
    match_decisions,
    refuse_stale,
    response_schema,
)
from graph_durable.nodes.outcomes import (
    call_with_timeout,
    read_reports,
    refused_args,
    watch_reports,
)
from graph_durable.nodes.reentry import ReentryRefused, ToolGate
from graph_durable.nodes.restarts import earlier_effect, fork_sources
from graph_durable.nodes.protocol import (
    Ask,
    CallContext,
    Claim,
    CallTool,
    Lookup,
    Outcome,
    Protocol,
    Read,
    Sleep,
    Write,
    run_call,
)
from graph_durable.policy import Effect
from graph_durable.faults import fault_point

__all__ = [
    "GuardCore",
    "withdrawal",
    "OnAsk",
    "Started",
    "interrupt_id_for",
    "pending_placeholder",
    "raise_interrupts",
]


OnAsk = Callable[[Ask, str], Any]
"""What a driver does when the protocol asks a human: `(ask, interrupt_id) -> result`."""

ToolResult = ToolMessage | Command


def interrupt_id_for(checkpoint_ns: str, key: str) -> str:
    """The id of the interrupt that asks about the effect `key` in the task
    `checkpoint_ns`: one interrupt per call, as LangChain's per-call mode.

    It has the form of LangGraph's own ids (32 hex digits), so LangGraph accepts
    `Command(resume={interrupt_id: decision, ...})` naming it, and hands the whole map to
    the task in its config, where the guard reads the answers addressed to its calls.
    """
    return hashlib.blake2b(f"{checkpoint_ns}|effect|{key}".encode(), digest_size=16).hexdigest()


def _offered_resume(conf: Mapping[str, Any]) -> bool:
    """Whether this run offers any resume value at all (bare, or a map)."""
    scratchpad = conf.get(CONFIG_KEY_SCRATCHPAD)
    if scratchpad is None:
        return False
    return scratchpad.get_null_resume(False) is not None or bool(conf.get(CONFIG_KEY_RESUME_MAP))


def _legacy_answer(conf: Mapping[str, Any]) -> tuple[str, Any] | None:
    """`(interrupt_id, value)` of the answer a resume map addresses to one of the task's
    own LangGraph interrupt ids, which LangGraph appended last to the scratchpad's
    answers; `None` if it addresses none.

    Whose question that id names is not known here: a guard of an earlier release asked
    under it (one interrupt per task), but so does any `interrupt()` of the task, such
    as a per-call `HumanInTheLoopMiddleware` listed before the guard, which has taken
    the answer by the time the guard runs. The caller asks the checkpoint (see
    `_guard_asked_under`).
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


def _peek_resume(conf: Mapping[str, Any], asked: list[EffectRecord],
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
    legacy = _legacy_answer(conf)
    if legacy is None or legacy[0] != legacy_id:
        return None
    return legacy[1]


def _guard_asked_under(pending: Any, task_id: Any, interrupt_id: str,
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


def _config_of(request: ToolCallRequest) -> Mapping[str, Any]:
    return getattr(request.runtime, "config", None) or {}


class _Task:
    """Where one guarded tool call runs: thread, task namespace, saver, config."""

    def __init__(self, config: Mapping[str, Any], call: Mapping[str, Any]) -> None:
        self.config = config
        self.conf: Mapping[str, Any] = config.get("configurable", {})
        self.thread_id = str(self.conf.get("thread_id", ""))
        self.checkpoint_ns = str(self.conf.get("checkpoint_ns", ""))
        wrapped = self.conf.get(CONFIG_KEY_CHECKPOINTER)
        saver = durable_saver(wrapped)
        if saver is None:
            raise NotDurableCheckpointer(
                f"Tool call {call.get('id')!r} ({call.get('name')}) in thread "
                f"{self.thread_id or '<none>'!r}: the graph was compiled with "
                f"{type(wrapped).__name__ if wrapped is not None else 'no checkpointer'}, which "
                "keeps no effect ledger. Compile it with a durable saver, e.g. "
                "builder.compile(checkpointer=DurableSqliteSaver(conn)).",
                thread_id=self.thread_id or None,
                tool_call_id=call.get("id"),
            )
        self.saver = saver
        durability = self.conf.get(CONFIG_KEY_DURABILITY)
        if durability != "sync":
            why = (f'durability="{durability}"' if durability else
                   'no durability given, and LangGraph defaults to "async"')
            raise self.not_durable(call, why)

    def not_durable(self, call: Mapping[str, Any], why: str) -> DurabilityError:
        return DurabilityError(
            f"Tool call {call.get('id')!r} ({call.get('name')}) in thread {self.thread_id!r} "
            f"was not sent: the step that requested it is not durably checkpointed ({why}). "
            "A crash now could make the model ask again under new tool_call_ids and repeat "
            'the effect. Run the graph with durability="sync", e.g. '
            'graph.invoke(inputs, config, durability="sync").',
            thread_id=self.thread_id,
            tool_call_id=call.get("id"),
        )

    def requesting_checkpoint(self) -> tuple[str, str, str] | None:
        """`(thread_id, checkpoint_ns, checkpoint_id)` of the checkpoint the task runs from."""
        parent_ns = self.checkpoint_ns.rpartition("|")[0]
        checkpoint_id = self.conf.get(CONFIG_KEY_CHECKPOINT_MAP, {}).get(parent_ns)
        if checkpoint_id is None:
            return None
        return self.thread_id, parent_ns, checkpoint_id

    def pending_at(self) -> dict[str, Any] | None:
        """The config of the checkpoint whose pending writes hold this task's."""
        where = self.requesting_checkpoint()
        if where is None:
            return None
        thread_id, checkpoint_ns, checkpoint_id = where
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns,
                                 "checkpoint_id": checkpoint_id}}

    def resume_at(self) -> tuple[str, str] | None:
        """Where the graph-level resume value of this run is stored."""
        checkpoint_id = self.conf.get(CONFIG_KEY_CHECKPOINT_MAP, {}).get("")
        return None if checkpoint_id is None else ("", checkpoint_id)


def _task_with_resume(config: Mapping[str, Any]) -> _Task | None:
    """The task, if a resume value is offered to it and its graph keeps a ledger.

    A resume value meant for another node of a graph without a durable saver is none of
    the guard's business: only a durable saver can hold the questions it answers.
    """
    conf = config.get("configurable", {})
    if not _offered_resume(conf):
        return None
    if durable_saver(conf.get(CONFIG_KEY_CHECKPOINTER)) is None:
        return None
    return _Task(config, {})


def _stale_ids(task: _Task, asked: list[EffectRecord]) -> set[str]:
    """Ids in this run's resume map that name no question this task asks now (they may
    be other tasks' questions, or this task's answered ones)."""
    resume_map = task.conf.get(CONFIG_KEY_RESUME_MAP) or {}
    if not resume_map:
        return set()
    return set(resume_map) - {interrupt_id_for(task.checkpoint_ns, r.key) for r in asked}


def _answers(task: _Task, record: EffectRecord, ids: set[str]) -> bool:
    """Whether one of `ids` was the question this task asked about `record`, now settled."""
    return (record.checkpoint_ns == task.checkpoint_ns and not record.asked
            and interrupt_id_for(task.checkpoint_ns, record.key) in ids)


def _decision_batch(task: _Task, asked: list[Any], resume: Any,
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


def _taken_again(events: list[Any], answer: Any) -> bool:
    """Whether `answer` is the decision a call last took (its journal, `events`) before
    it was asked about again."""
    kinds = [e.kind for e in events]
    if "decision" not in kinds or not isinstance(answer, Mapping):
        return False
    last = len(kinds) - 1 - kinds[::-1].index("decision")
    decided = events[last].data.get("decision") or {}
    return "asked" in kinds[last:] and all(decided.get(k) == v for k, v in answer.items())


def _answers_to_check(task: _Task, thread: list[EffectRecord], tools: Mapping[str, Any] | None
                      ) -> Generator[Read, Any, dict[str, EffectRecord]]:
    """The thread's questions, by interrupt id, whose answers in this run's resume map the
    task checks: its own, and the other tasks' but for answers they already took.

    A task that ran earlier in this run may have taken its answer, sent its call and
    asked about it again (an unknown outcome) under the same interrupt id: the answer it
    took is not checked against the new question. Its journal is read only for an answer
    that does not fit."""
    resume_map = task.conf.get(CONFIG_KEY_RESUME_MAP) or {}
    questions = {}
    for record in thread:
        interrupt_id = interrupt_id_for(record.checkpoint_ns, record.key)
        if not record.asked:
            continue
        answer = resume_map.get(interrupt_id)
        if (record.checkpoint_ns != task.checkpoint_ns and answer is not None
                and not _fits(answer, record, tools)):
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


def _decisions(task: _Task, tools: Mapping[str, Any] | None,
               policy_for: Callable[[str], Effect]) -> Generator[Read, Any, WriteBatch | None]:
    """The journal entries of the decisions this run's resume value carries for the
    task's questions (`None`: none), after checking every answer it holds; the sync and
    async drivers perform its reads.

    Each task of a step (`create_agent`'s calls, the branches of a `Send`) is handed the
    whole resume map, and may be the first of them to run: it checks the answers the map
    addresses to the other tasks' questions as well as its own, so that every task
    refuses a set with one invalid answer, and none of the set is recorded or sent."""
    asked = yield Read("asked_in_task", (task.thread_id, task.checkpoint_ns))
    questions = {interrupt_id_for(task.checkpoint_ns, r.key): r for r in asked}
    stale = _stale_ids(task, asked)
    if stale:
        thread = yield Read("effects", (task.thread_id,))
        settled = [r for r in thread if _answers(task, r, stale)]
        if settled:
            events = yield Read("events", (task.thread_id, settled[0].key))
            raise refuse_stale(settled[0], events, task.thread_id)
        questions = yield from _answers_to_check(task, thread, tools)
    check_answers(task.conf.get(CONFIG_KEY_RESUME_MAP) or {}, questions, task.thread_id,
                  tools)
    legacy = _legacy_answer(task.conf) if asked else None
    where = task.pending_at() if legacy is not None else None
    legacy_id = None
    if where is not None:
        pending = yield Read("get_tuple", (where,))
        if _guard_asked_under(pending, task.conf.get(CONFIG_KEY_TASK_ID), legacy[0], asked):
            legacy_id = legacy[0]
    resume = _peek_resume(task.conf, asked, legacy_id) if asked else None
    return None if resume is None else _decision_batch(task, asked, resume, tools, policy_for)


@dataclass
class Started:
    """A write call whose protocol ran up to its claim (see `GuardCore.claim_step`)."""

    task: _Task
    ctx: CallContext
    protocol: Protocol
    claim: Claim
    claimed: tuple[EffectRecord, bool] | None = None

    def matches(self, request: ToolCallRequest) -> bool:
        """Whether `request` is the call this protocol was started for."""
        return request.tool_call == self.ctx.tool_call


def _claimed(started: list[Started], claimed: list[tuple[EffectRecord, bool]]
             ) -> dict[str, Started]:
    for one, result in zip(started, claimed, strict=True):
        one.claimed = result
    return {one.ctx.tool_call_id: one for one in started}


class GuardCore:
    """Routes each tool call through the ledger according to its `Effect` policy."""

    def __init__(
        self, effects: Mapping[str, Effect] | None = None, default: Effect | None = None,
        messages_key: str = "messages",
    ) -> None:
        self.effects = dict(effects or {})
        self.default = default or Effect()
        self.messages_key = messages_key
        self._durable_checkpoints: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()
        # Sync attempts abandoned after their timeout, by (thread_id, key).
        self._abandoned: dict[tuple[str, str], threading.Thread] = {}
        # Calls running now, by (thread_id, key): a second copy of the same call in
        # one step waits for the first and gets its answer (see `_once`).
        self._running: dict[tuple[str, str], concurrent.futures.Future[Any]] = {}
        # What each root checkpoint a subgraph task ran from was forked from (immutable).
        self._fork_sources: dict[tuple[str, str], tuple[str, ...]] = {}
        for name, policy in self.effects.items():
            if not isinstance(policy, Effect):
                raise TypeError(f"effects[{name!r}] must be an Effect, got {policy!r}")

    @staticmethod
    def task_saver(config: Mapping[str, Any]) -> Any:
        """The durable saver of the task `config` belongs to."""
        return _Task(config, {}).saver

    def policy_for(self, tool: str) -> Effect:
        """The policy of `tool` (the default for tools not named in `effects`)."""
        return self.effects.get(tool, self.default)

    def _writes(self, tool_call: Mapping[str, Any], has_tool: bool) -> bool:
        """Whether the ledger guards this call (a write to a tool the node has)."""
        return has_tool and not self.policy_for(tool_call["name"]).read_only

    def _context(
        self, task: _Task, tool_call: Mapping[str, Any], state: Any, keying: Keying,
    ) -> CallContext:
        """The call's task and protocol context.

        `keying` is `saver.keying(thread_id)`: the thread whose id keys the effects, and
        whether the thread may hold effects under legacy keys. The key's anchor is the
        AIMessage in `state` that requested the call (`graph_durable.nodes.anchor`); one
        without an id is refused here, before anything is claimed or sent.
        """
        anchor = self._anchor(task, tool_call, state)
        return CallContext(task.thread_id, task.checkpoint_ns, dict(tool_call),
                           self.policy_for(tool_call["name"]), keying.key_thread, anchor,
                           secret=keying.secret, key_scheme=keying.pin,
                           requested_args=requested_args(state, tool_call, self.messages_key,
                                                          thread_id=task.thread_id))

    def _anchor(self, task: _Task, tool_call: Mapping[str, Any], state: Any) -> str:
        """What the call's key is anchored to: the AIMessage that requested it."""
        return call_anchor(state, tool_call.get("id"), task.checkpoint_ns, self.messages_key,
                           thread_id=task.thread_id)

    @staticmethod
    def _adopt_legacy_key(ctx: CallContext, legacy: EffectRecord | None) -> None:
        """Key the call as before the upgrade if its effect was recorded that way."""
        if legacy is not None:
            ctx.key = legacy.key

    def _prepare(self, request: ToolCallRequest) -> tuple[_Task, CallContext]:
        task = _Task(_config_of(request), request.tool_call)
        keying = task.saver.keying(task.thread_id)
        ctx = self._context(task, request.tool_call, request.state, keying)
        if keying[1]:
            self._adopt_legacy_key(ctx, task.saver.effect(ctx.legacy_key(), task.thread_id))
        _perform_reads(task.saver, self._restarted(task, ctx, request.state))
        return task, ctx

    async def _aprepare(self, request: ToolCallRequest) -> tuple[_Task, CallContext]:
        task = _Task(_config_of(request), request.tool_call)
        keying = await task.saver.akeying(task.thread_id)  # type: ignore[attr-defined]
        ctx = self._context(task, request.tool_call, request.state, keying)
        if keying[1]:
            self._adopt_legacy_key(
                ctx, await task.saver.aeffect(ctx.legacy_key(), task.thread_id))  # type: ignore[attr-defined]
        await _aperform_reads(task.saver, self._restarted(task, ctx, request.state))
        return task, ctx

    def _restarted(self, task: _Task, ctx: CallContext, state: Any
                   ) -> Generator[Read, Any, None]:
        """Key `ctx` as the earlier request it repeats when it runs in a subgraph that a
        run from a named checkpoint restarted (`graph_durable.nodes.restarts`)."""
        if "|" not in task.checkpoint_ns:
            return
        root = task.conf.get(CONFIG_KEY_CHECKPOINT_MAP, {}).get("")
        if root is None:
            return
        slot = (task.thread_id, root)
        sources = self._fork_sources.get(slot)
        if sources is None:
            sources = yield from fork_sources(task.thread_id, root)
            if len(self._fork_sources) >= 1024:
                self._fork_sources.clear()
            self._fork_sources[slot] = sources
        earlier = yield from earlier_effect(ctx, root, sources, state, self.messages_key)
        if earlier is not None:
            ctx.key = earlier.key

    # -- claiming a step's calls together (before any of them runs) -----------------------

    def _reconcilable_calls(self, tool_calls: list[tuple[Mapping[str, Any], bool]]
                            ) -> list[Mapping[str, Any]]:
        """The step's write calls to claim ahead, together.

        Only calls whose provider dedupes or can be asked are claimed ahead: after a
        crash, an intent for a call not sent yet costs them a lookup or a deduplicated
        re-send. A call that only a human could reconcile claims right before it is
        sent, so after a crash a human is asked only about calls that were on their way.
        Nothing is claimed ahead when tool_call_ids repeat (each call claims on its own).
        """
        ids = [call.get("id") for call, _ in tool_calls]
        if len(set(ids)) != len(ids):
            return []
        return [call for call, has_tool in tool_calls
                if self._writes(call, has_tool) and self.policy_for(call["name"]).reconcilable]

    def _contexts(self, calls: list[Mapping[str, Any]], config: Mapping[str, Any], state: Any,
                  keying: Keying) -> list[tuple[_Task, CallContext]]:
        contexts = []
        for call in calls:
            task = _Task(config, call)
            contexts.append((task, self._context(task, call, state, keying)))
        return contexts

    @staticmethod
    def _start(contexts: list[tuple[_Task, CallContext]]) -> list[Started]:
        """Run each call's protocol up to its claim (`before_intent` included)."""
        started: list[Started] = []
        for task, ctx in contexts:
            protocol = run_call(ctx)
            op = protocol.send(None)
            assert isinstance(op, Claim), op
            started.append(Started(task, ctx, protocol, op))
        return started

    def claim_step(
        self, tool_calls: list[tuple[Mapping[str, Any], bool]], config: Mapping[str, Any],
        state: Any = None,
    ) -> dict[str, Started]:
        """Claim a step's reconcilable write calls in one transaction; `{tool_call_id:
        started}`.

        `tool_calls` holds `(tool_call, has_tool)` pairs, `state` the node's input state
        (where the requesting AIMessage is). Pass each `Started` to `run` as `started=`:
        its protocol continues after the claim.
        """
        calls = self._reconcilable_calls(tool_calls)
        if not calls:
            return {}
        first = _Task(config, calls[0])
        keying = first.saver.keying(first.thread_id)
        if keying[1]:
            return {}  # legacy keys are looked up call by call
        contexts = self._contexts(calls, config, state, keying)
        for task, ctx in contexts:
            _perform_reads(task.saver, self._restarted(task, ctx, state))
        started = self._start(contexts)
        task = started[0].task
        self._check_requesting_checkpoint(task, started[0].ctx.tool_call)
        return _claimed(started, task.saver.claim_many([s.claim.intent for s in started],
                                                      task.config))

    async def aclaim_step(
        self, tool_calls: list[tuple[Mapping[str, Any], bool]], config: Mapping[str, Any],
        state: Any = None,
    ) -> dict[str, Started]:
        """Async `claim_step`."""
        calls = self._reconcilable_calls(tool_calls)
        if not calls:
            return {}
        first = _Task(config, calls[0])
        keying = await first.saver.akeying(first.thread_id)  # type: ignore[attr-defined]
        if keying[1]:
            return {}
        contexts = self._contexts(calls, config, state, keying)
        for task, ctx in contexts:
            await _aperform_reads(task.saver, self._restarted(task, ctx, state))
        started = self._start(contexts)
        task = started[0].task
        await self._acheck_requesting_checkpoint(task, started[0].ctx.tool_call)
        return _claimed(started, await task.saver.aclaim_many(
            [s.claim.intent for s in started], task.config))

    # -- decisions (once per task, before its calls run) ---------------------------------

    def resolve_decisions(self, config: Mapping[str, Any],
                          tools: Mapping[str, Any] | None = None) -> None:
        """Journal the decisions a resume value carries for this task, if any.

        `tools` (by name) give the argument schemas an edit is checked against. A resume
        map is checked whole first, the answers to other tasks' questions included
        (`decisions.check_answers`): one invalid answer runs none of the set. An answer
        addressed to a question of this task that is no longer asked is refused too.
        Refusals are raised as `RefusedDecision` (an `InvalidDecision`), and nothing is
        recorded."""
        task = _task_with_resume(config)
        if task is None:
            return
        try:
            batch = _perform_reads(task.saver, _decisions(task, tools, self.policy_for))
        except InvalidDecision as refused:
            raise RefusedDecision.of(refused) from None
        if batch is not None:
            task.saver.apply(batch, task.config)
            fault_point("after_decision")

    async def aresolve_decisions(self, config: Mapping[str, Any],
                                 tools: Mapping[str, Any] | None = None) -> None:
        """Async `resolve_decisions`."""
        task = _task_with_resume(config)
        if task is None:
            return
        try:
            batch = await _aperform_reads(task.saver,
                                          _decisions(task, tools, self.policy_for))
        except InvalidDecision as refused:
            raise RefusedDecision.of(refused) from None
        if batch is not None:
            await task.saver.aapply(batch, task.config)
            fault_point("after_decision")

    # -- sync driver -------------------------------------------------------------------

    def run(
        self,
        request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], ToolResult],
        on_ask: OnAsk,
        started: Started | None = None,
        repeats: bool = True,
    ) -> ToolResult:
        """Run one tool call through the protocol, synchronously.

        With `started` (from `claim_step`), the call's intent is already claimed.
        `repeats=False` says no other call of the step has this call's id, so it need
        not wait for a copy of itself (see `_lead`).
        """
        if started is not None:
            task, ctx, protocol = started.task, started.ctx, started.protocol
            value: Any = started.claimed
        else:
            if not self._writes(request.tool_call, request.tool is not None):
                return execute(request)
            task, ctx = self._prepare(request)
            self._check_requesting_checkpoint(task, request.tool_call)
            protocol = run_call(ctx)
            value = None
        if not repeats:
            return self._drive(task, ctx, request, execute, on_ask, protocol, value)
        running, leader = self._lead(task, ctx)
        if not leader:
            protocol.close()
            return _same_answer(running.result())
        try:
            result = self._drive(task, ctx, request, execute, on_ask, protocol, value)
        except BaseException as exc:
            self._settle(task, ctx, running, error=exc)
            raise
        self._settle(task, ctx, running, result=result)
        return result

    def _drive(self, task: _Task, ctx: CallContext, request: ToolCallRequest,
               execute: Callable[[ToolCallRequest], ToolResult], on_ask: OnAsk,
               protocol: Protocol, value: Any) -> ToolResult:
        while True:
            try:
                op = protocol.send(_unredacted(ctx, value))
            except StopIteration as done:
                return done.value
            if isinstance(op, Read):
                value = getattr(task.saver, op.name)(*op.args)
            elif isinstance(op, Claim):
                value = task.saver.claim(op.intent, task.config)
            elif isinstance(op, Write):
                value = task.saver.apply(op.write, task.config)
            elif isinstance(op, CallTool):
                value = self._call_tool(task, ctx, request, execute, op)
            elif isinstance(op, Lookup):
                value = self._lookup(ctx, op)
            elif isinstance(op, Sleep):
                time.sleep(op.seconds)
            else:
                value = on_ask(_with_schema(op, request.tool),
                               interrupt_id_for(task.checkpoint_ns, op.record.key))

    # -- the same call twice in one step: run once, answer both ---------------------------

    def _lead(self, task: _Task, ctx: CallContext) -> tuple[concurrent.futures.Future[Any], bool]:
        """`(running, leader)`: the future of the call with this key running now in this
        process, and whether this caller runs it (else it waits for its answer).

        A model may repeat a tool call, same id and same args, in one AIMessage: one
        requested call, one key, so one effect, and both calls get its answer.
        """
        slot = (task.thread_id, ctx.key)
        with self._lock:
            running = self._running.get(slot)
            if running is not None:
                return running, False
            running = self._running[slot] = concurrent.futures.Future()
            return running, True

    def _settle(self, task: _Task, ctx: CallContext, running: concurrent.futures.Future[Any],
                result: Any = None, error: BaseException | None = None) -> None:
        with self._lock:
            self._running.pop((task.thread_id, ctx.key), None)
        if error is not None:
            running.set_exception(error)
        else:
            running.set_result(result)

    # A run that names a checkpoint id (time travel, `get_state().config`) first writes
    # a fork checkpoint, and LangGraph saves it in the background while the first step
    # already runs, even with durability="sync"; such a save is waited for this long.
    FORK_SAVE_WAIT = 5.0

    def _check_requesting_checkpoint(self, task: _Task, call: Mapping[str, Any]) -> None:
        where = self._checkpoint_to_verify(task)
        if where is None:
            return
        stored = task.saver.checkpoint_exists(*where)
        deadline, pause = time.monotonic() + self.FORK_SAVE_WAIT, 0.005
        if not stored:
            _refused_by_fence(task, task.saver.live_leases())
        while not stored and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
            stored = task.saver.checkpoint_exists(*where)
        self._verified(task, call, where, stored)

    async def _acheck_requesting_checkpoint(self, task: _Task, call: Mapping[str, Any]) -> None:
        where = self._checkpoint_to_verify(task)
        if where is None:
            return
        stored = await task.saver.acheckpoint_exists(*where)
        deadline, pause = time.monotonic() + self.FORK_SAVE_WAIT, 0.005
        if not stored:
            _refused_by_fence(task, await task.saver.alive_leases())
        while not stored and time.monotonic() < deadline:
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.1)
            stored = await task.saver.acheckpoint_exists(*where)
        self._verified(task, call, where, stored)

    def _checkpoint_to_verify(self, task: _Task) -> tuple[str, str, str] | None:
        """The checkpoint the task runs from, unless already known to be stored."""
        where = task.requesting_checkpoint()
        return None if where is None or where in self._durable_checkpoints else where

    def _verified(
        self, task: _Task, call: Mapping[str, Any], where: tuple[str, str, str], stored: bool
    ) -> None:
        if not stored:
            raise task.not_durable(call, "its checkpoint is not in the database")
        # A stored checkpoint stays stored; the calls of one step share it, so ask once.
        if len(self._durable_checkpoints) >= 1024:
            self._durable_checkpoints.clear()
        self._durable_checkpoints.add(where)

    def _effect_context(self, task: _Task, op: CallTool) -> EffectContext:
        record = op.record
        return EffectContext(
            key=record.key, thread_id=task.thread_id, tool_call_id=record.tool_call_id,
            tool=record.tool, attempt=record.attempts, fencing_token=actor_of(task.config)[1],
        )

    @staticmethod
    def _check_lease(task: _Task) -> None:
        """Send nothing once this process knows its lease on the thread is gone."""
        lease = active_lease(task.config)
        if lease is not None:
            lease.check()

    @staticmethod
    def _edited(request: ToolCallRequest, op: CallTool) -> ToolCallRequest:
        if op.args is None or op.args == request.tool_call["args"]:
            return request
        return request.override(tool_call={**request.tool_call, "args": op.args})

    def _call_tool(
        self,
        task: _Task,
        ctx: CallContext,
        request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], ToolResult],
        op: CallTool,
    ) -> Outcome:
        self._check_lease(task)
        still_running = self._still_running(task, op)
        if still_running is not None:
            return still_running
        gate = self._gate(task, ctx)
        call_request = self._edited(request, op)
        refused = refused_args(call_request)
        if refused is not None:
            return Outcome(error=refused, args_refused=True)
        if gate is not None:
            call_request = gate.request(call_request)
        with watch_reports() as reported:
            return read_reports(self._call_entered(task, ctx, call_request, execute, op, gate),
                                reported)

    def _call_entered(
        self,
        task: _Task,
        ctx: CallContext,
        call_request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], ToolResult],
        op: CallTool,
        gate: ToolGate | None,
    ) -> Outcome:
        """Call the tool, whose args its schema accepts: its body runs."""
        effect = self._effect_context(task, op)

        def call() -> ToolResult:
            token = _CURRENT.set(effect)
            try:
                return execute(call_request)
            finally:
                _CURRENT.reset(token)

        timeout = ctx.policy.timeout
        if timeout is None:
            try:
                return _gated(gate, Outcome(value=call()))
            except GraphInterrupt as paused:
                return _gated(gate, Outcome(paused=self._inner_pause(task, ctx, paused)))
            except GraphBubbleUp:
                raise
            except (Exception, ReentryRefused) as exc:
                return _gated(gate, Outcome(error=exc))
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = call()
            except BaseException as exc:
                box["error"] = exc

        worker = threading.Thread(
            target=contextvars.copy_context().run, args=(target,), daemon=True,
            name=f"graph-durable-{ctx.tool}",
        )
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            with self._lock:
                self._abandoned[(task.thread_id, op.record.key)] = worker
            return Outcome(timed_out=True)
        error = box.get("error")
        if gate is not None and gate.refused:
            return _gated(gate, Outcome(error=error))
        if error is None:
            return _gated(gate, Outcome(value=box.get("value")))
        if isinstance(error, GraphInterrupt):
            return Outcome(paused=self._inner_pause(task, ctx, error))
        if isinstance(error, GraphBubbleUp) or (
            error is not None and not isinstance(error, Exception)
        ):
            raise error
        return Outcome(value=box.get("value"), error=error)

    refuse_reentry = False
    """Set by `EffectGuardMiddleware`: the middleware inside it may enter the tool once
    per attempt (`nodes.reentry`)."""

    def _gate(self, task: _Task, ctx: CallContext) -> ToolGate | None:
        return ToolGate(task.thread_id, ctx.tool_call_id, ctx.tool) if self.refuse_reentry else None

    refuse_inner_approvals = False
    """Set by `EffectGuardMiddleware`: a per-call approval of LangChain's
    `HumanInTheLoopMiddleware` raised inside the guard is a wrong middleware order."""

    def _inner_pause(self, task: _Task, ctx: CallContext, paused: GraphInterrupt
                     ) -> BaseException:
        """What the protocol raises after recording that the tool paused: the tool's own
        interrupt, or the refusal of a `HumanInTheLoopMiddleware` listed after the guard.

        Listed after it, the reviewer's answer reaches the tool inside the guard, so an
        edit would send arguments the ledger does not record under a key derived from
        others. Nothing was sent; the call resumes as asked once the order is fixed.
        """
        if not self.refuse_inner_approvals:
            return paused
        for interrupt in paused.args[0] if paused.args else ():
            value = getattr(interrupt, "value", None)
            if (isinstance(value, dict) and value.get("type") == "tool_approval"
                    and "key" not in value and value.get("tool_call_id") == ctx.tool_call_id):
                return MiddlewareOrderError(
                    f"HumanInTheLoopMiddleware asks about tool call {ctx.tool_call_id!r} "
                    f"({ctx.tool}) in thread {task.thread_id!r} from inside "
                    "EffectGuardMiddleware: an edit would then send arguments the ledger "
                    "does not record. List HumanInTheLoopMiddleware before "
                    "EffectGuardMiddleware in create_agent(middleware=[...]) and run the "
                    "thread again; nothing was sent.",
                    thread_id=task.thread_id, tool_call_id=ctx.tool_call_id)
        return paused

    def _still_running(self, task: _Task, op: CallTool) -> Outcome | None:
        """Refuse to send while an attempt abandoned after its timeout still runs here."""
        slot = (task.thread_id, op.record.key)
        with self._lock:
            worker = self._abandoned.get(slot)
            if worker is not None and not worker.is_alive():
                del self._abandoned[slot]
                worker = None
        if worker is None:
            return None
        return Outcome(outstanding=True, error=RuntimeError(
            f"an earlier attempt of tool call {op.record.tool_call_id!r} ({op.record.tool}), "
            "abandoned after its timeout, is still running in this process and may still "
            "land; not sent again. Decide once it has ended, or mark it applied or skip it"))

    def _lookup(self, ctx: CallContext, op: Lookup) -> Outcome:
        """Ask the provider, for at most the policy's timeout (on a worker thread, then
        abandoned: a lookup that does not answer cannot tell)."""
        lookup = ctx.policy.lookup
        assert lookup is not None
        answered, found, error = call_with_timeout(
            lambda: lookup(op.key), ctx.policy.timeout, f"graph-durable-lookup-{ctx.tool}")
        if not answered:
            return Outcome(timed_out=True)
        if error is not None:
            return Outcome(error=error)
        if inspect.isawaitable(found):
            if inspect.iscoroutine(found):
                found.close()
            return Outcome(error=TypeError(
                f"lookup for {ctx.tool!r} is async; run the graph with ainvoke/astream"))
        return Outcome(value=found)

    # -- async driver ------------------------------------------------------------------

    async def arun(
        self,
        request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], Awaitable[ToolResult]],
        on_ask: OnAsk,
        started: Started | None = None,
        repeats: bool = True,
    ) -> ToolResult:
        """Run one tool call through the protocol, asynchronously (see `run`)."""
        if started is not None:
            task, ctx, protocol = started.task, started.ctx, started.protocol
            value: Any = started.claimed
        else:
            if not self._writes(request.tool_call, request.tool is not None):
                return await execute(request)
            task, ctx = await self._aprepare(request)
            await self._acheck_requesting_checkpoint(task, request.tool_call)
            protocol = run_call(ctx)
            value = None
        if not repeats:
            return await self._adrive(task, ctx, request, execute, on_ask, protocol, value)
        running, leader = self._lead(task, ctx)
        if not leader:
            protocol.close()
            return _same_answer(await asyncio.wrap_future(running))
        try:
            result = await self._adrive(task, ctx, request, execute, on_ask, protocol, value)
        except BaseException as exc:
            self._settle(task, ctx, running, error=exc)
            raise
        self._settle(task, ctx, running, result=result)
        return result

    async def _adrive(self, task: _Task, ctx: CallContext, request: ToolCallRequest,
                      execute: Callable[[ToolCallRequest], Awaitable[ToolResult]],
                      on_ask: OnAsk, protocol: Protocol, value: Any) -> ToolResult:
        while True:
            try:
                op = protocol.send(_unredacted(ctx, value))
            except StopIteration as done:
                return done.value
            if isinstance(op, Read):
                value = await getattr(task.saver, "a" + op.name)(*op.args)
            elif isinstance(op, Claim):
                value = await task.saver.aclaim(op.intent, task.config)
            elif isinstance(op, Write):
                value = await task.saver.aapply(op.write, task.config)
            elif isinstance(op, CallTool):
                value = await self._acall_tool(task, ctx, request, execute, op)
            elif isinstance(op, Lookup):
                value = await self._alookup(ctx, op)
            elif isinstance(op, Sleep):
                await asyncio.sleep(op.seconds)
            else:
                value = on_ask(_with_schema(op, request.tool),
                               interrupt_id_for(task.checkpoint_ns, op.record.key))

    async def _acall_tool(
        self,
        task: _Task,
        ctx: CallContext,
        request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], Awaitable[ToolResult]],
        op: CallTool,
    ) -> Outcome:
        self._check_lease(task)
        gate = self._gate(task, ctx)
        call_request = self._edited(request, op)
        refused = refused_args(call_request)
        if refused is not None:
            return Outcome(error=refused, args_refused=True)
        if gate is not None:
            call_request = gate.request(call_request)
        with watch_reports() as reported:
            return read_reports(
                await self._acall_entered(task, ctx, call_request, execute, op, gate), reported)

    async def _acall_entered(
        self,
        task: _Task,
        ctx: CallContext,
        call_request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], Awaitable[ToolResult]],
        op: CallTool,
        gate: ToolGate | None,
    ) -> Outcome:
        """Call the tool, whose args its schema accepts: its body runs."""
        token = _CURRENT.set(self._effect_context(task, op))
        try:
            if ctx.policy.timeout is None:
                return _gated(gate, Outcome(value=await execute(call_request)))
            return _gated(gate, Outcome(
                value=await asyncio.wait_for(execute(call_request), ctx.policy.timeout)
            ))
        except asyncio.TimeoutError:
            return _gated(gate, Outcome(timed_out=True))
        except GraphInterrupt as paused:
            return _gated(gate, Outcome(paused=self._inner_pause(task, ctx, paused)))
        except GraphBubbleUp:
            raise
        except asyncio.CancelledError:
            await self._acancelled_in_flight(task, ctx, op)
            raise
        except (Exception, ReentryRefused) as exc:
            return _gated(gate, Outcome(error=exc))
        finally:
            _CURRENT.reset(token)

    @staticmethod
    async def _acancelled_in_flight(task: _Task, ctx: CallContext, op: CallTool) -> None:
        """The run was cancelled with the call on its way: the Agent Server's `interrupt`
        or `rollback` multitask strategy, a client gone with `on_disconnect="cancel"`. The
        request may have left, and a sync tool even runs on in its thread, so the effect
        may land after the next run's lookup found nothing. Unless the provider dedupes
        (then the next run re-sends under the same key), the effect becomes `unknown`:
        the next run looks the key up if it can (a hit is the receipt) and otherwise asks
        a human instead of sending it again. Best effort: if this
        write fails too, the next run reconciles the open intent as after a crash."""
        if ctx.policy.idempotent:
            return
        write = ctx.transition(
            op.record, EffectStatus.UNKNOWN, "unknown",
            error="the run was cancelled while the call was in flight; it may still land")
        try:
            await asyncio.shield(task.saver.aapply(write, task.config))
        except BaseException:  # noqa: BLE001 - the cancellation is what propagates
            pass

    async def _alookup(self, ctx: CallContext, op: Lookup) -> Outcome:
        """Ask the provider, for at most the policy's timeout; a sync lookup (a blocking
        HTTP or database call) runs on a worker thread, never on the event loop, which
        the Agent Server refuses."""
        lookup = ctx.policy.lookup
        assert lookup is not None

        async def ask() -> Any:
            if _is_async_callable(lookup):
                return await lookup(op.key)
            found = await asyncio.to_thread(lookup, op.key)
            return (await found) if inspect.isawaitable(found) else found

        try:
            return Outcome(value=await asyncio.wait_for(ask(), ctx.policy.timeout))
        except asyncio.TimeoutError:
            return Outcome(timed_out=True)
        except Exception as exc:
            return Outcome(error=exc)


def _perform_reads(saver: Any, reads: Generator[Read, Any, Any]) -> Any:
    """Perform a generator of `Read` operations on `saver`; return what it returns."""
    value = None
    while True:
        try:
            op = reads.send(value)
        except StopIteration as done:
            return done.value
        value = getattr(saver, op.name)(*op.args)


async def _aperform_reads(saver: Any, reads: Generator[Read, Any, Any]) -> Any:
    """`_perform_reads` with the saver's async reads."""
    value = None
    while True:
        try:
            op = reads.send(value)
        except StopIteration as done:
            return done.value
        value = await getattr(saver, "a" + op.name)(*op.args)


def _gated(gate: ToolGate | None, outcome: Outcome) -> Outcome:
    """`outcome`, unless the middleware inside the guard overruled the tool (entered it
    twice, or answered for it after it raised): then the tool's outcome is unknown
    whatever the middleware made of it, and the run stops with the refusal once the
    ledger says so."""
    if gate is None or not gate.overruled(answered=outcome.error is None
                                          and outcome.paused is None
                                          and not outcome.timed_out):
        return outcome
    return Outcome(error=ReentryRefused(gate.lost()), refused=gate.error())


def _is_async_callable(fn: Any) -> bool:
    """Whether calling `fn` returns a coroutine (a coroutine function, or an object whose
    `__call__` is one)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None))


def withdrawal(asks: list[tuple[Ask, str]]) -> WriteBatch | None:
    """Unask the questions of a task that a tool's own interrupt cut short.

    A task raises one interrupt at a time: the tool's goes out alone, and the guard's
    questions are asked again when the task runs after the tool's answer.
    """
    if not asks:
        return None
    thread_id = asks[0][0].record.thread_id
    return WriteBatch(thread_id, tuple(
        TransitionWrite(thread_id=thread_id, key=ask.record.key, to=ask.record.status,
                        kind="withdrawn", asked=False,
                        data={"reason": "a tool of the same step asked its own question"})
        for ask, _ in asks))


def _unredacted(ctx: CallContext, value: Any) -> Any:
    """`value` (what the saver answered) with the requested call's own record holding
    the call's full args again, where its policy stored them redacted: the tool is
    called, and the human asked, with what the model asked for."""
    if ctx.policy.redact is None:
        return value
    if isinstance(value, EffectRecord):
        if value.key == ctx.key and value.args != ctx.tool_call["args"]:
            return value.model_copy(update={"args": ctx.tool_call["args"]})
        return value
    if isinstance(value, list):
        return [_unredacted(ctx, item) for item in value]
    if isinstance(value, tuple) and value and isinstance(value[0], EffectRecord):
        return (_unredacted(ctx, value[0]), *value[1:])
    return value


def _same_answer(result: Any) -> Any:
    """The answer of a call's first copy, for a second copy of it."""
    return result.model_copy() if isinstance(result, ToolMessage) else result


def _with_schema(ask: Ask, tool: Any) -> Ask:
    """`ask` with the JSON schema of the decisions that answer it (edits follow `tool`)."""
    return dataclasses.replace(ask, schema=response_schema(ask.record, tool))


def raise_interrupts(asks: list[tuple[Ask, str]]) -> None:
    """Raise one GraphInterrupt carrying every question a task asks."""
    if asks:
        raise GraphInterrupt(
            tuple(Interrupt(value=ask.payload, id=interrupt_id, response_schema=ask.schema)
                  for ask, interrupt_id in asks)
        )


def pending_placeholder(ask: Ask) -> ToolMessage:
    """Stands in for a call awaiting a decision until the task raises its interrupt."""
    return ToolMessage(
        content="awaiting a human decision",
        name=ask.record.tool,
        tool_call_id=ask.record.tool_call_id,
        status="error",
    )


def _refused_by_fence(task: _Task, leases: Mapping[str, tuple[str, int, float]]) -> None:
    """Raise `LeaseLost` when the fence refuses this run's writes to the thread.

    The fork checkpoint a run from a checkpoint id saves in the background is then
    refused, so waiting for it would only end in a misleading `DurabilityError`.
    """
    row = leases.get(task.thread_id)
    if row is not None:
        check_fence(row, task.thread_id, actor_of(task.config)[1], task.saver.clock())
