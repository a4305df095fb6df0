"""`guarded` writes take what LangGraph's serializer handles (pydantic models,
dataclasses, enums, datetimes, UUIDs, Decimals, tuples and sets of them): keyed by a
canonical form (`graph_durable.canonical`), sent once, replayed, and the function gets
the objects it was called with. What has no canonical form is refused, type named."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import sqlite3
import uuid
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command
from pydantic import BaseModel

from graph_durable import DurableSqliteSaver, Effect, current_effect, guarded
from graph_durable.canonical import NotCanonical, canonical_form, legacy_forms
from graph_durable.errors import UnkeyableToolCall
from graph_durable.testing import FakeProvider, FaultPlan
from graph_durable.testing.crash.child import run_child

CONFIG = {"configurable": {"thread_id": "t"}}


class Size(enum.Enum):
    SMALL = "s"
    LARGE = "l"


class Line(BaseModel):
    sku: str
    size: Size = Size.SMALL


class Order(BaseModel):
    customer: str
    lines: list[Line]
    note: str = "none"


@dataclasses.dataclass
class Delivery:
    at: datetime.datetime
    ref: uuid.UUID
    price: decimal.Decimal
    tags: frozenset[str] = frozenset()


class State(TypedDict, total=False):
    sku: str
    receipt: Any


REF = uuid.UUID("12345678-1234-5678-1234-567812345678")
AT = datetime.datetime(2026, 12, 24, 9, 30, tzinfo=datetime.timezone.utc)


def test_the_canonical_form_is_plain_json_with_every_field_of_a_model() -> None:
    order = Order(customer="ana", lines=[Line(sku="a"), Line(sku="b", size=Size.LARGE)])
    assert canonical_form(order) == {
        "customer": "ana", "lines": [{"sku": "a", "size": "s"}, {"sku": "b", "size": "l"}],
        "note": "none"}
    # As a checkpoint gives it back (every field set): the same form.
    assert canonical_form(Order(**order.model_dump())) == canonical_form(order)
    # Releases before keyed the fields set explicitly (looked up for what they recorded),
    # which, given back by a checkpoint, are those that differ from their defaults.
    old = {"customer": "ana", "lines": [{"sku": "a"}, {"sku": "b", "size": "l"}]}
    assert legacy_forms(order, canonical_form(order)) == [old]
    rebuilt = Order(**order.model_dump())
    assert legacy_forms(rebuilt, canonical_form(rebuilt)) == [old]
    assert legacy_forms({"a": 1}, {"a": 1}) == [] and legacy_forms("x", "x") == []
    delivery = Delivery(at=AT, ref=REF, price=decimal.Decimal("9.90"),
                        tags=frozenset({"b", "a"}))
    assert canonical_form((delivery,)) == [{
        "at": "2026-12-24T09:30:00+00:00", "ref": str(REF), "price": "9.90",
        "tags": ["a", "b"]}]
    with pytest.raises(NotCanonical, match=r"args\.blob is a builtins\.bytes"):
        canonical_form({"blob": b"\x00"})
    with pytest.raises(NotCanonical):
        canonical_form({1: "not a str key"})


@pytest.fixture
def saver(tmp_path: Path) -> Any:
    saver = DurableSqliteSaver(sqlite3.connect(tmp_path / "agent.sqlite",
                                               check_same_thread=False))
    yield saver
    saver.conn.close()


def _graph(saver: Any, provider: FakeProvider, seen: list[Any], policy: Effect) -> Any:
    @guarded(policy, name=f"ship_{provider.mode}_{policy.approval}")
    def ship(order: Order, delivery: Delivery) -> dict[str, Any]:
        seen.append((order, delivery))
        return provider.apply(current_effect().key, {"customer": order.customer})

    def node(state: State) -> dict[str, Any]:
        order = Order(customer="ana", lines=[Line(sku=state["sku"])])
        delivery = Delivery(at=AT, ref=REF, price=decimal.Decimal("9.90"))
        return {"receipt": ship(order=order, delivery=delivery)}

    builder = StateGraph(State)
    builder.add_node("ship", node)
    builder.add_edge(START, "ship")
    builder.add_edge("ship", END)
    return builder.compile(checkpointer=saver)


def test_typed_arguments_are_keyed_sent_once_and_given_to_the_function_as_objects(
    saver: Any, tmp_path: Path
) -> None:
    provider = FakeProvider(str(tmp_path / "ship.sqlite"), "dedupe")
    seen: list[Any] = []
    graph = _graph(saver, provider, seen, Effect(idempotent=True))
    graph.invoke({"sku": "a"}, CONFIG, durability="sync")
    [(order, delivery)] = seen
    assert isinstance(order, Order) and isinstance(order.lines[0], Line)
    assert isinstance(delivery, Delivery) and delivery.at == AT
    [record] = saver.effects("t")
    assert record.args["order"] == {"customer": "ana", "lines": [{"sku": "a", "size": "s"}],
                                    "note": "none"}
    assert record.args["delivery"]["ref"] == str(REF)
    assert provider.count(record.key) == 1

    other = {"configurable": {"thread_id": "t2"}}
    graph.invoke({"sku": "b"}, other, durability="sync")  # one field changed: a new key
    [changed] = saver.effects("t2")
    assert changed.key != record.key and provider.count() == 2


def test_an_approval_shows_the_canonical_args_and_the_function_still_gets_objects(
    saver: Any, tmp_path: Path
) -> None:
    provider = FakeProvider(str(tmp_path / "ship.sqlite"), "blind")
    seen: list[Any] = []
    graph = _graph(saver, provider, seen, Effect(approval=True))
    graph.invoke({"sku": "a"}, CONFIG, durability="sync")
    [question] = graph.get_state(CONFIG).interrupts
    assert question.value["args"]["order"] == {
        "customer": "ana", "lines": [{"sku": "a", "size": "s"}], "note": "none"}
    assert seen == []
    graph.invoke(Command(resume={question.id: {"type": "approve"}}), CONFIG, durability="sync")
    [(order, _)] = seen
    assert isinstance(order, Order) and provider.count() == 1
    graph.invoke(None, CONFIG, durability="sync")  # nothing left to run, nothing re-sent
    assert provider.count() == 1


def test_an_argument_with_no_canonical_form_is_refused_naming_it(
    saver: Any, tmp_path: Path
) -> None:
    provider = FakeProvider(str(tmp_path / "ship.sqlite"), "dedupe")

    @guarded(Effect(idempotent=True), name="upload_blob")
    def upload(blob: bytes) -> Any:
        return provider.apply(current_effect().key, {})

    builder = StateGraph(State)
    builder.add_node("up", lambda state: {"receipt": upload(blob=b"\x00\x01")})
    builder.add_edge(START, "up")
    builder.add_edge("up", END)
    graph = builder.compile(checkpointer=saver)
    with pytest.raises(UnkeyableToolCall, match=r"blob is a builtins\.bytes"):
        graph.invoke({}, CONFIG, durability="sync")
    assert provider.count() == 0 and saver.effects("t") == []


@pytest.mark.crash
@pytest.mark.parametrize("mode", ["dedupe", "lookup", "blind"])
def test_a_typed_write_killed_after_its_effect_is_sent_once(tmp_path: Path, mode: str) -> None:
    factory = "graph_durable.testing.scenarios.typed_writes:build_typed_write_graph"
    kwargs = {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path),
              "mode": mode}
    invoices = FakeProvider(str(tmp_path / "invoice.sqlite"), mode)
    crashed = run_child(factory, kwargs, thread_id="t",
                        fault=FaultPlan("after_effect", tool="create_typed_invoice"))
    assert crashed.killed and invoices.count() == 1
    [effect] = invoices.effects()
    assert (effect["payload"]["invoice_type"], effect["payload"]["shipment_type"]) == (
        "Invoice", "Shipment")

    resumed = run_child(factory, kwargs, thread_id="t", action="resume")
    assert invoices.count() == 1
    if mode == "blind":
        [question] = resumed.interrupts
        assert question["type"] == "effect_unknown"
    else:
        assert resumed.done, resumed.summary


@pytest.mark.crash
@pytest.mark.parametrize("mode", ["dedupe", "lookup"])
def test_a_model_read_from_the_state_keeps_its_key_after_a_kill(tmp_path: Path,
                                                                mode: str) -> None:
    """The `Invoice` reaches the write through the graph's state, its defaults left
    unset; on the resume it is the model LangGraph's serializer rebuilt from the
    checkpoint, every field set. Keyed by the fields set explicitly, it was a new call
    after the kill and invoiced twice."""
    factory = "graph_durable.testing.scenarios.typed_writes:build_typed_write_graph"
    kwargs = {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path),
              "mode": mode, "from_state": True}
    invoices = FakeProvider(str(tmp_path / "invoice.sqlite"), mode)
    crashed = run_child(factory, kwargs, thread_id="t",
                        fault=FaultPlan("after_effect", tool="create_typed_invoice"))
    assert crashed.killed and invoices.count() == 1
    resumed = run_child(factory, kwargs, thread_id="t", action="resume")
    assert resumed.done, resumed.summary
    assert invoices.count() == 1


def test_a_write_an_earlier_release_keyed_by_the_fields_set_is_found(
    saver: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread that crossed the upgrade: its write, recorded under the key of the fields
    set explicitly, is answered from that record, not sent again under the new key."""
    import graph_durable.nodes.writes as writes_module

    provider = FakeProvider(str(tmp_path / "ship.sqlite"), "blind")
    seen: list[Any] = []
    graph = _graph(saver, provider, seen, Effect(approval=True))
    monkeypatch.setattr(writes_module, "canonical_form",
                        lambda value, path="args", fields="set": canonical_form(
                            value, path, fields=fields))
    monkeypatch.setattr(writes_module, "legacy_forms", lambda value, form, path="args": [])
    graph.invoke({"sku": "a"}, CONFIG, durability="sync")
    [question] = graph.get_state(CONFIG).interrupts
    graph.invoke(Command(resume={question.id: {"type": "approve"}}), CONFIG,
                 durability="sync")
    [earlier] = saver.effects("t")
    assert earlier.args["order"] == {"customer": "ana", "lines": [{"sku": "a"}]}
    monkeypatch.undo()
    # The step again (time travel to the checkpoint it ran from): the same request.
    [before] = [s for s in saver.list(CONFIG) if s.metadata.get("step") == 0]
    graph.invoke(None, before.config, durability="sync")
    assert provider.count() == 1 and len(seen) == 1
    assert [r.key for r in saver.effects("t")] == [earlier.key]


def test_an_edit_reaches_the_function_as_objects_validated_by_its_schema(
    saver: Any, tmp_path: Path
) -> None:
    provider = FakeProvider(str(tmp_path / "ship.sqlite"), "blind")
    seen: list[Any] = []
    graph = _graph(saver, provider, seen, Effect(approval=True))
    graph.invoke({"sku": "a"}, CONFIG, durability="sync")
    [question] = graph.get_state(CONFIG).interrupts
    args = {**question.value["args"],
            "order": {"customer": "bob", "lines": [{"sku": "z", "size": "l"}]}}
    edit = {"type": "edit", "edited_action": {"name": question.value["name"], "args": args}}
    graph.invoke(Command(resume={question.id: edit}), CONFIG, durability="sync")
    [(order, delivery)] = seen
    assert order == Order(customer="bob", lines=[Line(sku="z", size=Size.LARGE)])
    assert isinstance(delivery, Delivery) and delivery.ref == REF
    assert provider.count() == 1
