"""The async driver of the guard: the I/O of each operation, performed in one place
(`aperform` for the saver's, `AsyncDriver._aperform` for the tool's and the
provider's), and the async entry points that feed it `GuardBase`'s steps."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Generator, Mapping
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.errors import GraphBubbleUp, GraphInterrupt
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from graph_durable.errors import DatabaseUnavailable
from graph_durable.ledger import EffectStatus
from graph_durable.nodes import operations as ops
from graph_durable.nodes.context import _CURRENT
from graph_durable.nodes.key_delivery import report_unread_key
from graph_durable.nodes.core import Calling, GuardBase, Started, _same_answer
from graph_durable.nodes.interrupts import OnAsk
from graph_durable.nodes.operations import Outcome
from graph_durable.nodes.outcomes import read_reports, watch_reports
from graph_durable.nodes.protocol import CallContext, Protocol, run_call
from graph_durable.nodes.reentry import ReentryRefused, ToolGate, gated
from graph_durable.nodes.storage import described
from graph_durable.nodes.task import Task, config_of, task_with_resume

__all__ = ["AsyncDriver", "aperform", "aperform_reads"]

ToolResult = ToolMessage | Command


async def aperform(saver: Any, config: Any, op: ops.Op) -> Any:
    """Perform one of the saver's operations (or a `Sleep`) with its async methods."""
    call = ops.saver_call(op, config)
    if call is not None:
        method, args = call
        return await getattr(saver, "a" + method)(*args)
    if isinstance(op, ops.Sleep):
        await asyncio.sleep(op.seconds)
        return None
    raise TypeError(f"not an operation on the saver: {op!r}")


async def aperform_reads(saver: Any, reads: Generator[ops.Read, Any, Any]) -> Any:
    """`perform_reads` with the saver's async reads."""
    return await ops.aperformed(reads, lambda op: aperform(saver, None, op))


class AsyncDriver(GuardBase):
    """The guard's async entry points: each performs `GuardBase`'s steps."""

    async def _aperformed(self, task: Task, steps: Generator[ops.Op, Any, Any],
                          call: Calling | None = None) -> Any:
        """Async `SyncDriver._performed`."""
        return await ops.aperformed(steps, lambda op: self._aperform(task, op, call))

    async def _aperform(self, task: Task, op: ops.Op, call: Calling | None) -> Any:
        """Perform one operation of `task` (see `SyncDriver._perform`)."""
        if isinstance(op, ops.CallTool) and call is not None:
            call.ctx.sent = True
            return await self._acall_tool(task, call, op)
        if isinstance(op, ops.Lookup) and call is not None:
            return await self._alookup(call.ctx, op)
        try:
            return await aperform(task.saver, task.config, op)
        except DatabaseUnavailable as exc:
            raise described(exc, task.thread_id, call.ctx.tool_call if call else task.call,
                            call is not None and call.ctx.sent) from None

    async def aclaim_step(
        self, tool_calls: list[tuple[Mapping[str, Any], bool]], config: Mapping[str, Any],
        state: Any = None,
    ) -> dict[str, Started]:
        """Async `claim_step`."""
        calls = self._reconcilable_calls(tool_calls)
        if not calls:
            return {}
        first = Task(config, calls[0])
        return await self._aperformed(first, self._claiming(first, calls, state))

    async def aresolve_decisions(self, config: Mapping[str, Any],
                                 tools: Mapping[str, Any] | None = None) -> None:
        """Async `resolve_decisions`."""
        task = task_with_resume(config)
        if task is not None:
            await self._aperformed(task, self._resolving(task, tools))

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
            task = Task(config_of(request), request.tool_call)
            ctx = await self._aperformed(task, self._prepared(task, request))
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

    async def _adrive(self, task: Task, ctx: CallContext, request: ToolCallRequest,
                      execute: Callable[[ToolCallRequest], Awaitable[ToolResult]],
                      on_ask: OnAsk, protocol: Protocol, value: Any) -> ToolResult:
        return await self._aperformed(
            task, self._driven(task, ctx, request, on_ask, protocol, value),
            Calling(ctx, request, execute))

    async def _acall_tool(self, task: Task, call: Calling, op: ops.CallTool) -> Outcome:
        planned = self._tool_request(task, call, op, abandoned_here=False)
        if isinstance(planned, Outcome):
            return planned
        with watch_reports() as reported:
            return read_reports(await self._acall_entered(task, op, *planned), reported)

    async def _acall_entered(self, task: Task, op: ops.CallTool, call: Calling,
                             gate: ToolGate | None) -> Outcome:
        """Call the tool (`call.request`, whose args its schema accepts): its body runs."""
        ctx, call_request, execute = call
        effect = self._effect_context(task, op)

        async def run_tool() -> ToolResult:
            result = await execute(call_request)
            report_unread_key(ctx.tool_call["name"], ctx.policy, effect.asked)
            return result

        token = _CURRENT.set(effect)
        try:
            if ctx.policy.timeout is None:
                return gated(gate, Outcome(value=await run_tool()))
            return gated(gate, Outcome(
                value=await asyncio.wait_for(run_tool(), ctx.policy.timeout)
            ))
        except asyncio.TimeoutError:
            return gated(gate, Outcome(timed_out=True))
        except GraphInterrupt as paused:
            return gated(gate, Outcome(paused=self._inner_pause(task, ctx, paused)))
        except GraphBubbleUp:
            raise
        except asyncio.CancelledError:
            await self._acancelled_in_flight(task, ctx, op)
            raise
        except (Exception, ReentryRefused) as exc:
            return gated(gate, Outcome(error=exc))
        finally:
            _CURRENT.reset(token)

    @staticmethod
    async def _acancelled_in_flight(task: Task, ctx: CallContext, op: ops.CallTool) -> None:
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

    async def _alookup(self, ctx: CallContext, op: ops.Lookup) -> Outcome:
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


def _is_async_callable(fn: Any) -> bool:
    """Whether calling `fn` returns a coroutine (a coroutine function, or an object whose
    `__call__` is one)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None))
