"""Fakes several test modules share: tools whose one write goes to a `FakeProvider`,
and a stand-in for the scratchpad LangGraph gives a task."""

from __future__ import annotations

from typing import Any

from langchain_core.tools import BaseTool, tool

from graph_durable import current_effect
from graph_durable.testing import FakeProvider

__all__ = ["Scratchpad", "apay_tool", "charge_tool", "send_tool"]


def send_tool(provider: FakeProvider) -> BaseTool:
    """`send(to)`: one email through `provider`, keyed by the guard's key."""
    @tool
    def send(to: str) -> str:
        """Send an email."""
        receipt = provider.apply(current_effect().key, {"to": to})
        return f"sent {receipt['id']} to {to}"

    return send


def charge_tool(provider: FakeProvider) -> BaseTool:
    """`charge(cents)`: one charge through `provider`, keyed by the guard's key."""
    @tool
    def charge(cents: int) -> str:
        """Charge."""
        return f"charged {provider.apply(current_effect().key, {'cents': cents})['id']}"

    return charge


def apay_tool(provider: FakeProvider) -> BaseTool:
    """`pay(cents)`, an async tool: one payment through `provider`."""
    @tool
    async def pay(cents: int) -> str:
        """Pay."""
        return f"paid {provider.apply(current_effect().key, {'cents': cents})['id']}"

    return pay


class Scratchpad:
    """What the guard reads of a task's scratchpad: `get_null_resume` answers `bare`
    (the value a bare `Command(resume=...)` gave), `resume` the task's answers so far."""

    def __init__(self, bare: Any = None) -> None:
        self.bare = bare
        self.resume: list[Any] = []

    def get_null_resume(self, consume: bool = False) -> Any:
        return self.bare
