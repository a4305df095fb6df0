"""A subgraph task restarted in place ran more than once in its namespace: a later fork
repeats what all its runs asked, in the order asked (`nodes.restarts.earlier_effect`).

The reads are answered here from plain data, so each rule is checked alone; the crash
tests (`tests/test_explorer_regressions.py`, seed 1023294) check it with real processes.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from graph_durable.errors import GraphDurableError
from graph_durable.ledger import EffectRecord, EffectStatus, encode_args, key_of_encoded
from graph_durable.nodes.call_context import CallContext
from graph_durable.nodes.operations import performed
from graph_durable.nodes.restarts import earlier_effect
from graph_durable.policy import Effect

THREAD = "t"
ARGS = {"item": "x11a", "n": 0}
OLD = "payments:old"
"""The earlier incarnation: the first fork's subgraph task, run twice in its namespace."""


def _ask(message_id: str, call_id: str) -> AIMessage:
    return AIMessage(content="", id=message_id,
                     tool_calls=[{"name": "audit", "args": ARGS, "id": call_id}])


def _key(message_id: str, call_id: str) -> str:
    args = encode_args(ARGS, thread_id=THREAD, tool_call_id=call_id, tool="audit")
    return key_of_encoded(THREAD, f"msg:{message_id}", call_id, "audit", args, None)


def _record(key: str) -> EffectRecord:
    return EffectRecord(key=key, thread_id=THREAD, checkpoint_ns=OLD, tool_call_id="audit_x",
                        tool="audit", args=ARGS, status=EffectStatus.APPLIED,
                        created_at=0.0, updated_at=0.0)


def _saved(ns: str, checkpoint_id: str, messages: list[Any], ran_from: str = "") -> Any:
    return SimpleNamespace(
        config={"configurable": {"thread_id": THREAD, "checkpoint_ns": ns,
                                 "checkpoint_id": checkpoint_id}},
        metadata={"parents": {"": ran_from}} if ran_from else {},
        checkpoint={"channel_values": {"messages": messages}})


def _repeated(call_id: str, first_run: list[Any], second_run: list[Any],
              ledger: dict[str, EffectRecord]) -> EffectRecord | None:
    """What the call `call_id` of a new fork (asking `audit` twice) repeats, when `OLD`
    ran from the same root checkpoint twice, asking `first_run` then `second_run`."""
    given = [HumanMessage("Go.", id="h")]
    inputs = [_saved(OLD, "b-input", given, "root-1"), _saved(OLD, "a-input", given, "root-1")]
    ends = {("checkpoint_before", (THREAD, OLD, "b-input")):
            _saved(OLD, "a-end", given + first_run),
            ("get_tuple", OLD): _saved(OLD, "b-end", given + second_run)}
    mine = given + [_ask("new-1", "audit_1"), _ask("new-2", "audit_2")]
    call = next(c for m in mine[1:] for c in m.tool_calls if c["id"] == call_id)
    ctx = CallContext(THREAD, "payments:new|tools:x", call, Effect())
    steps = earlier_effect(ctx, "root-3", ("root-1",), {"messages": mine}, "messages")

    def read(op: Any) -> Any:
        if op.name == "subgraph_inputs":
            return inputs
        if op.name == "checkpoint_before":
            return ends[("checkpoint_before", tuple(op.args))]
        if op.name == "get_tuple":
            return ends[("get_tuple", op.args[0]["configurable"]["checkpoint_ns"])]
        assert op.name == "effect", op
        return ledger.get(op.args[0])

    return performed(steps, read)


def test_a_fork_repeats_the_first_run_whose_key_the_second_run_took() -> None:
    """Seed 1023294: the second run took the first run's key under a new message id, so
    only the first run's messages derive it."""
    first = [_ask("m1", "audit_1")]
    second = [_ask("m2", "audit_1")]  # took _key("m1"), its own is in no ledger
    ledger = {_key("m1", "audit_1"): _record(_key("m1", "audit_1"))}
    found = _repeated("audit_1", first, second, ledger)
    assert found is not None and found.key == _key("m1", "audit_1")


def test_a_fork_repeats_every_call_of_both_runs_in_the_order_asked() -> None:
    """The second run asked once more besides the call it took over: the fork's first
    call repeats the first run's effect, its second the second run's own."""
    first = [_ask("m1", "audit_1")]
    second = [_ask("m2", "audit_1"), _ask("m3", "audit_2")]
    ledger = {key: _record(key) for key in (_key("m1", "audit_1"), _key("m3", "audit_2"))}
    assert _repeated("audit_1", first, second, ledger).key == _key("m1", "audit_1")
    assert _repeated("audit_2", first, second, ledger).key == _key("m3", "audit_2")


def test_runs_of_two_incarnations_that_asked_apart_are_still_refused() -> None:
    """Two incarnations (not two runs of one) whose effects differ cannot be told apart."""
    given = [HumanMessage("Go.", id="h")]
    other = "payments:other"
    inputs = [_saved(OLD, "a-input", given, "root-1"), _saved(other, "c-input", given, "root-1")]
    latest = {OLD: _saved(OLD, "a-end", given + [_ask("m1", "audit_1")]),
              other: _saved(other, "c-end", given + [_ask("m9", "audit_1")])}
    ledger = {key: _record(key) for key in (_key("m1", "audit_1"), _key("m9", "audit_1"))}
    call = {"name": "audit", "args": ARGS, "id": "audit_1"}
    ctx = CallContext(THREAD, "payments:new|tools:x", call, Effect())
    steps = earlier_effect(ctx, "root-3", ("root-1",),
                           {"messages": given + [_ask("new-1", "audit_1")]}, "messages")
    with pytest.raises(GraphDurableError, match="cannot be told which one"):
        performed(steps, lambda op: (
            inputs if op.name == "subgraph_inputs" else
            latest[op.args[0]["configurable"]["checkpoint_ns"]] if op.name == "get_tuple"
            else ledger.get(op.args[0])))
