"""The sync driver of the guard: the I/O of each operation, performed in one place
(`perform` for the saver's, `SyncDriver._perform` for the tool's and the provider's),
and the sync entry points that feed it `GuardBase`'s steps."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Mapping
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.types import Command

from graph_durable.checkpointers._base import KeyingChanged
from graph_durable.errors import DatabaseUnavailable, GraphDurableError
from graph_durable.nodes import operations as ops
from graph_durable.nodes.context import _CURRENT
from graph_durable.nodes.core import Calling, GuardBase, Started
from graph_durable.nodes.interrupts import OnAsk
from graph_durable.nodes.key_delivery import report_unread_key
from graph_durable.nodes.observing import observed_outcome
from graph_durable.nodes.run_once import EditedIntoEachOther, same_answer
from graph_durable.nodes.outcomes import (
    Outcome,
    call_lookup,
    call_with_timeout,
    watch_reports,
)
from graph_durable.nodes.storage import described
from graph_durable.nodes.task import Task, task_with_resume

__all__ = ["SyncDriver", "perform", "perform_reads"]

ToolResult = ToolMessage | Command

def perform(saver: Any, config: Any, op: ops.Op) -> Any:
    """Perform one of the saver's operations (or a `Sleep`, or a `Join` outside a
    call's run, which waits for nothing); its result."""
    call = ops.saver_call(op, config)
    if call is not None:
        method, args = call
        return getattr(saver, method)(*args)
    if isinstance(op, ops.Sleep):
        time.sleep(op.seconds)
        return None
    if isinstance(op, ops.Join):
        return None  # outside a guarded call's run: no other call of it to wait for
    raise TypeError(f"not an operation on the saver: {op!r}")

def perform_reads(saver: Any, reads: Generator[ops.Read, Any, Any]) -> Any:
    """Perform a generator of `Read` operations on `saver`; return what it returns."""
    return ops.performed(reads, lambda op: perform(saver, None, op))

class SyncDriver(GuardBase):
    """The guard's sync entry points: each performs `GuardBase`'s steps."""

    def _performed(self, task: Task, steps: Generator[ops.Op, Any, Any],
                   call: Calling | None = None) -> Any:
        """Perform `steps` for `task` (the tool's and the provider's for `call`); return
        what the generator returns."""
        return ops.performed(steps, lambda op: self._perform(task, op, call))

    def _perform(self, task: Task, op: ops.Op, call: Calling | None) -> Any:
        """Perform one operation of `task`: the tool's and the provider's for `call`,
        the saver's otherwise."""
        if isinstance(op, ops.CallTool) and call is not None:
            call.ctx.sent = True
            with call.observed.provider_call():
                return self._call_tool(task, call, op)
        if isinstance(op, ops.Join):
            return None if call is None else self._join(task, call, op)
        if isinstance(op, ops.Lookup) and call is not None:
            with call.observed.lookup():
                return call_lookup(call.ctx.policy, op.key, timeout=call.ctx.policy.timeout,
                                   tool=call.ctx.tool,
                                   use_async="run the graph with ainvoke/astream")
        try:
            result = perform(task.saver, task.config, op)
            if call is not None and call.observed.recording:
                ops.observe_op(call.observed, op)
            return result
        except KeyingChanged as exc:  # a step's claim: thrown into `_claiming`
            return ops.Failed(exc)
        except DatabaseUnavailable as exc:
            raise described(exc, task.thread_id, call.ctx.tool_call if call else task.call,
                            call is not None and call.ctx.sent) from None

    def _join(self, task: Task, call: Calling, op: ops.Join) -> ops.Joined | None:
        """Wait for the call of this process running `op.key`, if one is (`RunOnce.join`)."""
        try:
            running, leader = self.once.join(task.thread_id, call.ctx, op.key)
        except EditedIntoEachOther as exc:
            return ops.Failed(exc)  # thrown into the protocol, which answers the call
        if leader:
            return None
        assert running is not None
        try:
            return ops.Joined(same_answer(running.result()))
        finally:
            self.once.done_waiting(task.thread_id, call.ctx)

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
        return self._performed(Task(config, calls[0]), self._claiming(config, calls, state))

    def resolve_decisions(self, config: Mapping[str, Any],
                          tools: Mapping[str, Any] | None = None) -> None:
        """Journal the decisions a resume value carries for this task, if any.

        `tools` (by name) give the argument schemas an edit is checked against. A resume
        map is checked whole first, the answers to other tasks' questions included
        (`decisions.check_answers`): one invalid answer runs none of the set. An answer
        addressed to a question of this task that is no longer asked is refused too.
        Refusals are raised as `RefusedDecision` (an `InvalidDecision`), and nothing is
        recorded."""
        task = task_with_resume(config)
        if task is not None:
            self._performed(task, self._resolving(task, tools))

    def run(self, request: Any, execute: Callable[[Any], Any], on_ask: OnAsk,
            started: Started | None = None, repeats: bool = True) -> Any:
        """Run one guarded call through the protocol, synchronously.

        `request` is a `ToolCallRequest` (or what the guard's keys take, see
        `call_keys`). With `started` (from `claim_step`), the call's intent is already
        claimed. `repeats=False` says no other call of the step has this call's id, so
        it need not wait for a copy of itself (see `RunOnce.lead`).
        """
        if started is None:
            if not self._writes(request.tool_call, request.tool is not None):
                return execute(request)
            task = Task(self.keys.config_of(request), request.tool_call)
            try:
                started = self._performed(task, self._starting(task, request))
            except GraphDurableError as exc:
                self._refused(task, exc)
                raise
        running, leader = self.once.lead(started, repeats)
        if not leader:
            assert running is not None
            return same_answer(running.result())
        try:
            with self._observing(started) as observed:
                try:
                    result = self._performed(
                        started.task, self._driven(started, request.tool, on_ask),
                        Calling(started.ctx, request, execute, observed))
                finally:
                    observed_outcome(observed, started.ctx)
        except BaseException as exc:
            self.once.settle(started, running, error=exc)
            raise
        self.once.settle(started, running, result=result)
        return result

    def _call_tool(self, task: Task, call: Calling, op: ops.CallTool) -> Outcome:
        planned = self._tool_request(task, call, op, abandoned_here=True)
        if not isinstance(planned, tuple):
            return planned
        call, gate = planned
        ctx, request, execute = call.ctx, call.request, call.execute
        effect = self._effect_context(task, op)

        def run_tool() -> ToolResult:
            token = _CURRENT.set(effect)
            try:
                result = execute(request)
            finally:
                _CURRENT.reset(token)
            report_unread_key(ctx.tool_call["name"], ctx.policy, effect.asked)
            return result

        with watch_reports() as reported:
            attempt = call_with_timeout(run_tool, ctx.policy.timeout, f"graph-durable-{ctx.tool}",
                                        abandoned=self._abandon(task, op))
        return self._outcome(task, ctx, attempt, gate, reported)
