"""Approvals and review: approve / edit / reject, matching by tool_call_id, both dispatches."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import create_react_agent, tools_condition
from langgraph.types import Command

from graph_durable import (
    Effect,
    EffectGuardMiddleware,
    EffectGuardNode,
    InvalidDecision,
    review,
)
from graph_durable.testing import FakeProvider
from graph_durable.testing.models import ScriptedChatModel
from tests.fakes import send_tool
from tests.nodes.test_guard import CONFIG, ledger_serde

CALL_IDS = ["c0", "c1", "c2"]


@pytest.fixture(params=["plain", "sealed"])
def saver(request: pytest.FixtureRequest, make_saver: Callable[..., Any]) -> Any:
    """Every approval test runs on every durable saver (`saver_backend`), with a plain
    ledger and with a sealed one."""
    return make_saver(serde=ledger_serde(request.param))


@pytest.fixture
def provider(tmp_path: Path) -> FakeProvider:
    return FakeProvider(str(tmp_path / "mail.sqlite"), "blind", name="mail")


def script(*targets: str) -> list[AIMessage]:
    calls = [{"name": "send", "args": {"to": t}, "id": f"c{i}"} for i, t in enumerate(targets)]
    return [AIMessage(content="", tool_calls=calls), AIMessage(content="done")]


def tool_node_graph(saver, provider, *targets: str, approval: Any = True,
                    approval_ttl: float | None = None):
    model = ScriptedChatModel(script=script(*targets))
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
    builder.add_node("tools", EffectGuardNode(
        [send_tool(provider)],
        effects={"send": Effect(approval=approval, approval_ttl=approval_ttl,
                                description="email")}))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


def create_agent_graph(saver, provider, *targets: str):
    return create_agent(
        ScriptedChatModel(script=script(*targets)), tools=[send_tool(provider)],
        middleware=[EffectGuardMiddleware({"send": Effect(approval=True)})], checkpointer=saver)


def react_agent_graph(saver, provider, *targets: str):
    node = EffectGuardNode([send_tool(provider)], effects={"send": Effect(approval=True)})
    return create_react_agent(ScriptedChatModel(script=script(*targets)), tools=node,
                              checkpointer=saver)


BUILDERS = {"ToolNode": tool_node_graph, "create_agent": create_agent_graph,
            "create_react_agent": react_agent_graph}


def start(graph) -> dict[str, Any]:
    return graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")


def tool_messages(result: dict[str, Any]) -> dict[str, Any]:
    return {m.tool_call_id: m for m in result["messages"] if m.type == "tool"}


def test_approval_payload_and_nothing_sent_before_the_decision(saver, provider) -> None:
    result = start(tool_node_graph(saver, provider, "ana"))
    [question] = result["__interrupt__"]
    # LangChain's per-call `ToolApprovalRequest`, with the ledger's fields beside it.
    assert question.value == {
        "type": "tool_approval", "tool_call_id": "c0", "name": "send",
        "args": {"to": "ana"}, "description": "email",
        "key": question.value["key"], "status": "awaiting_approval", "attempts": 0,
        "allowed_decisions": ["approve", "edit", "reject", "respond"],
    }
    assert len(question.id) == 32 and int(question.id, 16) >= 0  # LangGraph's id form
    branches = {ref["$ref"].rsplit("/", 1)[1] for ref in question.response_schema["oneOf"]}
    assert branches == {"Approve", "Edit", "Reject", "Respond"}
    assert provider.count() == 0
    assert saver.effects("t")[0].status == "awaiting_approval"


def test_approve_sends_once(saver, provider) -> None:
    graph = tool_node_graph(saver, provider, "ana")
    start(graph)
    result = review(graph, CONFIG).approve("c0", reviewer="lee").resume()
    assert tool_messages(result)["c0"].content == "sent mail-1 to ana"
    assert provider.count() == 1
    decision = [e for e in saver.events("t") if e.kind == "decision"][0]
    assert decision.data["decision"] == {"type": "approve", "reviewer": "lee"}


def test_edit_sends_the_edited_args_under_a_new_key(saver, provider) -> None:
    graph = tool_node_graph(saver, provider, "ana")
    original_key = start(graph)["__interrupt__"][0].value["key"]
    result = review(graph, CONFIG).edit("c0", {"to": "bob"}).resume()
    message = tool_messages(result)["c0"]
    assert "arguments edited by reviewer" in message.content and "to bob" in message.content
    [effect] = provider.effects()
    assert effect["payload"] == {"to": "bob"} and effect["key"] != original_key
    statuses = {r.key: r.status.value for r in saver.effects("t")}
    assert statuses == {original_key: "skipped", effect["key"]: "applied"}
    # The receipt is what the tool returned, as for any call; the note is the model's.
    assert saver.effect(effect["key"], "t").receipt == "sent mail-1 to bob"


def test_reject_sends_nothing_and_tells_the_model(saver, provider) -> None:
    graph = tool_node_graph(saver, provider, "ana")
    start(graph)
    result = review(graph, CONFIG).reject("c0", "wrong customer").resume()
    message = tool_messages(result)["c0"]
    assert message.status == "error" and "wrong customer" in message.content
    assert provider.count() == 0 and saver.effects("t")[0].status == "rejected"
    assert result["messages"][-1].content == "done"


def test_approval_predicate_decides_per_call(saver, provider) -> None:
    graph = tool_node_graph(saver, provider, "ana", "boss",
                            approval=lambda call: call["args"]["to"] == "boss")
    result = start(graph)
    assert [i.value["tool_call_id"] for i in result["__interrupt__"]] == ["c1"]
    assert provider.count() == 1  # the call to ana went out


@pytest.mark.parametrize("dispatch", sorted(BUILDERS))
def test_three_parallel_approvals_decided_in_shuffled_order(saver, provider, dispatch) -> None:
    graph = BUILDERS[dispatch](saver, provider, "a", "b", "c")
    first = start(graph)
    assert sorted(i.value["tool_call_id"] for i in first["__interrupt__"]) == CALL_IDS
    pending = review(graph, CONFIG)
    order = CALL_IDS[:]
    random.Random(7).shuffle(order)
    for tool_call_id in order:
        if tool_call_id == "c1":
            pending.reject(tool_call_id, "not b")
        else:
            pending.approve(tool_call_id)
    result = pending.resume()
    messages = tool_messages(result)
    assert messages["c0"].content.endswith("to a") and messages["c2"].content.endswith("to c")
    assert "not b" in messages["c1"].content
    assert sorted(e["payload"]["to"] for e in provider.effects()) == ["a", "c"]


def _by_id(graph: Any, decisions: dict[str, Any]) -> dict[str, Any]:
    """`{tool_call_id: decision}` keyed by the interrupt that asks about each call."""
    ids = {i.value["tool_call_id"]: i.id for i in graph.get_state(CONFIG).interrupts}
    return {ids.get(name, name): decision for name, decision in decisions.items()}


@pytest.mark.parametrize("bad", [
    {"c0": {"type": "approve"}, "c1": {"type": "approve"}, "c2": {"type": "applied",
                                                                  "receipt": 1}},
    {"c0": {"type": "edit", "edited_action": {"name": "send"}}, "c1": {"type": "approve"},
     "c2": {"type": "approve"}},                                             # no args
    {"c0": {"type": "edit", "edited_action": {"name": "send", "args": {"to": 5}}},
     "c1": {"type": "approve"}},                                             # wrong type
    {"c0": {"type": "edit", "edited_action": {"name": "send", "args": {}}}},  # missing arg
    {"c1": {"type": "respond"}},                                             # no message
])
def test_invalid_decisions_leave_state_and_ledger_unchanged(saver, provider, bad) -> None:
    """An invalid answer anywhere in a set changes nothing: no call of the set runs (the
    hazard LangChain documents for its own middleware)."""
    graph = tool_node_graph(saver, provider, "a", "b", "c")
    start(graph)
    before = ([r.model_dump() for r in saver.effects()], [e.model_dump() for e in saver.events()],
              [i.value for i in graph.get_state(CONFIG).interrupts])
    with pytest.raises(InvalidDecision):
        graph.invoke(Command(resume=_by_id(graph, bad)), CONFIG, durability="sync")
    after = ([r.model_dump() for r in saver.effects()], [e.model_dump() for e in saver.events()],
             [i.value for i in graph.get_state(CONFIG).interrupts])
    assert after == before and provider.count() == 0
    result = graph.invoke(Command(resume=_by_id(graph, {c: {"type": "approve"} for c in CALL_IDS})),
                          CONFIG, durability="sync")
    assert provider.count() == 3 and result["messages"][-1].content == "done"


@pytest.mark.parametrize("form", ["bare", "by_tool_call_id", "batched"])
def test_forms_langgraph_refuses_while_several_are_pending_change_nothing(
        saver, provider, form) -> None:
    graph = tool_node_graph(saver, provider, "a", "b")
    start(graph)
    before = [r.model_dump() for r in saver.effects()]
    value = {"bare": {"type": "approve"},
             "by_tool_call_id": {"c0": {"type": "approve"}, "c1": {"type": "approve"}},
             "batched": {"decisions": [{"type": "approve"}, {"type": "approve"}]}}[form]
    with pytest.raises(RuntimeError, match="multiple pending interrupts"):
        graph.invoke(Command(resume=value), CONFIG, durability="sync")
    assert [r.model_dump() for r in saver.effects()] == before and provider.count() == 0


@pytest.mark.parametrize("form", ["bare", "by_tool_call_id", "batched", "by_interrupt_id"])
def test_every_form_answers_a_single_pending_call(saver, provider, form) -> None:
    graph = tool_node_graph(saver, provider, "a")
    [question] = start(graph)["__interrupt__"]
    value = {"bare": {"type": "approve"}, "by_tool_call_id": {"c0": {"type": "approve"}},
             "batched": {"decisions": [{"type": "approve"}]},
             "by_interrupt_id": {question.id: {"type": "approve"}}}[form]
    result = graph.invoke(Command(resume=value), CONFIG, durability="sync")
    assert provider.count() == 1 and result["messages"][-1].content == "done"


def test_a_partial_answer_runs_what_it_answers_and_asks_the_rest_again(saver, provider) -> None:
    graph = tool_node_graph(saver, provider, "a", "b", "c")
    start(graph)
    pending = review(graph, CONFIG)
    ids = {i.tool_call_id: i.interrupt_id for i in pending.pending}
    pending.approve("c0").reject("c2", "not c")
    assert pending.command().resume == {ids["c0"]: {"type": "approve"},
                                        ids["c2"]: {"type": "reject", "message": "not c"}}
    result = pending.resume()
    assert [(i.value["tool_call_id"], i.id) for i in result["__interrupt__"]] == [("c1", ids["c1"])]
    assert [e["payload"]["to"] for e in provider.effects()] == ["a"]
    later = review(graph, CONFIG)
    assert [i.tool_call_id for i in later.pending] == ["c1"]
    result = later.approve("c1").resume()
    messages = tool_messages(result)
    assert messages["c0"].content.endswith("to a") and messages["c1"].content.endswith("to b")
    assert "not c" in messages["c2"].content
    assert sorted(e["payload"]["to"] for e in provider.effects()) == ["a", "b"]


def test_respond_answers_in_place_of_the_tool(saver, provider) -> None:
    graph = tool_node_graph(saver, provider, "ana")
    start(graph)
    result = review(graph, CONFIG).respond("c0", "Ana asked not to be emailed", reviewer="lee"
                                           ).resume()
    message = tool_messages(result)["c0"]
    assert message.content == "Ana asked not to be emailed" and message.status == "success"
    assert provider.count() == 0
    [record] = saver.effects("t")
    assert record.status == "rejected"
    decision = [e for e in saver.events("t") if e.kind == "decision"][0]
    assert decision.data["decision"] == {"type": "respond", "reviewer": "lee",
                                         "message": "Ana asked not to be emailed"}


def test_review_refuses_decisions_it_cannot_take(saver, provider) -> None:
    graph = tool_node_graph(saver, provider, "a", "b")
    start(graph)
    pending = review(graph, CONFIG)
    with pytest.raises(InvalidDecision, match="c7"):
        pending.approve("c7")
    with pytest.raises(InvalidDecision, match="accepts"):
        pending.retry("c0")
    with pytest.raises(InvalidDecision, match="No decisions taken"):
        pending.command()


def test_review_html_escapes_values(saver, provider) -> None:
    graph = tool_node_graph(saver, provider, "<script>alert(1)</script>")
    start(graph)
    page = review(graph, CONFIG)._repr_html_()
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "<table" in page and "c0" in page


def _as_earlier_release(saver: Any) -> str:
    """Rewrite the pending questions as an earlier release raised them: one interrupt per
    step, under the task's own LangGraph id, valued `effect_approval` with `tool`."""
    from langgraph.types import Interrupt, _interrupt_id

    latest = saver.get_tuple(CONFIG)
    [(task_id, interrupts)] = [(w[0], w[2]) for w in latest.pending_writes
                               if w[1] == "__interrupt__"]
    [task_ns] = {r.checkpoint_ns for r in saver.effects("t")} - {None}
    old_id = _interrupt_id(task_ns, 0)
    old = tuple(Interrupt(value={
        "type": "effect_approval", "tool_call_id": i.value["tool_call_id"],
        "tool": i.value["name"], "args": i.value["args"], "key": i.value["key"],
        "description": i.value["description"],
        "allowed_decisions": ["approve", "edit", "reject"]}, id=old_id) for i in interrupts)
    saver.put_writes(latest.config, [("__interrupt__", old)], task_id)
    return old_id


@pytest.mark.parametrize("targets", [("a",), ("a", "b")])
def test_questions_pending_in_the_shape_of_earlier_releases_are_still_answered(
        saver, provider, targets) -> None:
    graph = tool_node_graph(saver, provider, *targets)
    start(graph)
    old_id = _as_earlier_release(saver)
    assert {i.id for i in graph.get_state(CONFIG).interrupts} == {old_id}
    pending = review(graph, CONFIG)
    assert [(i.tool, i.interrupt_id) for i in pending.pending] == [("send", old_id)] * len(targets)
    for item in pending.pending:
        pending.approve(item.tool_call_id)
    command = pending.command()
    assert list(command.resume) == [old_id]
    result = pending.resume()
    assert result["messages"][-1].content == "done"
    assert sorted(e["payload"]["to"] for e in provider.effects()) == sorted(targets)


def test_sync_by_default_makes_every_run_durable_without_saying_so(saver, provider) -> None:
    from graph_durable import DurabilityError, sync_by_default

    plain = tool_node_graph(saver, provider, "a")
    with pytest.raises(DurabilityError, match="defaults to \"async\""):
        plain.invoke({"messages": [HumanMessage("go")]}, CONFIG)
    assert saver.effects("t") == []
    graph = sync_by_default(tool_node_graph(saver, provider, "a"))
    config = {"configurable": {"thread_id": "t2"}}
    [question] = graph.invoke({"messages": [HumanMessage("go")]}, config)["__interrupt__"]
    result = graph.invoke(Command(resume={question.id: {"type": "approve"}}), config)
    assert result["messages"][-1].content == "done" and provider.count() == 1
    assert review(graph, config).pending == [] and graph.get_state(config).next == ()
    with pytest.raises(DurabilityError, match='durability="async"'):
        graph.invoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": "t3"}},
                     durability="async")
    with pytest.raises(TypeError, match="compiled graph"):
        sync_by_default(object())


def test_an_approval_not_acted_on_within_its_ttl_is_asked_again(saver, provider) -> None:
    """The worker stopped after the decision was journaled; a new one resumes later than
    `approval_ttl` allows: the call is asked again, not sent on the stale approval."""
    from graph_durable.testing import FaultPlan, InjectedCrash, arm, disarm

    graph = tool_node_graph(saver, provider, "a", approval_ttl=0.2)
    start(graph)
    arm(FaultPlan("after_decision", action="raise"))
    try:
        with pytest.raises(InjectedCrash):
            review(graph, CONFIG).approve("c0", reviewer="lee").resume()
    finally:
        disarm()
    time.sleep(0.3)
    [question] = graph.invoke(None, CONFIG, durability="sync")["__interrupt__"]
    assert question.value["tool_call_id"] == "c0" and provider.count() == 0
    assert [e.kind for e in saver.events("t")][-3:] == ["decision", "expired", "asked"]
    result = review(graph, CONFIG).approve("c0").resume()  # acted on at once: sent
    assert result["messages"][-1].content == "done" and provider.count() == 1


def test_a_decision_for_a_call_no_longer_pending_names_when_and_by_whom(
        saver, provider) -> None:
    graph = tool_node_graph(saver, provider, "a")
    start(graph)
    stale = review(graph, CONFIG)  # a second reviewer's page, loaded before the first decided
    review(graph, CONFIG).approve("c0", reviewer="ana").resume()
    events = len(saver.events("t"))
    fresh = review(graph, CONFIG)
    with pytest.raises(InvalidDecision, match=r"decided at .* UTC by ana \(approve\)"):
        fresh.approve("c0", reviewer="lee")
    assert stale.pending  # its page still shows the call; the ledger has moved on
    assert len(saver.events("t")) == events and provider.count() == 1


def test_an_answer_to_a_question_no_longer_asked_is_refused_by_the_guard(
        saver, provider) -> None:
    """A second reviewer (or a double click) answers by interrupt id a call that was
    already decided, while another call of the same step is still pending: refused with
    when and by whom, nothing recorded, the pending call still answerable."""
    graph = tool_node_graph(saver, provider, "a", "b")
    start(graph)
    ids = {i.value["tool_call_id"]: i.id for i in graph.get_state(CONFIG).interrupts}
    graph.invoke(Command(resume={ids["c0"]: {"type": "approve", "reviewer": "ana"}}), CONFIG,
                 durability="sync")
    assert provider.count() == 1
    before = [e.model_dump() for e in saver.events("t")]
    again = {ids["c0"]: {"type": "reject", "reviewer": "lee"}, ids["c1"]: {"type": "approve"}}
    with pytest.raises(InvalidDecision, match=r"no longer pending: it was decided at .* by ana"):
        graph.invoke(Command(resume=again), CONFIG, durability="sync")
    assert [e.model_dump() for e in saver.events("t")] == before and provider.count() == 1
    result = graph.invoke(Command(resume={ids["c1"]: {"type": "approve"}}), CONFIG,
                          durability="sync")
    assert result["messages"][-1].content == "done" and provider.count() == 2


def _repeated_id_graph(saver: Any, provider: FakeProvider) -> Any:
    """A model that gives `send(to=a)` and `send(to=b)` the same tool_call_id."""
    calls = [{"name": "send", "args": {"to": to}, "id": "c"} for to in ("a", "b")]
    model = ScriptedChatModel(script=[AIMessage(content="", tool_calls=calls),
                                      AIMessage(content="done")])
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
    builder.add_node("tools", EffectGuardNode([send_tool(provider)],
                                              effects={"send": Effect(approval=True)}))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


@pytest.mark.parametrize("attempt", range(4))
def test_an_edit_into_the_other_call_under_a_shared_id_acts_on_its_approval_once(
        saver, provider, attempt) -> None:
    """Two calls under one tool_call_id; the reviewer edits `send(to=a)` into
    `send(to=b)`, the other call, and approves that one: one key, whose approval both
    calls acted on at once (in parallel threads), sending that key twice about half the
    time. The edited call waits for the other's answer: one email, both calls told it."""
    graph = _repeated_id_graph(saver, provider)
    result = graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    asked = {i.value["args"]["to"]: i for i in result["__interrupt__"]}
    edit = {"type": "edit", "edited_action": {"name": "send", "args": {"to": "b"}}}
    result = graph.invoke(Command(resume={asked["a"].id: edit,
                                          asked["b"].id: {"type": "approve"}}),
                          CONFIG, durability="sync")
    assert provider.count() == 1, provider.effects()
    answers = [m.content for m in result["messages"] if m.type == "tool"]
    assert len(answers) == 2 and all("sent mail-1 to b" in a for a in answers)
    assert not result.get("__interrupt__")


def test_two_calls_each_edited_into_the_other_never_wait_for_each_other() -> None:
    """`RunOnce.join`: a call that would wait, through the calls it waits for, for
    itself is refused; a call that joins a key nobody runs leads it, and its answer
    goes to whoever joins after it."""
    from types import SimpleNamespace

    from graph_durable.errors import GraphDurableError
    from graph_durable.nodes.run_once import RunOnce

    once = RunOnce()
    a = SimpleNamespace(task=SimpleNamespace(thread_id="t"),
                        ctx=SimpleNamespace(key="ka", tool_call_id="c", tool="send"),
                        protocol=None)
    b = SimpleNamespace(task=SimpleNamespace(thread_id="t"),
                        ctx=SimpleNamespace(key="kb", tool_call_id="c", tool="send"),
                        protocol=None)
    running_a, lead_a = once.lead(a, True)
    running_b, lead_b = once.lead(b, True)
    assert lead_a and lead_b
    waited, leader = once.join("t", a.ctx, "kb")  # a waits for b
    assert waited is running_b and not leader
    with pytest.raises(GraphDurableError, match="each edited into the other"):
        once.join("t", b.ctx, "ka")  # b would wait for a, which waits for b
    once.done_waiting("t", a.ctx)
    once.settle(b, running_b, result="sent")
    assert waited.result() == "sent"
    # A key nobody runs: the joining call leads it, settled with its own answer.
    joined, leader = once.join("t", a.ctx, "kc")
    assert leader and joined is not None
    once.settle(a, running_a, result="done")
    assert joined.result() == "done" and running_a.result() == "done"


def test_two_calls_edited_into_each_other_are_answered_not_sent(saver, provider) -> None:
    """`send(to=a)` edited into `send(to=b)` and `send(to=b)` into `send(to=a)` under one
    tool_call_id: each is skipped in favour of the other, so neither can be sent without
    being the other. Both are answered "not sent" (they bounced between each other until
    the recursion limit, on every run after), and the thread goes on."""
    graph = _repeated_id_graph(saver, provider)
    result = graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")
    asked = {i.value["args"]["to"]: i for i in result["__interrupt__"]}

    def edit(to: str) -> dict[str, Any]:
        return {"type": "edit", "edited_action": {"name": "send", "args": {"to": to}}}

    result = graph.invoke(Command(resume={asked["a"].id: edit("b"), asked["b"].id: edit("a")}),
                          CONFIG, durability="sync")
    answers = [m for m in result["messages"] if m.type == "tool"]
    assert len(answers) == 2
    assert all(m.status == "error" and "edited into the other" in m.content for m in answers)
    assert provider.count() == 0 and result["messages"][-1].content == "done"
    graph.invoke(None, CONFIG, durability="sync")  # nothing left, nothing raised
    assert provider.count() == 0
