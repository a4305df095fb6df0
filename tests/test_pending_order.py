"""`pending_items` lists a thread's questions in the order its AIMessages asked for the
calls, whatever order the interrupts were saved in (parallel calls raise theirs in the
order their threads happen to run)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.types import Interrupt

from graph_durable.operators.pending import pending_items


def question(call_id: str, name: str) -> Interrupt:
    return Interrupt(value={"type": "tool_approval", "tool_call_id": call_id, "name": name,
                            "args": {}, "key": f"key-{call_id}"}, id=f"interrupt-{call_id}")


def state(*interrupts: Interrupt) -> Any:
    asked = AIMessage("", tool_calls=[
        {"id": "call_pay", "name": "send_payment", "args": {}},
        {"id": "call_mail", "name": "send_email", "args": {}}])
    return SimpleNamespace(values={"messages": [HumanMessage("go"), asked]},
                           interrupts=interrupts)


def ids(items: list[Any]) -> list[str]:
    return [item.tool_call_id for item in items]


def test_questions_follow_the_messages_order_whatever_the_saved_order() -> None:
    pay, mail = question("call_pay", "send_payment"), question("call_mail", "send_email")
    assert ids(pending_items(state(pay, mail), None, "t")) == ["call_pay", "call_mail"]
    assert ids(pending_items(state(mail, pay), None, "t")) == ["call_pay", "call_mail"]


def test_a_question_no_message_names_keeps_its_place_after_the_others() -> None:
    pay, mail = question("call_pay", "send_payment"), question("call_mail", "send_email")
    write = question("write-1", "send_invoice")
    assert ids(pending_items(state(write, mail, pay), None, "t")) == [
        "call_pay", "call_mail", "write-1"]
