"""`EffectGuardMiddleware`: the effect guard for LangChain's `create_agent`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from graph_durable._extras import require

require("agents", "EffectGuardMiddleware (LangChain's create_agent)", "langchain.agents.middleware")

from langchain.agents.middleware import (  # noqa: E402
    AgentMiddleware,
    ModelRequest,
    ModelResponse,
)
from langgraph.prebuilt.tool_node import ToolCallRequest

from graph_durable.nodes.guard import GuardCore
from graph_durable.nodes.interrupts import raise_interrupts
from graph_durable.nodes.key_delivery import hidden_key_tools
from graph_durable.nodes.tripwire import arm
from graph_durable.nodes.task import config_of as _config_of
from graph_durable.nodes.protocol import Ask
from graph_durable.policy import Effect

__all__ = ["EffectGuardMiddleware"]


def _tools_of(request: ToolCallRequest) -> dict[str, Any]:
    """The agent's tools by name (the call's own among them): an edit's args are checked
    against its tool's schema, the edits of the other calls answered with it included."""
    tools = {tool.name: tool for tool in getattr(request.runtime, "tools", None) or ()}
    if request.tool is not None:
        tools[request.tool_call["name"]] = request.tool
    return tools


def _interrupt_now(ask: Ask, interrupt_id: str) -> Any:
    raise_interrupts([(ask, interrupt_id)])


class EffectGuardMiddleware(AgentMiddleware):
    """Guards the tools of a `create_agent` agent with the effect ledger.

    `create_agent` runs each tool call as its own task, so each call that needs a human
    raises its own interrupt; `review(graph, config)` builds the resume command for all
    of them. Compile the agent with a durable saver and run it with `durability="sync"`.

    List it after any middleware that may call the tool handler again or answer for it
    (`ToolRetryMiddleware`, a per-call `HumanInTheLoopMiddleware`): those then run
    outside the guard, and each of their calls goes through the ledger under the same
    key. Listed after the guard, such a middleware is refused (`MiddlewareOrderError`)
    before it sends anything a second time.

    Args:
        effects: `{tool_name: Effect(...)}`; tools not named get `default`.
        default: Policy of unnamed tools; `Effect()` (no dedupe, no lookup) if omitted.
    """

    def __init__(
        self, effects: Mapping[str, Effect] | None = None, default: Effect | None = None
    ) -> None:
        super().__init__()
        self.guard = GuardCore(effects, default)
        self.guard.refuse_inner_approvals = True
        self.guard.refuse_reentry = True
        self._key_args = any(policy.key_arg for policy in (*self.guard.effects.values(),
                                                            self.guard.default))

    def _hidden_keys(self, request: ModelRequest) -> ModelRequest:
        """The model request with each tool whose policy names a `key_arg` shown without
        that argument: the guard fills it when it sends the call. The agent's write
        tools are armed first (`nodes.tripwire`): run outside a guard, they say so."""
        arm(request.tools, self.guard.policy_for)
        if not self._key_args:
            return request
        return request.override(tools=hidden_key_tools(request.tools, self.guard.policy_for))

    def wrap_model_call(self, request: ModelRequest,
                        handler: Callable[[ModelRequest], ModelResponse]) -> ModelResponse:
        """Give the model the tools' schemas without the arguments the guard fills."""
        return handler(self._hidden_keys(request))

    async def awrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[ModelResponse]]
    ) -> ModelResponse:
        """Give the model the tools' schemas without the arguments the guard fills."""
        return await handler(self._hidden_keys(request))

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Any]
    ) -> Any:
        """Run the call through the ledger (sync)."""
        if request.tool is not None:
            self.guard.check_key_delivery(request.tool_call["name"], request.tool)
        if not self.guard.policy_for(request.tool_call["name"]).read_only:
            self.guard.resolve_decisions(_config_of(request), _tools_of(request))
        return self.guard.run(request, handler, _interrupt_now)

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[Any]]
    ) -> Any:
        """Run the call through the ledger (async)."""
        if request.tool is not None:
            self.guard.check_key_delivery(request.tool_call["name"], request.tool)
        if not self.guard.policy_for(request.tool_call["name"]).read_only:
            await self.guard.aresolve_decisions(_config_of(request), _tools_of(request))
        return await self.guard.arun(request, handler, _interrupt_now)
