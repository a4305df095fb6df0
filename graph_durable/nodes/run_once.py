"""The same call twice in one step: run once, answer both.

A model may repeat a tool call, same id and same args, in one AIMessage: one requested
call, one key, so one effect, and both calls get its answer. `RunOnce` lets the first
copy run it and makes the others wait for its answer.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, Protocol

from langchain_core.messages import ToolMessage

__all__ = ["RunOnce", "same_answer"]


class _Started(Protocol):
    """What `RunOnce` needs of a started call (`core.Started`)."""

    task: Any
    ctx: Any
    protocol: Any


class RunOnce:
    """The calls running now in this process, by `(thread_id, key)`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[tuple[str, str], concurrent.futures.Future[Any]] = {}

    def lead(self, started: _Started, repeats: bool
             ) -> tuple[concurrent.futures.Future[Any] | None, bool]:
        """`(running, leader)`: the future of the call with this key running now, and
        whether this caller runs it (else its protocol is closed and it waits for the
        answer). `repeats=False` says no other call of the step has this call's id:
        nothing to wait for."""
        if not repeats:
            return None, True
        slot = (started.task.thread_id, started.ctx.key)
        with self._lock:
            running = self._running.get(slot)
            if running is not None:
                started.protocol.close()
                return running, False
            running = self._running[slot] = concurrent.futures.Future()
            return running, True

    def settle(self, started: _Started, running: concurrent.futures.Future[Any] | None,
               result: Any = None, error: BaseException | None = None) -> None:
        """Hand the leader's answer (or error) to the copies waiting for it."""
        if running is None:
            return
        with self._lock:
            self._running.pop((started.task.thread_id, started.ctx.key), None)
        if error is not None:
            running.set_exception(error)
        else:
            running.set_result(result)


def same_answer(result: Any) -> Any:
    """The answer of a call's first copy, for a second copy of it."""
    return result.model_copy() if isinstance(result, ToolMessage) else result
