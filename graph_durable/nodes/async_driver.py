"""The async driver of the guard: the I/O of each operation, performed in one place
(`aperform` for the saver's, `AsyncDriver._aperform` for the tool's and the
provider's), and the async entry points that feed it `GuardBase`'s steps."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator, Mapping
from typing import Any

from graph_durable.checkpointers._base import KeyingChanged
from graph_durable.errors import DatabaseUnavailable, GraphDurableError
from graph_durable.ledger import EffectStatus
from graph_durable.nodes import operations as ops
from graph_durable.nodes.context import _CURRENT
from graph_durable.nodes.core import Calling, GuardBase, Started
from graph_durable.nodes.interrupts import OnAsk
from graph_durable.nodes.key_delivery import report_unread_key
from graph_durable.nodes.observing import observed_outcome
from graph_durable.nodes.run_once import EditedIntoEachOther, same_answer
from graph_durable.nodes.outcomes import Attempt, Outcome, acall_lookup, watch_reports
from graph_durable.nodes.protocol import CallContext
from graph_durable.nodes.storage import described
from graph_durable.nodes.task import Task, task_with_resume

__all__ = ["AsyncDriver", "aperform", "aperform_reads"]


async def aperform(saver: Any, config: Any, op: ops.Op) -> Any:
    """Perform one of the saver's operations (or a `Sleep`) with its async methods.

    The operation is shielded: a run cancelled while it waits for the database (LangGraph
    cancels a step's other tasks when one fails or is interrupted, and cancels them
    twice) gets its `CancelledError` at once, and the statement still runs to its end.
    Interrupted twice, psycopg closes the connection under a statement it could not
    cancel on the server, and a saver on one connection (`from_conn_string`) would be
    closed for every thread of the process."""
    call = ops.saver_call(op, config)
    if call is not None:
        method, args = call
        return await asyncio.shield(getattr(saver, "a" + method)(*args))
    if isinstance(op, ops.Sleep):
        await asyncio.sleep(op.seconds)
        return None
    if isinstance(op, ops.Join):
        return None  # outside a guarded call's run: no other call of it to wait for
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
            with call.observed.provider_call():
                return await self._acall_tool(task, call, op)
        if isinstance(op, ops.Join):
            return None if call is None else await self._ajoin(task, call, op)
        if isinstance(op, ops.Lookup) and call is not None:
            with call.observed.lookup():
                return await acall_lookup(call.ctx.policy, op.key,
                                          timeout=call.ctx.policy.timeout)
        try:
            result = await aperform(task.saver, task.config, op)
            if call is not None and call.observed.recording:
                ops.observe_op(call.observed, op)
            return result
        except KeyingChanged as exc:  # a step's claim: thrown into `_claiming`
            return ops.Failed(exc)
        except DatabaseUnavailable as exc:
            raise described(exc, task.thread_id, call.ctx.tool_call if call else task.call,
                            call is not None and call.ctx.sent) from None

    async def _ajoin(self, task: Task, call: Calling, op: ops.Join) -> ops.Joined | None:
        """Async `SyncDriver._join`."""
        try:
            running, leader = self.once.join(task.thread_id, call.ctx, op.key)
        except EditedIntoEachOther as exc:
            return ops.Failed(exc)  # thrown into the protocol, which answers the call
        if leader:
            return None
        assert running is not None
        try:
            # Shielded: a cancelled waiter must not cancel the future the leader (and
            # every other waiter) settles.
            return ops.Joined(same_answer(await asyncio.shield(asyncio.wrap_future(running))))
        finally:
            self.once.done_waiting(task.thread_id, call.ctx)

    async def aclaim_step(
        self, tool_calls: list[tuple[Mapping[str, Any], bool]], config: Mapping[str, Any],
        state: Any = None,
    ) -> dict[str, Started]:
        """Async `claim_step`."""
        calls = self._reconcilable_calls(tool_calls)
        if not calls:
            return {}
        return await self._aperformed(Task(config, calls[0]),
                                      self._claiming(config, calls, state))

    async def aresolve_decisions(self, config: Mapping[str, Any],
                                 tools: Mapping[str, Any] | None = None) -> None:
        """Async `resolve_decisions`."""
        task = task_with_resume(config)
        if task is not None:
            await self._aperformed(task, self._resolving(task, tools))

    async def arun(self, request: Any, execute: Callable[[Any], Awaitable[Any]],
                   on_ask: OnAsk, started: Started | None = None, repeats: bool = True
                   ) -> Any:
        """Run one guarded call through the protocol, asynchronously (see `run`)."""
        if started is None:
            if not self._writes(request.tool_call, request.tool is not None):
                return await execute(request)
            task = Task(self.keys.config_of(request), request.tool_call)
            try:
                started = await self._aperformed(task, self._starting(task, request))
            except GraphDurableError as exc:
                self._refused(task, exc)
                raise
        running, leader = self.once.lead(started, repeats)
        if not leader:
            assert running is not None
            return same_answer(await asyncio.shield(asyncio.wrap_future(running)))
        try:
            async with self._observing(started) as observed:
                try:
                    result = await self._aperformed(
                        started.task, self._driven(started, request.tool, on_ask),
                        Calling(started.ctx, request, execute, observed))
                finally:
                    observed_outcome(observed, started.ctx)
        except BaseException as exc:
            self.once.settle(started, running, error=exc)
            raise
        self.once.settle(started, running, result=result)
        return result

    async def _acall_tool(self, task: Task, call: Calling, op: ops.CallTool) -> Outcome:
        planned = self._tool_request(task, call, op, abandoned_here=False)
        if not isinstance(planned, tuple):
            return planned
        call, gate = planned
        ctx, request, execute = call.ctx, call.request, call.execute
        effect = self._effect_context(task, op)

        async def run_tool() -> Any:
            result = await execute(request)
            report_unread_key(ctx.tool_call["name"], ctx.policy, effect.asked)
            return result

        token = _CURRENT.set(effect)
        try:
            with watch_reports() as reported:
                attempt = Attempt(value=await asyncio.wait_for(run_tool(), ctx.policy.timeout))
        except asyncio.TimeoutError:
            attempt = Attempt(timed_out=True)
        except asyncio.CancelledError:
            await self._acancelled_in_flight(task, ctx, op)
            raise
        except BaseException as exc:  # noqa: BLE001 - classify reads it
            attempt = Attempt(error=exc)
        finally:
            _CURRENT.reset(token)
        return self._outcome(task, ctx, attempt, gate, reported)

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
