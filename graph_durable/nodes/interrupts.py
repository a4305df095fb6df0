"""The guard's interrupts: their ids, raising them, and what stands in for a call until
they are raised (pure: no saver, no graph)."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.errors import GraphInterrupt
from langgraph.types import Interrupt

from graph_durable.ledger import TransitionWrite, WriteBatch
from graph_durable.nodes.decisions import response_schema
from graph_durable.nodes.protocol import Ask

__all__ = [
    "OnAsk",
    "interrupt_id_for",
    "pending_placeholder",
    "raise_interrupts",
    "withdrawal",
    "with_schema",
]


OnAsk = Callable[[Ask, str], Any]
"""What a driver does when the protocol asks a human: `(ask, interrupt_id) -> result`."""



def interrupt_id_for(checkpoint_ns: str, key: str) -> str:
    """The id of the interrupt that asks about the effect `key` in the task
    `checkpoint_ns`: one interrupt per call, as LangChain's per-call mode.

    It has the form of LangGraph's own ids (32 hex digits), so LangGraph accepts
    `Command(resume={interrupt_id: decision, ...})` naming it, and hands the whole map to
    the task in its config, where the guard reads the answers addressed to its calls.
    """
    return hashlib.blake2b(f"{checkpoint_ns}|effect|{key}".encode(), digest_size=16).hexdigest()



def withdrawal(asks: list[tuple[Ask, str]]) -> WriteBatch | None:
    """Unask the questions of a task that a tool's own interrupt cut short.

    A task raises one interrupt at a time: the tool's goes out alone, and the guard's
    questions are asked again when the task runs after the tool's answer.
    """
    if not asks:
        return None
    thread_id = asks[0][0].record.thread_id
    return WriteBatch(thread_id, tuple(
        TransitionWrite(thread_id=thread_id, key=ask.record.key, to=ask.record.status,
                        kind="withdrawn", asked=False,
                        data={"reason": "a tool of the same step asked its own question"})
        for ask, _ in asks))



def with_schema(ask: Ask, tool: Any) -> Ask:
    """`ask` with the JSON schema of the decisions that answer it (edits follow `tool`)."""
    return dataclasses.replace(ask, schema=response_schema(ask.record, tool))



def raise_interrupts(asks: list[tuple[Ask, str]]) -> None:
    """Raise one GraphInterrupt carrying every question a task asks."""
    if asks:
        raise GraphInterrupt(
            tuple(Interrupt(value=ask.payload, id=interrupt_id, response_schema=ask.schema)
                  for ask, interrupt_id in asks)
        )



def pending_placeholder(ask: Ask) -> ToolMessage:
    """Stands in for a call awaiting a decision until the task raises its interrupt."""
    return ToolMessage(
        content="awaiting a human decision",
        name=ask.record.tool,
        tool_call_id=ask.record.tool_call_id,
        status="error",
    )
