"""A guarded tool that runs outside any guard is reported, not silent.

A tool object can be handed to more than one agent: deepagents gives its default
`general-purpose` subagent the main agent's tools but not the main agent's middleware,
and a supervisor's or a swarm's agents may share tools. There, a tool the guard knows
as a write runs with no ledger: nothing is recorded, and a crash can send it twice. A
tool that reads `current_effect()` fails loudly there (`LookupError`); one that does
not would run silently.

So a guard arms each write tool it is given (`arm`): the tool's function is wrapped,
once, to check that a guard is running this very call. Run outside one (a subagent
running inside another tool's guarded call counts as outside), it logs a warning on the
`graph_durable` logger and raises `UnguardedToolWarning`, naming the tool and the fix,
and runs with no effect context, so that `current_effect()` fails in it rather than
hand it the key of the call that started the subagent.
Read-only tools are not armed; a tool whose function cannot be reached (no `func` or
`coroutine`, as with a `BaseTool` subclass that writes `_run` itself) is left alone.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from graph_durable.nodes.context import _CURRENT
from graph_durable.nodes.key_delivery import loudly
from graph_durable.policy import Effect

__all__ = ["UnguardedToolWarning", "arm"]

_ARMED: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


class UnguardedToolWarning(UserWarning):
    """A tool a guard knows as a write ran outside any guard (no ledger)."""


def _report(name: str) -> None:
    message = (f"tool {name!r} is guarded as a write but ran outside any guard: nothing "
               "was recorded, and a crash could send it again. Give every agent that "
               "runs it the guard (for a deep agent's default subagent, pass "
               "subagents=[{'name': 'general-purpose', ..., 'middleware': "
               "[EffectGuardMiddleware(...)]}]), or mark it Effect(read_only=True).")
    loudly(message, UnguardedToolWarning, name)


def _guarded_here(name: str) -> bool:
    """Whether a guard runs this call of tool `name` now. A context of another tool's
    call (a subagent run by a guarded `task` call) does not count."""
    context = _CURRENT.get()
    return context is not None and context.tool == name


def _checked(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    # Outside its own guard the tool runs with no effect context, so a tool that reads
    # `current_effect()` fails loudly instead of taking another call's key.
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def acall(*args: Any, **kwargs: Any) -> Any:
            if _guarded_here(name):
                return await fn(*args, **kwargs)
            _report(name)
            token = _CURRENT.set(None)
            try:
                return await fn(*args, **kwargs)
            finally:
                _CURRENT.reset(token)

        return acall

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if _guarded_here(name):
            return fn(*args, **kwargs)
        _report(name)
        token = _CURRENT.set(None)
        try:
            return fn(*args, **kwargs)
        finally:
            _CURRENT.reset(token)

    return call


def arm(tools: Iterable[Any], policy_for: Callable[[str], Effect]) -> None:
    """Arm each write tool of `tools` (see the module docstring); each tool once."""
    for tool in tools:
        name = getattr(tool, "name", None)
        if not isinstance(name, str) or id(tool) in _ARMED or policy_for(name).read_only:
            continue
        for attribute in ("func", "coroutine"):
            fn = getattr(tool, attribute, None)
            if callable(fn):
                try:
                    setattr(tool, attribute, _checked(fn, name))
                except (AttributeError, TypeError, ValueError):  # a tool that will not be armed
                    pass
        _ARMED[id(tool)] = tool
