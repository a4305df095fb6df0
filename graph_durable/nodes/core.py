"""What the guard decides between two I/O operations, written once for both drivers.

`GuardBase` holds the guard's policy and everything about a tool call that is not I/O:
its context and key (anchor, legacy key, restarts), the step's claim plan, the check of
the checkpoint that requested the call, the run-once of a call repeated in one step, the
tool request it sends (edited args, reentry gate) and how the tool's outcome is read.
Where a step needs the saver, it is a generator yielding operations (`Read`, `Claim`,
`ClaimMany`, `Write`, `Sleep`, and the protocol's `CallTool` and `Lookup`, all in
`operations.py`): the sync driver (`sync_driver.py`) and the async driver
(`async_driver.py`) perform them, each operation in one place.

Longer than 400 lines for a reason: `GuardBase` is one class whose hooks
(`_anchor`, `_restarted`, `_checkpoint_to_verify`) `nodes.writes` overrides, and the
steps that call those hooks stay beside them; the pure parts it builds on live in
`task.py`, `answers.py`, `interrupts.py`, `call_context.py` (the call's key, its records
unredacted) and `reentry.py` (the tool's gate).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from langchain_core.messages import ToolMessage
from langgraph.errors import GraphInterrupt
from langgraph.prebuilt.tool_node import ToolCallRequest

from graph_durable._langgraph import CONFIG_KEY_CHECKPOINT_MAP
from graph_durable.checkpointers._base import actor_of
from graph_durable.errors import InvalidDecision, MiddlewareOrderError
from graph_durable.faults import fault_point
from graph_durable.ledger import EffectRecord, Keying
from graph_durable.nodes.anchor import call_anchor, requested_args
from graph_durable.nodes.answers import read_decisions
from graph_durable.nodes.context import EffectContext
from graph_durable.nodes.decisions import RefusedDecision
from graph_durable.nodes.interrupts import OnAsk, interrupt_id_for, with_schema
from graph_durable.nodes.key_delivery import undelivered_key, with_key
from graph_durable.nodes.outcomes import refused_args
from graph_durable.nodes.operations import (
    Ask,
    CallTool,
    Claim,
    ClaimMany,
    Op,
    Outcome,
    Read,
    Sleep,
    Write,
)
from graph_durable.nodes.protocol import CallContext, Protocol, run_call
from graph_durable.nodes.reentry import ToolGate
from graph_durable.nodes.restarts import earlier_effect, fork_sources, restart_root
from graph_durable.nodes.task import Task, check_lease, refused_by_fence
from graph_durable.policy import Effect

__all__ = ["Calling", "ClaimMany", "GuardBase", "Op", "Started"]


class Calling(NamedTuple):
    """The tool call a driver performs a protocol's `CallTool` and `Lookup` for."""

    ctx: CallContext
    request: ToolCallRequest
    execute: Callable[..., Any]
    """Runs the request: the tool (and the middleware inside the guard)."""


@dataclass
class Started:
    """A write call whose protocol ran up to its claim (see `GuardCore.claim_step`)."""

    task: Task
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


class GuardBase:
    """Routes each tool call through the ledger according to its `Effect` policy: the
    decisions between I/O operations (the drivers, mixed in by `GuardCore`, perform
    them)."""

    def __init__(
        self, effects: Mapping[str, Effect] | None = None, default: Effect | None = None,
        messages_key: str = "messages",
    ) -> None:
        self.effects = dict(effects or {})
        self.default = default or Effect()
        self.messages_key = messages_key
        self._durable_checkpoints: set[tuple[str, str, str]] = set()
        self._keys_delivered: set[str] = set()
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
        return Task(config, {}).saver

    def policy_for(self, tool: str) -> Effect:
        """The policy of `tool` (the default for tools not named in `effects`)."""
        return self.effects.get(tool, self.default)

    def check_key_delivery(self, name: str, tool: Any) -> None:
        """Refuse, before anything is claimed or sent, a tool whose policy relies on its
        key while the key would never reach its provider (`UndeliveredKey`, see
        `nodes.key_delivery`). Each tool is judged once."""
        if name in self._keys_delivered:
            return
        refused = undelivered_key(name, tool, self.policy_for(name))
        if refused is not None:
            raise refused
        self._keys_delivered.add(name)

    def _writes(self, tool_call: Mapping[str, Any], has_tool: bool) -> bool:
        """Whether the ledger guards this call (a write to a tool the node has)."""
        return has_tool and not self.policy_for(tool_call["name"]).read_only

    def _context(
        self, task: Task, tool_call: Mapping[str, Any], state: Any, keying: Keying,
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
                                                          thread_id=task.thread_id),
                           key_call_id=self._key_call_id(tool_call))

    @staticmethod
    def _key_call_id(tool_call: Mapping[str, Any]) -> str | None:
        """The id the call's key is derived from, if not its own (see `CallContext`)."""
        return None

    def _anchor(self, task: Task, tool_call: Mapping[str, Any], state: Any) -> str:
        """What the call's key is anchored to: the AIMessage that requested it."""
        return call_anchor(state, tool_call.get("id"), task.checkpoint_ns, self.messages_key,
                           thread_id=task.thread_id)

    @staticmethod
    def _adopt_legacy_key(ctx: CallContext, legacy: EffectRecord | None) -> None:
        """Key the call as before the upgrade if its effect was recorded that way."""
        if legacy is not None:
            ctx.key = legacy.key

    def _restarted(self, task: Task, ctx: CallContext, state: Any
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
        at = (task.requesting_checkpoint() or ("", "", None))[2]
        earlier = yield from earlier_effect(ctx, root, sources, state, self.messages_key, at)
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
                  keying: Keying) -> list[tuple[Task, CallContext]]:
        contexts = []
        for call in calls:
            task = Task(config, call)
            contexts.append((task, self._context(task, call, state, keying)))
        return contexts

    @staticmethod
    def _start(contexts: list[tuple[Task, CallContext]]) -> list[Started]:
        """Run each call's protocol up to its claim (`before_intent` included)."""
        started: list[Started] = []
        for task, ctx in contexts:
            protocol = run_call(ctx)
            op = protocol.send(None)
            assert isinstance(op, Claim), op
            started.append(Started(task, ctx, protocol, op))
        return started

    # -- the same call twice in one step: run once, answer both ---------------------------

    def _lead(self, task: Task, ctx: CallContext) -> tuple[concurrent.futures.Future[Any], bool]:
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

    def _settle(self, task: Task, ctx: CallContext, running: concurrent.futures.Future[Any],
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

    def _checkpoint_to_verify(self, task: Task) -> tuple[str, str, str] | None:
        """The checkpoint the task runs from, unless already known to be stored."""
        where = task.requesting_checkpoint()
        return None if where is None or where in self._durable_checkpoints else where

    def _to_verify(self, task: Task, where: tuple[str, str, str] | None
                   ) -> tuple[str, str, str] | None:
        """`where` (by default `_checkpoint_to_verify`), unless known to be stored."""
        if where is None:
            return self._checkpoint_to_verify(task)
        return None if where in self._durable_checkpoints else where

    def _verified(
        self, task: Task, call: Mapping[str, Any], where: tuple[str, str, str], stored: bool
    ) -> None:
        if not stored:
            raise task.not_durable(call, "its checkpoint is not in the database")
        # A stored checkpoint stays stored; the calls of one step share it, so ask once.
        if len(self._durable_checkpoints) >= 1024:
            self._durable_checkpoints.clear()
        self._durable_checkpoints.add(where)

    def _effect_context(self, task: Task, op: CallTool) -> EffectContext:
        record = op.record
        return EffectContext(
            key=record.key, thread_id=task.thread_id, tool_call_id=record.tool_call_id,
            tool=record.tool, attempt=record.attempts, fencing_token=actor_of(task.config)[1],
        )

    @staticmethod
    def _check_lease(task: Task) -> None:
        """Send nothing once this process knows its lease on the thread is gone."""
        check_lease(task)

    @staticmethod
    def _as_sent(request: ToolCallRequest, op: CallTool, policy: Effect) -> ToolCallRequest:
        """The request the tool gets: an edit's args, and the key where the policy
        names the argument that carries it (`Effect.key_arg`)."""
        args = request.tool_call["args"] if op.args is None else op.args
        args = with_key(args, policy, op.record.key)
        if args is request.tool_call["args"] or args == request.tool_call["args"]:
            return request
        return request.override(tool_call={**request.tool_call, "args": args})

    refuse_reentry = False
    """Set by `EffectGuardMiddleware`: the middleware inside it may enter the tool once
    per attempt (`nodes.reentry`)."""

    def _gate(self, task: Task, ctx: CallContext) -> ToolGate | None:
        return ToolGate(task.thread_id, ctx.tool_call_id, ctx.tool) if self.refuse_reentry else None

    refuse_inner_approvals = False
    """Set by `EffectGuardMiddleware`: a per-call approval of LangChain's
    `HumanInTheLoopMiddleware` raised inside the guard is a wrong middleware order."""

    def _inner_pause(self, task: Task, ctx: CallContext, paused: GraphInterrupt
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

    def _still_running(self, task: Task, op: CallTool) -> Outcome | None:
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

    # -- the steps between I/O operations (performed by the drivers) ---------------------

    def _prepared(self, task: Task, request: ToolCallRequest) -> Generator[Op, Any, CallContext]:
        """The call's context, keyed (legacy key, restarts), once the checkpoint that
        requested it is known to be stored."""
        keying = yield Read("keying", (task.thread_id,))
        ctx = self._context(task, request.tool_call, request.state, keying)
        if keying[1]:
            self._adopt_legacy_key(
                ctx, (yield Read("effect", (ctx.legacy_key(), task.thread_id))))
        # A subgraph's run from a fork waits for the fork's root checkpoint, which LangGraph
        # may still be saving, before reading where the fork came from.
        yield from self._requesting_checkpoint_stored(task, request.tool_call,
                                                      restart_root(task.conf))
        yield from self._restarted(task, ctx, request.state)
        yield from self._requesting_checkpoint_stored(task, request.tool_call)
        return ctx

    def _claiming(self, first: Task, calls: list[Mapping[str, Any]], state: Any
                  ) -> Generator[Op, Any, dict[str, Started]]:
        """Claim `calls` (the step's reconcilable write calls, `first` the task of the
        first) in one transaction; `{tool_call_id: started}` (see `claim_step`)."""
        keying = yield Read("keying", (first.thread_id,))
        if keying[1]:
            return {}  # legacy keys are looked up call by call
        contexts = self._contexts(calls, first.config, state, keying)
        for task, ctx in contexts:
            yield from self._requesting_checkpoint_stored(task, ctx.tool_call,
                                                          restart_root(task.conf))
            yield from self._restarted(task, ctx, state)
        started = self._start(contexts)
        task = started[0].task
        yield from self._requesting_checkpoint_stored(task, started[0].ctx.tool_call)
        claimed = yield ClaimMany(tuple(s.claim.intent for s in started))
        return _claimed(started, claimed)

    def _resolving(self, task: Task, tools: Mapping[str, Any] | None
                   ) -> Generator[Op, Any, None]:
        """Journal the decisions this run's resume value carries for the task (see
        `resolve_decisions`)."""
        try:
            batch = yield from read_decisions(task, tools, self.policy_for)
        except InvalidDecision as refused:
            raise RefusedDecision.of(refused) from None
        if batch is not None:
            yield Write(batch)
            fault_point("after_decision")

    def _requesting_checkpoint_stored(self, task: Task, call: Mapping[str, Any],
                                      where: tuple[str, str, str] | None = None
                                      ) -> Generator[Op, Any, None]:
        """Refuse to send unless the checkpoint the task runs from is stored (waiting up
        to `FORK_SAVE_WAIT` for a fork checkpoint saved in the background, unless the
        fence already refuses this run). `where` is that checkpoint by default
        (`_checkpoint_to_verify`)."""
        where = self._to_verify(task, where)
        if where is None:
            return
        stored = yield Read("checkpoint_exists", where)
        deadline, pause = time.monotonic() + self.FORK_SAVE_WAIT, 0.005
        if not stored:
            refused_by_fence(task, (yield Read("live_leases", ())))
        while not stored and time.monotonic() < deadline:
            yield Sleep(pause)
            pause = min(pause * 2, 0.1)
            stored = yield Read("checkpoint_exists", where)
        self._verified(task, call, where, stored)

    @staticmethod
    def _driven(task: Task, ctx: CallContext, request: ToolCallRequest, on_ask: OnAsk,
                protocol: Protocol, value: Any) -> Generator[Op, Any, Any]:
        """The call's protocol from `value` on, its questions handed to `on_ask`: the
        operations left are I/O for the driver."""
        while True:
            try:
                op = protocol.send(ctx.unredacted(value))
            except StopIteration as done:
                return done.value
            if isinstance(op, Ask):
                value = on_ask(with_schema(op, request.tool),
                               interrupt_id_for(task.checkpoint_ns, op.record.key))
            else:
                value = yield op

    def _tool_request(self, task: Task, call: Calling, op: CallTool, *, abandoned_here: bool
                      ) -> tuple[Calling, ToolGate | None] | Outcome:
        """`call` as the tool is called (edited args, gated) and its gate, or the outcome
        of not sending it: the lease is gone, an abandoned attempt still runs here (when
        `abandoned_here`: the sync driver abandons attempts on threads), or the args do
        not fit the tool's schema."""
        self._check_lease(task)
        if abandoned_here:
            still_running = self._still_running(task, op)
            if still_running is not None:
                return still_running
        gate = self._gate(task, call.ctx)
        call_request = self._as_sent(call.request, op, call.ctx.policy)
        refused = refused_args(call_request)
        if refused is not None:
            return Outcome(error=refused, args_refused=True)
        if gate is not None:
            call_request = gate.request(call_request)
        return call._replace(request=call_request), gate


def _same_answer(result: Any) -> Any:
    """The answer of a call's first copy, for a second copy of it."""
    return result.model_copy() if isinstance(result, ToolMessage) else result
