"""One entry into the tool per guarded attempt.

`create_agent` nests middleware in list order (first = outermost), and the handler a
middleware receives may be called any number of times. A middleware listed after
`EffectGuardMiddleware` runs inside it: `ToolRetryMiddleware` there calls the tool again
when the first call raised, under the same key, and so sends a second time an effect
whose answer was lost (a second charge with a provider that does not dedupe), while the
ledger records one attempt.

The guard hands the middleware inside it a request whose tool is gated: the first entry
runs the tool, a second entry within the same attempt is refused before it reaches the
tool, by an exception no `except Exception` can swallow. A middleware that answers in
the tool's place after the tool raised (`ToolErrorMiddleware` turning a lost answer into
an error message the ledger would take for "not applied") is caught the same way. The
guard then stops the run with `MiddlewareOrderError`, leaving the attempt in flight, so
the next run reconciles it as after a crash (lookup, same-key re-send, or a human's
decision).
"""

from __future__ import annotations

import threading
from typing import Any

from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt.tool_node import ToolCallRequest, ToolInvocationError
from pydantic import ValidationError

from graph_durable.errors import MiddlewareOrderError, NotApplied, Retryable

__all__ = ["ReentryRefused", "ToolGate", "inner_approval"]


class ReentryRefused(BaseException):
    """Raised into the middleware inside the guard when it enters the tool a second time
    in one guarded attempt. A `BaseException`, so that a retry or error-handling
    middleware's `except Exception` lets it through to the guard."""


class ToolGate:
    """Lets one guarded attempt enter its tool once.

    Args:
        thread_id: The thread of the call (for the error message).
        tool_call_id: The call's id.
        tool: The tool's name.
    """

    def __init__(self, thread_id: str, tool_call_id: str, tool: str) -> None:
        self.thread_id = thread_id
        self.tool_call_id = tool_call_id
        self.tool = tool
        self.entered = False
        self.refused = False
        self.first_error: BaseException | None = None
        """What the first entry raised, if it raised (its answer is then lost)."""
        self._lock = threading.Lock()

    def request(self, request: ToolCallRequest) -> ToolCallRequest:
        """`request` with its tool gated (a copy of the tool whose `invoke` and `ainvoke`
        pass through this gate; everything else about the tool is unchanged)."""
        tool = request.tool
        if tool is None:
            return request
        gated = tool.model_copy()

        def invoke(input: Any, config: Any = None, **kwargs: Any) -> Any:
            self._enter()
            try:
                return tool.invoke(input, config, **kwargs)
            except BaseException as exc:
                self.first_error = exc
                raise

        async def ainvoke(input: Any, config: Any = None, **kwargs: Any) -> Any:
            self._enter()
            try:
                return await tool.ainvoke(input, config, **kwargs)
            except BaseException as exc:
                self.first_error = exc
                raise

        # Instance attributes shadow the class's methods; pydantic keeps them out of
        # the tool's fields.
        object.__setattr__(gated, "invoke", invoke)
        object.__setattr__(gated, "ainvoke", ainvoke)
        return request.override(tool=gated)

    def overruled(self, answered: bool) -> bool:
        """Whether the middleware inside the guard overruled the tool: it entered the
        tool twice, or (`answered`: it returned an answer) answered in the tool's place
        after the tool raised an error that leaves the outcome unknown. An error that
        says nothing was applied (`NotApplied`, `Retryable`, arguments the tool's schema
        refused, which `ToolNode` itself answers) may be answered by anyone."""
        first = self.first_error
        return self.refused or (answered and first is not None and not isinstance(
            first, NotApplied | Retryable | ValidationError | ToolInvocationError
            | GraphBubbleUp))

    def _enter(self) -> None:
        with self._lock:
            if self.entered:
                self.refused = True
                raise ReentryRefused(self.error().args[0])
            self.entered = True

    def lost(self) -> str:
        """Why the attempt's outcome is not known (for the ledger)."""
        first = self.first_error
        what = (f"the tool raised {type(first).__name__}: {first}" if first is not None
                else "the tool's answer was set aside")
        then = ("called the tool again, which was refused before it reached the tool"
                if self.refused else "answered in the tool's place")
        return f"{what}; a middleware inside EffectGuardMiddleware then {then}"

    def error(self) -> MiddlewareOrderError:
        """The error that stops the run."""
        if self.refused:
            what = ("(ToolRetryMiddleware, or another that calls the tool handler again) "
                    "called tool call {call} a second time, under the same key: that would "
                    "send the effect twice while the ledger records one attempt. The second "
                    "call was refused, so nothing was sent twice.")
        else:
            what = ("(ToolErrorMiddleware, or another that answers for the tool) answered "
                    "tool call {call} in the tool's place after the tool raised, so the "
                    "ledger would record as not applied an effect that may exist. Nothing "
                    "was sent twice.")
        call = f"{self.tool_call_id!r} ({self.tool}) in thread {self.thread_id!r}"
        return MiddlewareOrderError(
            "A middleware listed after EffectGuardMiddleware " + what.format(call=call)
            + " List ToolRetryMiddleware (and any other middleware that re-calls tools or "
            "answers for them) BEFORE EffectGuardMiddleware in "
            "create_agent(middleware=[...]), then run the thread again: the call stays in "
            "flight and is reconciled then (looked up, re-sent under its key if the "
            "provider dedupes, or asked about).",
            thread_id=self.thread_id, tool_call_id=self.tool_call_id)


def inner_approval(paused: BaseException, thread_id: str, tool_call_id: str, tool: str
                   ) -> MiddlewareOrderError | None:
    """The refusal of a `HumanInTheLoopMiddleware` listed after the guard, if `paused`
    (the tool's interrupt) is its per-call approval of this call; `None` otherwise.

    Listed after it, the reviewer's answer reaches the tool inside the guard, so an
    edit would send arguments the ledger does not record under a key derived from
    others. Nothing was sent; the call resumes as asked once the order is fixed.
    """
    for interrupt in paused.args[0] if paused.args else ():
        value = getattr(interrupt, "value", None)
        if (isinstance(value, dict) and value.get("type") == "tool_approval"
                and "key" not in value and value.get("tool_call_id") == tool_call_id):
            return MiddlewareOrderError(
                f"HumanInTheLoopMiddleware asks about tool call {tool_call_id!r} "
                f"({tool}) in thread {thread_id!r} from inside "
                "EffectGuardMiddleware: an edit would then send arguments the ledger "
                "does not record. List HumanInTheLoopMiddleware before "
                "EffectGuardMiddleware in create_agent(middleware=[...]) and run the "
                "thread again; nothing was sent.",
                thread_id=thread_id, tool_call_id=tool_call_id)
    return None
