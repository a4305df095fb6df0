"""The explorer's reviewer: answers an episode's pauses as a careful person would.

`Reviewer.decide` approves, edits, rejects or answers in place of approvals, and settles
unknown outcomes from the provider's records (as a person with its dashboard);
`Reviewer.malformed` makes a resume value that must be refused. Every choice is drawn
from the episode's reviewer seed and the round, so a replay answers alike.
"""

from __future__ import annotations

import os
import random
from typing import Any

from graph_durable.testing.explorer.checks import RESPONDED
from graph_durable.testing.explorer.model import Episode
from graph_durable.testing.providers import FakeProvider

__all__ = ["APPROVALS", "Reviewer", "by_interrupt_id"]

APPROVALS = ("effect_approval", "tool_approval")
"""Interrupt types asking for an approval (today's, and LangChain's per-call shape)."""


class Reviewer:
    """Answers pauses as a careful person with the providers' dashboards would."""

    def __init__(self, episode: Episode, provider_dir: str) -> None:
        self.episode = episode
        self.provider_dir = provider_dir
        self.rounds = 0

    def _rng(self, what: str) -> random.Random:
        return random.Random(f"{self.episode.reviewer.get('seed', 0)}-{self.rounds}-{what}")

    def _found(self, tool: str, key: str) -> dict[str, Any] | None:
        path = os.path.join(self.provider_dir, f"{tool}.sqlite")
        return FakeProvider(path, "lookup", name=tool).find(key)

    def decide(self, interrupts: list[dict[str, Any]],
               pending: list[dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
        """`{tool_call_id or key: decision}`, one valid decision per pending call."""
        self.rounds += 1
        rng = self._rng("valid")
        decisions = {}
        questions = [i["value"] for i in interrupts]
        # A tool_call_id names a call only if no other pending one (decided or not) has it.
        ids = [i["value"]["tool_call_id"] for i in (pending or interrupts)]
        for interrupt, question in zip(interrupts, questions, strict=True):
            roll = rng.random()
            tool = question.get("tool") or question.get("name")
            if question["type"] in APPROVALS:
                if roll < 0.55 and "key" not in question and roll >= 0.5:
                    # LangChain's HumanInTheLoopMiddleware asks without a key; it takes
                    # approve, edit or reject.
                    decision: dict[str, Any] = {"type": "reject", "message": "not this one"}
                elif roll < 0.5:
                    decision = {"type": "approve"}
                elif roll < 0.55:
                    decision = {"type": "respond", "message": RESPONDED}
                elif roll < 0.8:
                    args = dict(question["args"])
                    if not self.episode.reviewer.get("edit_unchanged"):
                        args["n"] = int(args.get("n", 0)) + 1
                    elif self.episode.reviewer.get("reencoded") and isinstance(
                            args.get("n"), int):
                        # The same args as a JSON client sends them back: 0.0 for 0,
                        # equal in Python, encoded apart.
                        args["n"] = float(args["n"])
                    decision = {"type": "edit", "edited_action": {"name": tool, "args": args}}
                else:
                    decision = {"type": "reject", "message": "not this one"}
            else:
                receipt = self._found(tool, question["key"])
                if receipt is not None:
                    decision = ({"type": "applied", "receipt": receipt} if roll < 0.85
                                else {"type": "skip", "message": "leave it"})
                else:
                    decision = {"type": "retry"} if roll < 0.7 else {"type": "skip"}
            # A model that repeats a tool_call_id leaves the key as the call's only name.
            name = question["tool_call_id"]
            # HumanInTheLoopMiddleware's questions have no key: their interrupt id, then.
            decisions[name if ids.count(name) == 1
                      else question.get("key", interrupt["id"])] = decision
        return decisions

    def malformed(self, interrupts: list[dict[str, Any]]) -> dict[str, Any] | None:
        """A resume value that must be refused, or `None` this round."""
        if not self.episode.reviewer.get("malformed"):
            return None
        rng = self._rng("malformed")
        if rng.random() < 0.4:
            return None
        valid = by_interrupt_id(self.decide(interrupts), interrupts)
        self.rounds -= 1
        first = interrupts[0]["value"]
        approval = first["type"] in APPROVALS
        broken = rng.choice([
            {"type": "bogus"},
            {"type": "retry"} if approval else {"type": "approve"},
            {"type": "edit"} if approval else {"type": "applied"},
            {"type": "reject", "message": 5} if approval else {"type": "skip", "message": 5},
            {"type": "edit", "edited_action": {"name": "nope", "args": {}}} if approval
            else "applied",
            {"type": "edit", "edited_action": {"args": {"item": 7, "n": 0}}} if approval
            else {"type": "applied"},  # args off the tool's schema
            {"type": "respond"} if approval else {"type": "retry", "reviewer": 3},
        ])
        # Every other call answered validly: a bad answer in a set runs none of them.
        return {**valid, interrupts[0]["id"]: broken}


def by_interrupt_id(decisions: dict[str, Any], interrupts: list[dict[str, Any]]
                    ) -> dict[str, Any]:
    """`{tool_call_id or key: decision}` keyed by the interrupt asking about each call
    (LangGraph's own form, the one it accepts while several interrupts are pending)."""
    ids: dict[str, str] = {}
    for interrupt in interrupts:
        ids.setdefault(interrupt["value"]["tool_call_id"], interrupt["id"])
        ids[interrupt["value"].get("key", interrupt["id"])] = interrupt["id"]
    return {ids[name]: decision for name, decision in decisions.items()}
