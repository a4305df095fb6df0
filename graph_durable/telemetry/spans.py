"""A guarded call as a span: one `ObservedCall` from the guard's first look at the call
to its outcome, with child spans for what reaches the provider.

    with observe(CallInfo(thread_id, tool, tool_call_id, key, policy), config) as call:
        call.event("intent_claimed")
        with call.provider_call():           # the tool; call.lookup(), call.undo() alike
            result = tool(...)
        call.event("receipt_recorded")
        call.outcome(CallOutcome.SENT, attempts=1)
    # leaving the block reports it: `report` (or `areport` under `async with`)

`observe` is both a sync and an async context manager; the child spans are plain `with`
blocks, which work around an `await` too. When OpenTelemetry is installed the call is a
span named `guarded_call <tool>` in the caller's current trace (so a provider client's
own spans nest under `provider_call`); without it, the block costs two clock reads and
the report.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Literal

from graph_durable.telemetry import _otel
from graph_durable.telemetry.emit import LOG_LEVELS, areport, logger, quiet, report
from graph_durable.telemetry.model import ATTRIBUTES, CallInfo, CallOutcome, CallReport

__all__ = ["CallEvent", "ObservedCall", "ProviderSpan", "QuietCall", "observe",
           "observe_lazily"]

CallEvent = Literal["intent_claimed", "receipt_recorded", "decision_journaled",
                    "lease_taken", "lease_lost"]
"""The span events of a guarded call: its intent claimed in the ledger, its receipt
recorded, a decision journaled, its thread's lease taken or lost."""

_ERROR_OUTCOMES = frozenset({CallOutcome.FAILED, CallOutcome.REFUSED, CallOutcome.ABORTED,
                             CallOutcome.COMPENSATION_FAILED})
"""Outcomes whose span ends with status ERROR."""


class ProviderSpan:
    """What a guarded call sends to the provider (`operation`: `send`, `lookup` or
    `undo`): a child span, and its time in the histogram `graph_durable.provider.duration`."""

    __slots__ = ("_call", "_operation", "_start", "_span", "_token", "duration")

    def __init__(self, call: ObservedCall, operation: str) -> None:
        self._call = call
        self._operation = operation
        self._span: Any = None
        self._token: Any = None
        self.duration: float | None = None
        """Seconds the block took, once it has ended."""

    def __enter__(self) -> ProviderSpan:
        otel = self._call._otel
        parent = self._call._span
        if otel is not None and parent is not None:
            self._span = otel.tracer.start_span(
                self._operation if self._operation != "send" else "provider_call",
                context=otel.trace.set_span_in_context(parent),
                attributes={ATTRIBUTES["tool"]: self._call.call.tool,
                            ATTRIBUTES["operation"]: self._operation})
            self._token = otel.context.attach(otel.trace.set_span_in_context(self._span))
        self._start = time.perf_counter()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.duration = time.perf_counter() - self._start
        otel = self._call._otel
        if otel is None:
            return
        if otel.metering():
            attributes = {ATTRIBUTES["tool"]: self._call.call.tool,
                          ATTRIBUTES["operation"]: self._operation}
            if exc_type is not None:
                attributes[ATTRIBUTES["error_type"]] = exc_type.__name__
            otel.provider_duration.record(self.duration, attributes)
        if self._span is not None:
            if exc_type is not None:
                self._span.set_attribute(ATTRIBUTES["error_type"], exc_type.__name__)
                self._span.set_status(otel.trace.StatusCode.ERROR)
            self._span.end()
            otel.context.detach(self._token)


class ObservedCall:
    """One guarded call being observed (made by `observe`): a sync and an async context
    manager that reports the call's outcome when the block ends."""

    __slots__ = ("call", "config", "recording", "_otel", "_span", "_token", "_start",
                 "_outcome", "_attempts", "_error_type")

    def __init__(self, call: CallInfo, config: Mapping[str, Any] | None = None) -> None:
        self.call = call
        """The call observed."""
        self.config = config
        """The run's config the report's callback event goes to."""
        self.recording = False
        """Whether the call is a recorded span, which keeps its `event`s (set on entering
        the block): without one, an event need not be made."""
        self._otel: _otel.Instruments | None = None
        self._span: Any = None
        self._token: Any = None
        self._outcome: CallOutcome | None = None
        self._attempts: int | None = None
        self._error_type: str | None = None

    def outcome(self, outcome: CallOutcome, *, attempts: int | None = None,
                error: BaseException | type[BaseException] | str | None = None) -> None:
        """Say how the call ended (the last word counts); reported when the block ends.

        Args:
            outcome: How it ended.
            attempts: How many times the tool has been called for this key.
            error: The error that decided it (only its class name is kept).
        """
        self._outcome = outcome if type(outcome) is CallOutcome else CallOutcome(outcome)
        self._attempts = attempts
        self._error_type = None if error is None else _type_name(error)

    def event(self, name: CallEvent, **attributes: str | int | float | bool) -> None:
        """Add a span event (`CallEvent`) to the call's span; nothing without
        OpenTelemetry. Attributes must not carry args or receipts."""
        if self._span is not None:
            self._span.add_event(name, attributes)

    def provider_call(self) -> ProviderSpan:
        """A child span around the call of the tool (the provider call)."""
        return ProviderSpan(self, "send")

    def lookup(self) -> ProviderSpan:
        """A child span around a lookup of the key at the provider."""
        return ProviderSpan(self, "lookup")

    def undo(self) -> ProviderSpan:
        """A child span around a compensating call."""
        return ProviderSpan(self, "undo")

    def __enter__(self) -> ObservedCall:
        otel = self._otel = _otel.instruments()
        if otel is not None and otel.tracing():
            call = self.call
            self._span = otel.tracer.start_span(
                f"guarded_call {call.tool}",
                attributes={name: value for name, value in (
                    (ATTRIBUTES["thread_id"], call.thread_id), (ATTRIBUTES["tool"], call.tool),
                    (ATTRIBUTES["tool_call_id"], call.tool_call_id),
                    (ATTRIBUTES["key"], call.key), (ATTRIBUTES["policy"], call.policy),
                    (ATTRIBUTES["kind"], call.kind)) if value is not None})
            self._token = otel.context.attach(otel.trace.set_span_in_context(self._span))
            self.recording = True
        self._start = time.perf_counter()
        return self

    def _finish(self, exc_type: type[BaseException] | None) -> CallReport:
        outcome = self._outcome
        error_type = self._error_type
        if outcome is None:  # the block ended before the guard knew what became of the call
            outcome = CallOutcome.ABORTED
            error_type = error_type or _type_name(exc_type)
        return CallReport(self.call, outcome, time.perf_counter() - self._start,
                          self._attempts, error_type)

    def _end_span(self, rep: CallReport) -> None:
        otel, span = self._otel, self._span
        if otel is None or span is None:
            return
        span.set_attributes({name: value for name, value in (
            (ATTRIBUTES["outcome"], rep.outcome.value), (ATTRIBUTES["attempts"], rep.attempts),
            (ATTRIBUTES["error_type"], rep.error_type)) if value is not None})
        if rep.outcome in _ERROR_OUTCOMES:
            span.set_status(otel.trace.StatusCode.ERROR)
        span.end()
        otel.context.detach(self._token)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        rep = self._finish(exc_type)
        try:
            report(rep, self.config)
        finally:
            self._end_span(rep)

    async def __aenter__(self) -> ObservedCall:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        rep = self._finish(exc_type)
        try:
            await areport(rep, self.config)
        finally:
            self._end_span(rep)


class QuietCall(ObservedCall):
    """A guarded call that nothing but the log would hear of (`emit.quiet`): no span, no
    callback handler, no `custom` stream, no meter. It keeps what `outcome` is told,
    and reports it when the block ends only if the `graph_durable` logger logs that
    outcome's level (`LOG_LEVELS`); its `CallInfo` is made then, or when `call` is
    read, not before. Its provider spans still time their block (`duration`)."""

    __slots__ = ("_make_info", "_info")

    def __init__(self, make_info: Callable[[], CallInfo],
                 config: Mapping[str, Any] | None = None) -> None:
        self._make_info = make_info
        self._info: CallInfo | None = None
        self.config = config
        self.recording = False
        self._otel = None
        self._span = None
        self._outcome = None
        self._attempts = None
        self._error_type = None

    @property  # type: ignore[override]
    def call(self) -> CallInfo:
        """The call observed (made on first use)."""
        if self._info is None:
            self._info = self._make_info()
        return self._info

    def __enter__(self) -> QuietCall:
        self._start = time.perf_counter()
        return self

    def _logged(self) -> bool:
        return logger.isEnabledFor(LOG_LEVELS[self._outcome or CallOutcome.ABORTED])

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._logged():
            report(self._finish(exc_type), self.config)

    async def __aenter__(self) -> QuietCall:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._logged():
            await areport(self._finish(exc_type), self.config)


def _type_name(error: BaseException | type[BaseException] | str | None) -> str | None:
    if error is None or isinstance(error, str):
        return error
    return (error if isinstance(error, type) else type(error)).__name__


def observe(call: CallInfo, config: Mapping[str, Any] | None = None) -> ObservedCall:
    """Observe one guarded call: `with observe(call, config) as c:` (or `async with`).

    Leaving the block reports the outcome given to `c.outcome(...)`; a block left by an
    exception before any outcome was given reports `aborted` with the error's class name
    (an interrupt the guard raises should be preceded by `c.outcome(PAUSED_...)`).

    Args:
        call: The call.
        config: The `RunnableConfig` of the run (the task's), for the callback event.
    """
    return ObservedCall(call, config)


def observe_lazily(make_call: Callable[[], CallInfo],
                   config: Mapping[str, Any] | None = None) -> ObservedCall:
    """`observe(make_call(), config)`, or a `QuietCall` when a report would reach
    nothing but the log (`emit.quiet`): what the guard observes every call with, so
    that a call nobody watches costs no span, no report and no `CallInfo`."""
    if quiet(config):
        return QuietCall(make_call, config)
    return ObservedCall(make_call(), config)
