"""The review inbox widget (`graph_durable.operators.notebook.inbox`), driven from Python.

Each test builds a guarded invoice agent (a payment needing approval, an email to a blind
relay), brings threads to a pause, some by SIGKILLing a real worker process mid-effect,
then fills the widget's fields and clicks its buttons as a person would, and checks
what the ledger recorded and what the providers applied.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from graph_durable import (
    AsyncDurableSqliteSaver,
    DurableSqliteSaver,
    Effect,
    EffectGuardNode,
    current_effect,
)
from graph_durable.operators.notebook import Inbox, ainbox, inbox
from graph_durable.testing import FakeProvider, FaultPlan
from graph_durable.testing.crash.child import run_child
from graph_durable.testing.models import ScriptedChatModel

pytest.importorskip("ipywidgets")

FACTORY = "tests.test_notebook_widget:build_agent"
PAY = {"invoice": "INV-7", "to": "ACME GmbH", "cents": 125000}
MAIL = {"to": "billing@acme.example", "subject": "INV-7 is paid"}


@dataclass
class Agent:
    graph: Any
    saver: DurableSqliteSaver
    payments: FakeProvider
    mail: FakeProvider
    inputs: dict[str, Any]


def build_agent(db_path: str, provider_dir: str, mail_approval: bool = False,
                pay: dict[str, Any] | None = None, saver: Any = None) -> Agent:
    """Pay an invoice (a person approves) and email the customer (a blind relay), on
    `saver` if given (an async one for `ainvoke`), else a `DurableSqliteSaver` on
    `db_path`."""
    os.makedirs(provider_dir, exist_ok=True)
    payments = FakeProvider(os.path.join(provider_dir, "payments.sqlite"), "dedupe",
                            name="payment")
    mail = FakeProvider(os.path.join(provider_dir, "mail.sqlite"), "blind", name="email")

    @tool
    def send_payment(invoice: str, to: str, cents: int) -> dict:
        """Pay an invoice."""
        return payments.apply(current_effect().key, {"invoice": invoice, "to": to,
                                                     "cents": cents})

    @tool
    def send_email(to: str, subject: str) -> dict:
        """Send an email."""
        return mail.apply(current_effect().key, {"to": to, "subject": subject})

    tools = EffectGuardNode([send_payment, send_email], effects={
        "send_payment": Effect(idempotent=True, approval=True,
                               description="Money leaves the account."),
        "send_email": Effect(approval=mail_approval),
    })
    model = ScriptedChatModel(script=[
        AIMessage(content="", tool_calls=[
            {"id": "call_pay", "name": "send_payment", "args": pay or PAY},
            {"id": "call_mail", "name": "send_email", "args": MAIL}]),
        AIMessage(content="Paid and told."),
    ]).bind_tools([send_payment, send_email])

    def agent(state: MessagesState) -> dict:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    if saver is None:
        saver = DurableSqliteSaver(sqlite3.connect(db_path, check_same_thread=False))
    return Agent(builder.compile(checkpointer=saver), saver, payments, mail,
                 {"messages": [HumanMessage("Pay INV-7 and tell ACME.")]})


def agent_in(tmp_path: Path, **kwargs: Any) -> Agent:
    return build_agent(str(tmp_path / "agent.sqlite"), str(tmp_path / "providers"), **kwargs)


def config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


def statuses(agent: Agent, thread_id: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for record in agent.saver.effects(thread_id):
        found.setdefault(record.tool_call_id, []).append(record.status.value)
    return found


def test_a_crashed_thread_is_decided_from_the_widget(tmp_path: Path) -> None:
    """SIGKILL a worker after the relay took the email; approve the payment and mark the
    email applied with the relay's receipt, by clicking; each effect happens once."""
    kwargs = {"db_path": str(tmp_path / "agent.sqlite"),
              "provider_dir": str(tmp_path / "providers")}
    crashed = run_child(FACTORY, kwargs, thread_id="inv",
                        fault=FaultPlan("after_effect", tool="send_email"))
    assert crashed.killed and crashed.returncode == -signal.SIGKILL
    agent = agent_in(tmp_path)
    agent.graph.invoke(None, config("inv"), durability="sync")  # asks: approval + unknown
    assert agent.mail.count() == 1 and agent.payments.count() == 0

    box = inbox(agent.graph, agent.saver, reviewer="ana")
    assert list(box.threads) == ["inv"]
    pay, mail = box.call("inv", "call_pay"), box.call("inv", "call_mail")
    assert set(pay.buttons) == {"approve", "edit", "reject", "respond"}
    assert set(mail.buttons) == {"applied", "retry", "skip"}
    assert "Money leaves the account." in pay.card.value
    review = box.threads["inv"].review
    [mail_item] = [item for item in review.pending if item.tool_call_id == "call_mail"]
    assert box.threads["inv"].records[mail_item.key].attempts == 1  # (pending: either order)
    assert box.thread("inv").resume_button.disabled

    pay.buttons["approve"].click()
    [sent] = agent.mail.effects()
    mail.receipt.value = json.dumps(sent["receipt"])
    mail.buttons["applied"].click()
    assert "decided: applied by ana" in mail.status.value
    assert agent.payments.count() == 0, "a decision alone sends nothing"
    box.thread("inv").resume_button.click()

    assert "Paid and told." in box.thread("inv").result.value
    assert statuses(agent, "inv") == {"call_pay": ["applied"], "call_mail": ["applied"]}
    assert agent.payments.count() == 1 and agent.mail.count() == 1
    decisions = [e.data["decision"] for e in agent.saver.events("inv") if e.kind == "decision"]
    assert sorted((d["type"], d["reviewer"]) for d in decisions) == [
        ("applied", "ana"), ("approve", "ana")]
    assert all(button.disabled for button in pay.buttons.values()), "its cards are closed"
    assert not box.threads and not box.refresh().threads


def test_the_edit_form_follows_the_tool_schema_and_shows_the_diff(tmp_path: Path) -> None:
    agent = agent_in(tmp_path, mail_approval=True)
    agent.graph.invoke(agent.inputs, config("inv"), durability="sync")
    box = inbox(agent.graph, agent.saver, reviewer="bo")
    pay = box.call("inv", "call_pay")
    fields = {name: type(field).__name__ for name, field in pay.fields.items()}
    assert fields == {"invoice": "Text", "to": "Text", "cents": "IntText"}
    assert pay.fields["cents"].value == 125000

    pay.fields["cents"].value = 120000
    pay.buttons["edit"].click()
    assert "cents: 125000 -&gt; 120000" in pay.status.value
    assert "120000" in pay.card.value and "edited" in pay.card.value
    box.call("inv", "call_mail").buttons["approve"].click()
    box.thread("inv").resume_button.click()

    [payment] = agent.payments.effects()
    assert payment["payload"] == {**PAY, "cents": 120000}
    assert agent.mail.count() == 1
    # The edit was sent under a new key; the asked call is closed, never sent.
    assert statuses(agent, "inv")["call_pay"] == ["skipped", "applied"]


def test_reject_and_respond_send_nothing(tmp_path: Path) -> None:
    agent = agent_in(tmp_path, mail_approval=True)
    agent.graph.invoke(agent.inputs, config("inv"), durability="sync")
    box = inbox(agent.graph, agent.saver)
    pay, mail = box.call("inv", "call_pay"), box.call("inv", "call_mail")
    pay.message.value = "wrong amount"
    pay.buttons["reject"].click()
    mail.message.value = "ACME was told on the phone"
    mail.buttons["respond"].click()
    box.thread("inv").resume_button.click()

    assert agent.payments.count() == 0 and agent.mail.count() == 0
    tools = {m.tool_call_id: m.content
             for m in agent.graph.get_state(config("inv")).values["messages"]
             if m.type == "tool"}
    assert "wrong amount" in tools["call_pay"]
    assert tools["call_mail"] == "ACME was told on the phone"
    assert statuses(agent, "inv")["call_pay"] == ["rejected"]


def test_retry_and_skip_unknown_outcomes_after_real_crashes(tmp_path: Path) -> None:
    """Two threads, each SIGKILLed after claiming the email and before sending it: one is
    retried (sent once, same key), the other skipped (never sent)."""
    kwargs = {"db_path": str(tmp_path / "agent.sqlite"),
              "provider_dir": str(tmp_path / "providers")}
    for thread_id in ("retried", "skipped"):
        assert run_child(FACTORY, kwargs, thread_id=thread_id,
                         fault=FaultPlan("after_intent", tool="send_email")).killed
    agent = agent_in(tmp_path)
    for thread_id in ("retried", "skipped"):
        agent.graph.invoke(None, config(thread_id), durability="sync")
    assert agent.mail.count() == 0

    box = inbox(agent.graph, agent.saver, reviewer="ana")
    assert sorted(box.threads) == ["retried", "skipped"]
    box.call("retried", "call_mail").buttons["retry"].click()
    box.call("retried", "call_pay").buttons["approve"].click()
    box.thread("retried").resume_button.click()
    skipped = box.call("skipped", "call_mail")
    skipped.message.value = "sent by hand"
    skipped.buttons["skip"].click()
    box.call("skipped", "call_pay").buttons["approve"].click()
    box.thread("skipped").resume_button.click()

    keys = [e["key"] for e in agent.mail.effects()]
    [retried_mail] = [r for r in agent.saver.effects("retried") if r.tool == "send_email"]
    assert keys == [retried_mail.key], "retried once, under the key of the crashed attempt"
    assert statuses(agent, "skipped")["call_mail"] == ["skipped"]
    assert agent.payments.count() == 2 and not box.refresh().threads


def test_a_refused_decision_is_shown_and_changes_nothing(tmp_path: Path) -> None:
    kwargs = {"db_path": str(tmp_path / "agent.sqlite"),
              "provider_dir": str(tmp_path / "providers")}
    assert run_child(FACTORY, kwargs, thread_id="inv",
                     fault=FaultPlan("after_effect", tool="send_email")).killed
    agent = agent_in(tmp_path)
    agent.graph.invoke(None, config("inv"), durability="sync")
    events = agent.saver.events("inv")
    box = inbox(agent.graph, agent.saver)
    mail = box.call("inv", "call_mail")
    mail.receipt.value = "{not json"
    mail.buttons["applied"].click()
    assert "refused" in mail.status.value and "not JSON" in mail.status.value
    assert box.thread("inv").resume_button.disabled
    assert not box.threads["inv"].review.decisions
    assert agent.saver.events("inv") == events
    assert statuses(agent, "inv")["call_mail"] == ["unknown"]


def test_only_threads_waiting_for_a_person_are_listed(tmp_path: Path) -> None:
    agent = agent_in(tmp_path, mail_approval=True)
    for thread_id in ("a", "b", "done"):
        agent.graph.invoke(agent.inputs, config(thread_id), durability="sync")
    finish = inbox(agent.graph, agent.saver).threads["done"].review
    finish.approve("call_pay").approve("call_mail").resume()

    box = inbox(lambda thread_id: agent.graph, agent.saver)  # a factory per thread works
    assert sorted(box.threads) == ["a", "b"]
    assert repr(box) == "Inbox(2 thread(s) waiting: a: 2, b: 2)"
    bundle = box._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/html"].count("<b>send_payment</b>") == 2  # one card per thread


def test_without_ipywidgets_the_inbox_is_static_html(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    agent = agent_in(tmp_path, mail_approval=True)
    agent.graph.invoke(agent.inputs, config("inv"), durability="sync")
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import ipywidgets now fails
    box = Inbox(agent.graph, agent.saver)
    with pytest.raises(ImportError, match=r"pip install 'graph-durable\[notebooks\]'"):
        box.widget  # noqa: B018
    bundle = box._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert "send_payment" in bundle["text/html"] and "Money leaves" in bundle["text/html"]


async def test_an_async_saver_on_the_running_loop_is_decided_from_the_async_widget(
        tmp_path: Path) -> None:
    """SIGKILL a worker after the relay took the email; open the database with
    `AsyncDurableSqliteSaver` on this (the notebook's) running loop, where the sync inbox
    cannot read. `await ainbox(...)` lists the thread, clicks decide, the Resume and
    Refresh clicks run `aresume` and `arefresh` as tasks on the loop; each effect once."""
    kwargs = {"db_path": str(tmp_path / "agent.sqlite"),
              "provider_dir": str(tmp_path / "providers")}
    assert run_child(FACTORY, kwargs, thread_id="inv",
                     fault=FaultPlan("after_effect", tool="send_email")).killed
    async with AsyncDurableSqliteSaver.from_conn_string(kwargs["db_path"]) as saver:
        agent = agent_in(tmp_path, saver=saver)
        await agent.graph.ainvoke(None, config("inv"), durability="sync")  # it asks
        assert agent.mail.count() == 1 and agent.payments.count() == 0
        with pytest.raises(asyncio.InvalidStateError, match="await the `a`-prefixed"):
            inbox(agent.graph, saver)  # the sync path calls the saver from its own loop

        box = await ainbox(agent.graph, saver, reviewer="ana")
        assert box.asynchronous and list(box.threads) == ["inv"]
        pay, mail = box.call("inv", "call_pay"), box.call("inv", "call_mail")
        assert set(mail.buttons) == {"applied", "retry", "skip"}
        pay.buttons["approve"].click()
        [sent] = agent.mail.effects()
        mail.receipt.value = json.dumps(sent["receipt"])
        mail.buttons["applied"].click()
        thread = box.thread("inv")
        thread.resume_button.click()  # returns at once: the resume is a task on the loop
        assert thread.resume_button.disabled and len(thread.view.tasks) == 1
        await asyncio.gather(*thread.view.tasks)

        assert "Paid and told." in thread.result.value
        found = {r.tool_call_id: r.status.value for r in await saver.aeffects("inv")}
        assert found == {"call_pay": "applied", "call_mail": "applied"}
        assert agent.payments.count() == 1 and agent.mail.count() == 1
        assert all(button.disabled for button in pay.buttons.values())
        assert not box.threads

        await agent.graph.ainvoke(agent.inputs, config("next"), durability="sync")
        thread.view.refresh_button.click()
        await asyncio.gather(*thread.view.tasks)
        assert list(box.threads) == ["next"] and "next" in box.thread("next").header.value


async def test_an_async_resume_refused_by_another_workers_lease_is_shown_and_sends_nothing(
        tmp_path: Path) -> None:
    """The Resume task meets a thread another worker holds: `LeaseLost` is shown on the
    thread and raised into the task (no click awaits it), nothing is sent, and the button
    is live again; once the lease ends, the same decisions resume the thread."""
    async with AsyncDurableSqliteSaver.from_conn_string(str(tmp_path / "agent.sqlite")) as saver:
        agent = agent_in(tmp_path, saver=saver, mail_approval=True)
        await agent.graph.ainvoke(agent.inputs, config("inv"), durability="sync")
        box = await ainbox(agent.graph, saver, reviewer="ana")
        box.call("inv", "call_pay").buttons["approve"].click()
        box.call("inv", "call_mail").buttons["approve"].click()
        thread = box.thread("inv")
        async with saver.alease("inv", "worker-2", ttl=30):
            thread.resume_button.click()
            [outcome] = await asyncio.gather(*thread.view.tasks, return_exceptions=True)
        assert type(outcome).__name__ == "LeaseLost"
        assert "not resumed: LeaseLost" in thread.result.value and "worker-2" in thread.result.value
        assert not thread.resume_button.disabled
        assert agent.payments.count() == 0 and agent.mail.count() == 0

        thread.resume_button.click()
        await asyncio.gather(*thread.view.tasks)
        assert "Paid and told." in thread.result.value
        assert agent.payments.count() == 1 and agent.mail.count() == 1


def test_a_question_of_hitl_before_the_guard_is_decided_from_the_widget(tmp_path: Path) -> None:
    """create_agent with HumanInTheLoopMiddleware listed before the guard: its question
    is a card like the guard's, and an edit clicked there is sent as edited, once."""
    from graph_durable.testing.explorer.scenario import build_explorer_agent

    charge = {"mode": "blind", "policy": "blind", "approval": True, "retries": 0,
              "timeout": None}
    agent = build_explorer_agent(str(tmp_path / "a.sqlite"), str(tmp_path / "p"),
                                 {"charge": charge},
                                 [[{"tool": "charge", "id": "c1", "item": "x00", "n": 0}]],
                                 topology="create_agent", stack="hitl_before_guard")
    agent.graph.invoke(agent.inputs, config("t"), durability="sync")
    box = inbox(agent.graph, agent.saver, reviewer="ana")
    card = box.call("t", "c1")
    assert set(card.buttons) == {"approve", "edit", "reject", "respond"}
    card.fields["n"].value = 1
    card.buttons["edit"].click()
    box.thread("t").resume_button.click()
    [sent] = agent.providers["charge"].effects()
    assert sent["payload"] == {"item": "x00", "n": 1}
    assert not box.refresh().threads
