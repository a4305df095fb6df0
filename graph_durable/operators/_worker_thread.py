"""Async twins of the operators' sync functions, run on a worker thread.

An operator's read or write (`inbox`, `record_decisions`, `find_orphans`,
`resolve_orphan`) is written once, synchronously, with its parameters. Its async twin
takes the same arguments and awaits it run on a worker thread (`asyncio.to_thread`):
there an async saver's sync methods run its async ones on the caller's event loop, which
the await leaves free, and a sync saver or a sync lookup never blocks that loop.
`twin_of` gives the twin the sync function's parameters, so they are written once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

__all__ = ["twin_of"]

P = ParamSpec("P")
R = TypeVar("R")


def twin_of(sync: Callable[P, R]) -> Callable[[Callable[..., Coroutine[Any, Any, R]]],
                                              Callable[P, Coroutine[Any, Any, R]]]:
    """Give the async function it decorates (which takes `*args, **kwargs` and passes
    them on to `sync`) `sync`'s parameters: its signature, for `inspect`, `help()` and
    type checkers."""

    def decorate(twin: Callable[..., Coroutine[Any, Any, R]]
                 ) -> Callable[P, Coroutine[Any, Any, R]]:
        twin.__signature__ = inspect.signature(sync)  # type: ignore[attr-defined]
        return twin

    return decorate
