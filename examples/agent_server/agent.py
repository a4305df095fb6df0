"""A billing agent for the LangGraph Agent Server: a refund needs a human's approval;
a receipt email is sent to a provider that neither dedupes nor can be looked up; a card
is charged at a provider that does not dedupe but can be asked, by key, what it did.

The chat model is a small keyword router so the example runs offline: a message that
mentions "refund" asks for `refund`, one that mentions "receipt" asks for
`send_receipt`, one that mentions "charge" asks for `charge_card`, and after a tool's
answer it replies. Replace `KeywordModel()` with a
real model (e.g. `init_chat_model("openai:gpt-4.1")`) and nothing else changes.

The providers are graph_durable's fake ones, kept in SQLite files
(`BILLING_PROVIDER_DIR`), so a test can count what reached them. The card provider
answers after `BILLING_CARD_LATENCY` seconds (default 0), as a slow network would.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from graph_durable import Effect, EffectGuardNode, current_effect
from graph_durable.testing import FakeProvider

PROVIDER_DIR = os.environ.get("BILLING_PROVIDER_DIR", "providers")
os.makedirs(PROVIDER_DIR, exist_ok=True)
payments = FakeProvider(os.path.join(PROVIDER_DIR, "payments.sqlite"), "dedupe",
                        name="payments")
mail = FakeProvider(os.path.join(PROVIDER_DIR, "mail.sqlite"), "blind", name="mail")
cards = FakeProvider(os.path.join(PROVIDER_DIR, "cards.sqlite"), "lookup", name="cards")
CARD_LATENCY = float(os.environ.get("BILLING_CARD_LATENCY", "0"))


class KeywordModel(BaseChatModel):
    """Asks for a tool by keyword of the last human message; replies after a tool."""

    @property
    def _llm_type(self) -> str:
        return "keyword"

    def _generate(self, messages: list[BaseMessage], stop: Any = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            answer = AIMessage(content=f"Done: {last.content}")
        else:
            text = str(last.content) if isinstance(last, HumanMessage) else ""
            order = (re.findall(r"\d+", text) or ["0"])[0]
            if "refund" in text:
                call = {"name": "refund", "args": {"order": order, "cents": 1500}}
            elif "receipt" in text:
                call = {"name": "send_receipt", "args": {"order": order}}
            elif "charge" in text:
                call = {"name": "charge_card", "args": {"order": order, "cents": 900}}
            else:
                call = None
            answer = (AIMessage(content="", tool_calls=[{**call, "id": f"call_{call['name']}"}])
                      if call else AIMessage(content="How can I help?"))
        return ChatResult(generations=[ChatGeneration(message=answer)])

    def bind_tools(self, tools: Any, **kwargs: Any) -> KeywordModel:
        return self


@tool
def refund(order: str, cents: int) -> dict[str, Any]:
    """Refund an order."""
    return payments.apply(current_effect().key, {"order": order, "cents": cents})


@tool
def send_receipt(order: str) -> dict[str, Any]:
    """Email the receipt of an order."""
    return mail.apply(current_effect().key, {"order": order})


@tool
def charge_card(order: str, cents: int) -> dict[str, Any]:
    """Charge the customer's card for an order."""
    key = current_effect().key
    time.sleep(CARD_LATENCY)  # the request is out; the provider applies it, then answers
    return cards.apply(key, {"order": order, "cents": cents})


model = KeywordModel()


def agent(state: MessagesState) -> dict[str, Any]:
    return {"messages": [model.invoke(state["messages"])]}


builder = StateGraph(MessagesState)
builder.add_node("agent", agent)
builder.add_node("tools", EffectGuardNode(
    [refund, send_receipt, charge_card],
    effects={
        "refund": Effect(idempotent=True, approval=True,
                         description="Refunds money to the customer's card"),
        "send_receipt": Effect(),  # blind: neither dedupes nor can be looked up
        "charge_card": Effect(lookup=cards.find),  # no dedupe, but found by key
    },
))
builder.add_edge(START, "agent")
builder.add_conditional_edges("agent", tools_condition)
builder.add_edge("tools", "agent")

# No checkpointer here: the server compiles the graph with the one langgraph.json names.
graph = builder.compile()
