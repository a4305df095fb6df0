"""A guarded call in a subgraph that a fork restarted keeps the key of its first request.

A run that names a checkpoint id of the parent graph (resuming with
`graph.get_state(config).config`, time travel, continuing an `update_state` fork) makes
LangGraph write a fork checkpoint, and the subgraph's task gets a new id from it. The
subgraph then finds none of its own checkpoints and starts over: its model answers
again, under a new AIMessage id (and, with a real model, new tool_call_ids), so the
anchor of `graph_durable.nodes.anchor` alone would give the call a new key and send it a
second time, while the first intent stayed open for ever.

The rule: a call in a subgraph task that runs off a fork (or `update_state`) checkpoint
of the root graph repeats a call of an earlier run of the same subgraph (an
*incarnation*) when
- that incarnation ran from a checkpoint the fork descends from, or from another fork of
  one (through fork and update links only: a later turn of the parent is a new request;
  a second run from the same parent checkpoint repeats the first run's requests),
- at the same node path (the namespace's node names, task ids left out),
- and asked the same tool with the same canonical args (the earlier key is derived
  again from the earlier requesting message, so redacted or encrypted ledgers compare
  alike).
The n-th such call of the new run takes the n-th such earlier effect, in the order the
earlier run asked them (calls in the subgraph's input, asked before it ran, keep their own
keys): a model that asks the same thing in two turns gets each turn's receipt.
The earlier effect is then replayed, reconciled or asked about like any resumed call,
under the tool_call_id the model gives now: a replayed answer is made to answer it
(`graph_durable.nodes.results.rebound`), and a question names it (the record takes it
when it is asked about, so a decision keyed by it finds the call); the key stays.

A run from an `update_state` (or fork) checkpoint that is still the thread's latest
writes no fork of its own: the restarted subgraph's task keeps its id, so an earlier run
of it is in the same namespace, told apart by its input checkpoint (the run this call's
step belongs to started from the latest input checkpoint before that step's checkpoint;
an earlier one ends where the next one starts, `checkpoint_before`). Every run of an
earlier incarnation is read to its own end in the same way, and the runs of one
incarnation count as one request, their effects in the order asked: a later run took the
keys of the calls an earlier one asked alike, under new message ids, so only the earlier
run's messages derive those keys, and the later run's derive only what it asked besides
(seed 1023294).

Earlier runs that match from more than one incarnation (a `Send` fan-out of identical
payloads) cannot be told apart; such a call is refused before anything is sent, unless
they all asked for the same effects (a subgraph restarted twice, whose second run took
the first run's keys): then it repeats those.

`earlier_effect` is written once, as a generator of `Read` operations that the sync and
async drivers perform.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import Any, NamedTuple

from langchain_core.messages import AIMessage

from graph_durable._langgraph import CONFIG_KEY_CHECKPOINT_MAP
from graph_durable.errors import GraphDurableError
from graph_durable.ledger import EffectRecord, canonical_json, key_of_encoded
from graph_durable.nodes.anchor import messages_of
from graph_durable.nodes.protocol import CallContext, Read

__all__ = ["ForkOrigin", "earlier_effect", "fork_links", "fork_sources", "node_path",
           "restart_root"]

_FORK_SOURCES = ("fork", "update")
_STEP_SOURCE = "loop"
"""The source of a checkpoint a run makes as it goes, from its parent and the parent's
saved writes."""
_MAX_LINKS = 64


def node_path(checkpoint_ns: str) -> tuple[str, ...]:
    """The node names of a task namespace, without task ids: `a:1|b:2` -> `(a, b)`."""
    return tuple(part.partition(":")[0] for part in checkpoint_ns.split("|"))


def _at(thread_id: str, checkpoint_ns: str, checkpoint_id: str | None = None
        ) -> dict[str, Any]:
    conf = {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def restart_root(conf: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """`(thread_id, "", checkpoint_id)` of the root checkpoint a call in a subgraph (of
    the task config's configurable `conf`) runs from, whose fork links `fork_sources`
    reads; `None` outside a subgraph. A run from a checkpoint id saves its fork
    checkpoint in the background: the guard waits for it to be stored before reading
    them (else it finds no fork, and the call would take a new key and send again)."""
    root = (conf.get(CONFIG_KEY_CHECKPOINT_MAP) or {}).get("")
    if "|" not in str(conf.get("checkpoint_ns", "")) or root is None:
        return None
    return str(conf.get("thread_id", "")), "", str(root)


class ForkOrigin(NamedTuple):
    """Where a root checkpoint comes from (`fork_links`)."""

    sources: tuple[str, ...]
    """The root checkpoints it was forked or updated from, nearest first; empty when it
    is an ordinary step of the thread."""
    step_parent: str | None = None
    """When the checkpoint the links end at (the last source, or the root itself) is a
    `loop` checkpoint (a step a run made from its parent and the parent's saved
    writes): that parent's id. `None` otherwise (an input, a fork, one not found)."""


def fork_links(thread_id: str, root_checkpoint_id: str) -> Generator[Read, Any, ForkOrigin]:
    """`ForkOrigin` of the root checkpoint `root_checkpoint_id`: one read per link."""
    sources: list[str] = []
    checkpoint_id = root_checkpoint_id
    for _ in range(_MAX_LINKS):
        found = yield Read("get_tuple", (_at(thread_id, "", checkpoint_id),))
        if found is None:
            break
        parent = (found.parent_config or {}).get("configurable", {}).get("checkpoint_id")
        source = (found.metadata or {}).get("source")
        if source not in _FORK_SOURCES:
            step_parent = str(parent) if source == _STEP_SOURCE and parent else None
            return ForkOrigin(tuple(sources), step_parent)
        if parent is None:
            break
        sources.append(parent)
        checkpoint_id = parent
    return ForkOrigin(tuple(sources))


def fork_sources(thread_id: str, root_checkpoint_id: str
                 ) -> Generator[Read, Any, tuple[str, ...]]:
    """The root checkpoints `root_checkpoint_id` was forked or updated from, nearest
    first; empty when it is an ordinary step of the thread."""
    return (yield from fork_links(thread_id, root_checkpoint_id)).sources


def _same_calls(messages: Sequence[Any], tool: str, args_json: str
                ) -> list[tuple[int, AIMessage, str]]:
    """`(position, message, tool_call_id)` of each call to `tool` with `args_json`."""
    found = []
    for index, message in enumerate(messages):
        if not isinstance(message, AIMessage):
            continue
        for call in message.tool_calls:
            if call.get("name") == tool and _encoded(call.get("args")) == args_json:
                found.append((index, message, str(call.get("id"))))
    return found


def _encoded(args: Any) -> str | None:
    try:
        return canonical_json(args)
    except (TypeError, ValueError):
        return None


def _fresh_calls(messages: Sequence[Any], inherited: set[Any], tool: str, args_json: str
                 ) -> list[tuple[AIMessage, int, str]]:
    """`(message, position, tool_call_id)` of the calls to `tool` with `args_json` that
    a run of the subgraph asked itself (its input's messages, `inherited`, left out)."""
    return [(message, index, tool_call_id)
            for index, message, tool_call_id in _same_calls(messages, tool, args_json)
            if message.id is None or message.id not in inherited]


def _ids(messages: Sequence[Any]) -> set[Any]:
    return {message.id for message in messages if getattr(message, "id", None)}


def _input_id(first: Any) -> str:
    return str(first.config["configurable"]["checkpoint_id"])


def _runs_here(inputs: Sequence[Any], here: str, at: str | None) -> tuple[list[str], str | None]:
    """The input checkpoint ids of the runs of the subgraph task `here`, oldest first,
    and the one of the run that reached the checkpoint `at` (ids grow with time)."""
    ids = sorted(_input_id(first) for first in inputs
                 if first.config["configurable"]["checkpoint_ns"] == here)
    return ids, max((one for one in ids if at is None or one <= at), default=None)


def _parents_of(inputs: Sequence[Any], here: str, input_id: str | None) -> Mapping[str, Any]:
    """The `parents` of the run of subgraph task `here` that started at `input_id`: the
    checkpoint each enclosing graph was at when it started."""
    for first in inputs:
        if first.config["configurable"]["checkpoint_ns"] == here and _input_id(first) == input_id:
            return (first.metadata or {}).get("parents") or {}
    return {}


def _in_earlier_enclosing_run(inputs: Sequence[Any], mine: Mapping[str, Any],
                              theirs: Mapping[str, Any]) -> bool:
    """Whether an incarnation started (its `parents`: `theirs`) inside an earlier run of a
    subgraph task that encloses this call's too (`mine`), the same task run again in its
    own namespace: a run from the thread's latest fork or `update_state` checkpoint
    restarts it there, and it restarts the subgraphs inside it under new task ids."""
    shared = [ns for ns in mine if ns and ns in theirs]
    for enclosing in sorted(shared, key=len, reverse=True):
        runs, _ = _runs_here(inputs, enclosing, None)
        if not runs:
            continue
        their_run = max((one for one in runs if one <= theirs[enclosing]), default=None)
        my_run = max((one for one in runs if one <= mine[enclosing]), default=None)
        if their_run is not None and my_run is not None:
            return their_run < my_run
    return False


def _run_end(thread_id: str, inputs: Sequence[Any], incarnation: str, input_id: str
             ) -> Generator[Read, Any, Any]:
    """The last checkpoint of the run of the subgraph task `incarnation` that started at
    `input_id`. A task restarted in its own namespace ran more than once there, and each
    later run takes the keys of the one before it under new message ids (seed 1023294):
    only the run that asked first holds the messages its keys derive from."""
    runs, _ = _runs_here(inputs, incarnation, None)
    later = [one for one in runs if one > input_id]
    if later:
        return (yield Read("checkpoint_before", (thread_id, incarnation, later[0])))
    return (yield Read("get_tuple", (_at(thread_id, incarnation),)))


def earlier_effect(ctx: CallContext, root: str, sources: tuple[str, ...], state: Any,
                   messages_key: str, at: str | None = None
                   ) -> Generator[Read, Any, EffectRecord | None]:
    """The effect of the earlier request this call repeats (see the module docstring),
    or `None` when it repeats none. `root` is the checkpoint the root graph runs from,
    `sources` its `fork_sources`, `at` the checkpoint of the subgraph the call's step
    runs from.

    Raises:
        GraphDurableError: earlier runs of more than one incarnation match.
    """
    if "|" not in ctx.checkpoint_ns or not sources:
        return None
    path = node_path(ctx.checkpoint_ns)
    here = ctx.checkpoint_ns.rpartition("|")[0]
    current = messages_of(state, messages_key)
    inputs = yield Read("subgraph_inputs", (ctx.thread_id,))
    _, mine_from = _runs_here(inputs, here, at)
    matches: dict[str, tuple[list[EffectRecord], list[str]]] = {}
    for first in sorted(inputs, key=_input_id):  # each incarnation's runs, oldest first
        incarnation = first.config["configurable"]["checkpoint_ns"]
        if incarnation == here:
            # An earlier run of this very task (a run from an `update_state` or fork
            # checkpoint that is the thread's latest writes no fork of its own, so the
            # restarted subgraph keeps its namespace): it ends where the next one starts.
            if mine_from is None or _input_id(first) >= mine_from:
                continue
        else:
            parents: Mapping[str, Any] = (first.metadata or {}).get("parents") or {}
            ran_from = parents.get("")
            if node_path(incarnation) != path[:-1] or ran_from is None:
                continue
            if ran_from == root:
                # The same root run: an earlier incarnation only inside an earlier run of
                # an enclosing subgraph task that was restarted in place (seed 850869).
                if not _in_earlier_enclosing_run(inputs, _parents_of(inputs, here, mine_from),
                                                 parents):
                    continue
            elif ran_from not in sources:
                # Another fork (or update) of a checkpoint this run descends from.
                theirs = yield from fork_sources(ctx.thread_id, ran_from)
                if not set(theirs) & {root, *sources}:
                    continue
        latest = yield from _run_end(ctx.thread_id, inputs, incarnation, _input_id(first))
        if latest is None:
            continue
        earlier_messages = messages_of(latest.checkpoint.get("channel_values", {}),
                                       messages_key)
        inherited = _ids(messages_of(first.checkpoint.get("channel_values", {}), messages_key))
        records = []
        for message, index, tool_call_id in _fresh_calls(earlier_messages, inherited,
                                                         ctx.tool, ctx.args_json):
            anchor = f"msg:{message.id}" if message.id else f"idx:{index}"
            key = key_of_encoded(ctx.key_thread_id or ctx.thread_id, anchor, tool_call_id,
                                 ctx.tool, ctx.args_json, ctx.secret)
            record = yield Read("effect", (key, ctx.thread_id))
            if record is not None:
                records.append(record)
        if records:
            # The runs of one incarnation are one request: a later run took the keys of
            # the calls an earlier one asked alike (their messages no longer derive
            # them), and keyed only what it asked besides; together, in the order asked.
            merged, _ = matches.setdefault(incarnation, ([], sorted(inherited)))
            known = {record.key for record in merged}  # from the earlier runs only
            merged.extend(record for record in records if record.key not in known)
    if not matches:
        return None
    # Earlier runs that all asked for the same effects (a restart that took the keys of
    # the run before it, seed 993623) are one: whichever the call repeats, it repeats those.
    if len({(tuple(record.key for record in records), tuple(inherited))
            for records, inherited in matches.values()}) > 1:
        raise GraphDurableError(
            f"Tool call {ctx.tool_call_id!r} ({ctx.tool}) in thread {ctx.thread_id!r} runs in "
            f"a subgraph that this run from a named checkpoint restarted, and "
            f"{len(matches)} earlier runs of that subgraph asked for the same call, so it "
            "cannot be told which one this call repeats; nothing was sent. Resume the "
            "thread without a checkpoint id (graph.invoke(None, {'configurable': "
            "{'thread_id': ...}})), or settle the earlier effects first (graph-durable "
            "pending lists them).",
            thread_id=ctx.thread_id, tool_call_id=ctx.tool_call_id)
    earlier, inherited = next(iter(matches.values()))
    mine = [tool_call_id for _, _, tool_call_id in
            _fresh_calls(current, set(inherited), ctx.tool, ctx.args_json)]
    if ctx.tool_call_id not in mine:
        return None  # asked before this run of the subgraph: its own key holds
    ordinal = len(mine) - 1 - mine[::-1].index(ctx.tool_call_id)
    return earlier[ordinal] if ordinal < len(earlier) else None

