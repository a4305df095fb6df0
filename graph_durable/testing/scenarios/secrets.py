"""A scenario whose tool calls carry secrets, for tests of what a ledger keeps at rest.

`build_secrets_agent` builds a ReAct-style graph (model -> EffectGuardNode -> model)
whose one model turn asks `charge(card=SECRET_CARD, cents=500)`. The tool writes to a
`FakeProvider` (file `<provider_dir>/charge.sqlite`) and answers with a receipt that
holds another secret (`SECRET_RECEIPT`); a `lookup` provider is looked up through the
same receipt. With `decline`, the tool refuses with `NotApplied` whose message holds
`SECRET_ERROR`. Reviewers' answers in the tests carry `SECRET_HUMAN_RECEIPT` (a receipt
given by a human) and `SECRET_EDIT` (edited arguments).

Every secret is a distinctive ASCII string, so a search of a database's raw bytes for it
is meaningful. The saver encrypts with `EncryptedSerializer` under `TEST_KEY` when
`encrypt` is set; `redact` names argument and receipt keys the tool's policy masks
(`Effect(redact=redact_keys(...))`). All arguments are JSON, so a child process
(`graph_durable.testing.crash.child.run_child`) rebuilds the same agent on the same database.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import StructuredTool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from graph_durable.checkpointers.sqlite import DurableSqliteSaver
from graph_durable.errors import NotApplied
from graph_durable.nodes import EffectGuardNode, current_effect
from graph_durable.policy import Effect
from graph_durable.testing.models import ScriptedChatModel
from graph_durable.testing.providers import FakeProvider, ProviderMode
from graph_durable.testing.scenarios.effects import EffectsAgent, policy_for_mode

__all__ = [
    "CHARGE_ARGS",
    "EDITED_ARGS",
    "SECRETS",
    "SECRET_CARD",
    "SECRET_EDIT",
    "SECRET_ERROR",
    "SECRET_HUMAN_RECEIPT",
    "SECRET_RECEIPT",
    "TEST_KEY",
    "build_secrets_agent",
    "charge_provider",
    "open_saver",
]

SECRET_CARD = "SECRET-CARD-4111111111111111"
"""The card number the model asks to charge (the call's arguments)."""
SECRET_RECEIPT = "SECRET-RECEIPT-auth-7Qx9Lm2VbT4k"
"""The provider's authorization token, in the tool's receipt."""
SECRET_HUMAN_RECEIPT = "SECRET-HUMAN-RECEIPT-ch-3Pz8Kw1NdR6m"
"""A token in the receipt a reviewer gives for an `unknown` outcome."""
SECRET_EDIT = "SECRET-EDIT-5555444433332222"
"""The card number a reviewer's edit puts in the call's arguments."""
SECRET_ERROR = "SECRET-ERROR-issuer-ref-9Fh2Rt6Ys"
"""Part of the error message of a declined charge."""
SECRETS = (SECRET_CARD, SECRET_RECEIPT, SECRET_HUMAN_RECEIPT, SECRET_EDIT, SECRET_ERROR)

TEST_KEY = b"graph-durable-at-rest-test-key-!"
"""The fixed 32-byte AES key of the encrypted saver (for tests only)."""
assert len(TEST_KEY) == 32

CHARGE_ARGS = {"card": SECRET_CARD, "cents": 500}
"""The arguments the model asks for."""
EDITED_ARGS = {"card": SECRET_EDIT, "cents": 500}
"""The arguments of a reviewer's edit."""


def charge_provider(provider_dir: str, mode: ProviderMode = "lookup") -> FakeProvider:
    """The charge tool's provider (its own SQLite file under `provider_dir`)."""
    os.makedirs(provider_dir, exist_ok=True)
    return FakeProvider(os.path.join(provider_dir, "charge.sqlite"), mode, name="charge")


def _receipt(applied: dict[str, Any]) -> dict[str, Any]:
    """What the tool returns for an applied charge: an id and a secret token."""
    return {"charge_id": applied["id"], "auth_token": SECRET_RECEIPT}


def _charge_tool(provider: FakeProvider, decline: bool) -> StructuredTool:
    def charge(card: str, cents: int) -> dict[str, Any]:
        if decline:
            raise NotApplied(f"card declined by the issuer, reference {SECRET_ERROR}")
        effect = current_effect()
        applied = provider.apply(effect.key, {"card": card, "cents": cents},
                                 fencing_token=effect.fencing_token)
        return _receipt(applied)

    return StructuredTool.from_function(charge, name="charge", description="Charge a card.")


def _policy(provider: FakeProvider, approval: bool, redact: list[str] | None) -> Effect:
    policy = policy_for_mode(provider, approval=approval)
    if policy.lookup is not None:
        def lookup(key: str) -> dict[str, Any] | None:
            found = provider.find(key)
            return None if found is None else _receipt(found)

        policy = dataclasses.replace(policy, lookup=lookup)
    if redact is not None:
        # Imported only when asked for, so the other scenarios run without it.
        from graph_durable import redact_keys  # type: ignore[attr-defined]

        policy = dataclasses.replace(policy, redact=redact_keys(*redact))  # type: ignore[call-arg]
    return policy


def _serde(encrypt: bool) -> Any:
    if not encrypt:
        return None
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    return EncryptedSerializer.from_pycryptodome_aes(key=TEST_KEY)


def _saver(db_path: str | None, postgres: str | None, encrypt: bool) -> Any:
    if postgres is None:
        assert db_path is not None
        return DurableSqliteSaver(sqlite3.connect(db_path, check_same_thread=False),
                                  serde=_serde(encrypt))
    from psycopg import Connection
    from psycopg.rows import dict_row

    from graph_durable.checkpointers.postgres import DurablePostgresSaver

    conn = Connection.connect(postgres, autocommit=True, prepare_threshold=0,
                              row_factory=dict_row)
    return DurablePostgresSaver(conn, serde=_serde(encrypt))


@contextmanager
def open_saver(db_path: str | None = None, *, postgres: str | None = None,
               encrypt: bool = False) -> Iterator[Any]:
    """The scenario's saver on `db_path` (or the PostgreSQL database `postgres`), with
    the test key when `encrypt`, closed on exit: to read back what the agent stored."""
    saver = _saver(db_path, postgres, encrypt)
    try:
        yield saver
    finally:
        saver.conn.close()


def build_secrets_agent(
    db_path: str,
    provider_dir: str,
    mode: ProviderMode = "lookup",
    approval: bool = False,
    decline: bool = False,
    encrypt: bool = False,
    redact: list[str] | None = None,
    postgres: str | None = None,
) -> EffectsAgent:
    """Build the charging agent.

    Args:
        db_path: The agent's SQLite database (checkpoints and ledger); unused with
            `postgres`.
        provider_dir: Folder of the provider's own database (`charge.sqlite`).
        mode: The provider's contract (`dedupe`, `lookup`, `blind`); the policy follows
            it, as in `graph_durable.testing.scenarios`.
        approval: The charge needs a human's approval before it is sent.
        decline: The tool refuses every charge with `NotApplied` (holding
            `SECRET_ERROR`); nothing reaches the provider.
        encrypt: The saver's serde is `EncryptedSerializer` under `TEST_KEY`.
        redact: Keys the tool's policy redacts (`Effect(redact=redact_keys(*redact))`).
        postgres: A libpq connection string: checkpoints and ledger live in that
            PostgreSQL database (`DurablePostgresSaver`) instead of `db_path`.
    """
    provider = charge_provider(provider_dir, mode)
    model = ScriptedChatModel(script=[
        AIMessage(content="", tool_calls=[
            {"name": "charge", "args": dict(CHARGE_ARGS), "id": "call_0_0"}]),
        AIMessage(content="All done."),
    ])

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", EffectGuardNode(
        [_charge_tool(provider, decline)],
        effects={"charge": _policy(provider, approval, redact)},
    ))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    saver = _saver(db_path, postgres, encrypt)
    return EffectsAgent(
        graph=builder.compile(checkpointer=saver),
        saver=saver,
        providers={"charge": provider},
        inputs={"messages": [HumanMessage("Charge the card on file for the order.")]},
    )
