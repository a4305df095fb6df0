"""EffectGuardNode in one process: outcomes, decisions, bad input (sync)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command

from graph_durable import (
    DurabilityError,
    DurableSqliteSaver,
    Effect,
    EffectStatus,
    EffectGuardNode,
    InvalidDecision,
    NotApplied,
    Retryable,
    current_effect,
)
from graph_durable.errors import NotDurableCheckpointer, UnkeyableToolCall
from graph_durable.testing import FakeProvider, FaultPlan, InjectedCrash, arm, disarm
from graph_durable.testing.models import ScriptedChatModel

CONFIG = {"configurable": {"thread_id": "t"}}


def call(name: str, args: dict[str, Any], call_id: str = "c1") -> dict[str, Any]:
    return {"name": name, "args": args, "id": call_id}


def build(saver: Any, tools: list, effects: dict[str, Effect], *calls: dict[str, Any]):
    script = [AIMessage(content="", tool_calls=list(calls)), AIMessage(content="done")]
    model = ScriptedChatModel(script=script)
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
    builder.add_node("tools", EffectGuardNode(tools, effects=effects))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


NEW = object()


def run(graph: Any, value: Any = NEW) -> dict[str, Any]:
    """Invoke: a new conversation by default, `None` to continue, or a Command."""
    value = {"messages": [HumanMessage("go")]} if value is NEW else value
    return graph.invoke(value, CONFIG, durability="sync")


def ledger_serde(kind: str) -> Any:
    """`None` (a plain ledger), or an encrypting serde (a sealed one)."""
    return EncryptedSerializer.from_pycryptodome_aes(key=b"k" * 32) if kind == "sealed" else None


@pytest.fixture(params=["plain", "sealed"])
def saver(request: pytest.FixtureRequest, make_saver: Callable[..., Any]) -> Any:
    """Every guard test runs on every durable saver (`saver_backend`), with a plain
    ledger and with one sealed by an encrypting serde."""
    return make_saver(serde=ledger_serde(request.param))


@pytest.fixture
def provider(tmp_path: Path) -> FakeProvider:
    return FakeProvider(str(tmp_path / "p.sqlite"), "blind", name="p")


@pytest.fixture(autouse=True)
def _disarm():
    yield
    disarm()


def ledger_snapshot(saver: Any) -> tuple[list, list]:
    return ([r.model_dump() for r in saver.effects()], [e.model_dump() for e in saver.events()])


# -- receipts and replay -------------------------------------------------------------------


def test_receipt_is_replayed_with_an_identical_tool_message(saver, provider) -> None:
    @tool(response_format="content_and_artifact")
    def book(room: str) -> tuple[str, dict]:
        """Book a room."""
        receipt = provider.apply(current_effect().key, {"room": room})
        return f"booked {receipt['id']}", {"receipt": receipt}

    graph = build(saver, [book], {}, call("book", {"room": "A"}))
    arm(FaultPlan("after_receipt", action="raise"))
    with pytest.raises(InjectedCrash):
        run(graph)
    disarm()
    stored = saver.stored_result("t", saver.effects("t")[0].key)
    result = run(graph, None)

    replayed = result["messages"][2]
    assert isinstance(replayed, ToolMessage)
    for attribute in ("content", "artifact", "name", "tool_call_id", "status"):
        assert getattr(replayed, attribute) == getattr(stored, attribute)
    assert replayed.content == "booked p-1"
    assert provider.count() == 1 and len(provider.requests()) == 1


@pytest.mark.parametrize("mode", ["blind", "lookup"])
def test_a_copied_thread_replays_or_reconciles_under_its_sources_keys(
    saver, tmp_path, mode
) -> None:
    """A fork of a thread that crashed mid-step must not send its effect again."""
    provider = FakeProvider(str(tmp_path / f"{mode}.sqlite"), mode, name="p")

    @tool
    def send(to: str) -> str:
        """Send."""
        provider.apply(current_effect().key, {"to": to})
        return f"sent to {to}"

    policy = Effect(lookup=provider.find) if mode == "lookup" else Effect()
    graph = build(saver, [send], {"send": policy}, call("send", {"to": "x"}))
    # blind: the receipt is committed, the step is not; lookup: the receipt is not.
    arm(FaultPlan("after_receipt" if mode == "blind" else "after_effect", action="raise"))
    with pytest.raises(InjectedCrash):
        run(graph)
    disarm()
    saver.copy_thread("t", "fork")
    result = graph.invoke(None, {"configurable": {"thread_id": "fork"}}, durability="sync")
    assert result["messages"][-1].content == "done"
    assert provider.count() == 1 and len(provider.requests()) == 1
    [record] = saver.effects("fork")
    assert record.status is EffectStatus.APPLIED
    assert record.key == saver.effects("t")[0].key  # the key the provider saw


def lost_send(keys: list[str], error: str) -> Any:
    """A `send` tool that notes the key it is given in `keys`, then loses the connection
    (`error`): its outcome is unknown."""
    @tool
    def send(to: str) -> str:
        """Send."""
        keys.append(current_effect().key)
        raise ConnectionError(error)

    return send


def test_key_is_stable_and_visible_to_the_tool(saver, provider) -> None:
    seen: list[str] = []
    send = lost_send(seen, "reset by peer")
    graph = build(saver, [send], {"send": Effect(idempotent=True)}, call("send", {"to": "x"}))
    result = run(graph)
    # Live unknown outcome + idempotent provider: one re-send with the same key, then ask.
    assert len(seen) == 2 and seen[0] == seen[1]
    [question] = result["__interrupt__"]
    assert question.value["key"] == seen[0] and question.value["attempts"] == 2


# -- tool outcomes -------------------------------------------------------------------------


def test_not_applied_becomes_failed_and_the_model_sees_an_error(saver) -> None:
    @tool
    def pay(cents: int) -> str:
        """Pay."""
        raise NotApplied("card declined")

    result = run(build(saver, [pay], {}, call("pay", {"cents": 5})))
    message = result["messages"][2]
    assert message.status == "error" and "card declined" in message.content
    [record] = saver.effects("t")
    assert record.status == "failed" and record.attempts == 1


def test_retryable_is_retried_with_the_same_key_then_applied(saver) -> None:
    keys: list[str] = []

    @tool
    def pay(cents: int) -> str:
        """Pay."""
        keys.append(current_effect().key)
        if len(keys) < 3:
            raise Retryable("busy")
        return "paid"

    run(build(saver, [pay], {"pay": Effect(retries=2)}, call("pay", {"cents": 5})))
    [record] = saver.effects("t")
    assert record.status == "applied" and record.attempts == 3
    assert len(set(keys)) == 1
    assert [e.kind for e in saver.events("t")] == ["intent", "attempt", "attempt", "receipt"]


def test_retryable_beyond_retries_is_failed(saver) -> None:
    @tool
    def pay(cents: int) -> str:
        """Pay."""
        raise Retryable("busy")

    result = run(build(saver, [pay], {"pay": Effect(retries=1)}, call("pay", {"cents": 5})))
    assert saver.effects("t")[0].status == "failed"
    assert saver.effects("t")[0].attempts == 2
    assert "after 2 attempts" in result["messages"][2].content


def test_other_exception_is_unknown_not_failed(saver) -> None:
    @tool
    def pay(cents: int) -> str:
        """Pay."""
        raise ConnectionError("connection reset after sending")

    result = run(build(saver, [pay], {}, call("pay", {"cents": 5})))
    [question] = result["__interrupt__"]
    assert question.value["type"] == "effect_unknown"
    assert "ConnectionError" in question.value["error"]
    assert saver.effects("t")[0].status == "unknown"


def test_timeout_is_unknown(saver) -> None:
    import time

    @tool
    def pay(cents: int) -> str:
        """Pay."""
        time.sleep(2)
        return "late"

    result = run(build(saver, [pay], {"pay": Effect(timeout=0.2)}, call("pay", {"cents": 5})))
    [question] = result["__interrupt__"]
    assert "timeout" in question.value["error"]


def test_lookup_finds_the_effect_after_a_lost_answer(saver, tmp_path) -> None:
    mail = FakeProvider(str(tmp_path / "m.sqlite"), "lookup", name="mail")
    mail.script_faults("lost")

    @tool
    def send(to: str) -> dict:
        """Send."""
        return mail.apply(current_effect().key, {"to": to})

    result = run(build(saver, [send], {"send": Effect(lookup=mail.find)},
                       call("send", {"to": "x"})))
    assert result["messages"][-1].content == "done"
    assert mail.count() == 1
    receipt_event = [e for e in saver.events("t") if e.kind == "receipt"][0]
    assert receipt_event.data["source"] == "lookup"


def test_read_only_tools_bypass_the_ledger(saver) -> None:
    @tool
    def search(q: str) -> str:
        """Search."""
        return "found"

    result = run(build(saver, [search], {"search": Effect(read_only=True)},
                       call("search", {"q": "x"})))
    assert result["messages"][2].content == "found"
    assert saver.effects() == []


# -- durability barrier and bad input ------------------------------------------------------


@pytest.mark.parametrize("durability", ["async", "exit", None])
def test_effects_refused_unless_durability_is_sync(saver, provider, durability) -> None:
    @tool
    def send(to: str) -> dict:
        """Send."""
        return provider.apply(current_effect().key, {})

    graph = build(saver, [send], {}, call("send", {"to": "x"}))
    kwargs = {} if durability is None else {"durability": durability}
    with pytest.raises(DurabilityError, match='durability="sync"'):
        graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, **kwargs)
    assert provider.count() == 0 and saver.effects() == []


def test_non_durable_checkpointer_is_refused_with_the_fix(provider) -> None:
    @tool
    def send(to: str) -> dict:
        """Send."""
        return provider.apply(current_effect().key, {})

    graph = build(InMemorySaver(), [send], {}, call("send", {"to": "x"}))
    with pytest.raises(NotDurableCheckpointer, match="DurableSqliteSaver"):
        run(graph)
    assert provider.count() == 0


@pytest.mark.parametrize("value", [float("nan"), b"raw bytes"])
def test_non_json_arguments_are_refused_before_anything_is_sent(saver, provider, value) -> None:
    @tool
    def send(to: Any) -> dict:
        """Send."""
        return provider.apply(current_effect().key, {})

    graph = build(saver, [send], {}, call("send", {"to": value}))
    with pytest.raises(UnkeyableToolCall, match="not JSON"):
        run(graph)
    assert provider.count() == 0 and saver.effects() == []


def test_effects_naming_an_unknown_tool_is_refused() -> None:
    @tool
    def send(to: str) -> str:
        """Send."""
        return "ok"

    with pytest.raises(ValueError, match="sned"):
        EffectGuardNode([send], effects={"sned": Effect(idempotent=True)})


def test_call_to_a_tool_the_node_does_not_have_writes_nothing(saver) -> None:
    @tool
    def send(to: str) -> str:
        """Send."""
        return "ok"

    result = run(build(saver, [send], {}, call("delete_everything", {})))
    message = result["messages"][2]
    assert message.status == "error" and "delete_everything" in message.content
    assert saver.effects() == []


# -- a step's calls are claimed together -----------------------------------------------------


def test_every_intent_of_a_step_is_durable_before_any_call_is_sent(saver, make_saver) -> None:
    seen: list[set[str]] = []

    @tool
    def send(to: str) -> str:
        """Send."""
        # What a process started after a crash would find: another connection's view.
        # Every intent of the step is there (a call sent before may already hold its
        # receipt: one that does not ride on the step's write commits it at once).
        other = make_saver(serde=saver.serde)
        seen.append({r.tool_call_id for r in other.effects("t")})
        return f"sent to {to}"

    calls = [call("send", {"to": to}, f"c{i}") for i, to in enumerate("xyz")]
    claims: list[int] = []
    claim_many = saver.claim_many

    def counting_claim_many(intents, config=None):
        claims.append(len(intents))
        return claim_many(intents, config)

    saver.claim_many = counting_claim_many
    result = run(build(saver, [send], {"send": Effect(idempotent=True)}, *calls))
    assert [m.content for m in result["messages"][2:5]] == ["sent to x", "sent to y", "sent to z"]
    assert seen == [{"c0", "c1", "c2"}] * 3
    assert claims == [3]  # one transaction for the step's three intents
    assert [r.status for r in saver.effects("t")] == [EffectStatus.APPLIED] * 3


def test_calls_only_a_human_could_reconcile_claim_right_before_they_are_sent(saver) -> None:
    """Claimed ahead, a call not yet sent would turn into a question after a crash."""
    ledger_when_sent: dict[str, set[str]] = {}

    def make(name: str):
        @tool(name)
        def send(to: str) -> str:
            """Send."""
            ledger_when_sent[to] = {r.tool_call_id for r in saver.effects("t")}
            return f"sent to {to}"
        return send

    claimed_ahead: list[list[str]] = []
    claim_many = saver.claim_many

    def recording_claim_many(intents, config=None):
        claimed_ahead.append([intent.tool_call_id for intent in intents])
        return claim_many(intents, config)

    saver.claim_many = recording_claim_many
    calls = [call("dedupe", {"to": "a"}, "c0"), call("blind", {"to": "b"}, "c1"),
             call("dedupe", {"to": "c"}, "c2")]
    graph = build(saver, [make("dedupe"), make("blind")],
                  {"dedupe": Effect(idempotent=True), "blind": Effect()}, *calls)
    run(graph)
    assert claimed_ahead[0] == ["c0", "c2"]
    assert ledger_when_sent["a"] >= {"c0", "c2"}
    assert "c1" in ledger_when_sent["b"]  # its own intent, recorded before it was sent
    assert [r.status for r in saver.effects("t")] == [EffectStatus.APPLIED] * 3


def test_a_wrapper_that_rewrites_calls_has_them_claimed_as_rewritten(saver, provider) -> None:
    @tool
    def send(to: str) -> str:
        """Send."""
        provider.apply(current_effect().key, {"to": to})
        return f"sent to {to}"

    def lower_case(request, execute):
        args = {"to": request.tool_call["args"]["to"].lower()}
        return execute(request.override(tool_call={**request.tool_call, "args": args}))

    script = [AIMessage(content="", tool_calls=[call("send", {"to": "ADA"})]),
              AIMessage(content="done")]
    model = ScriptedChatModel(script=script)
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
    builder.add_node("tools", EffectGuardNode([send], wrap_tool_call=lower_case))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    result = run(builder.compile(checkpointer=saver))
    assert result["messages"][2].content == "sent to ada"
    [record] = saver.effects("t")
    assert record.args == {"to": "ada"} and record.status is EffectStatus.APPLIED
    assert provider.count() == 1


# -- decisions on unknown outcomes ---------------------------------------------------------


@pytest.fixture
def unknown_graph(saver, provider):
    calls: list[str] = []

    @tool
    def send(to: str) -> dict:
        """Send."""
        calls.append(current_effect().key)
        if len(calls) == 1:
            provider.apply(current_effect().key, {})
            raise ConnectionError("lost after sending")
        return {"sent": True}

    graph = build(saver, [send], {}, call("send", {"to": "x"}))
    run(graph)
    return graph, calls


@pytest.mark.parametrize("bad", [
    {"type": "approve"},                                   # not allowed for unknown
    {"type": "applied"},                                   # no receipt
    {"c2": {"type": "retry"}},                             # unknown tool_call_id
    ["retry"],                                             # neither decision nor mapping
    "yes",                                                 # not a decision
    {"c1": {"type": "skip", "message": 3}},                # malformed field
])
def test_malformed_decision_changes_nothing_and_a_corrected_one_goes_through(
    saver, unknown_graph, bad
) -> None:
    graph, calls = unknown_graph
    before = ledger_snapshot(saver)
    with pytest.raises(InvalidDecision):
        run(graph, Command(resume=bad))
    assert ledger_snapshot(saver) == before
    assert graph.get_state(CONFIG).interrupts  # still pending

    result = run(graph, Command(resume={"c1": {"type": "skip", "message": "dup risk"}}))
    assert result["messages"][2].content == "Skipped by reviewer: dup risk"
    assert saver.effects("t")[0].status == "skipped"
    assert len(calls) == 1


def test_applied_decision_finishes_without_calling_the_tool(saver, provider, unknown_graph) -> None:
    graph, calls = unknown_graph
    result = run(graph, Command(resume={"type": "applied", "receipt": {"id": "p-1"},
                                        "reviewer": "ana"}))
    assert result["messages"][-1].content == "done"
    assert len(calls) == 1 and provider.count() == 1
    decision = [e for e in saver.events("t") if e.kind == "decision"][0]
    assert decision.data["decision"]["reviewer"] == "ana"
    kinds = [e.kind for e in saver.events("t")]
    assert kinds.index("decision") < kinds.index("receipt")


def test_retry_decision_resends_with_the_same_key(saver, unknown_graph) -> None:
    graph, calls = unknown_graph
    result = run(graph, Command(resume={"type": "retry"}))
    assert result["messages"][-1].content == "done"
    assert len(calls) == 2 and calls[0] == calls[1]
    assert saver.effects("t")[0].status == "applied"


def test_a_used_decision_is_never_applied_twice(saver, provider) -> None:
    calls: list[str] = []
    graph = build(saver, [lost_send(calls, "lost")], {}, call("send", {"to": "x"}))
    run(graph)
    again = run(graph, Command(resume={"type": "retry"}))
    assert len(calls) == 2 and again["__interrupt__"]
    # Continuing without a new answer asks again; it does not retry a third time.
    still = run(graph, None)
    assert len(calls) == 2 and still["__interrupt__"]


def test_a_decision_whose_resume_value_is_saved_late_is_still_used_once(saver) -> None:
    """LangGraph saves a run's resume value in the background, so the save can land
    after the guard journaled the decision and deleted the stored value. It is deleted
    again in the late save's own transaction; otherwise it would answer the next
    question with the old answer."""
    calls: list[str] = []

    @tool
    def send(to: str) -> dict:
        """Send."""
        calls.append(current_effect().key)
        raise ConnectionError("lost")

    put_writes = saver.put_writes

    def late_resume(config, writes, task_id, task_path=""):
        if any(channel == "__resume__" for channel, _ in writes):
            time.sleep(0.3)  # after the tools task has journaled the decision
        return put_writes(config, writes, task_id, task_path)

    saver.put_writes = late_resume
    graph = build(saver, [send], {}, call("send", {"to": "x"}))
    run(graph)
    again = run(graph, Command(resume={"type": "retry"}))
    assert len(calls) == 2 and again["__interrupt__"]
    still = run(graph, None)
    assert len(calls) == 2 and still["__interrupt__"]
    retries = [e for e in saver.events("t") if e.kind == "decision"]
    assert len(retries) == 1


def test_calls_asked_together_are_answered_one_by_one_by_interrupt_id(saver) -> None:
    """Each call is asked in its own interrupt. An answer to some of them runs those; the
    others stay pending, under the same ids, until answered. Forms LangGraph refuses
    while several interrupts are pending (a bare decision, a map keyed by tool_call_id)
    change nothing."""
    @tool
    def send(to: str) -> str:
        """Send."""
        raise ConnectionError("lost")

    graph = build(saver, [send], {}, call("send", {"to": "a"}, "c1"), call("send", {"to": "b"}, "c2"))
    first = run(graph)
    ids = {i.value["tool_call_id"]: i.id for i in first["__interrupt__"]}
    assert sorted(ids) == ["c1", "c2"] and len(set(ids.values())) == 2
    before = ledger_snapshot(saver)
    with pytest.raises(RuntimeError, match="multiple pending interrupts"):
        run(graph, Command(resume={"type": "skip"}))
    with pytest.raises(RuntimeError, match="multiple pending interrupts"):
        run(graph, Command(resume={"c1": {"type": "skip"}}))
    with pytest.raises(InvalidDecision, match="c2"):
        run(graph, Command(resume={ids["c1"]: {"type": "skip"}, ids["c2"]: {"type": "approve"}}))
    assert ledger_snapshot(saver) == before
    partial = run(graph, Command(resume={ids["c1"]: {"type": "applied", "receipt": "ok"}}))
    assert [(i.value["tool_call_id"], i.id) for i in partial["__interrupt__"]] == [("c2", ids["c2"])]
    result = run(graph, Command(resume={ids["c2"]: {"type": "skip"}}))
    assert [m.content for m in result["messages"][2:4]] == ['ok', "Skipped by reviewer: no reason given"]


