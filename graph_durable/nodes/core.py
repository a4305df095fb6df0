"""What the guard decides between two I/O operations, written once for both drivers.

`GuardBase` holds the guard's policies and everything about a guarded call that is not
I/O: its context and key (by the keying strategy it is given, `call_keys.CallKeys`),
the step's claim plan, the check that the checkpoint that requested the call is stored,
the run-once of a call repeated in one step, the request the tool gets (edited args,
the key where the policy names its argument, the reentry gate) and how what it did
becomes an `Outcome` (`outcomes.classify`). Where a step needs the saver, it is a
generator yielding operations (`Read`, `Claim`, `ClaimMany`, `Write`, `Sleep`, and the
protocol's `CallTool` and `Lookup`, all in `operations.py`): the sync driver
(`sync_driver.py`) and the async driver (`async_driver.py`) perform them, each
operation in one place.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphInterrupt

from graph_durable import telemetry
from graph_durable.checkpointers._base import KeyingChanged, actor_of
from graph_durable.errors import InvalidDecision
from graph_durable.faults import fault_point
from graph_durable.ledger import EffectRecord
from graph_durable.nodes.answers import read_decisions
from graph_durable.nodes.call_keys import BoundedCache, CallKeys, ToolCallKeys, Where
from graph_durable.nodes.context import EffectContext
from graph_durable.nodes.decisions import RefusedDecision
from graph_durable.nodes.interrupts import OnAsk, interrupt_id_for, with_schema
from graph_durable.nodes.key_delivery import undelivered_key, with_key
from graph_durable.nodes.observing import call_info, refused, traced, with_metadata
from graph_durable.nodes.operations import (
    Ask,
    CallTool,
    Claim,
    ClaimMany,
    Op,
    Read,
    Sleep,
    Write,
)
from graph_durable.nodes.outcomes import (
    ArgsRefused,
    Attempt,
    Outcome,
    StillRunning,
    classify,
    refused_args,
)
from graph_durable.nodes.protocol import CallContext, Protocol, run_call
from graph_durable.nodes.reentry import ToolGate, inner_approval
from graph_durable.nodes.run_once import RunOnce
from graph_durable.nodes.task import Task, check_lease, refused_by_fence
from graph_durable.policy import Effect

__all__ = ["Calling", "GuardBase", "Started"]


class Calling(NamedTuple):
    """The call a driver performs a protocol's `CallTool` and `Lookup` for."""

    ctx: CallContext
    request: Any
    """The request the tool is called with (a `ToolCallRequest`, a `WriteRequest`)."""
    execute: Callable[..., Any]
    """Runs the request: the tool (and the middleware inside the guard)."""
    observed: telemetry.ObservedCall
    """The call as telemetry sees it: its span, and the outcome it reports."""


@dataclass
class Started:
    """A call whose protocol is ready to be driven: `value` is what it is sent first
    (`None`, or the `(record, created)` of its claim when `claim_step` claimed it)."""

    task: Task
    ctx: CallContext
    protocol: Protocol
    value: Any = None

    def matches(self, request: Any) -> bool:
        """Whether `request` is the call this protocol was started for."""
        return request.tool_call == self.ctx.tool_call


class GuardBase:
    """Routes each guarded call through the ledger according to its `Effect` policy: the
    decisions between I/O operations (the drivers, mixed in by `GuardCore`, perform
    them).

    Args:
        effects: The policy of each tool (by name).
        default: The policy of tools not named in `effects`.
        keys: Where a call's key comes from (`ToolCallKeys(messages_key)` by default).
        messages_key: Where the node's state holds its messages (for the default keys).
    """

    def __init__(
        self, effects: Mapping[str, Effect] | None = None, default: Effect | None = None,
        messages_key: str = "messages", keys: CallKeys | None = None,
    ) -> None:
        self.effects = dict(effects or {})
        self.default = default or Effect()
        self.keys: CallKeys = keys or ToolCallKeys(messages_key)
        self._stored: BoundedCache[Where, bool] = BoundedCache()
        self._keys_delivered: set[str] = set()
        self._lock = threading.Lock()
        # Sync attempts abandoned after their timeout, by (thread_id, key).
        self._abandoned: dict[tuple[str, str], threading.Thread] = {}
        self.once = RunOnce()
        """A call repeated in one step runs once; its copies get its answer."""
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

    def _call_info(self, task: Task, key: str | None) -> Callable[[], telemetry.CallInfo]:
        """What makes the call of `task` as telemetry names it, its policy read now."""
        policy, kind = self.policy_for(str(task.call.get("name"))), self.keys.kind
        return lambda: call_info(task, key, policy, kind)

    def _observing(self, started: Started) -> telemetry.ObservedCall:
        """The call's telemetry, from its first look at the ledger to its outcome (a
        `QuietCall` when nothing but the log would hear of it)."""
        return telemetry.observe_lazily(self._call_info(started.task, started.ctx.key),
                                        started.task.config)

    def _refused(self, task: Task, error: BaseException) -> None:
        """Report a call refused before its protocol ran (no durable checkpoint, a call
        that cannot be keyed, a lease lost)."""
        refused(self._call_info(task, None)(), task, error)

    def _writes(self, tool_call: Mapping[str, Any], has_tool: bool) -> bool:
        """Whether the ledger guards this call (a write to a tool the node has)."""
        return has_tool and not self.policy_for(tool_call["name"]).read_only

    # -- before the protocol runs: the call keyed, its checkpoint stored -------------------

    def _starting(self, task: Task, request: Any) -> Generator[Op, Any, Started]:
        """The call keyed (`keys.context`), once the checkpoints it is keyed from and
        requested from are known to be stored; its protocol, ready to be driven."""
        keying = yield Read("keying", (task.thread_id,))
        # A subgraph's run from a fork waits for the fork's root checkpoint, which
        # LangGraph may still be saving, before reading where the fork came from.
        yield from self._checkpoint_stored(task, request.tool_call, self.keys.fork_root(task))
        ctx = yield from self.keys.context(task, request, self.policy_for(task.call["name"]),
                                           keying)
        yield from self._checkpoint_stored(task, request.tool_call,
                                           self.keys.requesting_checkpoint(task))
        return Started(task, ctx, run_call(ctx))

    # A run that names a checkpoint id (time travel, `get_state().config`) first writes
    # a fork checkpoint, and LangGraph saves it in the background while the first step
    # already runs, even with durability="sync"; such a save is waited for this long.
    FORK_SAVE_WAIT = 5.0

    def _checkpoint_stored(self, task: Task, call: Mapping[str, Any], where: Where | None
                           ) -> Generator[Op, Any, None]:
        """Refuse to send unless the checkpoint `where` is stored (waiting up to
        `FORK_SAVE_WAIT` for a fork checkpoint saved in the background, unless the fence
        already refuses this run). The one place this is checked; a stored checkpoint
        stays stored, and the calls of one step share it, so each is asked about once."""
        if where is None or where in self._stored:
            return
        stored = yield Read("checkpoint_exists", where)
        deadline, pause = time.monotonic() + self.FORK_SAVE_WAIT, 0.005
        if not stored:
            refused_by_fence(task, (yield Read("live_leases", ())))
        while not stored and time.monotonic() < deadline:
            yield Sleep(pause)
            pause = min(pause * 2, 0.1)
            stored = yield Read("checkpoint_exists", where)
        if not stored:
            raise task.not_durable(call, "its checkpoint is not in the database")
        self._stored[where] = True

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

    def _claiming(self, config: Mapping[str, Any], calls: list[Mapping[str, Any]], state: Any
                  ) -> Generator[Op, Any, dict[str, Started]]:
        """Claim `calls` (the step's reconcilable tool calls, requested by an AIMessage
        in `state`) in one transaction; `{tool_call_id: started}` (see `claim_step`)."""
        keys = self.keys
        assert isinstance(keys, ToolCallKeys), "only a step's tool calls are claimed ahead"
        first = Task(config, calls[0])
        # The keying most threads have, once the saver has read one: the claim checks it
        # in its transaction, which saves the read (see `predicted_keying`).
        predicted = yield Read("predicted_keying", (first.thread_id,))
        keying = predicted if predicted is not None else (
            yield Read("keying", (first.thread_id,)))
        # The calls of a step run from one root checkpoint (asked about once), and were
        # requested by messages of one state (each found once, for all of them).
        yield from self._checkpoint_stored(first, calls[0], keys.fork_root(first))
        requests = keys.requests(state, calls)
        while True:
            if keying.legacy:
                return {}  # legacy keys are looked up call by call
            started: list[Started] = []
            for call in calls:
                task = first if call is calls[0] else first.for_call(call)
                ctx = yield from keys.step_context(task, call, state,
                                                   self.policy_for(call["name"]), keying,
                                                   request=requests[call.get("id")])
                if keying is predicted:  # its intent carries it, for the claim to check
                    ctx.predicted_keying = keying
                started.append(Started(task, ctx, run_call(ctx)))
            claims = [_claim(one) for one in started]
            yield from self._checkpoint_stored(first, calls[0],
                                               keys.requesting_checkpoint(first))
            intents = tuple(claim.intent for claim in claims)
            try:
                claimed = yield ClaimMany(intents)
            except KeyingChanged:  # nothing was claimed: key the calls as the thread is
                for one in started:
                    one.protocol.close()
                keying = yield Read("keying", (first.thread_id,))
                continue
            break
        for one, result in zip(started, claimed, strict=True):
            one.value = result
        return {one.ctx.tool_call_id: one for one in started}

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

    # -- driving the protocol: its questions, and the request the tool gets ----------------

    @staticmethod
    def _driven(started: Started, tool: Any, on_ask: OnAsk) -> Generator[Op, Any, Any]:
        """The call's protocol from `started.value` on, its questions handed to `on_ask`:
        the operations left are I/O for the driver."""
        task, ctx, protocol, value = started.task, started.ctx, started.protocol, started.value
        redacted = ctx.policy.redact is not None
        thrown: Exception | None = None
        while True:
            try:
                if thrown is not None:  # an operation's `Failed` result, for the protocol
                    op, thrown = protocol.throw(thrown), None
                else:
                    op = protocol.send(ctx.unredacted(value) if redacted else value)
            except StopIteration as done:
                return done.value
            if isinstance(op, Ask):
                value = on_ask(with_schema(op, tool),
                               interrupt_id_for(task.checkpoint_ns, op.record.key))
            else:
                try:
                    value = yield op
                except Exception as exc:  # noqa: BLE001 - thrown in by the driver: passed on
                    thrown = exc

    def _effect_context(self, task: Task, op: CallTool) -> EffectContext:
        record = op.record
        return EffectContext(
            key=record.key, thread_id=task.thread_id, tool_call_id=record.tool_call_id,
            tool=record.tool, attempt=record.attempts,
            fencing_token=actor_of(cast(RunnableConfig, task.config))[1],
        )

    @staticmethod
    def _as_sent(request: Any, op: CallTool, policy: Effect) -> Any:
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

    refuse_inner_approvals = False
    """Set by `EffectGuardMiddleware`: a per-call approval of LangChain's
    `HumanInTheLoopMiddleware` raised inside the guard is a wrong middleware order."""

    def _inner_pause(self, task: Task, ctx: CallContext, paused: GraphInterrupt
                     ) -> BaseException:
        """What the protocol raises after recording that the tool paused: the tool's own
        interrupt, or (`refuse_inner_approvals`) the refusal of a per-call approval
        asked from inside the guard (`reentry.inner_approval`)."""
        if not self.refuse_inner_approvals:
            return paused
        return inner_approval(paused, task.thread_id, ctx.tool_call_id, ctx.tool) or paused

    def _still_running(self, task: Task, op: CallTool) -> Outcome | None:
        """Refuse to send while an attempt abandoned after its timeout still runs here."""
        if not self._abandoned:
            return None  # nothing abandoned in this process (the common case): no lock
        slot = (task.thread_id, op.record.key)
        with self._lock:
            worker = self._abandoned.get(slot)
            if worker is not None and not worker.is_alive():
                del self._abandoned[slot]
                worker = None
        if worker is None:
            return None
        return StillRunning(RuntimeError(
            f"an earlier attempt of tool call {op.record.tool_call_id!r} ({op.record.tool}), "
            "abandoned after its timeout, is still running in this process and may still "
            "land; not sent again. Decide once it has ended, or mark it applied or skip it"))

    def _abandon(self, task: Task, op: CallTool) -> Callable[[threading.Thread], None]:
        """What notes a sync attempt abandoned after its timeout, still running."""

        def note(worker: threading.Thread) -> None:
            with self._lock:
                self._abandoned[(task.thread_id, op.record.key)] = worker

        return note

    def _tool_request(self, task: Task, call: Calling, op: CallTool, *, abandoned_here: bool
                      ) -> tuple[Calling, ToolGate | None] | Outcome:
        """`call` as the tool is called (edited args, keyed, gated) and its gate, or the
        outcome of not sending it: the lease is gone (raised), an abandoned attempt still
        runs here (when `abandoned_here`: the sync driver abandons attempts on threads),
        or the args do not fit the tool's schema."""
        check_lease(task)
        if abandoned_here:
            still_running = self._still_running(task, op)
            if still_running is not None:
                return still_running
        call_request = self._as_sent(call.request, op, call.ctx.policy)
        refused = refused_args(call_request)
        if refused is not None:
            return ArgsRefused(refused)
        if (self.keys.kind == "tool" and call_request.tool is not None
                and traced(task.config)):
            # The tool's own run carries the effect's key, tool_call_id and policy.
            call_request = call_request.override(tool=with_metadata(
                call_request.tool, call.observed.call, op.record.attempts))
        gate = None
        if self.refuse_reentry:
            gate = ToolGate(task.thread_id, call.ctx.tool_call_id, call.ctx.tool)
            call_request = gate.request(call_request)
        return Calling(call.ctx, call_request, call.execute, call.observed), gate

    def _outcome(self, task: Task, ctx: CallContext, attempt: Attempt, gate: ToolGate | None,
                 reported: list[Exception]) -> Outcome:
        """What the tool's attempt came to (`outcomes.classify`)."""
        return classify(attempt, gate=gate, reported=reported,
                        on_pause=lambda paused: self._inner_pause(task, ctx, paused))


def _claim(started: Started) -> Claim:
    """Run `started`'s protocol up to its claim (`before_intent` included)."""
    op = started.protocol.send(None)
    assert isinstance(op, Claim), op
    return op
