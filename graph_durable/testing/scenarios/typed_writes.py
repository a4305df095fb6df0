"""A `guarded` write whose arguments are not plain JSON: a pydantic model and a dataclass
holding a datetime, a UUID, a Decimal and an enum (`graph_durable.canonical`).

A custom node `bill` calls `create_invoice(invoice=Invoice(...), shipment=Shipment(...))`,
which writes to provider `invoice` (`<provider_dir>/invoice.sqlite`) in the mode given.
With `from_state`, a node before it drafts the `Invoice` (its defaults left unset) into
the graph's state, and `bill` passes on the model it reads there: on a resume, the one
LangGraph's serializer rebuilt from the checkpoint.
The provider records the types the function was given, so a test sees that it got the
objects, not their JSON form. A scenario factory of the crash kit (`run_child`).
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import os
import uuid
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph
from pydantic import BaseModel

from graph_durable.nodes.context import current_effect
from graph_durable.nodes.writes import guarded
from graph_durable.policy import Effect
from graph_durable.testing.providers import FakeProvider, ProviderMode
from graph_durable.testing.savers import open_saver
from graph_durable.testing.scenarios.effects import EffectsAgent

__all__ = ["Currency", "Invoice", "Shipment", "build_typed_write_graph"]


class Currency(enum.Enum):
    """An invoice's currency."""

    EUR = "EUR"
    USD = "USD"


class Invoice(BaseModel):
    """What is billed."""

    customer: str
    cents: int
    currency: Currency = Currency.EUR
    tax_rate: decimal.Decimal = decimal.Decimal("0.21")


@dataclasses.dataclass(frozen=True)
class Shipment:
    """Where and when the goods go."""

    ship_at: datetime.datetime
    ref: uuid.UUID


class BillState(TypedDict, total=False):
    """State of the graph: the input, then the invoice's receipt."""

    customer: str
    cents: int
    draft: Invoice
    invoice: dict[str, Any]


def _policy(provider: FakeProvider) -> Effect:
    if provider.mode == "dedupe":
        return Effect(idempotent=True)
    if provider.mode == "lookup":
        return Effect(lookup=provider.find)
    return Effect()


def build_typed_write_graph(db_path: str, provider_dir: str,
                            mode: ProviderMode = "dedupe", from_state: bool = False
                            ) -> EffectsAgent:
    """The graph on a `DurableSqliteSaver` at `db_path`; input `{"customer", "cents"}`."""
    os.makedirs(provider_dir, exist_ok=True)
    invoices = FakeProvider(os.path.join(provider_dir, "invoice.sqlite"), mode, name="invoice")

    @guarded(_policy(invoices), name="create_typed_invoice")
    def create_invoice(invoice: Invoice, shipment: Shipment) -> dict[str, Any]:
        return invoices.apply(current_effect().key, {
            "invoice_type": type(invoice).__name__, "shipment_type": type(shipment).__name__,
            "currency": invoice.currency.value, "ship_at": shipment.ship_at.isoformat(),
            "customer": invoice.customer, "cents": invoice.cents})

    def draft(state: BillState) -> dict[str, Any]:
        return {"draft": Invoice(customer=state["customer"], cents=state["cents"])}

    def bill(state: BillState) -> dict[str, Any]:
        invoice = (state["draft"] if from_state
                   else Invoice(customer=state["customer"], cents=state["cents"]))
        shipment = Shipment(
            ship_at=datetime.datetime(2026, 12, 24, 9, 30, tzinfo=datetime.timezone.utc),
            ref=uuid.uuid5(uuid.NAMESPACE_URL, f"shipment/{state['customer']}"))
        return {"invoice": create_invoice(invoice=invoice, shipment=shipment)}

    saver = open_saver(None, db_path)
    builder = StateGraph(BillState)
    builder.add_node("bill", bill)
    if from_state:
        builder.add_node("draft", draft)
        builder.add_edge(START, "draft")
        builder.add_edge("draft", "bill")
    else:
        builder.add_edge(START, "bill")
    builder.add_edge("bill", END)
    return EffectsAgent(graph=builder.compile(checkpointer=saver), saver=saver,
                        providers={"invoice": invoices},
                        inputs={"customer": "ana", "cents": 1250})
