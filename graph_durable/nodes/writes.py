"""`guarded`: the effect guard for a write made from any node or functional-API `@task`.

    @guarded(Effect(idempotent=True))
    def create_invoice(customer: str, cents: int) -> dict:
        return billing.create(customer, cents, idempotency_key=current_effect().key)

    def send_invoice(state: State) -> dict:           # a custom StateGraph node
        return {"invoice": create_invoice(state["customer"], state["cents"])}

    @task                                              # or under LangGraph's @task
    def bill(customer: str, cents: int) -> dict:
        return create_invoice(customer, cents)

A call of a guarded function goes through the same protocol as a guarded tool call
(`graph_durable.nodes.protocol`): intent first, the key passed through
`current_effect()`, the receipt after; on a resume a receipt is replayed, an open intent
is looked up, re-sent under its key, or asked about; approvals and unknown outcomes pause
the node with the same per-call interrupts and decisions. It returns what the function
returned (a replayed or looked-up receipt comes back as JSON), and raises `NotApplied`
when the write did not happen (refused, rejected or skipped by a reviewer).

**The same request.** No AIMessage asks for such a write, so its key is anchored to where
it is made: the root checkpoint the run started the step from (for a run from a fork,
time travel or an `update_state`, the checkpoint those were made from), the node path
(node names, without task ids), the step, the task's path (a `Send` or `@task` call's
index) and the write's position among the guarded writes of that run of the task; plus
the function's name and the canonical JSON of its arguments. A node that runs again
after a crash, an interrupt, `get_state().config`, time travel to the checkpoint it ran
from, or a copy of the thread makes the same writes in the same order and gets the same
keys. A run from an earlier checkpoint that re-runs the nodes before it makes new
requests, as a model asked again does. Arguments must be JSON; a function whose
arguments cannot be named (`*args`, positional-only) is refused when decorated.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.tools import StructuredTool
from langgraph.prebuilt.tool_node import ToolCallRequest
from pydantic import BaseModel, ValidationError

from graph_durable._langgraph import CONFIG_KEY_CHECKPOINT_MAP, CONFIG_KEY_SCRATCHPAD
from graph_durable.canonical import NotCanonical, canonical_form
from graph_durable.errors import GraphDurableError, NotApplied, UnkeyableToolCall
from graph_durable.nodes.async_driver import aperform_reads as _aperform_reads
from graph_durable.nodes.guard import GuardCore
from graph_durable.nodes.interrupts import raise_interrupts
from graph_durable.nodes.sync_driver import perform_reads as _perform_reads
from graph_durable.nodes.task import Task as _Task
from graph_durable.nodes.protocol import Ask, Read
from graph_durable.nodes.restarts import fork_sources, node_path
from graph_durable.policy import Effect

__all__ = ["GuardedWrite", "guarded"]


def guarded(effect: Effect | None = None, *, name: str | None = None
            ) -> Callable[[Callable[..., Any]], GuardedWrite]:
    """Decorate a function that writes to the world, so each call goes through the ledger.

    Args:
        effect: The write's policy (`Effect()`, a blind write, if omitted).
        name: The name the ledger, interrupts and decisions know it by (the function's
            name if omitted); names are unique in a process.
    """

    def wrap(fn: Callable[..., Any]) -> GuardedWrite:
        return GuardedWrite(fn, effect or Effect(), name or fn.__name__)

    return wrap


@dataclass
class _Run:
    """One run of a task: the guarded writes it made so far."""

    scratchpad: Any
    writes: int = 0
    decided: bool = False


_RUNS: OrderedDict[int, _Run] = OrderedDict()
_RUNS_LOCK = threading.Lock()
_RUNS_KEPT = 4096


def _run_of(conf: Mapping[str, Any]) -> _Run:
    """The run of the task `conf` belongs to. LangGraph gives each run of a task its own
    scratchpad; it is frozen and has no weak references, so runs are kept by its id
    beside a reference to it (an id is not reused while the object lives)."""
    scratchpad = conf.get(CONFIG_KEY_SCRATCHPAD)
    with _RUNS_LOCK:
        run = _RUNS.get(id(scratchpad))
        if run is None or run.scratchpad is not scratchpad:
            run = _RUNS[id(scratchpad)] = _Run(scratchpad)
            while len(_RUNS) > _RUNS_KEPT:
                _RUNS.popitem(last=False)
        else:
            _RUNS.move_to_end(id(scratchpad))
        return run


@dataclass
class _Where:
    """The task a guarded write is made from, as the config tells it."""

    config: Mapping[str, Any]
    conf: Mapping[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.conf = self.config.get("configurable", {})

    @property
    def root(self) -> str | None:
        return self.conf.get(CONFIG_KEY_CHECKPOINT_MAP, {}).get("")

    def anchor(self, origin: str) -> str:
        """The anchor of the writes of this task run from `origin` (see the module
        docstring). A task of the root graph (a node, or a `@task` its entrypoint calls)
        is placed by the root checkpoint alone: its step number moves with a fork. A
        task inside a subgraph adds the subgraph's own step, which a restarted subgraph
        counts again from the same start."""
        return "write:" + json.dumps([origin, *self.place], default=str, separators=(",", ":"))

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

    def call_id(self, name: str, position: int) -> str:
        """The id of a guarded write's call: `name#position@place`, `place` six hex
        digits of a hash of `place`, so that writes of one function in two `Send`
        branches, two parallel nodes or two subgraphs ask questions under different ids
        (the key is derived from `name#position`, with the place in its anchor)."""
        where = json.dumps(self.place, default=str, separators=(",", ":"))
        return f"{name}#{position}@{hashlib.blake2b(where.encode(), digest_size=3).hexdigest()}"


class _WriteGuard(GuardCore):
    """The guard of every `GuardedWrite` in the process (policies by name)."""

    def policy_for(self, tool: str) -> Effect:
        write = _REGISTRY.get(tool)
        return write.effect if write is not None else self.default

    def _anchor(self, task: _Task, tool_call: Mapping[str, Any], state: Any) -> str:
        return str(state)  # computed by `GuardedWrite`, handed over as the state

    @staticmethod
    def _key_call_id(tool_call: Mapping[str, Any]) -> str | None:
        return str(tool_call["id"]).rpartition("@")[0]  # `name#position`: the key's id

    def _restarted(self, task: _Task, ctx: Any, state: Any) -> Generator[Read, Any, None]:
        return  # the anchor already follows forks back to where they were made
        yield

    def _checkpoint_to_verify(self, task: _Task) -> tuple[str, str, str] | None:
        """The root checkpoint the step runs from: the anchor is taken from it (a
        `@task` call's namespace maps to the root's checkpoint, not one of its own)."""
        root = task.conf.get(CONFIG_KEY_CHECKPOINT_MAP, {}).get("")
        where = None if root is None else (task.thread_id, "", root)
        return None if where is None or where in self._durable_checkpoints else where

    def origin(self, where: _Where) -> Generator[Read, Any, str]:
        """The root checkpoint the step was first run from, through fork links."""
        root = where.root
        if root is None:
            return ""
        thread_id = str(where.conf.get("thread_id", ""))
        slot = (thread_id, root)
        sources = self._fork_sources.get(slot)
        if sources is None:
            sources = yield from fork_sources(thread_id, root)
            if len(self._fork_sources) >= 1024:
                self._fork_sources.clear()
            self._fork_sources[slot] = sources
        return sources[-1] if sources else root


_REGISTRY: dict[str, GuardedWrite] = {}
_GUARD = _WriteGuard()


def _interrupt_now(ask: Ask, interrupt_id: str) -> Any:
    raise_interrupts([(ask, interrupt_id)])


def _config(name: str) -> Mapping[str, Any]:
    from langgraph.config import get_config

    try:
        return get_config()
    except RuntimeError:
        raise GraphDurableError(
            f"The guarded write {name!r} was called outside a LangGraph run; nothing was "
            "sent. Call it from a node or a @task of a graph compiled with a durable saver "
            "(its key is taken from the run).") from None


@dataclass
class _Runtime:
    config: Mapping[str, Any]


def _value(result: Any) -> Any:
    """What the guarded function returns, from the guard's answer."""
    if not isinstance(result, ToolMessage):
        return result
    if result.status == "error":
        raise NotApplied(str(result.content))
    content = result.content
    if isinstance(content, str):
        try:
            return json.loads(content)
        except ValueError:
            return content
    return content


class GuardedWrite:
    """A function whose calls go through the effect ledger (see `guarded`)."""

    def __init__(self, fn: Callable[..., Any], effect: Effect, name: str) -> None:
        if not isinstance(effect, Effect):
            raise TypeError(f"guarded({name!r}) takes an Effect, got {effect!r}")
        self.fn = fn
        self.effect = effect
        self.name = name
        self.is_async = inspect.iscoroutinefunction(fn)
        self._signature = inspect.signature(fn)
        for parameter in self._signature.parameters.values():
            if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.VAR_POSITIONAL):
                raise TypeError(
                    f"guarded({name!r}): parameter {parameter.name!r} has no name a call "
                    "can be keyed by; use named parameters (and **kwargs if needed).")
        known = _REGISTRY.get(name)
        if known is not None and known.fn is not fn and (
                getattr(known.fn, "__qualname__", None) != getattr(fn, "__qualname__", None)
                or known.fn.__module__ != fn.__module__):
            raise GraphDurableError(
                f"Two guarded writes are named {name!r} ({known.fn.__module__}."
                f"{getattr(known.fn, '__qualname__', known.fn)} and {fn.__module__}."
                f"{getattr(fn, '__qualname__', fn)}); the ledger tells writes apart by "
                "name. Give one of them guarded(..., name=...).")
        _REGISTRY[name] = self
        kwargs: dict[str, Any] = {"coroutine": fn} if self.is_async else {"func": fn}
        self.tool = StructuredTool.from_function(
            name=name, description=(fn.__doc__ or name).strip(), **kwargs)
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<guarded write {self.name!r} {self.effect!r}>"

    def _arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        named: dict[str, Any] = {}
        for param, value in bound.arguments.items():
            if self._signature.parameters[param].kind is inspect.Parameter.VAR_KEYWORD:
                named.update(value)
            else:
                named[param] = value
        return named

    def _keyed(self, named: dict[str, Any], where: _Where) -> dict[str, Any]:
        """The arguments in canonical form (`graph_durable.canonical`): what keys and
        records the call; refused, naming the argument and its type, if one has none."""
        try:
            return {name: canonical_form(value, name) for name, value in named.items()}
        except NotCanonical as exc:
            thread_id = where.config.get("configurable", {}).get("thread_id")
            raise UnkeyableToolCall(
                f"The guarded write {self.name!r} in thread {thread_id!r} was called with "
                f"an argument it cannot be keyed by: {exc}; nothing was sent. Pass JSON "
                "values, pydantic models, dataclasses, enums, datetimes, UUIDs or "
                "Decimals (or lists, tuples, sets and dicts of them).",
                thread_id=thread_id) from None

    def _as_called(self, request: ToolCallRequest, named: dict[str, Any],
                   keyed: dict[str, Any]) -> dict[str, Any]:
        """What the function is called with: the objects it was given, unless a reviewer
        edited the call (then its args, validated by the function's own schema), and the
        key where the policy names the argument that carries it."""
        sent = dict(request.tool_call["args"])
        key_arg = self.effect.key_arg or ""
        key = sent.pop(key_arg, None)
        schema = self.tool.args_schema
        if sent == keyed:
            called = dict(named)
        elif isinstance(schema, type) and issubclass(schema, BaseModel):
            try:
                called = dict(schema.model_validate(sent))
            except ValidationError:  # **kwargs the schema does not name: as sent
                called = sent
        else:
            called = sent
        if key is not None:
            called[key_arg] = key
        return called

    def _call(self, args: dict[str, Any], call_id: str) -> dict[str, Any]:
        return {"name": self.name, "args": args, "id": call_id, "type": "tool_call"}

    def _request(self, where: _Where, args: dict[str, Any], anchor: str, call_id: str
                 ) -> ToolCallRequest:
        call = self._call(args, call_id)
        return ToolCallRequest(tool_call=call, tool=self.tool, state=anchor,  # type: ignore[arg-type]
                               runtime=_Runtime(where.config))  # type: ignore[arg-type]

    def _message(self, request: ToolCallRequest, value: Any) -> ToolMessage:
        return ToolMessage(content=json.dumps(value, ensure_ascii=False, default=str),
                           name=self.name, tool_call_id=request.tool_call["id"])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.is_async:
            return self._acall(args, kwargs)
        if self.effect.read_only:
            return self.fn(*args, **kwargs)
        where = _Where(_config(self.name))
        named = self._arguments(args, kwargs)
        keyed = self._keyed(named, where)
        run = _run_of(where.conf)
        position, run.writes = run.writes, run.writes + 1
        call_id = where.call_id(self.name, position)
        task = _Task(where.config, {"id": call_id, "name": self.name})
        # The root checkpoint is read to find the fork it came from; a run from a
        # checkpoint id saves its fork in the background: wait for it to be stored.
        _GUARD._performed(task, _GUARD._requesting_checkpoint_stored(
            task, self._call(keyed, call_id)))
        anchor = where.anchor(_perform_reads(task.saver, _GUARD.origin(where)))
        if not run.decided:
            run.decided = True
            _GUARD.resolve_decisions(where.config, {n: w.tool for n, w in _REGISTRY.items()})
        request = self._request(where, keyed, anchor, call_id)

        def execute(req: ToolCallRequest) -> ToolMessage:
            return self._message(req, self.fn(**self._as_called(req, named, keyed)))

        return _value(_GUARD.run(request, execute, _interrupt_now))

    async def _acall(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.effect.read_only:
            return await self.fn(*args, **kwargs)
        where = _Where(_config(self.name))
        named = self._arguments(args, kwargs)
        keyed = self._keyed(named, where)
        run = _run_of(where.conf)
        position, run.writes = run.writes, run.writes + 1
        call_id = where.call_id(self.name, position)
        task = _Task(where.config, {"id": call_id, "name": self.name})
        await _GUARD._aperformed(task, _GUARD._requesting_checkpoint_stored(
            task, self._call(keyed, call_id)))
        anchor = where.anchor(await _aperform_reads(task.saver, _GUARD.origin(where)))
        if not run.decided:
            run.decided = True
            await _GUARD.aresolve_decisions(where.config,
                                            {n: w.tool for n, w in _REGISTRY.items()})
        request = self._request(where, keyed, anchor, call_id)

        async def execute(req: ToolCallRequest) -> ToolMessage:
            return self._message(req, await self.fn(**self._as_called(req, named, keyed)))

        return _value(await _GUARD.arun(request, execute, _interrupt_now))
