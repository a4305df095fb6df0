"""The sync driver of the guard: the I/O of each operation, performed in one place
(`perform` for the saver's, `SyncDriver._perform` for the tool's and the provider's),
and the sync entry points that feed it `GuardBase`'s steps."""

from __future__ import annotations

import contextvars
import inspect
import threading
import time
from collections.abc import Callable, Generator, Mapping
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.errors import GraphBubbleUp, GraphInterrupt
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from graph_durable.errors import DatabaseUnavailable
from graph_durable.nodes import operations as ops
from graph_durable.nodes.context import _CURRENT
from graph_durable.nodes.key_delivery import report_unread_key
from graph_durable.nodes.core import Calling, GuardBase, Started, _same_answer
from graph_durable.nodes.interrupts import OnAsk
from graph_durable.nodes.operations import Outcome
from graph_durable.nodes.outcomes import call_with_timeout, read_reports, watch_reports
from graph_durable.nodes.protocol import CallContext, Protocol, run_call
from graph_durable.nodes.reentry import ReentryRefused, ToolGate, gated
from graph_durable.nodes.storage import described
from graph_durable.nodes.task import Task, config_of, task_with_resume

__all__ = ["SyncDriver", "perform", "perform_reads"]

ToolResult = ToolMessage | Command


def perform(saver: Any, config: Any, op: ops.Op) -> Any:
    """Perform one of the saver's operations (or a `Sleep`); its result."""
    call = ops.saver_call(op, config)
    if call is not None:
        method, args = call
        return getattr(saver, method)(*args)
    if isinstance(op, ops.Sleep):
        time.sleep(op.seconds)
        return None
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
            return self._call_tool(task, call, op)
        if isinstance(op, ops.Lookup) and call is not None:
            return self._lookup(call.ctx, op)
        try:
            return perform(task.saver, task.config, op)
        except DatabaseUnavailable as exc:
            raise described(exc, task.thread_id, call.ctx.tool_call if call else task.call,
                            call is not None and call.ctx.sent) from None

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
        first = Task(config, calls[0])
        return self._performed(first, self._claiming(first, calls, state))

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
            task = Task(config_of(request), request.tool_call)
            ctx = self._performed(task, self._prepared(task, request))
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

    def _drive(self, task: Task, ctx: CallContext, request: ToolCallRequest,
               execute: Callable[[ToolCallRequest], ToolResult], on_ask: OnAsk,
               protocol: Protocol, value: Any) -> ToolResult:
        return self._performed(task, self._driven(task, ctx, request, on_ask, protocol, value),
                               Calling(ctx, request, execute))

    def _call_tool(self, task: Task, call: Calling, op: ops.CallTool) -> Outcome:
        planned = self._tool_request(task, call, op, abandoned_here=True)
        if isinstance(planned, Outcome):
            return planned
        with watch_reports() as reported:
            return read_reports(self._call_entered(task, op, *planned), reported)

    def _call_entered(self, task: Task, op: ops.CallTool, call: Calling,
                      gate: ToolGate | None) -> Outcome:
        """Call the tool (`call.request`, whose args its schema accepts): its body runs."""
        ctx, call_request, execute = call
        effect = self._effect_context(task, op)

        def run_tool() -> ToolResult:
            token = _CURRENT.set(effect)
            try:
                result = execute(call_request)
            finally:
                _CURRENT.reset(token)
            report_unread_key(ctx.tool_call["name"], ctx.policy, effect.asked)
            return result

        timeout = ctx.policy.timeout
        if timeout is None:
            try:
                return gated(gate, Outcome(value=run_tool()))
            except GraphInterrupt as paused:
                return gated(gate, Outcome(paused=self._inner_pause(task, ctx, paused)))
            except GraphBubbleUp:
                raise
            except (Exception, ReentryRefused) as exc:
                return gated(gate, Outcome(error=exc))
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = run_tool()
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
            return gated(gate, Outcome(error=error))
        if error is None:
            return gated(gate, Outcome(value=box.get("value")))
        if isinstance(error, GraphInterrupt):
            return Outcome(paused=self._inner_pause(task, ctx, error))
        if isinstance(error, GraphBubbleUp) or (
            error is not None and not isinstance(error, Exception)
        ):
            raise error
        return Outcome(value=box.get("value"), error=error)

    def _lookup(self, ctx: CallContext, op: ops.Lookup) -> Outcome:
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
