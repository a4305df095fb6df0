"""The ticket agent on stock LangGraph, for the demo's comparison: `ToolNode` and
`SqliteSaver`, no guard, the same script and the same providers' contracts.

    python -m graph_durable.demo.stock --db stock.sqlite --providers DIR --thread T [--crash]

With `--crash` the process SIGKILLs itself right after the ticket provider created the
ticket, at the same point the demo kills the guarded agent; without it, the thread is
resumed (or started). The tools send what a tool without a ledger can send: a fresh
request id each time, which a provider cannot tell from a new request.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import uuid
from typing import Any

from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from graph_durable.demo.ticket import SCRIPT
from graph_durable.faults import FaultPlan, arm, fault_point
from graph_durable.testing import FakeProvider, ScriptedChatModel

__all__ = ["build_stock_graph", "main"]

INPUT = "Customer Ana: my refund for order 1042 is late."


def build_stock_graph(db_path: str, provider_dir: str) -> tuple[Any, FakeProvider]:
    """The stock graph on `db_path`, and its ticket provider."""
    os.makedirs(provider_dir, exist_ok=True)
    tickets = FakeProvider(os.path.join(provider_dir, "tickets.sqlite"), "lookup",
                           name="ticket")
    mail = FakeProvider(os.path.join(provider_dir, "mail.sqlite"), "dedupe", name="email")

    @tool
    def create_ticket(title: str, body: str) -> dict:
        """Open a support ticket."""
        receipt = tickets.apply(f"req-{uuid.uuid4().hex[:12]}", {"title": title, "body": body})
        fault_point("after_effect", tool="create_ticket")  # where the demo kills it
        return receipt

    @tool
    def send_email(to: str, subject: str) -> dict:
        """Email a customer."""
        return mail.apply(f"req-{uuid.uuid4().hex[:12]}", {"to": to, "subject": subject})

    model = ScriptedChatModel(script=SCRIPT)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([create_ticket, send_email]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    saver = SqliteSaver(sqlite3.connect(db_path, check_same_thread=False))
    return builder.compile(checkpointer=saver), tickets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graph_durable.demo.stock",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--providers", required=True)
    parser.add_argument("--thread", required=True)
    parser.add_argument("--crash", action="store_true")
    args = parser.parse_args(argv)
    graph, _ = build_stock_graph(args.db, args.providers)
    config = {"configurable": {"thread_id": args.thread}}
    if args.crash:
        arm(FaultPlan("after_effect", tool="create_ticket"))
    started = graph.get_state(config).values
    graph.invoke(None if started else {"messages": [HumanMessage(INPUT)]}, config,
                 durability="sync")
    return 0


if __name__ == "__main__":
    sys.exit(main())
