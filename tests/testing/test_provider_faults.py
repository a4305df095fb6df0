"""Provider faults through `EffectGuardNode`: each fault has its own, documented outcome.

The outcome table lives in the docstring of `graph_durable.testing.crash.matrix`; each row is a
test here. The seed requirement: a slow answer (under `Effect.timeout`), a permanent
failure and a timeout end differently — `applied`, `failed`, `unknown` — because only
the first certainly applied the effect and only the second certainly did not.
"""

from __future__ import annotations

import dataclasses
import time
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import StructuredTool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command

from graph_durable import DurableSqliteSaver, EffectGuardNode, current_effect
from graph_durable.testing import FakeProvider
from graph_durable.testing.models import ScriptedChatModel
from graph_durable.testing.scenarios.effects import policy_for_mode

CONFIG = {"configurable": {"thread_id": "t"}}
TIMEOUT = 0.4
"""`Effect.timeout` of every test: above `slow_seconds`, below `hang_seconds`."""


@dataclasses.dataclass
class Run:
    provider: FakeProvider
    saver: DurableSqliteSaver
    graph: Any
    result: dict[str, Any]

    @property
    def status(self) -> str:
        [record] = self.saver.effects("t")
        return record.status.value

    @property
    def tool_message(self) -> Any:
        [message] = [m for m in self.result["messages"] if m.type == "tool"]
        return message

    def interrupts(self) -> list[dict[str, Any]]:
        return [i.value for i in self.result.get("__interrupt__", [])]

    def resume(self, decision: dict[str, Any]) -> None:
        self.result = self.graph.invoke(Command(resume=decision), CONFIG, durability="sync")


def run(tmp_path: Path, mode: str, *faults: str, retries: int = 0,
        timeout: float | None = TIMEOUT, flavour: str = "sync") -> Run:
    """One `pay` call to a provider in `mode` whose next answers misbehave as `faults`."""
    provider = FakeProvider(str(tmp_path / "pay.sqlite"), mode,  # type: ignore[arg-type]
                            name="pay", slow_seconds=0.1, hang_seconds=1.0)
    provider.script_faults(*faults)

    def pay(item: str) -> dict[str, Any]:
        return provider.apply(current_effect().key, {"item": item})

    effect = dataclasses.replace(policy_for_mode(provider), retries=retries, timeout=timeout)
    model = ScriptedChatModel(script=[
        AIMessage(content="", tool_calls=[{"name": "pay", "args": {"item": "42"}, "id": "c1"}]),
        AIMessage(content="done"),
    ])
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
    builder.add_node("tools", EffectGuardNode(
        [StructuredTool.from_function(pay, name="pay", description="Pay.")],
        effects={"pay": effect}))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    saver = DurableSqliteSaver(sqlite3.connect(tmp_path / "a.sqlite", check_same_thread=False))
    graph = builder.compile(checkpointer=saver)
    inputs = {"messages": [HumanMessage("pay")]}
    if flavour == "async":
        import asyncio

        result = asyncio.run(graph.ainvoke(inputs, CONFIG, durability="sync"))
    else:
        result = graph.invoke(inputs, CONFIG, durability="sync")
    return Run(provider, saver, graph, result)


def event_kinds(run: Run) -> list[str]:
    return [event.kind for event in run.saver.events("t")]


# -- the seed requirement: three faults, three outcomes -------------------------------------


@pytest.mark.parametrize("mode", ["dedupe", "lookup", "blind"])
def test_slow_answer_within_the_timeout_is_applied(tmp_path: Path, mode: str) -> None:
    done = run(tmp_path, mode, "slow")
    assert done.status == "applied"
    assert done.provider.count() == 1
    assert done.tool_message.status == "success" and '"pay-1"' in done.tool_message.content
    assert event_kinds(done) == ["intent", "receipt"]


@pytest.mark.parametrize("mode", ["dedupe", "lookup", "blind"])
def test_permanent_failure_is_failed_with_an_error_message(tmp_path: Path, mode: str) -> None:
    done = run(tmp_path, mode, "permanent")
    assert done.status == "failed"
    assert done.provider.count() == 0
    assert done.tool_message.status == "error"
    assert done.tool_message.content.startswith("Not applied: pay: request refused")
    assert done.result["messages"][-1].content == "done"  # the model carried on
    assert [r["outcome"] for r in done.provider.requests()] == ["permanent"]


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_timeout_without_lookup_or_dedupe_is_unknown_and_asks(tmp_path: Path,
                                                              flavour: str) -> None:
    paused = run(tmp_path, "blind", "hang", flavour=flavour)
    [question] = paused.interrupts()
    assert question["type"] == "effect_unknown"
    assert question["error"].startswith(f"no answer within {TIMEOUT} s (timeout)")
    assert paused.status == "unknown"  # never "failed": it may have happened
    assert paused.provider.count() == 0
    time.sleep(1.0)  # the hung attempt ends; until then a retry would be refused
    paused.resume({"type": "retry"})  # a human checked: nothing there, send again
    assert paused.status == "applied" and paused.provider.count() == 1


@pytest.mark.parametrize("mode", ["dedupe", "lookup"])
def test_timeout_with_lookup_or_dedupe_pauses_then_is_reconciled_under_the_same_key(
        tmp_path: Path, mode: str) -> None:
    """An abandoned attempt may still land, so nothing is re-sent after a timeout until
    a human decides; a retry (after a lookup, where there is one) keeps the key."""
    done = run(tmp_path, mode, "hang")
    [question] = done.interrupts()
    assert question["type"] == "effect_unknown" and "may still land" in question["error"]
    assert done.provider.count() == 0 and len(done.provider.requests()) == 0
    time.sleep(1.0)  # the hung attempt ends (it applied nothing)
    done.resume({"type": "retry"})
    assert done.status == "applied" and done.provider.count() == 1
    [record] = done.saver.effects("t")
    assert [e["key"] for e in done.provider.effects()] == [record.key]
    assert {r["key"] for r in done.provider.requests()} == {record.key}


# -- transient errors and lost answers ------------------------------------------------------


def test_transient_errors_are_retried_with_the_same_key(tmp_path: Path) -> None:
    done = run(tmp_path, "blind", "transient", "transient", retries=2)
    assert done.status == "applied" and done.provider.count() == 1
    requests = done.provider.requests()
    assert [r["outcome"] for r in requests] == ["transient", "transient", "applied"]
    assert len({r["key"] for r in requests}) == 1
    assert event_kinds(done) == ["intent", "attempt", "attempt", "receipt"]


def test_transient_errors_beyond_the_retries_are_failed(tmp_path: Path) -> None:
    done = run(tmp_path, "blind", "transient", "transient", retries=1)
    assert done.status == "failed" and done.provider.count() == 0
    assert done.tool_message.content.startswith("Not applied after 2 attempts")


def test_lost_answer_with_lookup_is_found_not_resent(tmp_path: Path) -> None:
    done = run(tmp_path, "lookup", "lost")
    assert done.status == "applied" and done.provider.count() == 1
    assert [r["outcome"] for r in done.provider.requests()] == ["applied"]
    receipt = [e for e in done.saver.events("t") if e.kind == "receipt"][0]
    assert receipt.data["source"] == "lookup"


def test_lost_answer_with_dedupe_is_resent_and_deduplicated(tmp_path: Path) -> None:
    done = run(tmp_path, "dedupe", "lost")
    assert done.status == "applied" and done.provider.count() == 1
    requests = done.provider.requests()
    assert [r["outcome"] for r in requests] == ["applied", "deduplicated"]
    assert requests[0]["key"] == requests[1]["key"]


def test_lost_answer_from_a_blind_provider_pauses_instead_of_resending(
        tmp_path: Path) -> None:
    paused = run(tmp_path, "blind", "lost")
    [question] = paused.interrupts()
    assert question["type"] == "effect_unknown"
    assert question["error"].startswith("ConnectionError")
    assert paused.provider.count() == 1  # it did happen; the guard does not repeat it
    [effect] = paused.provider.effects()
    paused.resume({"type": "applied", "receipt": effect["receipt"]})
    assert paused.status == "applied" and paused.provider.count() == 1
    assert len(paused.provider.requests()) == 1
