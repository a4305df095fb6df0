"""Where a guarded call's report goes: LangChain callbacks, LangGraph's custom stream,
OpenTelemetry metrics and the `graph_durable` logger.

    report(CallReport(call, CallOutcome.RECONCILED, attempts=1), config)        # sync
    await areport(CallReport(call, CallOutcome.PAUSED_UNKNOWN), config)         # async

Each channel is quiet when it has nowhere to go: no run (a config without a parent run
id) sends no callback event, no graph run (or a stream without `custom` mode) writes
nothing to the stream, no OpenTelemetry sends no metric, and the logger says nothing
unless the application configures logging. A channel that fails never fails the call.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import FunctionType, MethodType
from typing import Any

from langchain_core.callbacks import BaseCallbackManager
from langchain_core.callbacks.manager import adispatch_custom_event, dispatch_custom_event
from langgraph.config import get_stream_writer

from graph_durable.telemetry import _otel
from graph_durable.telemetry.model import ATTRIBUTES, CallInfo, CallOutcome, CallReport

__all__ = ["EVENT", "LOG_LEVELS", "RUN_TAG", "areport", "log_lease_takeover", "logger",
           "quiet", "report", "run_metadata", "with_run_metadata"]

EVENT = "graph_durable.outcome"
"""Name of the LangChain custom event (and the `event` of a stream chunk) a report is."""

RUN_TAG = "graph_durable"
"""The tag a guarded tool's LangChain run carries (`run_metadata`)."""

logger = logging.getLogger("graph_durable")
"""The library's logger: recovery decisions, with structured `extra` fields."""
logger.addHandler(logging.NullHandler())  # silent, even for warnings, until the app configures logging

LOG_LEVELS: Mapping[CallOutcome, int] = {
    CallOutcome.SENT: logging.DEBUG,
    CallOutcome.REPLAYED: logging.DEBUG,
    CallOutcome.FAILED: logging.DEBUG,
    CallOutcome.RECONCILED: logging.INFO,
    CallOutcome.RESENT: logging.INFO,
    CallOutcome.DECIDED: logging.INFO,
    CallOutcome.PAUSED_APPROVAL: logging.INFO,
    CallOutcome.PAUSED_TOOL: logging.INFO,
    CallOutcome.COMPENSATED: logging.INFO,
    CallOutcome.PAUSED_UNKNOWN: logging.WARNING,
    CallOutcome.REFUSED: logging.WARNING,
    CallOutcome.COMPENSATION_FAILED: logging.WARNING,
    CallOutcome.COMPENSATION_UNKNOWN: logging.WARNING,
    CallOutcome.ABORTED: logging.WARNING,
}
"""How loud each outcome is logged: the recovery decisions (reconcile, re-send, a pause,
a refusal) at INFO or WARNING, the everyday paths at DEBUG."""

_WHAT = {
    CallOutcome.SENT: "sent",
    CallOutcome.RESENT: "re-sent under its key",
    CallOutcome.REPLAYED: "replayed from its receipt, not sent",
    CallOutcome.RECONCILED: "reconciled: a lookup found the effect, not sent again",
    CallOutcome.DECIDED: "settled by a reviewer's decision, not sent",
    CallOutcome.PAUSED_APPROVAL: "paused for approval",
    CallOutcome.PAUSED_UNKNOWN: "paused: outcome unknown, a person must decide",
    CallOutcome.PAUSED_TOOL: "paused by the tool's own interrupt",
    CallOutcome.FAILED: "failed: not applied",
    CallOutcome.REFUSED: "refused before sending",
    CallOutcome.COMPENSATED: "compensated",
    CallOutcome.COMPENSATION_FAILED: "compensation failed",
    CallOutcome.COMPENSATION_UNKNOWN: "compensation outcome unknown",
    CallOutcome.ABORTED: "aborted before its outcome was known",
}


def _manager(config: Mapping[str, Any] | None) -> Any:
    """The run's callback manager when a custom event can reach a handler, else `None`
    (no config, no run, or a run without handlers: nothing to dispatch to)."""
    if not config:
        return None
    callbacks = config.get("callbacks")
    if (isinstance(callbacks, BaseCallbackManager) and callbacks.parent_run_id is not None
            and callbacks.handlers):
        return callbacks
    return None


_SILENT = (lambda _: None).__code__
"""The code of a writer that does nothing (LangGraph's when the run does not stream
`custom`): `RESUME; LOAD_CONST None; RETURN_VALUE`, nothing else."""


def _silent(writer: Any) -> bool:
    """Whether `writer` is a Python function (or a method of one) whose body does
    nothing (it reads no name and calls nothing: its code is `_SILENT`'s). Anything
    else, a wrapper that forwards `__code__` included, counts as a listener."""
    function = writer.__func__ if isinstance(writer, MethodType) else writer
    if not isinstance(function, FunctionType):
        return False
    code = function.__code__
    return code.co_code == _SILENT.co_code and code.co_consts == _SILENT.co_consts


def quiet(config: Mapping[str, Any] | None) -> bool:
    """Whether a report made now would reach nothing but the log: the run has no
    callback handler, it streams no `custom` events (outside a graph run nobody does),
    and OpenTelemetry records neither spans nor measurements. A guarded call then keeps
    its outcome for the log alone (`spans.QuietCall`)."""
    if _manager(config) is not None:
        return False
    otel = _otel.instruments()
    if otel is not None and (otel.tracing() or otel.metering()):
        return False
    try:
        writer = get_stream_writer()
    except (RuntimeError, KeyError, AttributeError):
        return True  # outside a graph run (or a context that lost it): nobody streams
    return _silent(writer)


def _write_stream(payload: dict[str, Any]) -> None:
    try:
        get_stream_writer()({"event": EVENT, **payload})
    except (RuntimeError, KeyError, AttributeError):
        pass  # outside a graph run (or a context that lost it): nobody streams


def _count(rep: CallReport) -> None:
    otel = _otel.instruments()
    if otel is not None and otel.metering():
        call = rep.call
        otel.calls.add(1, {ATTRIBUTES["tool"]: call.tool, ATTRIBUTES["outcome"]: rep.outcome.value,
                           ATTRIBUTES["kind"]: call.kind})


def _log(rep: CallReport) -> None:
    level = LOG_LEVELS[rep.outcome]
    if logger.isEnabledFor(level):
        call = rep.call
        logger.log(level, "%s call %s to %s in thread %s %s (key %s)", call.kind,
                   call.tool_call_id, call.tool, call.thread_id, _WHAT[rep.outcome], call.key,
                   extra={"thread_id": call.thread_id, "tool_call_id": call.tool_call_id,
                          "key": call.key, "tool": call.tool, "outcome": rep.outcome.value,
                          "policy": call.policy, "attempts": rep.attempts})


def report(rep: CallReport, config: Mapping[str, Any] | None = None) -> None:
    """Tell every channel how a guarded call ended (sync code).

    Sends the LangChain custom event `graph_durable.outcome` to the run's callback
    handlers (LangSmith, Langfuse, `astream_events` and any handler see it), writes the
    same payload with `event` set to LangGraph's custom stream (`stream_mode="custom"`),
    counts it in the OpenTelemetry counter `graph_durable.calls`, and logs it.

    Args:
        rep: The report.
        config: The `RunnableConfig` of the run the call belongs to (the task's); without
            one, no callback event is sent.
    """
    payload = rep.payload()
    manager = _manager(config)
    if manager is not None:
        try:
            dispatch_custom_event(EVENT, payload, config=config)  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - a handler's failure is not the call's
            logger.debug("custom event %s not dispatched", EVENT, exc_info=True)
    _write_stream(payload)
    _count(rep)
    _log(rep)


async def areport(rep: CallReport, config: Mapping[str, Any] | None = None) -> None:
    """`report` for async code: the callback event goes through async handlers."""
    payload = rep.payload()
    manager = _manager(config)
    if manager is not None:
        try:
            await adispatch_custom_event(EVENT, payload, config=config)  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - a handler's failure is not the call's
            logger.debug("custom event %s not dispatched", EVENT, exc_info=True)
    _write_stream(payload)
    _count(rep)
    _log(rep)


def log_lease_takeover(thread_id: str, owner: str, previous_owner: str | None,
                       token: int | None = None) -> None:
    """Log that `owner` took `thread_id`'s lease over from `previous_owner`, whose lease
    had expired (a worker that stopped, or one too slow to renew)."""
    if logger.isEnabledFor(logging.WARNING):
        logger.warning("lease of thread %s taken over by %s from %s (fencing token %s)",
                       thread_id, owner, previous_owner, token,
                       extra={"thread_id": thread_id, "owner": owner,
                              "previous_owner": previous_owner, "fencing_token": token})


def run_metadata(call: CallInfo) -> dict[str, Any]:
    """The metadata a guarded tool's LangChain run carries: the effect's key (an HMAC
    when keys are secret), tool_call_id, policy and thread, under `ATTRIBUTES` names."""
    return {ATTRIBUTES["key"]: call.key, ATTRIBUTES["tool_call_id"]: call.tool_call_id,
            ATTRIBUTES["policy"]: call.policy, ATTRIBUTES["thread_id"]: call.thread_id,
            ATTRIBUTES["kind"]: call.kind}


def with_run_metadata(config: Mapping[str, Any] | None, call: CallInfo) -> dict[str, Any]:
    """`config` with `run_metadata(call)` merged into its metadata and `RUN_TAG` into its
    tags: the config to run the guarded tool with, so that its run (and every handler
    that sees it) carries them."""
    from langchain_core.runnables.config import merge_configs

    return merge_configs(dict(config or {}),  # type: ignore[return-value,arg-type]
                         {"metadata": run_metadata(call), "tags": [RUN_TAG]})
