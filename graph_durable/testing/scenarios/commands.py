"""A scenario whose looked-up tool returns a `Command`: a state update and a `goto`.

`build_booking_agent` builds: agent -> tools -> (the tool's `goto`) confirm ->
notify_tools -> agent. The agent's scripted model asks for `book(room)`; `book` writes
to the provider `book` (lookup mode, file `<provider_dir>/book.sqlite`) and returns
`Command(update={"messages": [its ToolMessage], "booking": <id>}, goto="confirm")`. The
`tools` node has no edge of its own, so only that `goto` leads on. `confirm` asks for
`notify(booking=state["booking"])`, a second guarded write to the provider `notify`
(lookup mode, `notify.sqlite`). So after a crash, a replay that drops the Command shows
on the providers' side: no notification, and no booking in the state.

`lookup` says what the book tool's lookup returns: `receipt` (the provider's receipt)
or `command` (the Command the tool would have returned, built from that receipt).
Arguments are JSON, so `graph_durable.testing.crash.child.run_child` can rebuild the agent.
"""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

import aiosqlite
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, StructuredTool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command

from graph_durable.checkpointers.sqlite import AsyncDurableSqliteSaver
from graph_durable.nodes import EffectGuardNode, current_effect
from graph_durable.policy import Effect
from graph_durable.testing.models import ScriptedChatModel
from graph_durable.testing.providers import FakeProvider
from graph_durable.testing.savers import SaverSpec, aopen_saver, open_saver
from graph_durable.testing.scenarios.effects import EffectsAgent

__all__ = ["BOOK_CALL_ID", "BookingState", "booked", "build_booking_agent",
           "build_booking_agent_async"]

BOOK_CALL_ID = "call_book"


class BookingState(MessagesState, total=False):
    """The conversation, and the booking the `book` tool's Command sets."""

    booking: str
    """The id of the booking (set only by `book`'s state update)."""


def booked(receipt: dict[str, Any], tool_call_id: str) -> Command:
    """What `book` returns for the provider's `receipt`: its answer, the booking id in
    the state, and a `goto` to the confirmation."""
    return Command(
        update={"messages": [ToolMessage(json.dumps(receipt), tool_call_id=tool_call_id)],
                "booking": receipt["id"]},
        goto="confirm",
    )


def build_booking_agent(db_path: str, provider_dir: str, lookup: str = "receipt",
                        saver: SaverSpec | None = None) -> EffectsAgent:
    """The booking agent on a `DurableSqliteSaver` at `db_path` (or the saver `saver`
    names, `graph_durable.testing.savers`); `lookup` is `receipt` or `command`."""
    return _assemble(open_saver(saver, db_path), provider_dir, lookup)


async def build_booking_agent_async(db_path: str, provider_dir: str, lookup: str = "receipt",
                                    saver: SaverSpec | None = None) -> EffectsAgent:
    """`build_booking_agent` on an `AsyncDurableSqliteSaver` (or the async saver `saver`
    names), for `ainvoke`."""
    durable = (AsyncDurableSqliteSaver(aiosqlite.connect(db_path)) if saver is None
               else await aopen_saver(saver, db_path))
    return _assemble(durable, provider_dir, lookup)


def _assemble(saver: Any, provider_dir: str, lookup: str) -> EffectsAgent:
    if lookup not in ("receipt", "command"):
        raise ValueError(f"lookup is 'receipt' or 'command', not {lookup!r}")
    os.makedirs(provider_dir, exist_ok=True)
    books, notices = (FakeProvider(os.path.join(provider_dir, f"{name}.sqlite"), "lookup",
                                   name=name) for name in ("book", "notify"))

    def book(room: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
        return booked(books.apply(current_effect().key, {"room": room}), tool_call_id)

    def notify(booking: str) -> dict[str, Any]:
        return notices.apply(current_effect().key, {"booking": booking})

    def find_booking(key: str) -> Any:
        receipt = books.find(key)
        if receipt is None or lookup == "receipt":
            return receipt
        return booked(receipt, tool_call_id="")  # the guard makes it answer the call

    model = ScriptedChatModel(script=[
        AIMessage(content="", tool_calls=[{"name": "book", "args": {"room": "A"},
                                           "id": BOOK_CALL_ID}]),
        AIMessage(content="Booked and confirmed."),
    ])

    def agent(state: BookingState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def confirm(state: BookingState) -> dict[str, Any]:
        call = {"name": "notify", "args": {"booking": state["booking"]}, "id": "call_notify"}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}

    builder = StateGraph(BookingState)
    builder.add_node("agent", agent)
    builder.add_node("tools", EffectGuardNode(
        [StructuredTool.from_function(book, description="Book a room.")],
        effects={"book": Effect(lookup=find_booking)}), destinations=("confirm",))
    builder.add_node("confirm", confirm)
    builder.add_node("notify_tools", EffectGuardNode(
        [StructuredTool.from_function(notify, description="Send the confirmation.")],
        effects={"notify": Effect(lookup=notices.find)}))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("confirm", "notify_tools")
    builder.add_edge("notify_tools", "agent")
    return EffectsAgent(graph=builder.compile(checkpointer=saver), saver=saver,
                        providers={"book": books, "notify": notices},
                        inputs={"messages": [HumanMessage("Book room A and confirm it.")]})
