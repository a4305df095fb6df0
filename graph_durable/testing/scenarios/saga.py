"""A two-step saga for compensation tests: a charge, then a ticket; each can be undone.

`build_saga_agent` builds a ReAct-style graph (model -> EffectGuardNode -> model) whose
scripted model first charges a customer (`charge`, on a provider that can be looked up),
then opens a ticket (`open_ticket`, looked up too), then answers. Each tool has a
compensation on a provider of its own: `refund` undoes the charge, `close_ticket` the
ticket. The compensations' providers run in the mode given (`dedupe`, `lookup`, `blind`),
and their policies follow that contract, so a test can check on the providers' side
that every effect was undone exactly once, or paused for a human where the compensating
provider can neither dedupe nor be asked.

Run it in a child process (for SIGKILL crash tests)::

    python -m graph_durable.testing.scenarios.saga run|cancel|acancel DB PROVIDER_DIR REFUND_MODE CLOSE_MODE [TTL]

`run` drives the thread to its end; `cancel` cancels it (`graph_durable.cancel`, under a
lease of TTL seconds, 1 by default, so a killed cancel's lease soon expires) and prints
the report's summary; it exits 3 while another worker holds the thread. `acancel` does
the same with `graph_durable.acancel`, on an `AsyncDurableSqliteSaver`'s event loop.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import StructuredTool

from graph_durable.checkpointers.sqlite import DurableSqliteSaver
from graph_durable.nodes import current_effect
from graph_durable.policy import Compensation, Effect
from graph_durable.testing.models import ScriptedChatModel
from graph_durable.testing.providers import FakeProvider
from graph_durable.testing.scenarios.effects import EffectsAgent, policy_for_mode, react_graph

__all__ = ["SAGA_THREAD", "assemble_saga_agent", "build_saga_agent", "saga_providers",
           "graph_on", "saga_step"]

SAGA_THREAD = "saga"
PROVIDERS = ("charges", "tickets", "refunds", "closures")


def saga_providers(provider_dir: str, refund_mode: str = "dedupe",
                   close_mode: str = "lookup") -> dict[str, FakeProvider]:
    """The four providers: charges and tickets (lookup), refunds and closures (as given)."""
    os.makedirs(provider_dir, exist_ok=True)
    modes = {"charges": "lookup", "tickets": "lookup", "refunds": refund_mode,
             "closures": close_mode}
    return {name: FakeProvider(os.path.join(provider_dir, f"{name}.sqlite"), mode,  # type: ignore[arg-type]
                               name=name.rstrip("s"))
            for name, mode in modes.items()}


def _script() -> list[AIMessage]:
    return [
        AIMessage(content="", tool_calls=[{"name": "charge", "id": "call_charge",
                                           "args": {"customer": "ana", "cents": 500}}]),
        AIMessage(content="", tool_calls=[{"name": "open_ticket", "id": "call_ticket",
                                           "args": {"title": "ship the order"}}]),
        AIMessage(content="Charged and ticketed."),
    ]


def assemble_saga_agent(saver: Any, providers: dict[str, FakeProvider]) -> EffectsAgent:
    """The saga agent on `saver` with `providers` (see `saga_providers`)."""
    charges, tickets = providers["charges"], providers["tickets"]
    refunds, closures = providers["refunds"], providers["closures"]

    def charge(customer: str, cents: int) -> dict[str, Any]:
        return charges.apply(current_effect().key, {"customer": customer, "cents": cents})

    def open_ticket(title: str) -> dict[str, Any]:
        return tickets.apply(current_effect().key, {"title": title})

    def refund(record: Any, receipt: Any) -> dict[str, Any]:
        return refunds.apply(current_effect().key, {"charge": receipt["id"]})

    def close_ticket(record: Any, receipt: Any) -> dict[str, Any]:
        return closures.apply(current_effect().key, {"ticket": receipt["id"]})

    effects = {
        "charge": Effect(lookup=charges.find, compensate=Compensation(
            refund, effect=policy_for_mode(refunds),
            args=lambda record, receipt: {"charge": receipt["id"]})),
        "open_ticket": Effect(lookup=tickets.find, compensate=Compensation(
            close_ticket, effect=policy_for_mode(closures),
            args=lambda record, receipt: {"ticket": receipt["id"]})),
    }
    tools = [StructuredTool.from_function(charge, name="charge", description="Charge."),
             StructuredTool.from_function(open_ticket, name="open_ticket",
                                          description="Open a ticket.")]
    model = ScriptedChatModel(script=_script())
    return EffectsAgent(graph=react_graph(model, tools, effects, saver), saver=saver,
                        providers=providers,
                        inputs={"messages": [HumanMessage("Charge Ana and open a ticket.")]})


def build_saga_agent(db_path: str, provider_dir: str, refund_mode: str = "dedupe",
                     close_mode: str = "lookup") -> EffectsAgent:
    """The saga agent on a `DurableSqliteSaver` at `db_path`."""
    saver = DurableSqliteSaver(sqlite3.connect(db_path, check_same_thread=False))
    return assemble_saga_agent(saver, saga_providers(provider_dir, refund_mode, close_mode))


def graph_on(saver: Any) -> Any:
    """The saga graph on `saver`, its providers in `$GRAPH_DURABLE_SAGA_DIR` (modes
    `$GRAPH_DURABLE_SAGA_MODES`, default `dedupe,lookup`): for `graph-durable --graph
    graph_durable.testing.scenarios.saga:graph_on`."""
    refund_mode, close_mode = os.environ.get("GRAPH_DURABLE_SAGA_MODES", "dedupe,lookup").split(",")
    providers = saga_providers(os.environ["GRAPH_DURABLE_SAGA_DIR"], refund_mode, close_mode)
    return assemble_saga_agent(saver, providers).graph


def saga_step(action: str, db_path: str, provider_dir: str, refund_mode: str = "dedupe",
              close_mode: str = "lookup", ttl: float = 1.0) -> dict[str, Any]:
    """Run the thread to its end (`run`; `resume` goes on from its last checkpoint), or
    cancel it (`cancel`, or `acancel` on an async saver); for a child process
    (`ForkServer.run` names it). Runs are `audited`."""
    from graph_durable.operators.audit import audited
    from graph_durable.operators.compensation import cancel

    if action == "acancel":
        return asyncio.run(_acancel(db_path, provider_dir, refund_mode, close_mode, ttl))
    agent = build_saga_agent(db_path, provider_dir, refund_mode, close_mode)
    try:
        if action in ("run", "resume"):
            audited(agent.graph).invoke(agent.inputs if action == "run" else None,
                                        {"configurable": {"thread_id": SAGA_THREAD}},
                                        durability="sync")
            return {"outcome": "done", "summary": ""}
        report = cancel(agent.graph, agent.saver, SAGA_THREAD, owner=f"pid-{os.getpid()}",
                        ttl=ttl)
        return {"outcome": report.outcome, "summary": report.summary()}
    finally:
        agent.saver.conn.close()


async def _acancel(db_path: str, provider_dir: str, refund_mode: str, close_mode: str,
                   ttl: float) -> dict[str, Any]:
    from graph_durable.checkpointers.sqlite import AsyncDurableSqliteSaver
    from graph_durable.operators.compensation import acancel

    async with AsyncDurableSqliteSaver.from_conn_string(db_path) as saver:
        agent = assemble_saga_agent(saver, saga_providers(provider_dir, refund_mode, close_mode))
        report = await acancel(agent.graph, saver, SAGA_THREAD, owner=f"pid-{os.getpid()}",
                               ttl=ttl)
    return {"outcome": report.outcome, "summary": report.summary()}


def _main(argv: list[str]) -> int:
    action, db_path, provider_dir, refund_mode, close_mode, *rest = argv
    done = saga_step(action, db_path, provider_dir, refund_mode, close_mode,
                     float(rest[0]) if rest else 1.0)
    print(done["summary"])
    return 0 if done["outcome"] in ("done", "cancelled") else 3


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
