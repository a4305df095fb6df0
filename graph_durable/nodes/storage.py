"""A database that failed under a guarded call's write says which call, and whether it
was sent: nothing was sent (the claim, a decision), or it was sent and its receipt is
not recorded yet, which resuming the thread reconciles. The savers raise
`DatabaseUnavailable` (or `StorageFull`) naming the thread; the drivers add the call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graph_durable.errors import DatabaseUnavailable

__all__ = ["described"]


def described(exc: DatabaseUnavailable, thread_id: str, tool_call: Mapping[str, Any],
              sent: bool) -> DatabaseUnavailable:
    """`exc`, its message naming the thread, `tool_call` and whether it was `sent` (once:
    an error already described is left as it is). A `tool_call` without an id is the
    answers of a resume, read or journaled before any call of them runs."""
    if exc.sent is not None:
        return exc
    name = f"{tool_call.get('id')!r} ({tool_call.get('name')})"
    if tool_call.get("id") is None:
        outcome = ("It broke while the answers of this resume were read or recorded, "
                   "before any call they answer ran: Nothing was sent, and no answer was "
                   "recorded; resume with the same answers once the database takes "
                   "writes again.")
    elif sent:
        outcome = (f"The guarded call {name} was sent, and its receipt is not recorded "
                   "yet: resume the thread once the database takes writes again, and it is "
                   "reconciled (a lookup, a same-key re-send, or a question for a person); "
                   "it is never sent under a new key.")
    else:
        outcome = f"The guarded call {name} was not sent: Nothing was sent."
    message = str(exc.args[0]) if exc.args else str(exc)
    if thread_id and f"thread {thread_id!r}" not in message:
        message = f"Thread {thread_id!r}: {message}"
    exc.args = (f"{message} {outcome}", *exc.args[1:])
    exc.sent = sent
    exc.thread_id = exc.thread_id or thread_id
    exc.tool_call_id = exc.tool_call_id or tool_call.get("id")
    return exc
