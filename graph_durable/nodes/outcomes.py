"""What the drivers tell the protocol about a tool call before and after it runs.

Once a tool's body has been entered, only `NotApplied` (and `Retryable`, once attempts
run out) says the effect was not applied; any other error is an unknown outcome. So the
drivers must know two things an error ToolMessage hides:

- whether the body was entered at all: the args are validated against the tool's own
  schema before sending (`refused_args`), as `BaseTool` does before running the body, so
  a `ValidationError` that reaches the guard afterwards was raised inside the body;
- whether the tool said "not applied": `NotApplied` and `Retryable` note themselves
  while the guard watches (`watch_reports`), so one that an error handler (a
  `ToolNode`'s `handle_tool_errors`, a middleware) turned into an error ToolMessage
  still reads as what it is (`read_reports`).

`call_with_timeout` runs a blocking call on a worker thread and gives up waiting after
its timeout (lookups use it).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest, ToolInvocationError
from pydantic import BaseModel, ValidationError
from pydantic.v1 import BaseModel as BaseModelV1
from pydantic.v1 import ValidationError as ValidationErrorV1

from graph_durable.errors import _REPORTED, NotApplied, Retryable
from graph_durable.nodes.protocol import Outcome

__all__ = ["call_with_timeout", "read_reports", "refused_args", "watch_reports"]


def _fields(schema: Any) -> set[str]:
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return set(schema.model_fields)
    if isinstance(schema, type) and issubclass(schema, BaseModelV1):
        return set(schema.__fields__)
    return set()


def refused_args(request: ToolCallRequest) -> ToolInvocationError | None:
    """The error the tool's own argument validation raises for this call, if any.

    The call's args are validated against the tool's `args_schema`, as `BaseTool` does
    before it runs the body. Errors about arguments the tool gets injected (graph state,
    the runtime, the tool_call_id; not in `tool_call_schema`) are left to the tool, and
    so is anything this check cannot read: it is never stricter than the tool, so an arg
    it refuses would never have reached the body.
    """
    tool, args = request.tool, request.tool_call["args"]
    schema = getattr(tool, "args_schema", None)
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
        error = exc
    except Exception:  # noqa: BLE001 - a schema this check cannot run is the tool's to run
        return None
    try:
        injected = fields - _fields(tool.tool_call_schema)  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001
        return None
    details = [e for e in error.errors()
               if not injected or (e["loc"] and e["loc"][0] not in injected)]
    if not details:
        return None
    return ToolInvocationError(request.tool_call["name"], error, args,  # type: ignore[arg-type]
                               details)  # type: ignore[arg-type]


@contextmanager
def watch_reports() -> Iterator[list[Exception]]:
    """Collect the `NotApplied` and `Retryable` errors made while the block runs (in
    this context and the contexts copied from it: worker threads, tasks)."""
    reported: list[Exception] = []
    token = _REPORTED.set(reported)
    try:
        yield reported
    finally:
        _REPORTED.reset(token)


def read_reports(outcome: Outcome, reported: list[Exception]) -> Outcome:
    """`outcome`, or the tool's own `NotApplied`/`Retryable` when an error handler turned
    it into the error ToolMessage that came back."""
    result = outcome.value
    if (outcome.error is None and isinstance(result, ToolMessage) and result.status == "error"
            and reported and isinstance(reported[-1], NotApplied | Retryable)):
        return Outcome(error=reported[-1])
    return outcome


def call_with_timeout(fn: Callable[[], Any], timeout: float | None, name: str
                      ) -> tuple[bool, Any, BaseException | None]:
    """`(answered, value, error)` of `fn()`; with a timeout, `fn` runs on a daemon thread
    that is abandoned (`answered` False) if it has not returned in time."""
    if timeout is None:
        try:
            return True, fn(), None
        except Exception as exc:  # noqa: BLE001 - the caller reads it
            return True, None, exc
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
        return False, None, None
    error = box.get("error")
    if error is not None and not isinstance(error, Exception):
        raise error
    return True, box.get("value"), error
