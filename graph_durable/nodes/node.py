"""`EffectGuardNode`: a LangGraph `ToolNode` whose writes go through the effect ledger."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp, GraphInterrupt
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import (
    AsyncToolCallWrapper,
    ToolCallRequest,
    ToolCallWrapper,
)

from graph_durable._langgraph import (
    _default_handle_tool_errors,
    _handle_tool_error,
    _infer_handled_types,
)
from graph_durable.nodes.core import Started
from graph_durable.nodes.guard import GuardCore
from graph_durable.nodes.interrupts import pending_placeholder, raise_interrupts, withdrawal
from graph_durable.nodes.key_delivery import hidden_key_tools
from graph_durable.nodes.tripwire import arm
from graph_durable.nodes.protocol import Ask
from graph_durable.policy import Effect

__all__ = ["EffectGuardNode"]



@dataclass
class _TaskState:
    """What the calls of the task being run share (across its worker threads)."""

    asks: list[tuple[Ask, str]] = field(default_factory=list)
    """Questions asked by the calls, raised as one interrupt when the task ends."""
    started: dict[str, Started] = field(default_factory=dict)
    """Write calls claimed together before the task ran them, by tool_call_id."""
    repeats: bool = True
    """Whether a tool_call_id repeats among the step's calls (then copies of one call
    wait for each other; see `GuardCore.run`)."""
    running: int = 0
    """Async calls of the task still running (see `settled`)."""
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    async def settled(self, timeout: float = 30.0) -> None:
        """Wait until the task's async calls have ended. `asyncio.gather` lets the others
        run on when one raises; a tool's interrupt must not leave a question half-asked."""
        if self.running:
            await asyncio.wait_for(self.idle.wait(), timeout)

    def take_started(self, request: ToolCallRequest) -> Started | None:
        started = self.started.pop(request.tool_call["id"], None)
        if started is not None and not started.matches(request):
            # Cannot happen without a wrapper rewriting calls (then nothing is claimed
            # ahead); the call claims on its own and finds its key known.
            return None
        return started


def _repeats(calls: list[tuple[dict[str, Any], bool]]) -> bool:
    ids = [call.get("id") for call, _ in calls]
    return not calls or len(set(ids)) != len(ids)


_TASK: ContextVar[_TaskState | None] = ContextVar("graph_durable_task", default=None)

ErrorHandling = bool | str | Callable[..., str] | type[Exception] | tuple[type[Exception], ...]


class EffectGuardNode(ToolNode):
    """A `ToolNode` that records intent, key and receipt of every external write.

    Args:
        tools: The tools, as for `ToolNode`.
        effects: `{tool_name: Effect(...)}`; tools not named get `default`.
        default: Policy of unnamed tools; `Effect()` (no dedupe, no lookup) if omitted.
        handle_tool_errors: Applied to read-only tools only. Write tools classify errors
            themselves: `NotApplied` -> failed, `Retryable` -> retried, anything else ->
            unknown, because turning an unknown outcome into an error message would let
            the model send the effect again.
        name: As for `ToolNode`.
        tags: As for `ToolNode`.
        messages_key: As for `ToolNode`.
        wrap_tool_call: Your own wrapper, run around the guard.
        awrap_tool_call: Your own async wrapper, run around the guard.

    Each call that needs a human is asked in its own interrupt (LangChain's per-call
    shape, with a `response_schema`); resume with `Command(resume={interrupt_id:
    decision, ...})`, any subset of them (or one bare decision when one call is pending),
    or let `review(graph, config)` build it. Run the graph with `durability="sync"`.
    """

    def __init__(
        self,
        tools: Sequence[BaseTool | Callable],
        *,
        effects: Mapping[str, Effect] | None = None,
        default: Effect | None = None,
        name: str = "tools",
        tags: list[str] | None = None,
        handle_tool_errors: ErrorHandling = _default_handle_tool_errors,
        messages_key: str = "messages",
        wrap_tool_call: ToolCallWrapper | None = None,
        awrap_tool_call: AsyncToolCallWrapper | None = None,
    ) -> None:
        self._guard = GuardCore(effects, default, messages_key=messages_key)
        self._read_only_errors = handle_tool_errors
        self._user_wrap = wrap_tool_call
        self._user_awrap = awrap_tool_call
        super().__init__(
            tools,
            name=name,
            tags=tags,
            handle_tool_errors=_default_handle_tool_errors,
            messages_key=messages_key,
            wrap_tool_call=self._wrap_guarded,
            awrap_tool_call=self._awrap_guarded,
        )
        unknown = sorted(set(self._guard.effects) - set(self.tools_by_name))
        if unknown:
            raise ValueError(
                f"effects names tools this node does not have: {unknown}; "
                f"its tools are {sorted(self.tools_by_name)}"
            )
        for tool_name, tool in self.tools_by_name.items():
            self._guard.check_key_delivery(tool_name, tool)
        arm(self.tools_by_name.values(), self._guard.policy_for)

    @property
    def model_tools(self) -> list[BaseTool]:
        """The node's tools as the model should see them: bind these
        (`model.bind_tools(node.model_tools)`). A tool whose policy names a `key_arg` is
        shown without that argument; the guard fills it when it sends the call."""
        return hidden_key_tools(list(self.tools_by_name.values()), self._guard.policy_for)

    @property
    def guard(self) -> GuardCore:
        """The guard core (policies by tool)."""
        return self._guard

    # -- one task: resolve decisions, run the calls, ask once --------------------------

    def _calls_of(self, input: Any) -> list[tuple[dict[str, Any], bool]]:
        """The step's tool calls, as `(tool_call, has_tool)`, to claim them together.

        Nothing is claimed ahead when your own wrapper runs around the guard: it may
        rewrite or skip calls, so each call claims for itself.
        """
        if self._user_wrap is not None or self._user_awrap is not None:
            return []
        tool_calls, _ = self._parse_input(input)
        return [(call, call["name"] in self.tools_by_name) for call in tool_calls]

    def _func(self, input: Any, config: RunnableConfig, runtime: Any) -> Any:
        self._guard.resolve_decisions(config, self.tools_by_name)
        calls = self._calls_of(input)
        state = _TaskState(started=self._guard.claim_step(
            calls, config, self._extract_state(input, config)), repeats=_repeats(calls))
        token = _TASK.set(state)
        try:
            output = super()._func(input, config, runtime)
        except GraphInterrupt:
            unask = withdrawal(state.asks)
            if unask is not None:
                self._guard.task_saver(config).apply(unask, config)
            raise
        finally:
            _TASK.reset(token)
        raise_interrupts(state.asks)
        return output

    async def _afunc(self, input: Any, config: RunnableConfig, runtime: Any) -> Any:
        await self._guard.aresolve_decisions(config, self.tools_by_name)
        calls = self._calls_of(input)
        state = _TaskState(started=await self._guard.aclaim_step(
            calls, config, self._extract_state(input, config)), repeats=_repeats(calls))
        token = _TASK.set(state)
        try:
            output = await super()._afunc(input, config, runtime)
        except GraphInterrupt:
            await state.settled()
            unask = withdrawal(state.asks)
            if unask is not None:
                await self._guard.task_saver(config).aapply(unask, config)
            raise
        finally:
            _TASK.reset(token)
        raise_interrupts(state.asks)
        return output

    # -- one call ------------------------------------------------------------------------

    @staticmethod
    def _defer_ask(ask: Ask, interrupt_id: str) -> ToolMessage:
        state = _TASK.get()
        if state is None:
            raise RuntimeError("EffectGuardNode asked a question outside of its task")
        state.asks.append((ask, interrupt_id))
        return pending_placeholder(ask)

    @staticmethod
    def _started(request: ToolCallRequest) -> Started | None:
        state = _TASK.get()
        return None if state is None else state.take_started(request)

    def _wrap_guarded(self, request: ToolCallRequest, execute: Callable) -> Any:
        def guarded(req: ToolCallRequest) -> Any:
            if self._guard.policy_for(req.tool_call["name"]).read_only:
                return self._run_read_only(req, execute)
            state = _TASK.get()
            return self._guard.run(req, execute, self._defer_ask, self._started(req),
                                   repeats=state is None or state.repeats)

        if self._user_wrap is not None:
            return self._user_wrap(request, guarded)
        return guarded(request)

    async def _awrap_guarded(self, request: ToolCallRequest, execute: Callable) -> Any:
        async def guarded(req: ToolCallRequest) -> Any:
            if self._guard.policy_for(req.tool_call["name"]).read_only:
                try:
                    return await execute(req)
                except Exception as exc:
                    return self._read_only_error(req, exc)
            state = _TASK.get()
            if state is None:
                return await self._guard.arun(req, execute, self._defer_ask, None)
            state.running += 1
            try:
                return await self._guard.arun(req, execute, self._defer_ask,
                                               state.take_started(req), repeats=state.repeats)
            finally:
                state.running -= 1
                if not state.running:
                    state.idle.set()

        if self._user_awrap is not None:
            return await self._user_awrap(request, guarded)
        return await guarded(request)

    def _run_read_only(self, request: ToolCallRequest, execute: Callable) -> Any:
        try:
            return execute(request)
        except Exception as exc:
            return self._read_only_error(request, exc)

    def _read_only_error(self, request: ToolCallRequest, exc: Exception) -> ToolMessage:
        """A read-only tool's exception as `handle_tool_errors` asks (the ToolNode's own
        rule); re-raised when it is not handled, and always for a `GraphBubbleUp` (an
        interrupt, a parent command), which is LangGraph's control flow, not an error."""
        flag = self._read_only_errors
        if isinstance(exc, GraphBubbleUp) or flag is _default_handle_tool_errors or not flag:
            raise exc
        if isinstance(flag, tuple):
            handled: tuple[type[Exception], ...] = flag
        elif isinstance(flag, type):
            handled = (flag,)
        elif callable(flag):
            handled = _infer_handled_types(flag)
        else:
            handled = (Exception,)
        if not isinstance(exc, handled):
            raise exc
        return ToolMessage(
            content=_handle_tool_error(exc, flag=flag),
            name=request.tool_call["name"],
            tool_call_id=request.tool_call["id"],
            status="error",
        )
