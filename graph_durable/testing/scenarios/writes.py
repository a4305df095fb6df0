"""Scenarios whose writes are made by `guarded` functions, not by tool calls.

Two shapes of graph make the same two writes, an invoice (`create_invoice`, provider
`invoice.sqlite`) and then an email about it (`send_receipt`, provider `mail.sqlite`):

- `shape="node"`: a hand-built `StateGraph` whose custom node `bill` calls both guarded
  functions, after a node `prepare` that writes nothing;
- `shape="functional"`: LangGraph's functional API, an `@entrypoint` that runs two
  `@task`s, `bill` and `notify`, each calling one guarded function.

Both are scenario factories of the crash kit (`crash_matrix`, `run_child`): every fault
point of the guard protocol is reached by name (`tool` is the guarded function's name).
With `approval=True` the invoice waits for a human first.
"""

from __future__ import annotations

import os
from typing import Any, Literal, TypedDict

from langgraph.func import entrypoint, task
from langgraph.graph import END, START, StateGraph

from graph_durable.nodes.context import current_effect
from graph_durable.nodes.writes import guarded
from graph_durable.policy import Effect
from graph_durable.testing.providers import FakeProvider, ProviderMode
from graph_durable.testing.savers import SaverSpec, aopen_saver, open_saver
from graph_durable.testing.scenarios.effects import EffectsAgent

__all__ = ["build_write_graph", "build_write_graph_async"]

Shape = Literal["node", "functional"]


class BillState(TypedDict, total=False):
    """State of the custom-node graph."""

    customer: str
    cents: int
    invoice: dict[str, Any]
    email: dict[str, Any]


def _policy(provider: FakeProvider, approval: bool = False) -> Effect:
    if provider.mode == "dedupe":
        return Effect(idempotent=True, approval=approval)
    if provider.mode == "lookup":
        return Effect(lookup=provider.find, approval=approval)
    return Effect(approval=approval)


def _assemble(saver: Any, provider_dir: str, mode: ProviderMode, shape: Shape,
              approval: bool, is_async: bool) -> EffectsAgent:
    os.makedirs(provider_dir, exist_ok=True)
    invoices = FakeProvider(os.path.join(provider_dir, "invoice.sqlite"), mode, name="invoice")
    mail = FakeProvider(os.path.join(provider_dir, "mail.sqlite"), mode, name="mail")

    if is_async:
        @guarded(_policy(invoices, approval), name="create_invoice")
        async def create_invoice(customer: str, cents: int) -> dict[str, Any]:
            return invoices.apply(current_effect().key, {"customer": customer, "cents": cents})

        @guarded(_policy(mail), name="send_receipt")
        async def send_receipt(customer: str, invoice: str) -> dict[str, Any]:
            return mail.apply(current_effect().key, {"to": customer, "invoice": invoice})
    else:
        @guarded(_policy(invoices, approval), name="create_invoice")
        def create_invoice(customer: str, cents: int) -> dict[str, Any]:
            return invoices.apply(current_effect().key, {"customer": customer, "cents": cents})

        @guarded(_policy(mail), name="send_receipt")
        def send_receipt(customer: str, invoice: str) -> dict[str, Any]:
            return mail.apply(current_effect().key, {"to": customer, "invoice": invoice})

    inputs = {"customer": "ana", "cents": 1250}
    providers = {"invoice": invoices, "mail": mail}
    if shape == "node":
        graph = _node_graph(saver, create_invoice, send_receipt, is_async)
    else:
        graph = _functional_graph(saver, create_invoice, send_receipt, is_async)
    return EffectsAgent(graph=graph, saver=saver, providers=providers, inputs=inputs)


def _node_graph(saver: Any, create_invoice: Any, send_receipt: Any, is_async: bool) -> Any:
    def prepare(state: BillState) -> dict[str, Any]:
        return {"cents": state.get("cents", 0)}

    def bill(state: BillState) -> dict[str, Any]:
        invoice = create_invoice(state["customer"], state["cents"])
        return {"invoice": invoice, "email": send_receipt(state["customer"], invoice["id"])}

    async def abill(state: BillState) -> dict[str, Any]:
        invoice = await create_invoice(state["customer"], state["cents"])
        return {"invoice": invoice,
                "email": await send_receipt(state["customer"], invoice["id"])}

    builder = StateGraph(BillState)
    builder.add_node("prepare", prepare)
    builder.add_node("bill", abill if is_async else bill)
    builder.add_edge(START, "prepare")
    builder.add_edge("prepare", "bill")
    builder.add_edge("bill", END)
    return builder.compile(checkpointer=saver)


def _functional_graph(saver: Any, create_invoice: Any, send_receipt: Any,
                      is_async: bool) -> Any:
    if is_async:
        @task(name="bill")
        async def abill_task(customer: str, cents: int) -> dict[str, Any]:
            return await create_invoice(customer, cents)

        @task(name="notify")
        async def anotify(customer: str, invoice: str) -> dict[str, Any]:
            return await send_receipt(customer, invoice)

        @entrypoint(checkpointer=saver, name="billing")
        async def abilling(order: dict[str, Any]) -> dict[str, Any]:
            invoice = await abill_task(order["customer"], order["cents"])
            email = await anotify(order["customer"], invoice["id"])
            return {"invoice": invoice, "email": email}

        return abilling

    @task(name="bill")
    def bill_task(customer: str, cents: int) -> dict[str, Any]:
        return create_invoice(customer, cents)

    @task(name="notify")
    def notify(customer: str, invoice: str) -> dict[str, Any]:
        return send_receipt(customer, invoice)

    @entrypoint(checkpointer=saver, name="billing")
    def billing(order: dict[str, Any]) -> dict[str, Any]:
        invoice = bill_task(order["customer"], order["cents"]).result()
        email = notify(order["customer"], invoice["id"]).result()
        return {"invoice": invoice, "email": email}

    return billing


def build_write_graph(db_path: str, provider_dir: str, mode: ProviderMode = "lookup",
                      shape: Shape = "node", approval: bool = False,
                      saver: SaverSpec | None = None) -> EffectsAgent:
    """A graph of `shape` whose writes are guarded functions, on a sync saver.

    Args:
        db_path: The SQLite database (unused with a PostgreSQL `saver`).
        provider_dir: Folder of the providers' databases.
        mode: Both providers' contract: `dedupe`, `lookup` or `blind`.
        shape: `node` (a custom StateGraph node) or `functional` (`@entrypoint`/`@task`).
        approval: The invoice waits for a human's approval first.
        saver: Which saver (`graph_durable.testing.savers`); SQLite on `db_path` if omitted.
    """
    return _assemble(open_saver(saver, db_path), provider_dir, mode, shape, approval, False)


async def build_write_graph_async(db_path: str, provider_dir: str,
                                  mode: ProviderMode = "lookup", shape: Shape = "node",
                                  approval: bool = False,
                                  saver: SaverSpec | None = None) -> EffectsAgent:
    """`build_write_graph` with async guarded functions on an async saver (`ainvoke`)."""
    return _assemble(await aopen_saver(saver, db_path), provider_dir, mode, shape, approval,
                     True)
