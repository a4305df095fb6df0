"""How a guarded call is keyed: the strategy the guard is given.

The guard (`graph_durable.nodes.core`) runs one protocol for every guarded call; what
differs between a tool call and a guarded write is only where the call's key comes from
and which checkpoint must be stored before it is sent. A `CallKeys` says that:

- `ToolCallKeys` (the tool node and the middleware): the key is anchored to the
  AIMessage that requested the call (`graph_durable.nodes.anchor`), a call repeated by a
  restarted subgraph keeps its earlier key (`graph_durable.nodes.restarts`), and the
  checkpoint the task runs from must be stored;
- `WriteKeys` (`graph_durable.nodes.write_keys`): the key is anchored to the root
  checkpoint the step was first run from and the task's place in the graph.

Both build the call's `CallContext` as a generator of reads, which the guard's drivers
perform.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Generator, Hashable, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeVar

from langgraph.prebuilt.tool_node import ToolCallRequest

from graph_durable._langgraph import CONFIG_KEY_CHECKPOINT_MAP
from graph_durable.ledger import Keying
from graph_durable.nodes.anchor import (
    UNREAD,
    Request,
    call_anchor,
    request_of,
    requested_args,
    requests_of,
)
from graph_durable.nodes.call_context import CallContext
from graph_durable.nodes.operations import Read
from graph_durable.nodes.restarts import ForkOrigin, earlier_effect, fork_links, restart_root
from graph_durable.nodes.task import Task
from graph_durable.policy import Effect

__all__ = ["BoundedCache", "CallKeys", "ForkLinks", "ToolCallKeys", "adopt_legacy_key",
           "adopt_sent_args_key"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

Where = tuple[str, str, str]
"""A checkpoint: `(thread_id, checkpoint_ns, checkpoint_id)`."""


class BoundedCache(OrderedDict[K, V]):
    """A dict of facts that never change once known (a stored checkpoint, the forks a
    checkpoint came from), holding the `limit` most recently added."""

    def __init__(self, limit: int = 1024) -> None:
        super().__init__()
        self.limit = limit

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        while len(self) > self.limit:
            self.popitem(last=False)


class ForkLinks:
    """Where each root checkpoint comes from (`restarts.fork_links`: the root
    checkpoints it was forked or updated from, nearest first), read once per
    checkpoint: that never changes."""

    def __init__(self) -> None:
        self._known: BoundedCache[tuple[str, str], ForkOrigin] = BoundedCache()

    def origin(self, thread_id: str, root: str) -> Generator[Read, Any, ForkOrigin]:
        """Where `root` (a root checkpoint of `thread_id`) comes from."""
        known = self._known.get((thread_id, root))
        if known is None:
            known = self._known[(thread_id, root)] = yield from fork_links(thread_id, root)
        return known

    def sources(self, thread_id: str, root: str) -> Generator[Read, Any, tuple[str, ...]]:
        """What `root` (a root checkpoint of `thread_id`) was forked from."""
        return (yield from self.origin(thread_id, root)).sources


class CallKeys(Protocol):
    """Where a guarded call's key comes from (see the module docstring)."""

    kind: Literal["tool", "guarded"]
    """What the calls keyed so are, as telemetry names them (`telemetry.CallKind`)."""

    def config_of(self, request: Any) -> Mapping[str, Any]:
        """The config of the task the call runs in."""

    def fork_root(self, task: Task) -> Where | None:
        """The checkpoint whose fork links the key is read through, which must be
        stored first (a run from a checkpoint id saves its fork in the background)."""

    def requesting_checkpoint(self, task: Task) -> Where | None:
        """The checkpoint that must be stored before the call is sent."""

    def context(self, task: Task, request: Any, policy: Effect, keying: Keying
                ) -> Generator[Read, Any, CallContext]:
        """The call's protocol context, keyed."""


def adopt_legacy_key(ctx: CallContext, keying: Keying, thread_id: str
                     ) -> Generator[Read, Any, None]:
    """Key the call as before keys were anchored, if its effect was recorded that way:
    by the args the model asked for, or, for a call a middleware before the guard
    changed, by the args it is sent with (as those releases keyed it)."""
    if keying.legacy:
        legacy = yield Read("effect", (ctx.legacy_key(), thread_id))
        if legacy is None and ctx.requested_args is not None:
            legacy = yield Read("effect", (ctx.legacy_key(sent=True), thread_id))
        if legacy is not None:
            ctx.key = legacy.key


def adopt_sent_args_key(ctx: CallContext, thread_id: str) -> Generator[Read, Any, None]:
    """Key the call as earlier releases did (`CallContext.sent_args_key`), if its
    effect was recorded that way: a call changed before the guard under a tool_call_id
    that calls to other tools share (a thread resumed across the upgrade)."""
    earlier = yield Read("effect", (ctx.sent_args_key(), thread_id))
    if earlier is not None:
        ctx.key = earlier.key


class ToolCallKeys:
    """The keys of tool calls: anchored to the AIMessage in the node's state that
    requested each (`messages_key` names where its messages are)."""

    kind: Literal["tool", "guarded"] = "tool"

    def __init__(self, messages_key: str = "messages") -> None:
        self.messages_key = messages_key
        self.forks = ForkLinks()

    def config_of(self, request: ToolCallRequest) -> Mapping[str, Any]:
        """The config of the tool call's task (from the request's runtime)."""
        return getattr(request.runtime, "config", None) or {}

    def fork_root(self, task: Task) -> Where | None:
        """The root checkpoint a call in a subgraph runs from (`restarts.restart_root`)."""
        return restart_root(task.conf)

    def requesting_checkpoint(self, task: Task) -> Where | None:
        """The checkpoint the task runs from: the step that requested the call."""
        return task.requesting_checkpoint()

    def context(self, task: Task, request: ToolCallRequest, policy: Effect, keying: Keying
                ) -> Generator[Read, Any, CallContext]:
        """The call's context, keyed (legacy key, restarts)."""
        return self.step_context(task, request.tool_call, request.state, policy, keying)

    def requests(self, state: Any, tool_calls: Sequence[Mapping[str, Any]]
                 ) -> dict[str | None, Request]:
        """The request of each of a step's `tool_calls` in `state` (`anchor.requests_of`),
        by id: what `step_context` is given as `request`."""
        return requests_of(state, [call.get("id") for call in tool_calls], self.messages_key)

    def step_context(self, task: Task, tool_call: Mapping[str, Any], state: Any,
                     policy: Effect, keying: Keying, *, request: Request = UNREAD
                     ) -> Generator[Read, Any, CallContext]:
        """The context of `tool_call`, requested by an AIMessage in `state` (`request`:
        its `request_of`, when already found).

        The key's anchor is that AIMessage; one without an id is refused here, before
        anything is claimed or sent.
        """
        if request is UNREAD:
            request = request_of(state, tool_call.get("id"), self.messages_key)
        anchor = call_anchor(state, tool_call.get("id"), task.checkpoint_ns,
                             self.messages_key, thread_id=task.thread_id, request=request)
        ctx = CallContext(task.thread_id, task.checkpoint_ns, dict(tool_call), policy,
                          keying.key_thread, anchor, secret=keying.secret,
                          key_scheme=keying.pin,
                          requested_args=requested_args(state, tool_call, self.messages_key,
                                                        thread_id=task.thread_id,
                                                        request=request),
                          # A receipt deferred to the step's writes is lost with an answer
                          # they carry, and with it the only run that would reconcile the
                          # call: committed at once (seed 870232).
                          defer_receipts=not task.holds_answers())
        yield from adopt_legacy_key(ctx, keying, task.thread_id)
        if ctx.requested_args is not None and request is not None and len(request[1]) > 1:
            yield from adopt_sent_args_key(ctx, task.thread_id)
        yield from self._restarted(task, ctx, state)
        return ctx

    def _restarted(self, task: Task, ctx: CallContext, state: Any
                   ) -> Generator[Read, Any, None]:
        """Key `ctx` as the earlier request it repeats when it runs in a subgraph that a
        run from a named checkpoint restarted (`graph_durable.nodes.restarts`)."""
        if "|" not in task.checkpoint_ns:
            return
        root = task.conf.get(CONFIG_KEY_CHECKPOINT_MAP, {}).get("")
        if root is None:
            return
        sources = yield from self.forks.sources(task.thread_id, root)
        at = (task.requesting_checkpoint() or ("", "", None))[2]
        earlier = yield from earlier_effect(ctx, root, sources, state, self.messages_key, at)
        if earlier is not None:
            ctx.key = earlier.key
