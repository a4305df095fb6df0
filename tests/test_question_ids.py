"""One id per question in a thread: a guarded write made in two `Send` branches asks two
questions whose ids differ (`name#position@place`), each answerable by that id from
`review`, the inbox (`record_decisions`) and the CLI; the short `name#position` is
refused as ambiguous, naming both."""

from __future__ import annotations

import operator
import sqlite3
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from graph_durable import DurableSqliteSaver, Effect, current_effect, guarded, review
from graph_durable.errors import InvalidDecision, NotApplied
from graph_durable.operators.inbox import inbox, record_decisions
from graph_durable.testing import FakeProvider
from tests.test_cli import cli

CONFIG = {"configurable": {"thread_id": "t"}}


class State(TypedDict, total=False):
    customers: list[str]
    customer: str
    invoices: Annotated[list[Any], operator.add]


def _fan_out(saver: Any, provider: FakeProvider) -> Any:
    @guarded(Effect(), name="create_invoice_fan")  # blind: neither dedupes nor looked up
    def create_invoice(customer: str) -> dict[str, Any]:
        return provider.apply(current_effect().key, {"customer": customer})

    def bill(state: State) -> dict[str, Any]:
        try:
            return {"invoices": [create_invoice(customer=state["customer"])]}
        except NotApplied as skipped:
            return {"invoices": [{"skipped": str(skipped)}]}

    builder = StateGraph(State)
    builder.add_node("bill", bill)
    builder.add_conditional_edges(
        START, lambda state: [Send("bill", {"customer": c}) for c in state["customers"]])
    builder.add_edge("bill", END)
    return builder.compile(checkpointer=saver)


@pytest.fixture
def paused(tmp_path: Path) -> tuple[Any, Any, FakeProvider, str]:
    """The fan-out paused on two `unknown` questions: both invoices were applied and
    both answers lost."""
    db = str(tmp_path / "agent.sqlite")
    saver = DurableSqliteSaver(sqlite3.connect(db, check_same_thread=False))
    provider = FakeProvider(str(tmp_path / "invoice.sqlite"), "blind")
    provider.script_faults("lost", "lost")
    graph = _fan_out(saver, provider)
    graph.invoke({"customers": ["ana", "bob"]}, CONFIG, durability="sync")
    return graph, saver, provider, db


def test_two_branches_ask_under_two_ids(paused: tuple[Any, Any, FakeProvider, str]) -> None:
    graph, saver, provider, _ = paused
    questions = [i.value for i in graph.get_state(CONFIG).interrupts]
    ids = sorted(q["tool_call_id"] for q in questions)
    assert [q["type"] for q in questions] == ["effect_unknown"] * 2
    assert len(set(ids)) == 2 and all(i.startswith("create_invoice_fan#0@") for i in ids)
    assert sorted(item.tool_call_id for item in review(graph, CONFIG).pending) == ids
    assert sorted(item.tool_call_id for item in inbox(saver, "t")) == ids
    assert sorted(r.tool_call_id for r in saver.effects("t")) == ids
    with pytest.raises(InvalidDecision, match="create_invoice_fan#0@"):
        review(graph, CONFIG).mark_applied("create_invoice_fan#0", {"id": "x"})
    with pytest.raises(InvalidDecision, match="full id"):
        record_decisions(saver, "t", {"create_invoice_fan#0": {"type": "skip"}})


def test_each_question_is_answered_by_its_id_from_review_the_inbox_and_the_cli(
    paused: tuple[Any, Any, FakeProvider, str]
) -> None:
    graph, saver, provider, db = paused
    first, second = sorted(i.value["tool_call_id"] for i in graph.get_state(CONFIG).interrupts)

    answered = review(graph, CONFIG).mark_applied(first, {"id": "inv-1"})
    graph.invoke(answered.command(), CONFIG, durability="sync")
    [left] = graph.get_state(CONFIG).interrupts
    assert left.value["tool_call_id"] == second

    done = cli("resolve", "t", second, "--applied", "--receipt", '{"id": "inv-2"}',
               "--db", db, "--no-resume")
    assert done.returncode == 0, done.stderr
    out = graph.invoke(None, CONFIG, durability="sync")
    assert sorted(i["id"] for i in out["invoices"]) == ["inv-1", "inv-2"]
    assert provider.count() == 2  # each applied once, before the answers were lost
    assert {r.status.value for r in saver.effects("t")} == {"applied"}


def test_the_inbox_records_an_answer_by_the_full_id(
    paused: tuple[Any, Any, FakeProvider, str]
) -> None:
    graph, saver, provider, _ = paused
    first, second = sorted(i.value["tool_call_id"] for i in graph.get_state(CONFIG).interrupts)
    record_decisions(saver, "t", {first: {"type": "skip", "message": "not needed"},
                                  second: {"type": "applied", "receipt": {"id": "inv-2"}}})
    graph.invoke(None, CONFIG, durability="sync")
    assert {r.tool_call_id: r.status.value for r in saver.effects("t")} == {
        first: "skipped", second: "applied"}
    assert provider.count() == 2
