"""What a guarded call came back with, decided in one place: `classify`.

A tool's (or a lookup's, or a compensation's) result or exception becomes an `Outcome`
in `classify` and nowhere else. `Outcome` is one of a few small frozen types, one per
thing that can happen, so the protocol (`graph_durable.nodes.protocol`) matches on it:

- `Returned`: the call returned (for a tool, possibly an error ToolMessage);
- `Raised`: it raised once its body ran, so the effect may exist, unless the error is
  `NotApplied` (or `Retryable`, retried while attempts remain);
- `TimedOut`: no answer within the policy's timeout; the attempt may still land;
- `StillRunning`: not sent, because an earlier attempt abandoned after its timeout
  still runs in this process and may still land;
- `ArgsRefused`: not sent, because the args fail the tool's own schema;
- `Paused`: the tool asked a question of its own (LangGraph's `interrupt()`) before
  applying anything;
- `Overruled`: a middleware inside the guard overruled the tool (`nodes.reentry`).

Once a tool's body has been entered, only `NotApplied` (and `Retryable`, once attempts
run out) says the effect was not applied. So the guard must know two things an error
ToolMessage hides: whether the body was entered at all (`refused_args` validates the
args against the tool's schema before sending, as `BaseTool` does before running the
body), and whether the tool said "not applied": `NotApplied` and `Retryable` note
themselves while the guard watches (`watch_reports`), so one an error handler turned
into an error ToolMessage still reads as what it is.

`call_with_timeout` runs a blocking call, on a worker thread when it has a timeout (the
thread is abandoned if it does not answer in time); `call_lookup` and `acall_lookup` ask
a policy's lookup, for the guard's drivers and the compensation drivers alike.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.errors import GraphBubbleUp, GraphInterrupt
from langgraph.prebuilt.tool_node import ToolInvocationError
from pydantic import BaseModel, ValidationError
from pydantic.v1 import BaseModel as BaseModelV1
from pydantic.v1 import ValidationError as ValidationErrorV1

from graph_durable.errors import _REPORTED, NotApplied, Retryable
from graph_durable.nodes.reentry import ReentryRefused, ToolGate
from graph_durable.policy import Effect

__all__ = [
    "ArgsRefused",
    "Attempt",
    "Outcome",
    "Overruled",
    "Paused",
    "Raised",
    "Returned",
    "StillRunning",
    "TimedOut",
    "acall_lookup",
    "call_lookup",
    "call_with_timeout",
    "classify",
    "refused_args",
    "watch_reports",
]


@dataclass(frozen=True, slots=True)
class Returned:
    """The call returned `value`: a tool's ToolMessage or Command (an error message
    too), a lookup's record of the effect (`None`: certainly absent)."""

    value: Any


@dataclass(frozen=True, slots=True)
class Raised:
    """The call raised `error` once it ran: the effect may exist, unless `error` is
    `NotApplied` or `Retryable`."""

    error: BaseException


@dataclass(frozen=True, slots=True)
class TimedOut:
    """No answer within the policy's timeout: the attempt may still land."""


@dataclass(frozen=True, slots=True)
class StillRunning:
    """Not sent: an earlier attempt of this process, abandoned after its timeout, still
    runs and may still land (`error` says which); nothing may be sent again until a
    lookup finds the effect or a human decides."""

    error: BaseException


@dataclass(frozen=True, slots=True)
class ArgsRefused:
    """Not sent: the args fail the tool's own schema (`error` says how), so the tool's
    body never ran and the effect was certainly not applied."""

    error: BaseException


@dataclass(frozen=True, slots=True)
class Paused:
    """The tool asked a question of its own before applying anything: `interrupt` is
    raised once journaled (or the refusal of a wrong middleware order that stands for
    it), and the tool is called again with the answer."""

    interrupt: BaseException


@dataclass(frozen=True, slots=True)
class Overruled:
    """A middleware inside the guard overruled the tool in this attempt (called it a
    second time, refused before it reached the tool, or answered in its place after it
    raised): what the tool did is not known (`error` says why), and `refusal` is raised
    once journaled."""

    error: BaseException
    refusal: BaseException


Outcome = Returned | Raised | TimedOut | StillRunning | ArgsRefused | Paused | Overruled
"""What a guarded call (or a lookup, or a compensation) came back with."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """What running a call gave, before `classify` reads it: its value, or what it
    raised, or no answer in time."""

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False


def _propagates(error: BaseException) -> bool:
    """Whether `error` is not the call's outcome but LangGraph's or the process's own
    (a `Command` to a parent graph, a cancellation, `KeyboardInterrupt`): it goes on up."""
    if isinstance(error, GraphBubbleUp):
        return not isinstance(error, GraphInterrupt)
    return not isinstance(error, Exception | ReentryRefused)


def classify(attempt: Attempt, *, gate: ToolGate | None = None,
             reported: Sequence[Exception] = (),
             on_pause: Callable[[GraphInterrupt], BaseException] | None = None) -> Outcome:
    """The outcome of `attempt`: the one place a result or an exception is read.

    Args:
        attempt: What running the call gave.
        gate: The tool's gate, when a middleware runs inside the guard: if it overruled
            the tool, the outcome is `Overruled` whatever the middleware made of it.
        reported: The `NotApplied` / `Retryable` errors the tool made while it ran
            (`watch_reports`): an error ToolMessage a handler made of one reads as it.
        on_pause: What to raise for the tool's own interrupt (the interrupt itself by
            default).

    Raises:
        What must go on up rather than be an outcome (see `_propagates`).
    """
    error = attempt.error
    if gate is not None and gate.refused:
        return Overruled(ReentryRefused(gate.lost()), gate.error())
    if error is not None and _propagates(error):
        raise error
    outcome: Outcome
    if attempt.timed_out:
        outcome = TimedOut()
    elif isinstance(error, GraphInterrupt):
        outcome = Paused(error if on_pause is None else on_pause(error))
    elif error is not None:
        outcome = Raised(error)
    else:
        outcome = Returned(attempt.value)
    if gate is not None and gate.overruled(answered=isinstance(outcome, Returned)):
        return Overruled(ReentryRefused(gate.lost()), gate.error())
    if (isinstance(outcome, Returned) and isinstance(outcome.value, ToolMessage)
            and outcome.value.status == "error" and reported
            and isinstance(reported[-1], NotApplied | Retryable)):
        return Raised(reported[-1])
    return outcome


def call_with_timeout(fn: Callable[[], Any], timeout: float | None, name: str,
                      abandoned: Callable[[threading.Thread], None] | None = None) -> Attempt:
    """Run `fn()`; with a timeout, on a daemon thread (in a copy of this context) that is
    abandoned if it has not returned in time (`abandoned` is told of it). Whatever `fn`
    raises is in the attempt; `classify` decides what goes on up."""
    if timeout is None:
        try:
            return Attempt(value=fn())
        except BaseException as exc:  # noqa: BLE001 - classify reads it
            return Attempt(error=exc)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    worker = threading.Thread(target=contextvars.copy_context().run, args=(target,),
                              daemon=True, name=name)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        if abandoned is not None:
            abandoned(worker)
        return Attempt(timed_out=True)
    return Attempt(value=box.get("value"), error=box.get("error"))


class watch_reports:  # noqa: N801 - used as a function: `with watch_reports() as reported`
    """Collect the `NotApplied` and `Retryable` errors made while the block runs (in
    this context and the contexts copied from it: worker threads, tasks).

    A class rather than a `contextmanager` generator: it wraps every tool call."""

    __slots__ = ("_reported", "_token")

    def __enter__(self) -> list[Exception]:
        self._reported: list[Exception] = []
        self._token = _REPORTED.set(self._reported)
        return self._reported

    def __exit__(self, *exc_info: object) -> None:
        _REPORTED.reset(self._token)


def _no_lookup() -> Outcome:
    return Raised(LookupError("no lookup"))


def call_lookup(policy: Effect, key: str, *, timeout: float | None = None,
                tool: str = "", use_async: str = "use the async API") -> Outcome:
    """Ask `policy`'s lookup (of `tool`) about `key` from sync code, for at most `timeout`
    seconds (then on a worker thread, abandoned if it does not answer: a lookup that does
    not answer cannot tell). `Returned(None)` is "certainly absent"; an async lookup
    cannot be asked from here (`use_async` says what to do instead)."""
    lookup = policy.lookup
    if lookup is None:
        return _no_lookup()
    attempt = call_with_timeout(lambda: lookup(key), timeout, f"graph-durable-lookup-{tool}")
    if inspect.isawaitable(attempt.value):
        if inspect.iscoroutine(attempt.value):
            attempt.value.close()
        return Raised(TypeError(f"lookup for {tool!r} is async; {use_async}"))
    return classify(attempt)


async def acall_lookup(policy: Effect, key: str, *, timeout: float | None = None) -> Outcome:
    """Ask `policy`'s lookup about `key` from async code: an async lookup is awaited, a
    sync one (a blocking HTTP or database call) runs on a worker thread, never on the
    event loop; for at most `timeout` seconds."""
    lookup: Any = policy.lookup
    if lookup is None:
        return _no_lookup()

    async def ask() -> Any:
        if _is_async_callable(lookup):
            return await lookup(key)
        found = await asyncio.to_thread(lookup, key)
        return (await found) if inspect.isawaitable(found) else found

    try:
        attempt = Attempt(value=await asyncio.wait_for(ask(), timeout))
    except asyncio.TimeoutError:
        attempt = Attempt(timed_out=True)
    except Exception as exc:  # noqa: BLE001 - classify reads it
        attempt = Attempt(error=exc)
    return classify(attempt)


def _is_async_callable(fn: Any) -> bool:
    """Whether calling `fn` returns a coroutine (a coroutine function, or an object whose
    `__call__` is one)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None))


_FIELDS: weakref.WeakKeyDictionary[type, frozenset[str]] = weakref.WeakKeyDictionary()
"""The fields of each schema class met (a model's fields are fixed once it is built, and
reading them from pydantic costs more than the check that uses them)."""


def _fields(schema: Any) -> frozenset[str]:
    if not isinstance(schema, type):
        return frozenset()
    fields = _FIELDS.get(schema)
    if fields is None:
        if issubclass(schema, BaseModel):
            fields = frozenset(schema.model_fields)
        elif issubclass(schema, BaseModelV1):
            fields = frozenset(schema.__fields__)
        else:
            fields = frozenset()
        _FIELDS[schema] = fields
    return fields


def refused_args(request: Any) -> ToolInvocationError | None:
    """The error the tool's own argument validation raises for `request` (a
    `ToolCallRequest` or a `WriteRequest`: its `tool` and `tool_call`), if any.

    The call's args are validated against the tool's `args_schema`, as `BaseTool` does
    before it runs the body. Errors about arguments the tool gets injected (graph state,
    the runtime, the tool_call_id; not in `tool_call_schema`) are left to the tool, and
    so is anything this check cannot read: it is never stricter than the tool, so an arg
    it refuses would never have reached the body.
    """
    tool, call = request.tool, request.tool_call
    args = call["args"]
    schema: Any = getattr(tool, "args_schema", None)
    fields = _fields(schema)
    if not fields or not isinstance(args, dict):
        return None  # BaseTool validates nothing then either
    try:
        if issubclass(schema, BaseModel):
            schema.model_validate(args)
        else:
            schema.parse_obj(args)
        return None
    except (ValidationError, ValidationErrorV1) as exc:
        error: Any = exc
    except Exception:  # noqa: BLE001 - a schema this check cannot run is the tool's to run
        return None
    try:
        injected = fields - _fields(getattr(tool, "tool_call_schema", None))
    except Exception:  # noqa: BLE001
        return None
    details: list[Any] = [e for e in error.errors()
                          if not injected or (e["loc"] and e["loc"][0] not in injected)]
    if not details:
        return None
    return ToolInvocationError(call["name"], error, args, details)
