"""A step's claim made with the keying most threads have, checked in its transaction.

The guard claims a step's calls with `predicted_keying` instead of reading the thread's
keying first; the claim checks it where it writes (SQLite: in its transaction; PostgreSQL:
`graph_durable_keyed_as`, after the fenced claim, in the same round trip) and writes
nothing of a thread keyed otherwise: a copy (keyed by its source), a thread pinned to
another key secret.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from graph_durable import DurableSqliteSaver, Effect, EffectGuardNode, current_effect
from graph_durable.checkpointers._base import KeyingChanged
from graph_durable.ledger import EffectStatus, IntentWrite, Keying
from graph_durable.testing import FakeProvider
from graph_durable.testing.models import ScriptedChatModel

S = EffectStatus
SECRET_A = "a" * 64
SECRET_B = "b" * 64


def _sqlite(path: Path, **options: Any) -> DurableSqliteSaver:
    saver = DurableSqliteSaver(sqlite3.connect(path, check_same_thread=False), **options)
    saver.setup()
    return saver


@pytest.fixture(params=["sqlite", "postgres"])
def open_saver(request, tmp_path: Path) -> Iterator[Any]:
    """`open_saver(**options)`: a sync durable saver on one database per test."""
    opened: list[Any] = []
    if request.param == "sqlite":
        def make(**options: Any) -> Any:
            saver = _sqlite(tmp_path / "ledger.sqlite", **options)
            opened.append(saver.conn)
            return saver
    else:
        from graph_durable.checkpointers.postgres import DurablePostgresSaver
        conninfo = request.getfixturevalue("postgres_conninfo")

        def make(**options: Any) -> Any:
            context = DurablePostgresSaver.from_conn_string(conninfo, **options)
            opened.append(context)
            return context.__enter__()
    yield make
    for one in opened:
        if hasattr(one, "__exit__"):
            one.__exit__(None, None, None)
        else:
            one.close()


def _intent(thread_id: str, key: str, keying: Keying | None) -> IntentWrite:
    return IntentWrite(key=key, thread_id=thread_id, checkpoint_ns="tools:x",
                       tool_call_id=f"c-{key}", tool="pay", args={"cents": 5},
                       status=S.IN_FLIGHT, key_scheme=None if keying is None else keying.pin,
                       keying=keying)


def test_nothing_is_predicted_before_a_thread_is_read(open_saver) -> None:
    saver = open_saver()
    assert saver.predicted_keying("t") is None
    read = saver.keying("t")
    assert saver.predicted_keying("u") == read._replace(key_thread="u")
    assert saver.predicted_keying("u") == saver.keying("u")


def test_a_claim_keyed_as_predicted_is_written_and_pins_the_scheme(open_saver) -> None:
    saver = open_saver(key_secret=SECRET_A)
    saver.keying("first")
    predicted = saver.predicted_keying("t")
    [(record, created)] = saver.claim_many([_intent("t", "k1", predicted)])
    assert created and record.key == "k1"
    assert saver.keying("t").pin is None  # pinned by the claim
    assert saver.keying("t")[:3] == predicted[:3]


def test_a_copy_is_not_claimed_under_the_predicted_keying(open_saver) -> None:
    saver = open_saver()
    saver.keying("first")
    saver.claim_many([_intent("source", "k0", None)])
    saver.copy_thread("source", "copy")
    predicted = saver.predicted_keying("copy")
    assert predicted is not None and predicted.key_thread == "copy"
    with pytest.raises(KeyingChanged):
        saver.claim_many([_intent("copy", "k1", predicted), _intent("copy", "k2", predicted)])
    assert {effect.key for effect in saver.effects("copy")} == {"k0"}  # the copy's own
    assert all(event.key == "k0" for event in saver.events("copy"))
    assert saver.keying("copy").key_thread == "source"


def test_a_thread_pinned_to_another_key_secret_is_not_claimed_under_the_new_one(
        open_saver) -> None:
    first = open_saver(key_secret=SECRET_A)
    first.claim_many([_intent("t", "k0", first.predicted_keying("t") or first.keying("t"))])
    rotated = open_saver(key_secret=[SECRET_B, SECRET_A])
    rotated.keying("fresh")  # a thread of the new secret: what the saver predicts
    predicted = rotated.predicted_keying("t")
    assert predicted.secret != first.keying("t").secret
    with pytest.raises(KeyingChanged):
        rotated.claim_many([_intent("t", "k1", predicted)])
    assert [effect.key for effect in rotated.effects("t")] == ["k0"]
    assert rotated.keying("t").secret == first.keying("t").secret


def test_a_refused_prediction_leaves_other_claims_of_the_group_alone(tmp_path: Path) -> None:
    # SQLite's group commit may claim another caller's intents of the thread in the same
    # transaction: only the intents made with the prediction are refused.
    saver = _sqlite(tmp_path / "ledger.sqlite")
    saver.keying("first")
    saver.claim_many([_intent("source", "k0", None)])
    saver.copy_thread("source", "copy")
    predicted = saver.predicted_keying("copy")
    from graph_durable.checkpointers.sqlite._txn import QueuedWrite
    items = [QueuedWrite(_intent("copy", "read", None), None),
             QueuedWrite(_intent("copy", "guessed", predicted), None)]
    with saver.lock:
        cur = saver.conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        saver._claim_txn(cur, items, (None, None))
        saver.conn.commit()
    assert items[0].error is None and isinstance(items[1].error, KeyingChanged)
    assert {effect.key for effect in saver.effects("copy")} == {"k0", "read"}


def test_a_guarded_step_in_a_copy_claims_under_its_sources_keys(open_saver, tmp_path) -> None:
    # The saver has read a thread keyed by its own id, so it predicts that keying for
    # the copy too: the claim is refused, the guard reads the copy's keying and finds
    # the source's effect, which it replays instead of sending again.
    saver = open_saver()
    provider = FakeProvider(str(tmp_path / "p.sqlite"), "dedupe", name="p")

    @tool
    def pay(cents: int) -> str:
        """Pay."""
        provider.apply(current_effect().key, {"cents": cents})
        return f"paid {cents}"

    model = ScriptedChatModel(script=[
        AIMessage(content="", tool_calls=[{"name": "pay", "args": {"cents": 5}, "id": "c1"}]),
        AIMessage(content="done")])
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
    builder.add_node("tools", EffectGuardNode([pay], effects={"pay": Effect(idempotent=True)}))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    graph = builder.compile(checkpointer=saver, interrupt_after=["tools"])
    graph.invoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": "t"}},
                 durability="sync")
    assert provider.count() == 1
    before_tools = next(state for state in graph.get_state_history(
        {"configurable": {"thread_id": "t"}}) if state.next == ("tools",))
    saver.copy_thread("t", "copy")
    assert saver.predicted_keying("copy").key_thread == "copy"
    refused: list[BaseException] = []
    original = type(saver)._keying_refusal

    def spied(self: Any, *args: Any) -> BaseException | None:
        refusal = original(self, *args)
        refused.append(refusal)
        return refusal

    copy_config = {"configurable": {**before_tools.config["configurable"],
                                    "thread_id": "copy"}}
    if hasattr(type(saver), "_claim_txn"):
        type(saver)._keying_refusal = spied  # type: ignore[method-assign]
    try:
        graph.invoke(None, copy_config, durability="sync")
    finally:
        type(saver)._keying_refusal = original  # type: ignore[method-assign]
    assert provider.count() == 1  # replayed from the source's receipt, not sent again
    if hasattr(type(saver), "_claim_txn"):
        assert any(isinstance(one, KeyingChanged) for one in refused)
    copied = [effect for effect in saver.effects("copy") if effect.tool == "pay"]
    assert [effect.status for effect in copied] == [S.APPLIED]
    assert copied[0].key == [e for e in saver.effects("t") if e.tool == "pay"][0].key


async def test_the_async_postgres_saver_claims_under_the_predicted_keying(
        postgres_conninfo: str) -> None:
    from graph_durable.checkpointers.postgres import AsyncDurablePostgresSaver

    async with AsyncDurablePostgresSaver.from_conn_string(postgres_conninfo) as saver:
        assert await saver.apredicted_keying("t") is None
        await saver.akeying("first")
        predicted = await saver.apredicted_keying("t")
        [(record, created)] = await saver.aclaim_many([_intent("t", "k1", predicted)])
        assert created and record.key == "k1"
        assert (await saver.akeying("t"))[:3] == predicted[:3]
        await saver.aclaim_many([_intent("source", "k0", None)])
        await saver.acopy_thread("source", "copy")
        with pytest.raises(KeyingChanged):
            await saver.aclaim_many([_intent("copy", "k2", await saver.apredicted_keying(
                "copy"))])
        assert {effect.key for effect in await saver.aeffects("copy")} == {"k0"}


async def test_the_async_group_commit_claims_a_prediction_only_in_a_group_of_its_own(
        postgres_conninfo: str) -> None:
    """Its check would refuse the whole transaction: grouped with another caller's
    intent, a predicted intent is refused unasked (`KeyingChanged`, nothing written),
    and the other caller's intent is claimed."""
    import asyncio

    from graph_durable.checkpointers.postgres import AsyncDurablePostgresSaver

    async with AsyncDurablePostgresSaver.from_conn_string(postgres_conninfo) as saver:
        await saver.akeying("first")
        predicted = await saver.apredicted_keying("t")
        lock = saver._group_locks.setdefault("t", asyncio.Lock())
        async with lock:  # both callers queue behind it: one commit takes both
            read = asyncio.create_task(saver.aclaim_many([_intent("t", "read", None)]))
            guessed = asyncio.create_task(saver.aclaim_many([_intent("t", "guessed",
                                                                      predicted)]))
            while len(saver._groups.get("t", [])) < 2:
                await asyncio.sleep(0.01)
        [(record, created)] = await read
        assert created and record.key == "read"
        with pytest.raises(KeyingChanged):
            await guessed
        assert [effect.key for effect in await saver.aeffects("t")] == ["read"]
        [(_, created)] = await saver.aclaim_many([_intent("t", "guessed", predicted)])
        assert created  # alone, the same prediction is claimed


def test_intents_claimed_together_carry_one_predicted_keying() -> None:
    from graph_durable.checkpointers.postgres._sql import predicted_of

    one = Keying("t", False, b"a" * 32, "hmac-sha256:a")
    other = Keying("t", False, b"b" * 32, "hmac-sha256:b")
    assert predicted_of([_intent("t", "k1", one), _intent("t", "k2", None)]) == one
    with pytest.raises(ValueError, match="different predicted keyings"):
        predicted_of([_intent("t", "k1", one), _intent("t", "k2", other)])
