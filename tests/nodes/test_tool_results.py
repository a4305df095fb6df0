"""What a guarded tool returned is what the model (and the graph) get back, on every path.

A looked-up tool's receipt may ride on the step's commit, since a lookup recovers it
after a crash. But a lookup rebuilds only a plain ToolMessage carrying its receipt: a
Command, an artifact or values JSON cannot hold are recorded at once, and replayed as
they were. A lookup may return a ToolMessage or a Command itself. In-process crashes
(`action="raise"`) with a new saver on the same database, as a new process would open;
the crash test that kills a real process is `tests/test_crash_commands.py`.
"""

from __future__ import annotations

import datetime
import decimal
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command, Send

from graph_durable import Effect, EffectGuardNode, EffectStatus, current_effect
from graph_durable.ledger import RESULT_FROM_RECEIPT, IntentWrite, TransitionWrite
from graph_durable.testing import FakeProvider, FaultPlan, InjectedCrash, arm, disarm
from graph_durable.testing.models import ScriptedChatModel

CONFIG = {"configurable": {"thread_id": "t"}}
CALL = {"name": "book", "args": {"room": "A"}, "id": "c1"}
WHEN = datetime.datetime(2026, 12, 4, 9, 30, tzinfo=datetime.timezone.utc)
ODD = {"at": WHEN, "amount": decimal.Decimal("12.50"), "tags": {"vip"}, "raw": b"\x00\x01"}
"""Values JSON cannot hold, as a tool may return them."""


class State(MessagesState, total=False):
    when: Any
    followed: bool


@pytest.fixture(autouse=True)
def _disarm():
    yield
    disarm()


@pytest.fixture
def provider(tmp_path: Path) -> FakeProvider:
    return FakeProvider(str(tmp_path / "p.sqlite"), "lookup", name="p")


def build(saver: Any, book: Any, lookup: Callable[[str], Any] | None,
          policy: Effect | None = None) -> Any:
    """agent -> tools -> agent; a Command's `goto="follow"` leads through `follow`.
    `book` is looked up with `lookup` unless another `policy` is given."""
    model = ScriptedChatModel(script=[AIMessage(content="", tool_calls=[dict(CALL)]),
                                      AIMessage(content="done")])
    builder = StateGraph(State)
    builder.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
    builder.add_node("tools", EffectGuardNode([book], effects={
        "book": policy or Effect(lookup=lookup)}), destinations=("follow",))
    builder.add_node("follow", lambda s: {"followed": True})
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    # Only a Command sets `when`; its goto is the way on then.
    builder.add_conditional_edges("tools", lambda s: END if "when" in s else "agent",
                                  ["agent", END])
    builder.add_edge("follow", "agent")
    return builder.compile(checkpointer=saver)


def run(graph: Any, value: Any) -> dict[str, Any]:
    return graph.invoke(value, CONFIG, durability="sync")


def book_tool(provider: FakeProvider, returns: str) -> Any:
    """`book` returning a plain dict, a ToolMessage with an artifact, or a Command."""
    if returns == "artifact":
        @tool(response_format="content_and_artifact")
        def book(room: str) -> tuple[str, dict[str, Any]]:
            """Book a room."""
            receipt = provider.apply(current_effect().key, {"room": room})
            return f"booked {receipt['id']}", {**ODD, "receipt": receipt}
        return book
    if returns == "command":
        @tool
        def book(room: str,  # type: ignore[no-redef]
                 tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
            """Book a room."""
            receipt = provider.apply(current_effect().key, {"room": room})
            answer = ToolMessage(f"booked {receipt['id']}", tool_call_id=tool_call_id,
                                 artifact=ODD)
            return Command(update={"messages": [answer], "when": WHEN}, goto="follow")
        return book

    @tool
    def book(room: str) -> dict[str, Any]:  # type: ignore[no-redef]
        """Book a room."""
        return provider.apply(current_effect().key, {"room": room})
    return book


def counted(lookup: Callable[[str], Any], calls: list[str]) -> Callable[[str], Any]:
    def find(key: str) -> Any:
        calls.append(key)
        return lookup(key)
    return find


def crash(graph: Any, point: str) -> None:
    arm(FaultPlan(point, action="raise"))
    with pytest.raises(InjectedCrash):
        run(graph, {"messages": [HumanMessage("go")]})
    disarm()


def answer(result: dict[str, Any]) -> ToolMessage:
    [message] = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    return message


# -- results a lookup could not rebuild are recorded at once, and replayed -------------------


@pytest.mark.parametrize("returns", ["artifact", "command"])
def test_a_result_a_lookup_could_not_rebuild_is_recorded_at_once_and_replayed(
        make_saver, provider, returns) -> None:
    saver = make_saver()
    crash(build(saver, book_tool(provider, returns), provider.find), "after_receipt")
    after = make_saver()  # what a new process finds: the receipt did not wait
    [record] = after.effects("t")
    assert record.status is EffectStatus.APPLIED, "the receipt waited for the step's commit"

    lookups: list[str] = []
    result = run(build(after, book_tool(provider, returns), counted(provider.find, lookups)),
                 None)
    assert lookups == [] and provider.count() == 1 and len(provider.requests()) == 1
    replayed = answer(result)
    receipt = provider.effects()[0]["receipt"]
    assert (replayed.content, replayed.name, replayed.tool_call_id, replayed.status) == (
        "booked p-1", "book", "c1", "success")
    assert replayed.artifact == (ODD if returns == "command" else {**ODD, "receipt": receipt})
    assert replayed.artifact["at"] == WHEN and replayed.artifact["tags"] == {"vip"}
    assert result["messages"][-1].content == "done"
    if returns == "command":
        assert result["when"] == WHEN and result["followed"] is True


def test_a_plain_result_still_rides_on_the_steps_commit(make_saver, provider) -> None:
    """The receipt a lookup recovers in full waits for the step's commit (no extra
    write); after a crash, the lookup gives the model the same ToolMessage."""
    saver = make_saver()
    crash(build(saver, book_tool(provider, "plain"), provider.find), "after_receipt")
    after = make_saver()
    [record] = after.effects("t")
    assert record.status is EffectStatus.IN_FLIGHT
    lookups: list[str] = []
    result = run(build(after, book_tool(provider, "plain"), counted(provider.find, lookups)),
                 None)
    assert lookups == [record.key] and provider.count() == 1
    receipt = provider.effects()[0]["receipt"]
    assert answer(result).content == json.dumps(receipt, ensure_ascii=False)
    assert after.effect(record.key, "t").receipt == receipt


# -- a result that is its receipt's own message is stored once -----------------------------


@pytest.mark.parametrize("content", [
    {"zone": "Zürich", "id": "p-1", "nested": {"b": [1.5, None], "a": True}},
    "booked p-1 (plain text)",
])
def test_a_result_that_is_its_receipt_is_rebuilt_from_it_for_replay(make_saver, provider,
                                                                      content) -> None:
    """A plain ToolMessage carrying the receipt is not stored beside it: the replay of a
    blind call (receipt committed at once) rebuilds the very message the model got,
    keys in the tool's order, without a lookup or a send."""

    @tool
    def book(room: str) -> Any:
        """Book a room."""
        provider.apply(current_effect().key, {"room": room})
        return content

    def blind(saver: Any) -> Any:
        return build(saver, book, None, Effect())

    sent = run(blind(make_saver()), {"messages": [HumanMessage("go")]})
    thread = {"configurable": {"thread_id": "t2"}}
    crash_graph = blind(make_saver())
    arm(FaultPlan("after_receipt", action="raise"))
    with pytest.raises(InjectedCrash):
        crash_graph.invoke({"messages": [HumanMessage("go")]}, thread, durability="sync")
    disarm()

    after = make_saver()
    [record] = after.effects("t2")
    assert record.status is EffectStatus.APPLIED
    replayed = blind(after).invoke(None, thread, durability="sync")
    assert provider.count() == 2  # one for each thread, none again on replay
    expected = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    assert answer(sent).content == expected
    assert answer(replayed).content == expected  # the tool's key order, not sorted
    assert answer(replayed).model_copy(update={"id": None}) == answer(sent).model_copy(
        update={"id": None})
    assert after.stored_result("t2", record.key) == ToolMessage(
        expected, name="book", tool_call_id="c1")
    assert record.receipt == content
    # Stored once: the row holds the receipt, and no serialised (or sealed) copy of it.
    query = ("SELECT result_type, result FROM effects WHERE thread_id = ?", ("t2",))
    [(result_type, stored)] = (after._query(*query) if hasattr(after, "_query")
                               else after._sync(after._aquery(*query)))
    assert (result_type, stored) == (RESULT_FROM_RECEIPT, None)


# -- a lookup that returns the tool's result ---------------------------------------------


def test_a_lookup_may_return_the_tool_message_itself(make_saver, provider) -> None:
    saver = make_saver()
    crash(build(saver, book_tool(provider, "artifact"), provider.find), "after_effect")

    def find(key: str) -> ToolMessage | None:
        receipt = provider.find(key)
        return None if receipt is None else ToolMessage(
            f"booked {receipt['id']}", tool_call_id="", artifact={**ODD, "receipt": receipt})

    after = make_saver()
    result = run(build(after, book_tool(provider, "artifact"), find), None)
    replayed = answer(result)
    assert (replayed.tool_call_id, replayed.name, replayed.content) == ("c1", "book", "booked p-1")
    assert replayed.artifact["amount"] == decimal.Decimal("12.50")
    assert provider.count() == 1 and len(provider.requests()) == 1
    [record] = after.effects("t")
    assert record.receipt["content"] == "booked p-1"
    assert after.stored_result("t", record.key) == replayed.model_copy(update={"id": None})


def test_a_lookup_may_return_the_command_itself(make_saver, provider) -> None:
    saver = make_saver()
    crash(build(saver, book_tool(provider, "command"), provider.find), "after_effect")

    def find(key: str) -> Command | None:
        receipt = provider.find(key)
        return None if receipt is None else Command(
            update={"messages": [ToolMessage(f"booked {receipt['id']}", tool_call_id="x")],
                    "when": WHEN}, goto="follow")

    result = run(build(make_saver(), book_tool(provider, "command"), find), None)
    assert answer(result).tool_call_id == "c1" and answer(result).content == "booked p-1"
    assert result["when"] == WHEN and result["followed"] is True
    assert provider.count() == 1 and len(provider.requests()) == 1


def test_a_lookup_command_that_cannot_answer_the_call_leaves_the_outcome_unknown(
        make_saver, provider) -> None:
    saver = make_saver()
    crash(build(saver, book_tool(provider, "command"), provider.find), "after_effect")

    def find(key: str) -> Command | None:
        return None if provider.find(key) is None else Command(update={"when": WHEN},
                                                                goto="follow")

    result = run(build(make_saver(), book_tool(provider, "command"), find), None)
    [question] = result["__interrupt__"]
    assert question.value["type"] == "effect_unknown"
    assert "carrying 0 ToolMessages" in question.value["error"]
    assert provider.count() == 1 and len(provider.requests()) == 1


# -- the saver stores every field of a Command ---------------------------------------------


def stored_command() -> Command:
    return Command(
        graph=Command.PARENT,
        update={"messages": [ToolMessage("booked", tool_call_id="c1", name="book",
                                         artifact=ODD)], "when": WHEN, "tags": {"a", "b"}},
        goto=["follow", Send("notify", {"at": WHEN})],
        resume={"interrupt": {"amount": decimal.Decimal("1.5")}},
    )


def intent() -> IntentWrite:
    return IntentWrite(key="k1", thread_id="t", checkpoint_ns="", tool_call_id="c1",
                       tool="book", args={"room": "A"}, status=EffectStatus.IN_FLIGHT)


def receipt(defer: bool) -> TransitionWrite:
    return TransitionWrite(thread_id="t", key="k1", to=EffectStatus.APPLIED, kind="receipt",
                           receipt={"id": "p-1"}, result=stored_command(), defer=defer)


def test_a_stored_command_keeps_every_field(make_saver) -> None:
    saver = make_saver()
    saver.claim(intent())
    saver.apply(receipt(defer=False))
    assert make_saver().stored_result("t", "k1") == stored_command()


async def test_a_stored_command_keeps_every_field_async(amake_saver) -> None:
    saver = await amake_saver()
    await saver.aclaim(intent())
    await saver.aapply(receipt(defer=False))
    assert await (await amake_saver()).astored_result("t", "k1") == stored_command()


def test_a_replayed_answer_is_made_to_answer_the_call_replaying_it() -> None:
    """A stored answer replayed to a call the model asked under another tool_call_id (a
    restarted subgraph): its one ToolMessage answers the new call, in a Command or a
    list too; of several, only those answering the ids the effect was asked under."""
    from graph_durable.nodes.results import rebound

    old = ToolMessage("ok", tool_call_id="old", name="book")
    assert rebound(old, "new").tool_call_id == "new"
    assert rebound(old, "old") is old
    command = Command(update={"messages": [old], "when": 1}, goto="audit")
    again = rebound(command, "new")
    assert again.update["messages"][0].tool_call_id == "new"
    assert (again.goto, again.update["when"]) == ("audit", 1)
    [listed] = rebound([command], "new")
    assert listed.update["messages"][0].tool_call_id == "new"
    other = ToolMessage("note", tool_call_id="other", name="note")
    several = rebound(Command(update={"messages": [other, old]}), "new", ("old",))
    assert [m.tool_call_id for m in several.update["messages"]] == ["other", "new"]
    untouched = Command(update={"messages": [other, old]})
    assert rebound(untouched, "new") is untouched


class _OwnToolMessage(ToolMessage):
    """A tool's own ToolMessage class (its messages compare as their class)."""


@pytest.mark.parametrize("result", [
    ToolMessage(content="booked A", name="book", tool_call_id="c1"),
    ToolMessage(content="booked A", name="book", tool_call_id="c1", artifact=None),
    ToolMessage(content="booked A", name="book", tool_call_id="c1", status="error"),
    ToolMessage(content="booked A", name="book", tool_call_id="c1", id="m1"),
    ToolMessage(content="booked A", name="book", tool_call_id="c1", artifact={"pdf": 1}),
    ToolMessage(content="booked A", name="book", tool_call_id="c1",
                additional_kwargs={"seen": True}),
    ToolMessage(content="booked A", name="book", tool_call_id="c1",
                response_metadata={"latency": 3}),
    ToolMessage(content="booked A", name="book", tool_call_id="c1", shelf="top"),
    ToolMessage(content="booked A", name="other", tool_call_id="c1"),
    ToolMessage(content="booked A", name="book", tool_call_id="c2"),
    ToolMessage(content="booked B", name="book", tool_call_id="c1"),
    _OwnToolMessage(content="booked A", name="book", tool_call_id="c1"),
], ids=["plain", "artifact-none", "error", "id", "artifact", "kwargs", "metadata", "extra",
        "other-tool", "other-call", "other-content", "own-class"])
def test_a_text_receipt_is_compared_as_the_message_it_makes(result: ToolMessage) -> None:
    """The text-receipt path of `rebuilt_by_lookup` (fields compared, no message built)
    says what comparing with the built message says."""
    from graph_durable.ledger import receipt_message
    from graph_durable.nodes.results import rebuilt_by_lookup

    built = receipt_message("booked A", "book", "c1")
    assert rebuilt_by_lookup(result, "booked A", "book", "c1") == (result == built)
    assert rebuilt_by_lookup(result, "booked A", "book", "c1") == (
        result.__class__ is ToolMessage and result.content == "booked A"
        and result.name == "book" and result.tool_call_id == "c1"
        and result.status == "success" and result.id is None and result.artifact is None
        and not result.additional_kwargs and not result.response_metadata
        and not result.__pydantic_extra__)
