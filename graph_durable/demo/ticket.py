"""The ticket scenario: an agent opens a support ticket, then emails the customer.

`build_ticket_agent` (and `build_ticket_agent_async`, for `ainvoke`) is module-level and
takes only paths and modes, so a child process can build the same agent on the same
database and providers after a crash.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from pydantic import BaseModel

from graph_durable import (
    Compensation,
    DurableSqliteSaver,
    Effect,
    EffectGuardNode,
    current_effect,
)
from graph_durable.testing import FakeProvider
from graph_durable.testing.models import ScriptedChatModel
from graph_durable.testing.providers import ProviderMode
from graph_durable.testing.savers import SaverSpec, aopen_saver, open_saver

__all__ = ["SCRIPT", "TicketAgent", "build_ticket_agent", "build_ticket_agent_async",
           "graph", "policy_for"]


def _calling(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    """A model turn that calls one tool."""
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}])


SCRIPT = [
    _calling("create_ticket",
             {"title": "Refund not received", "body": "Order 1042 was cancelled."},
             "call_ticket"),
    _calling("send_email",
             {"to": "ana@example.com", "subject": "We opened ticket for order 1042"},
             "call_email"),
    AIMessage(content="Ticket opened and customer informed."),
]


# The tools' argument schemas, built once at import: `@tool` would otherwise infer a
# pydantic model from each signature every time the agent is built, nearly half of
# the cost of building it, and a crash sweep builds it in every process it starts.
class _TicketArgs(BaseModel):
    title: str
    body: str


class _EmailArgs(BaseModel):
    to: str
    subject: str


def policy_for(provider: FakeProvider) -> Effect:
    """The policy a provider's contract allows."""
    if provider.mode == "dedupe":
        return Effect(idempotent=True, description=f"{provider.name} (dedupes by key)")
    if provider.mode == "lookup":
        return Effect(lookup=provider.find, description=f"{provider.name} (lookup by key)")
    return Effect(description=f"{provider.name} (no dedupe, no lookup)")


@dataclass
class TicketAgent:
    """The compiled graph with its saver, providers and input."""

    graph: Any
    saver: Any
    tickets: FakeProvider
    mail: FakeProvider
    inputs: dict[str, Any]


def build_ticket_agent(
    db_path: str,
    provider_dir: str,
    ticket_mode: ProviderMode = "lookup",
    email_mode: ProviderMode = "dedupe",
    postgres: str | None = None,
    saver: SaverSpec | None = None,
) -> TicketAgent:
    """Build the ticket agent on `db_path`, with providers kept under `provider_dir`.

    With `postgres` (a libpq connection string), checkpoints and ledger live in that
    PostgreSQL database instead (`DurablePostgresSaver`), and `db_path` is unused; with
    `saver`, on the saver it names (`graph_durable.testing.savers`), for sync use.
    """
    durable = open_saver(saver, db_path) if saver is not None else _saver(db_path, postgres)
    return _assemble(durable, provider_dir, ticket_mode, email_mode)


def graph(saver: Any) -> Any:
    """The demo's graph on `saver`, for `graph-durable --graph graph_durable.demo.ticket:graph`.

    Its providers are those of `make demo`, under `$GRAPH_DURABLE_DEMO_DIR/providers`
    (`demo-run/providers` by default).
    """
    folder = os.environ.get("GRAPH_DURABLE_DEMO_DIR", "demo-run")
    return _assemble(saver, os.path.join(folder, "providers"), "lookup", "blind").graph


async def build_ticket_agent_async(
    db_path: str,
    provider_dir: str,
    ticket_mode: ProviderMode = "lookup",
    email_mode: ProviderMode = "dedupe",
    saver: SaverSpec | None = None,
) -> TicketAgent:
    """`build_ticket_agent` on an async saver, for `ainvoke`: `AsyncDurableSqliteSaver`
    on `db_path`, or the saver `saver` names (`AsyncDurablePostgresSaver` for
    `postgres-async`)."""
    return _assemble(await aopen_saver(saver, db_path), provider_dir, ticket_mode, email_mode)


def _assemble(saver: Any, provider_dir: str, ticket_mode: ProviderMode,
              email_mode: ProviderMode) -> TicketAgent:
    os.makedirs(provider_dir, exist_ok=True)
    tickets = FakeProvider(os.path.join(provider_dir, "tickets.sqlite"), ticket_mode,
                           name="ticket")
    mail = FakeProvider(os.path.join(provider_dir, "mail.sqlite"), email_mode, name="email")

    @tool(args_schema=_TicketArgs)
    def create_ticket(title: str, body: str) -> dict:
        """Open a support ticket."""
        return tickets.apply(current_effect().key, {"title": title, "body": body})

    @tool(args_schema=_EmailArgs)
    def send_email(to: str, subject: str) -> dict:
        """Email a customer."""
        return mail.apply(current_effect().key, {"to": to, "subject": subject})

    def close_ticket(record: Any, receipt: dict[str, Any]) -> dict[str, Any]:
        """Undo a ticket: close it (under the compensation's own key)."""
        return tickets.apply(current_effect().key, {"ticket": receipt["id"]}, operation="close")

    # A ticket can be undone (closed, and looked up like a ticket); an email cannot.
    ticket_policy = dataclasses.replace(policy_for(tickets), compensate=Compensation(
        close_ticket, effect=Effect(lookup=tickets.find),
        args=lambda record, receipt: {"ticket": receipt["id"]}))
    model = ScriptedChatModel(script=SCRIPT)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", EffectGuardNode(
        [create_ticket, send_email],
        effects={"create_ticket": ticket_policy, "send_email": policy_for(mail)},
    ))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return TicketAgent(
        graph=builder.compile(checkpointer=saver),
        saver=saver,
        tickets=tickets,
        mail=mail,
        inputs={"messages": [HumanMessage("Customer Ana: my refund for order 1042 is late.")]},
    )


def _saver(db_path: str, postgres: str | None) -> Any:
    if postgres is None:
        return DurableSqliteSaver(sqlite3.connect(db_path, check_same_thread=False))
    from psycopg import Connection
    from psycopg.rows import dict_row

    from graph_durable.checkpointers.postgres import DurablePostgresSaver

    conn = Connection.connect(postgres, autocommit=True, prepare_threshold=0,
                              row_factory=dict_row)
    return DurablePostgresSaver(conn)
