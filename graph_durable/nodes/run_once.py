"""The same call twice in one step: run once, answer both.

A model may repeat a tool call, same id and same args, in one AIMessage: one requested
call, one key, so one effect, and both calls get its answer. `RunOnce` lets the first
copy run it and makes the others wait for its answer. A reviewer's edit can make one call
of a message another one under the same tool_call_id (same tool, same args: one key);
the edited call joins that key (`join`) as a copy of it would, so that one journaled
decision is acted on once, never by both calls at the same time.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, Protocol

from langchain_core.messages import ToolMessage

from graph_durable.errors import GraphDurableError

__all__ = ["EditedIntoEachOther", "RunOnce", "same_answer"]


class EditedIntoEachOther(GraphDurableError):
    """Raised by `RunOnce.join` (and thrown into the protocol) when a call would wait,
    through the calls it waits for, for itself: calls edited into each other."""


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
        self._led_by: dict[tuple[str, str], tuple[str, str]] = {}
        """The slot of the call leading each slot joined (`join`)."""
        self._waiting: dict[tuple[str, str], tuple[str, str]] = {}
        """The slot each leading call waits for (`join`)."""

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

    def join(self, thread_id: str, ctx: Any, key: str
             ) -> tuple[concurrent.futures.Future[Any] | None, bool]:
        """`(running, leader)` for the call keyed `key` that the running call of `ctx`
        (a `CallContext`) turned into (an edit): the future of another call of this process running it
        (whose answer is this call's), or a new one this call leads, settled with its own
        (`settle`). A call that, through the calls it waits for, waits for this one (two
        edits, each into the other call) is refused rather than waited for forever."""
        me, slot = (thread_id, ctx.key), (thread_id, key)
        with self._lock:
            if self._led_by.get(slot, slot) == me:
                return None, True  # joined before (a retry of the protocol's step)
            running = self._running.get(slot)
            if running is None:
                running = self._running[slot] = concurrent.futures.Future()
                self._led_by[slot] = me
                return running, True
            leader, seen = self._led_by.get(slot, slot), {me}
            while leader not in seen:
                seen.add(leader)
                waited = self._waiting.get(leader)
                if waited is None:
                    break
                leader = self._led_by.get(waited, waited)
            else:
                raise EditedIntoEachOther(
                    f"Two calls under tool_call_id {ctx.tool_call_id!r} ({ctx.tool}) in "
                    f"thread {thread_id!r} were each edited into the other: this one would "
                    "wait for the other, which waits for it. Nothing was sent for this "
                    "one: run the thread again, and each is answered from what the other "
                    "did.", thread_id=thread_id, tool_call_id=ctx.tool_call_id)
            self._waiting[me] = slot
            return running, False

    def done_waiting(self, thread_id: str, ctx: Any) -> None:
        """The call of `ctx` has its answer from the call it joined."""
        with self._lock:
            self._waiting.pop((thread_id, ctx.key), None)

    def settle(self, started: _Started, running: concurrent.futures.Future[Any] | None,
               result: Any = None, error: BaseException | None = None) -> None:
        """Hand the leader's answer (or error) to the copies waiting for it, and to the
        calls waiting for the keys it joined."""
        if running is None and not self._led_by:
            return
        me = (started.task.thread_id, started.ctx.key)
        with self._lock:
            futures = [] if running is None else [running]
            if running is not None:
                self._running.pop(me, None)
            for slot in [slot for slot, leader in self._led_by.items() if leader == me]:
                del self._led_by[slot]
                futures.append(self._running.pop(slot))
            self._waiting.pop(me, None)
        for future in futures:
            if future.done():  # cancelled by a waiter's cancelled task
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)


def same_answer(result: Any) -> Any:
    """The answer of a call's first copy, for a second copy of it."""
    return result.model_copy() if isinstance(result, ToolMessage) else result
