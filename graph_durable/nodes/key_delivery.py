"""How the call's key reaches a provider whose tool code is not ours.

A tool the user wrote reads `current_effect().key` and passes it on. A tool they do not
own (an MCP tool, a toolkit's, an HTTP tool) cannot: `Effect(key_arg=...)` names the
argument that carries the key, the guard fills it on every send (`with_key`), and the
model is given the tool's schema without it (`hidden_key_tools`).

A policy that promises deduplication or a lookup by key (`Effect.reconcilable`) for a
tool that would never pass the key on is refused before anything is sent
(`undelivered_key`): its schema has a key-like argument the policy does not name, or
`key_arg` names no argument of the tool. Where that can only be known after the call (a
tool of the user's own that never read its key), `report_unread_key` warns, naming the
tool and the fix.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from graph_durable.errors import UndeliveredKey
from graph_durable.nodes.context import _CURRENT, current_effect
from graph_durable.policy import Effect

__all__ = ["KEY_LIKE", "UnreadKeyWarning", "hidden_key_tools", "key_header_interceptor",
           "key_like_arguments", "loudly", "report_unread_key", "undelivered_key",
           "with_key"]

log = logging.getLogger("graph_durable")

KEY_LIKE = frozenset({
    "idempotencykey", "idempotencytoken", "idempotencyid", "idempotentkey",
    "dedupekey", "dedupkey", "deduplicationkey", "deduplicationid", "dedupeid",
    "clienttoken", "clientrequesttoken", "clientrequestid",
})
"""Argument names (lower case, without `_` and `-`) that carry an idempotency key."""


class UnreadKeyWarning(UserWarning):
    """A tool declared `idempotent` or looked up ran without reading its key."""


def _normal(name: str) -> str:
    return re.sub(r"[_\-\s]", "", name).lower()


def _arguments(tool: Any) -> dict[str, Any] | None:
    """The tool's arguments as its schema declares them (`None`: not a tool we can read)."""
    try:
        args = tool.args
    except Exception:  # noqa: BLE001 - a tool whose schema cannot be read is not judged
        return None
    return args if isinstance(args, Mapping) else None


def key_like_arguments(tool: Any) -> list[str]:
    """The arguments of `tool` whose names say they carry an idempotency key."""
    return [name for name in _arguments(tool) or () if _normal(name) in KEY_LIKE]


def undelivered_key(name: str, tool: Any, policy: Effect) -> UndeliveredKey | None:
    """Why `tool` (called `name`) would never pass its key on under `policy`, or `None`."""
    arguments = _arguments(tool)
    if arguments is None or policy.read_only:
        return None
    if policy.key_arg is not None:
        if policy.key_arg in arguments:
            return None
        return UndeliveredKey(
            f"Effect(key_arg={policy.key_arg!r}) for tool {name!r} names an argument the "
            f"tool does not have (its arguments: {sorted(arguments)}); name the one that "
            "carries the idempotency key to the provider.", tool=name)
    if not policy.reconcilable:
        return None
    named = key_like_arguments(tool)
    if not named:
        return None
    promise = "idempotent=True" if policy.idempotent else "lookup=..."
    return UndeliveredKey(
        f"Effect({promise}) for tool {name!r} relies on the provider knowing each call's "
        f"key, but the key would never reach it: the tool takes it as {named[0]!r}, which "
        f"the policy does not name, so a call re-sent after a crash would be applied "
        f"twice. Give Effect({promise}, key_arg={named[0]!r}): the guard then fills it "
        "on every send and hides it from the model. Nothing was sent.", tool=name)


def with_key(args: Mapping[str, Any], policy: Effect, key: str) -> Mapping[str, Any]:
    """`args` as sent under `policy`: with the key in `policy.key_arg`, if it names one."""
    if policy.key_arg is None:
        return args
    return {**args, policy.key_arg: key}


def report_unread_key(name: str, policy: Effect, key_read: bool) -> None:
    """Warn, naming the tool and the fix, when a tool whose policy relies on its key
    ran without reading it (`current_effect().key`) or being given it (`key_arg`)."""
    if key_read or policy.key_arg is not None or not policy.reconcilable:
        return
    message = (f"tool {name!r} is guarded with Effect(idempotent=True or lookup=...) but "
               "ran without reading its key (current_effect().key): the provider cannot "
               "dedupe or look up a call by a key it never received, so a call re-sent "
               "after a crash may be applied twice. Pass current_effect().key to the "
               "provider, or, for a tool whose code is not yours, name the argument that "
               "carries it with Effect(key_arg=...).")
    loudly(message, UnreadKeyWarning, name)


def loudly(message: str, category: type[Warning], tool: str) -> None:
    """Say `message` about `tool` where it is heard: the `graph_durable` logger (a
    warning, with the tool as a field) and Python's warnings (`category`)."""
    log.warning(message, extra={"tool": tool})
    warnings.warn(message, category, stacklevel=3)


def key_header_interceptor(header: str = "Idempotency-Key") -> Any:
    """A `langchain-mcp-adapters` tool interceptor that sends each guarded call's key in
    an HTTP header (`MultiServerMCPClient(..., tool_interceptors=[...])`), for MCP
    servers on an HTTP transport that take it there. It reads `current_effect()`, so a
    tool the guard runs gets its own key; outside a guard it adds nothing."""
    async def interceptor(request: Any, handler: Any) -> Any:
        if _CURRENT.get() is None:
            return await handler(request)
        headers = {**(request.headers or {}), header: current_effect().key}
        return await handler(request.override(headers=headers))

    return interceptor


def _without(schema: Mapping[str, Any], argument: str) -> dict[str, Any]:
    properties = {k: v for k, v in (schema.get("properties") or {}).items() if k != argument}
    required = [r for r in schema.get("required") or () if r != argument]
    hidden = {**schema, "properties": properties}
    if required:
        hidden["required"] = required
    else:
        hidden.pop("required", None)
    return hidden


def hidden_key_tools(tools: Sequence[Any], policy_for: Any) -> list[Any]:
    """`tools` as the model should see them: a tool whose policy names a `key_arg` is
    replaced by a copy whose schema lacks that argument (the copy is only bound to the
    model; the guard runs the original). `policy_for(name) -> Effect`."""
    shown = []
    for tool in tools:
        name = getattr(tool, "name", None)
        key_arg = policy_for(name).key_arg if isinstance(name, str) else None
        if key_arg is None or not hasattr(tool, "tool_call_schema"):
            shown.append(tool)
            continue
        schema = tool.tool_call_schema
        as_json = schema if isinstance(schema, dict) else schema.model_json_schema()
        shown.append(tool.model_copy(update={"args_schema": _without(as_json, key_arg)}))
    return shown
