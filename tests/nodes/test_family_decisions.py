"""Decisions in two threads of one family (`copy_thread`): a call is sent once across them.

The protocol is driven here against a real SQLite ledger, one step at a time, with the
tool's outcomes scripted (a pause on the tool's own question, a lost answer); the crash
tests of the same paths are `tests/test_explorer_regressions.py` (seeds 1011557,
1011825), which kill real workers.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langgraph.errors import GraphInterrupt

from graph_durable import DurableSqliteSaver, Effect, EffectStatus
from graph_durable.ledger import TransitionWrite
from graph_durable.nodes import operations as ops
from graph_durable.nodes.outcomes import Paused, Raised, Returned
from graph_durable.nodes.protocol import CallContext, run_call
from graph_durable.nodes.sync_driver import perform

CALL = {"id": "call1", "name": "email", "args": {"to": "a"}, "type": "tool_call"}
EDITED = {"name": "email", "args": {"to": "b"}}


class Ledger:
    """A saver and the sends the protocol made through it: `(thread, key, args)`."""

    def __init__(self, path: Path) -> None:
        self.saver = DurableSqliteSaver(sqlite3.connect(str(path), check_same_thread=False))
        self.saver.setup()
        self.sends: list[tuple[str, str, dict[str, Any]]] = []

    def run(self, thread: str, outcomes: list[Any], *, stop_after: Any = None
            ) -> tuple[str, Any]:
        """Run the call's protocol in `thread` until it ends (`done`, its answer), asks a
        human (`asked`, the record) or `stop_after(op)` says the worker dies there."""
        keying = self.saver.keying(thread)
        ctx = CallContext(thread_id=thread, checkpoint_ns="", tool_call=dict(CALL),
                          policy=Effect(approval=True), key_thread_id=keying.key_thread,
                          secret=keying.secret, key_scheme=keying.pin)
        protocol, value = run_call(ctx), None
        while True:
            try:
                op = protocol.send(value)
            except StopIteration as done:
                return "done", done.value
            if isinstance(op, ops.Ask):
                return "asked", op.record
            if isinstance(op, ops.CallTool):
                value = outcomes.pop(0)
                if not isinstance(value, Paused):  # a paused tool asked before it acted
                    self.sends.append((thread, op.record.key, dict(op.record.args)))
                continue
            value = perform(self.saver, None, op)
            if stop_after is not None and stop_after(op):
                return "stopped", op

    def decide(self, thread: str, key: str, decision: dict[str, Any]) -> None:
        status = self.saver.effect(key, thread).status
        self.saver.apply(TransitionWrite(
            thread_id=thread, key=key, to=status, kind="decision", asked=False,
            decision={**decision, "decided_at": time.time()}))


def _edited_in_copy(ledger: Ledger) -> tuple[Any, Any]:
    """The call asked in S, then copied into C, where a reviewer edited it and the
    edited call's answer was lost: the call's record in S and the edited one in C."""
    _, asked = ledger.run("S", [])
    ledger.saver.copy_thread("S", "C")
    ledger.decide("C", asked.key, {"type": "edit", "edited_action": EDITED})
    _, unknown = ledger.run("C", [Raised(RuntimeError("connection reset"))])
    return asked, unknown


def _paused(ledger: Ledger, thread: str) -> None:
    with pytest.raises(GraphInterrupt):
        ledger.run(thread, [Paused(GraphInterrupt())])


def test_a_tool_paused_in_both_threads_is_resumed_by_the_first_only(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    _, asked = ledger.run("S", [])
    ledger.decide("S", asked.key, {"type": "approve"})
    _paused(ledger, "S")
    ledger.saver.copy_thread("S", "C")  # the copy holds the paused call too
    state, answer = ledger.run("C", [Returned(ToolMessage("sent", tool_call_id="call1"))])
    assert (state, answer.content) == ("done", "sent")
    state, answer = ledger.run("S", [])  # resuming the tool here sends nothing
    assert (state, answer.content) == ("done", "sent")
    assert [thread for thread, _, _ in ledger.sends] == ["C"]


def test_a_paused_tool_is_resumed_while_a_copy_is_still_paused(tmp_path: Path) -> None:
    """A copy paused on the tool's question has sent nothing: it does not hold the call
    back here (and when it resumes, it finds this thread's send)."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    _, asked = ledger.run("S", [])
    ledger.decide("S", asked.key, {"type": "approve"})
    _paused(ledger, "S")
    ledger.saver.copy_thread("S", "C")
    assert ledger.run("S", [Returned(ToolMessage("sent", tool_call_id="call1"))])[0] == "done"
    assert ledger.run("C", [])[0] == "done"
    assert [thread for thread, _, _ in ledger.sends] == ["S"]


@pytest.mark.parametrize("paused_here", [False, True], ids=["awaiting", "paused"])
def test_a_call_edited_in_a_copy_is_that_call_in_its_source(tmp_path: Path,
                                                              paused_here: bool) -> None:
    """The copy's reviewer edited the call, and the edited one was sent with its answer
    lost. In the source, the call (awaiting its approval, or paused on its tool's
    question) is that edited call: asked about under its key, and a retry re-sends it
    under that key, never the call as first asked under its own."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    _, asked = ledger.run("S", [])
    original = asked.key
    ledger.saver.copy_thread("S", "C")
    if paused_here:
        ledger.decide("S", original, {"type": "approve"})
        _paused(ledger, "S")
    ledger.decide("C", original, {"type": "edit", "edited_action": EDITED})
    state, unknown = ledger.run("C", [Raised(RuntimeError("connection reset"))])
    assert (state, unknown.status, unknown.args) == ("asked", EffectStatus.UNKNOWN, {"to": "b"})
    if not paused_here:
        ledger.decide("S", original, {"type": "approve"})
    state, asked_here = ledger.run("S", [])
    assert (state, asked_here.key, asked_here.status) == ("asked", unknown.key,
                                                          EffectStatus.UNKNOWN)
    assert ledger.saver.effect(original, "S").status is EffectStatus.SKIPPED
    ledger.decide("S", unknown.key, {"type": "retry"})
    assert ledger.run("S", [Returned(ToolMessage("sent", tool_call_id="call1"))])[0] == "done"
    assert [(thread, key) for thread, key, _ in ledger.sends] == [("C", unknown.key),
                                                                  ("S", unknown.key)]


def test_a_call_takes_over_a_copys_edit_once_it_was_sent(tmp_path: Path) -> None:
    """As above, the copy's edited call then settled as applied: the source replays it."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    asked, unknown = _edited_in_copy(ledger)
    ledger.decide("S", asked.key, {"type": "approve"})
    state, asked_here = ledger.run("S", [])
    ledger.decide("C", unknown.key, {"type": "applied", "receipt": {"id": "m-1"}})
    assert ledger.run("C", [])[0] == "done"
    ledger.decide("S", asked_here.key, {"type": "retry"})
    state, answer = ledger.run("S", [])
    assert state == "done" and "m-1" in answer.content
    assert [thread for thread, _, _ in ledger.sends] == ["C"]


def test_a_worker_stopped_while_taking_over_an_edit_takes_it_up_again(tmp_path: Path) -> None:
    """Killed between resolving the call in favour of the family's edit and claiming
    the edited call here: the next run claims it and asks about it, so no call is left
    that nothing asks about."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    asked, unknown = _edited_in_copy(ledger)
    ledger.decide("S", asked.key, {"type": "approve"})
    state, _ = ledger.run("S", [], stop_after=lambda op: isinstance(op, ops.Write))
    assert state == "stopped"
    assert ledger.saver.effect(unknown.key, "S") is None  # resolved, not claimed yet
    state, asked_here = ledger.run("S", [])
    assert (state, asked_here.key) == ("asked", unknown.key)
    assert ledger.sends == [("C", unknown.key, {"to": "b"})]
