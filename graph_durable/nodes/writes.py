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
import inspect
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.tools import StructuredTool
from pydantic import BaseModel, ValidationError

from graph_durable._langgraph import CONFIG_KEY_SCRATCHPAD
from graph_durable.canonical import NotCanonical, canonical_form, legacy_forms
from graph_durable.errors import GraphDurableError, NotApplied, UnkeyableToolCall
from graph_durable.nodes.guard import GuardCore
from graph_durable.nodes.interrupts import raise_interrupts
from graph_durable.nodes.operations import Ask
from graph_durable.nodes.write_keys import WriteKeys, WritePlace, WriteRequest
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


_REGISTRY: dict[str, GuardedWrite] = {}
_GUARD = GuardCore(keys=WriteKeys())
"""The guard of every `GuardedWrite` in the process (their policies by name)."""


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


@dataclass
class _Call:
    """One call of a guarded write: its request, and whether it is the first of its task's
    run (which journals the decisions the run's resume value carries)."""

    request: WriteRequest
    first: bool
    named: dict[str, Any]
    keyed: dict[str, Any]


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
        _GUARD.effects[name] = effect
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

    def _keyed(self, named: dict[str, Any], where: WritePlace) -> dict[str, Any]:
        """The arguments in canonical form (`graph_durable.canonical`): what keys and
        records the call; refused, naming the argument and its type, if one has none."""
        try:
            return {name: canonical_form(value, name) for name, value in named.items()}
        except NotCanonical as exc:
            raise UnkeyableToolCall(
                f"The guarded write {self.name!r} in thread {where.thread_id!r} was called "
                f"with an argument it cannot be keyed by: {exc}; nothing was sent. Pass JSON "
                "values, pydantic models, dataclasses, enums, datetimes, UUIDs or "
                "Decimals (or lists, tuples, sets and dicts of them).",
                thread_id=where.thread_id) from None

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call:
        """This call's request: its arguments keyed, its position among the guarded
        writes of its task's run."""
        where = WritePlace(_config(self.name))
        named = self._arguments(args, kwargs)
        keyed = self._keyed(named, where)
        run = _run_of(where.conf)
        position, run.writes = run.writes, run.writes + 1
        first, run.decided = not run.decided, True
        call = {"name": self.name, "args": keyed, "id": where.call_id(self.name, position),
                "type": "tool_call"}
        return _Call(WriteRequest(call, self.tool, where, _legacy_args(named, keyed)),
                     first, named, keyed)

    def _as_called(self, request: WriteRequest, call: _Call) -> dict[str, Any]:
        """What the function is called with: the objects it was given, unless a reviewer
        edited the call (then its args, validated by the function's own schema), and the
        key where the policy names the argument that carries it."""
        sent = dict(request.tool_call["args"])
        key_arg = self.effect.key_arg or ""
        key = sent.pop(key_arg, None)
        schema = self.tool.args_schema
        if sent == call.keyed:
            called = dict(call.named)
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

    def _message(self, request: WriteRequest, value: Any) -> ToolMessage:
        return ToolMessage(content=json.dumps(value, ensure_ascii=False, default=str),
                           name=self.name, tool_call_id=request.tool_call["id"])

    @staticmethod
    def _tools() -> dict[str, Any]:
        """The schemas an edit of any guarded write is checked against, by name."""
        return {name: write.tool for name, write in _REGISTRY.items()}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.is_async:
            return self._acall(args, kwargs)
        if self.effect.read_only:
            return self.fn(*args, **kwargs)
        call = self._call(args, kwargs)
        if call.first:
            _GUARD.resolve_decisions(call.request.where.config, self._tools())

        def execute(request: WriteRequest) -> ToolMessage:
            return self._message(request, self.fn(**self._as_called(request, call)))

        return _value(_GUARD.run(call.request, execute, _interrupt_now))

    async def _acall(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.effect.read_only:
            return await self.fn(*args, **kwargs)
        call = self._call(args, kwargs)
        if call.first:
            await _GUARD.aresolve_decisions(call.request.where.config, self._tools())

        async def execute(request: WriteRequest) -> ToolMessage:
            return self._message(request, await self.fn(**self._as_called(request, call)))

        return _value(await _GUARD.arun(call.request, execute, _interrupt_now))


def _legacy_args(named: dict[str, Any], keyed: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """The args as releases before this one may have keyed them, where they differ
    (`canonical.legacy_forms`: a pydantic model with fields left unset or at their
    defaults); none for plain JSON arguments."""
    variants: list[dict[str, Any]] = []
    for name, value in named.items():
        for form in legacy_forms(value, keyed[name], name):
            args = {**keyed, name: form}
            if args not in variants:
                variants.append(args)
    if len(variants) > 1:  # several models: the forms of all of them at once, too
        for fields in ("set", "not_default"):
            args = {name: canonical_form(value, name, fields=fields)  # type: ignore[arg-type]
                    for name, value in named.items()}
            if args != keyed and args not in variants:
                variants.append(args)
    return tuple(variants)
