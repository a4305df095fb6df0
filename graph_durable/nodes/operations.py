"""The operations the guard's steps and the effect protocol yield, and how a driver runs
them: the vocabulary shared by the protocol (`graph_durable.nodes.protocol`), the guard's
steps (`graph_durable.nodes.core`), its two drivers and the compensation drivers
(`graph_durable.operators._compensation_driver`).

An operation says what to do and holds no I/O. `saver_call` names the saver method that
performs each of the saver's operations (the async side calls its `a`-prefixed twin), and
`performed` / `aperformed` drive a generator of operations with a function that performs
one, sync or async: each driver writes only that function.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Literal, Union

from graph_durable.ledger import EffectRecord, IntentWrite, LedgerWrite

__all__ = [
    "Ask",
    "CallTool",
    "Claim",
    "ClaimMany",
    "Done",
    "Failed",
    "Join",
    "Joined",
    "Lookup",
    "Op",
    "Read",
    "SaverRead",
    "Sleep",
    "Write",
    "aperformed",
    "next_op",
    "observe_op",
    "performed",
    "saver_call",
]


SaverRead = Literal[
    "asked_in_task",       # (thread_id, checkpoint_ns) -> records asked about there
    "cancelled_by",        # (thread_id,) -> the cancel of a thread, if any
    "checkpoint_before",   # (thread_id, checkpoint_ns, before) -> a checkpoint
    "checkpoint_exists",   # (thread_id, checkpoint_ns, checkpoint_id) -> bool
    "effect",              # (key, thread_id) -> EffectRecord | None
    "effects",             # (thread_id,) -> list[EffectRecord]
    "events",              # (thread_id[, key]) -> list[EffectEvent]
    "get_tuple",           # (config,) -> CheckpointTuple | None
    "keying",              # (thread_id,) -> Keying
    "live_leases",         # () -> {thread_id: (owner, token, expires)}
    "predicted_keying",    # (thread_id,) -> Keying | None, without I/O
    "sent_in_family",      # (key, thread_id) -> EffectRecord | None
    "step_anchor",         # (thread_id, checkpoint_id, parent_id) -> str | None
    "stored_result",       # (thread_id, key) -> the stored answer of a call
    "subgraph_inputs",     # (thread_id,) -> the inputs of the thread's subgraph runs
]
"""The durable saver's read methods the guard's steps may call (`a<name>` when async).
`step_anchor` records the anchor it answers, the first time, for later readers."""


@dataclass(frozen=True)
class Read:
    """Operation: call a read method of the durable saver (`a<name>` when async)."""

    name: SaverRead
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Write:
    """Operation: apply a ledger write; the result is the list of changed records."""

    write: LedgerWrite


@dataclass(frozen=True)
class Claim:
    """Operation: record an intent unless its key is known; the result is
    `(record, created)`."""

    intent: IntentWrite


@dataclass(frozen=True)
class CallTool:
    """Operation: call the tool once (with `args`, if the call was edited)."""

    record: EffectRecord
    args: dict[str, Any] | None = None


@dataclass(frozen=True)
class Lookup:
    """Operation: ask the provider whether the keyed effect exists."""

    key: str


@dataclass(frozen=True)
class Join:
    """Operation: answer the call as the one keyed `key` that a reviewer's edit made it
    (`RunOnce.join`). The result is `None` when no other call of this process is
    running that key (this call now runs it), else a `Joined` holding that call's
    answer."""

    key: str


@dataclass(frozen=True)
class Joined:
    """The answer of the call a `Join` waited for."""

    result: Any


@dataclass(frozen=True)
class Sleep:
    """Operation: wait before another attempt."""

    seconds: float


@dataclass(frozen=True)
class Ask:
    """Operation: ask a human; the driver interrupts (or defers) and may return a result."""

    record: EffectRecord
    payload: dict[str, Any]
    schema: dict[str, Any] | None = None
    """The JSON schema of the decisions that answer it (set by the driver, which knows
    the tool)."""


@dataclass(frozen=True)
class ClaimMany:
    """Operation: claim the intents of a step's calls in one transaction; the result is
    a `(record, created)` pair per intent."""

    intents: tuple[IntentWrite, ...]


Op = Union[Read, Claim, ClaimMany, Write, Sleep, CallTool, Lookup, Join]  # noqa: UP007
"""What the guard's steps yield for a driver to perform."""


def observe_op(observed: Any, op: Any) -> None:
    """Mark on a call's telemetry (`telemetry.ObservedCall`) what a performed operation
    of the saver did: an intent claimed, a receipt recorded."""
    if isinstance(op, Claim):
        observed.event("intent_claimed")
    elif isinstance(op, Write) and getattr(op.write, "kind", None) == "receipt":
        observed.event("receipt_recorded")


def saver_call(op: Any, config: Any) -> tuple[str, tuple[Any, ...]] | None:
    """`(method, args)`: the saver method that performs `op` under `config` (the async
    drivers call `"a" + method`), or `None` when `op` is not one of the saver's."""
    if isinstance(op, Read):
        return op.name, op.args
    if isinstance(op, Claim):
        return "claim", (op.intent, config)
    if isinstance(op, ClaimMany):
        return "claim_many", (list(op.intents), config)
    if isinstance(op, Write):
        return "apply", (op.write, config)
    return None


@dataclass(frozen=True)
class Done:
    """What `next_op` gives once the generator has returned: its return value."""

    value: Any


@dataclass(frozen=True)
class Failed:
    """The result of an operation that raised: `next_op` (and `performed`) throw `error`
    into the generator instead of sending a value."""

    error: Exception


def next_op(ops: Generator[Any, Any, Any], result: Any = None) -> Any:
    """The operation `ops` yields next once it receives `result` (an operation's result,
    or a `Failed` one, thrown in), or `Done` with what it returned."""
    try:
        return ops.throw(result.error) if isinstance(result, Failed) else ops.send(result)
    except StopIteration as done:
        return Done(done.value)


def performed(ops: Generator[Any, Any, Any], perform: Callable[[Any], Any]) -> Any:
    """Drive `ops` to its end, each operation performed by `perform`; what it returns.

    The loop of `next_op`, inlined: it runs for every operation of every guarded call.
    """
    send, throw = ops.send, ops.throw
    try:
        op = send(None)
    except StopIteration as done:
        return done.value
    while True:
        result = perform(op)
        try:
            op = throw(result.error) if isinstance(result, Failed) else send(result)
        except StopIteration as done:
            return done.value


async def aperformed(ops: Generator[Any, Any, Any],
                     perform: Callable[[Any], Awaitable[Any]]) -> Any:
    """`performed`, each operation awaited."""
    send, throw = ops.send, ops.throw
    try:
        op = send(None)
    except StopIteration as done:
        return done.value
    while True:
        result = await perform(op)
        try:
            op = throw(result.error) if isinstance(result, Failed) else send(result)
        except StopIteration as done:
            return done.value
