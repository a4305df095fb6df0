"""What the guard tells `graph_durable.telemetry` about each guarded call.

The drivers open a call's observation once it is keyed (`telemetry.observe`) and close it with
the outcome the protocol named on the path it took (`observed_outcome`, from
`CallContext.outcome`); a call refused before its protocol ran is reported as `refused`.
A tool that runs carries the call's key, tool_call_id and policy as run metadata, when
someone sees its run (`traced`, `with_metadata`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from graph_durable import telemetry
from graph_durable.nodes.call_context import CallContext
from graph_durable.nodes.task import Task
from graph_durable.policy import Effect

try:  # LangChain's own test for LangSmith tracing (the environment, or a `with` block)
    from langchain_core.tracers.context import _tracing_v2_is_enabled
except ImportError:  # pragma: no cover - a release that moved it
    from langsmith.utils import tracing_is_enabled as _tracing_v2_is_enabled

__all__ = ["call_info", "observed_outcome", "refused", "traced", "with_metadata"]


def call_info(task: Task, key: str | None, policy: Effect,
              kind: Literal["tool", "guarded"]) -> telemetry.CallInfo:
    """The call of `task` as telemetry names it."""
    call = task.call
    return telemetry.CallInfo(task.thread_id, str(call.get("name")), call.get("id"), key,
                              _label(policy), kind)


_LABELS: dict[int, tuple[Effect, str]] = {}
"""`telemetry.policy_label` of the policies met, by identity (a policy is frozen, and a
guard names the same few policies on every call)."""


def _label(policy: Effect) -> str:
    known = _LABELS.get(id(policy))
    if known is not None and known[0] is policy:
        return known[1]
    label = telemetry.policy_label(policy)
    if len(_LABELS) >= 256:
        _LABELS.clear()
    _LABELS[id(policy)] = (policy, label)
    return label


def observed_outcome(observed: telemetry.ObservedCall, ctx: CallContext) -> None:
    """Tell telemetry what became of the call (unless it stopped before the protocol
    knew: then it is reported `aborted`)."""
    if ctx.outcome is not None:
        observed.outcome(telemetry.CallOutcome(ctx.outcome))


def refused(info: telemetry.CallInfo, task: Task, error: BaseException) -> None:
    """Report a call refused before its protocol ran."""
    telemetry.report(telemetry.CallReport(info, telemetry.CallOutcome.REFUSED,
                                          error_type=type(error).__name__), task.config)


def traced(config: Mapping[str, Any]) -> bool:
    """Whether anyone sees a tool's run: a callback handler of the run, or LangSmith
    tracing (which LangChain adds when the tool runs). Without one the tool is not
    copied to carry metadata nobody reads.

    The answer for the last callbacks seen is kept: a step's calls share their task's
    callback manager, and LangSmith's test reads the environment each time."""
    global _last_traced
    callbacks = config.get("callbacks")
    last = _last_traced  # one tuple, read and replaced whole: safe across threads
    if callbacks is not None and last[0] is callbacks:
        return last[1]
    handlers = getattr(callbacks, "handlers", callbacks)
    seen = bool(handlers) or bool(_tracing_v2_is_enabled())
    if callbacks is not None:
        _last_traced = (callbacks, seen)
    return seen


_last_traced: tuple[Any, bool] = (None, False)
"""`(callbacks, traced)` of the last call to `traced` that had callbacks."""


def with_metadata(tool: Any, info: telemetry.CallInfo, attempts: int) -> Any:
    """`tool` whose LangChain run carries the guarded call's metadata (a copy: a tool's
    own `metadata` is merged into its run's)."""
    metadata = {**(getattr(tool, "metadata", None) or {}), **telemetry.run_metadata(info),
                telemetry.ATTRIBUTES["attempts"]: attempts}
    try:
        return tool.model_copy(update={"metadata": metadata})
    except Exception:  # noqa: BLE001 - a tool that cannot be copied runs as it is
        return tool
