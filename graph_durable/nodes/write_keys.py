"""How a guarded write (`graph_durable.nodes.writes`) is keyed and asked about.

No AIMessage asks for such a write, so its key is anchored to where it is made: the
root checkpoint the run started the step from (through fork links, for a run from a
fork, time travel or an `update_state`), the node path, a subgraph's own step, the
task's path (a `Send` or `@task` call's index) and the write's position among the
guarded writes of that run of the task (see the `writes` module docstring).

One step is anchored otherwise: a step a run made again after the thread was copied, or
copied from, at the checkpoint before it. A worker killed after that checkpoint's writes
were saved, but before the step's own checkpoint, leaves the step to be made again on
resume, under a new id; a copy of the thread made then (`copy_thread` records where, for
both threads: the source's newest checkpoint) makes its own under another. Both follow
the same checkpoint with the same saved writes, so such a step is anchored to that
checkpoint's id and a digest of its writes as stored (`saver.step_anchor`): the write is
sent once in the family, as a tool call (keyed by its AIMessage) is. A thread that made
the step from other writes (a node that had not saved its writes when the copy was made,
run again; an answer given in one thread only) asks anew. The anchor is recorded for the
family the first time it keys a write (or before a `prune` deletes the writes), so a
later prune or write changes nothing; a write already keyed by the step's own id (by a
worker of an earlier release) keeps that key. Every other step keeps its root
checkpoint's id, as before: no key of a thread never copied changes.

`WritePlace` reads that from the task's config, `WriteRequest` is the request the guard
runs, and `WriteKeys` is the guard's keying strategy for it
(`graph_durable.nodes.call_keys`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from graph_durable._langgraph import CONFIG_KEY_CHECKPOINT_MAP, CONFIG_KEY_SCRATCHPAD
from graph_durable.ledger import Keying
from graph_durable.nodes.call_context import CallContext
from graph_durable.nodes.call_keys import BoundedCache, ForkLinks, Where, adopt_legacy_key
from graph_durable.nodes.operations import Read
from graph_durable.nodes.restarts import node_path
from graph_durable.nodes.task import Task
from graph_durable.policy import Effect

__all__ = ["WriteKeys", "WritePlace", "WriteRequest"]


@dataclass
class WritePlace:
    """The task a guarded write is made from, as the config tells it."""

    config: Mapping[str, Any]
    conf: Mapping[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.conf = self.config.get("configurable", {})

    @property
    def thread_id(self) -> str:
        return str(self.conf.get("thread_id", ""))

    @property
    def root(self) -> str | None:
        """The root checkpoint the step runs from."""
        return self.conf.get(CONFIG_KEY_CHECKPOINT_MAP, {}).get("")

    @property
    def place(self) -> list[Any]:
        """Where in the graph the task runs, the same on every run of the same request:
        its node path, a subgraph's own step, and its task path (a `Send` or `@task`
        call's index)."""
        metadata = self.config.get("metadata") or {}
        ns = str(self.conf.get("checkpoint_ns", ""))
        checkpoints = self.conf.get(CONFIG_KEY_CHECKPOINT_MAP, {})
        enclosing = checkpoints.get(ns.rpartition("|")[0])
        step = None
        if enclosing is None or enclosing != checkpoints.get(""):
            scratchpad = self.conf.get(CONFIG_KEY_SCRATCHPAD)
            step = metadata.get("langgraph_step", getattr(scratchpad, "step", None))
        return [list(node_path(ns)), step, metadata.get("langgraph_path", ())]

    def anchor(self, origin: str) -> str:
        """The anchor of the writes of this task run from `origin`. A task of the root
        graph (a node, or a `@task` its entrypoint calls) is placed by the root
        checkpoint alone: its step number moves with a fork. A task inside a subgraph
        adds the subgraph's own step, which a restarted subgraph counts again from the
        same start."""
        return "write:" + json.dumps([origin, *self.place], default=str, separators=(",", ":"))

    def call_id(self, name: str, position: int) -> str:
        """The id of a guarded write's call: `name#position@place`, `place` six hex
        digits of a hash of `place`, so that writes of one function in two `Send`
        branches, two parallel nodes or two subgraphs ask questions under different ids
        (the key is derived from `name#position`, with the place in its anchor)."""
        where = json.dumps(self.place, default=str, separators=(",", ":"))
        return f"{name}#{position}@{hashlib.blake2b(where.encode(), digest_size=3).hexdigest()}"


@dataclass(frozen=True)
class WriteRequest:
    """A guarded write's call, as the guard runs it: the call (`name`, canonical `args`,
    its `id`), the tool that carries the function's schema, and where it is made."""

    tool_call: dict[str, Any]
    tool: Any
    where: WritePlace
    legacy_args: tuple[dict[str, Any], ...] = ()
    """The args as releases before may have keyed them, where they differ (a pydantic
    model with fields left unset or at their defaults: `canonical.legacy_forms`)."""

    def override(self, **changes: Any) -> WriteRequest:
        """This request with `changes` (an edited call's `tool_call`)."""
        return replace(self, **changes)


class WriteKeys:
    """The keying strategy of guarded writes (see the module docstring)."""

    kind: Literal["tool", "guarded"] = "guarded"

    def __init__(self) -> None:
        self.forks = ForkLinks()
        self._steps: BoundedCache[tuple[str, str], tuple[str | None]] = BoundedCache()

    def _step_anchor(self, thread_id: str, origin: str, parent: str | None
                     ) -> Generator[Read, Any, str | None]:
        """The anchor of the step `origin` begins when its thread was copied (or copied
        from) at `parent`, its `loop` parent (`saver.step_anchor`), asked once: it is
        recorded when first asked, and a step after any other checkpoint never becomes
        one (a copy point is where the thread stood: its newest checkpoint)."""
        known = self._steps.get((thread_id, origin))
        if known is None:
            anchor = yield Read("step_anchor", (thread_id, origin, parent))
            known = self._steps[(thread_id, origin)] = (anchor,)
        return known[0]

    def config_of(self, request: WriteRequest) -> Mapping[str, Any]:
        """The config of the task the write is made from."""
        return request.where.config

    def fork_root(self, task: Task) -> Where | None:
        """The root checkpoint the step runs from: the anchor is read through its fork
        links (a `@task` call's namespace maps to the root's checkpoint, not one of its
        own)."""
        root = task.conf.get(CONFIG_KEY_CHECKPOINT_MAP, {}).get("")
        return None if root is None else (task.thread_id, "", str(root))

    requesting_checkpoint = fork_root

    def context(self, task: Task, request: WriteRequest, policy: Effect, keying: Keying
                ) -> Generator[Read, Any, CallContext]:
        """The write's context: anchored to the root checkpoint the step was first run
        from, its key derived from `name#position` (its id without the place)."""
        root = request.where.root
        origin = own = ""
        if root is not None:
            links = yield from self.forks.origin(task.thread_id, str(root))
            origin = own = links.sources[-1] if links.sources else str(root)
            # Asked whatever is known of the parent now: a prune may have removed it (or
            # its link) after the anchor was recorded.
            origin = (yield from self._step_anchor(task.thread_id, own,
                                                   links.step_parent)) or own
        ctx = self._keyed(task, request, policy, keying, origin)
        if origin != own:
            # Keyed by the step's own id before the step's anchor was known here (a
            # worker of an earlier release, or one that asked before the copy that
            # made this a copy point committed): that key stays.
            earlier = self._keyed(task, request, policy, keying, own)
            if (yield Read("effect", (earlier.key, task.thread_id))) is not None:
                ctx, origin = earlier, own
        if request.legacy_args and keying.pin is None:
            # A model keyed as releases before keyed it (`canonical.legacy_forms`), in a
            # thread that holds effects already (one with none is pinned by its first
            # intent): a write they recorded keeps its key.
            for args in request.legacy_args:
                earlier = self._keyed(task, request.override(tool_call={
                    **request.tool_call, "args": args}), policy, keying, origin)
                if (yield Read("effect", (earlier.key, task.thread_id))) is not None:
                    ctx.key = earlier.key
                    break
        yield from adopt_legacy_key(ctx, keying, task.thread_id)
        return ctx

    @staticmethod
    def _keyed(task: Task, request: WriteRequest, policy: Effect, keying: Keying,
               origin: str) -> CallContext:
        call = request.tool_call
        return CallContext(task.thread_id, task.checkpoint_ns, dict(call), policy,
                           keying.key_thread, request.where.anchor(origin),
                           secret=keying.secret, key_scheme=keying.pin,
                           key_call_id=str(call["id"]).rpartition("@")[0],
                           defer_receipts=not task.holds_answers())
