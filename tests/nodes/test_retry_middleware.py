"""The guard next to LangChain's `ToolRetryMiddleware` (and other middleware that may call
the tool handler again, or answer for it) in `create_agent`.

`create_agent` nests middleware in list order, first = outermost. Listed before the
guard, a retry middleware runs outside it: each of its attempts goes through the ledger
under the same key, so a lost answer is reconciled (found by a lookup, re-sent to a
deduping provider, or asked about) and never charged twice. Listed after it, the retry
would call the tool again inside one guarded attempt; the guard refuses that second call
before it reaches the tool, stops the run with `MiddlewareOrderError`, and the call is
reconciled once the thread runs again in the safe order.

Every test's tool applies the charge and then loses the answer (the provider's `lost`
fault raises `ConnectionError` after applying); the assertions are on the provider's side.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import (
    AgentMiddleware,
    ModelRetryMiddleware,
    ToolErrorMiddleware,
    ToolRetryMiddleware,
)
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.types import Command

from graph_durable import (
    AsyncDurableSqliteSaver,
    DurableSqliteSaver,
    Effect,
    EffectGuardMiddleware,
    EffectStatus,
    current_effect,
)
from graph_durable.errors import MiddlewareOrderError
from graph_durable.testing import FakeProvider
from graph_durable.testing.models import ScriptedChatModel

CONFIG = {"configurable": {"thread_id": "t"}}
MODES = ["blind", "lookup", "dedupe"]


@pytest.fixture(params=MODES)
def provider(request: pytest.FixtureRequest, tmp_path: Path) -> FakeProvider:
    provider = FakeProvider(str(tmp_path / "payments.sqlite"), request.param, name="payments")
    provider.script_faults("lost")  # the first charge is applied, its answer lost
    return provider


@pytest.fixture
def saver(tmp_path: Path) -> DurableSqliteSaver:
    return DurableSqliteSaver(sqlite3.connect(tmp_path / "a.sqlite", check_same_thread=False))


def policy(provider: FakeProvider, **options: Any) -> Effect:
    if provider.mode == "dedupe":
        return Effect(idempotent=True, **options)
    if provider.mode == "lookup":
        return Effect(lookup=provider.find, **options)
    return Effect(**options)


def retry() -> ToolRetryMiddleware:
    return ToolRetryMiddleware(max_retries=2, initial_delay=0, jitter=False)


class FlakyModel(ScriptedChatModel):
    """Fails its first `failures` calls (a provider outage), then follows the script."""

    failures: list[int]

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> Any:
        if self.failures[0] > 0:
            self.failures[0] -= 1
            raise ConnectionError("model provider unavailable")
        return super()._generate(messages, stop, run_manager, **kwargs)


def agent(saver: Any, provider: FakeProvider, *, inner: Sequence[Any] = (),
          outer: Sequence[Any] = (), model_failures: int = 0, **options: Any) -> Any:
    """The charge agent with `outer` middleware listed before the guard, `inner` after."""

    @tool
    def charge(cents: int) -> str:
        """Charge the customer."""
        return f"charged {provider.apply(current_effect().key, {'cents': cents})['id']}"

    model = FlakyModel(script=[
        AIMessage(content="", tool_calls=[{"name": "charge", "args": {"cents": 5}, "id": "c1"}]),
        AIMessage(content="done")], failures=[model_failures])
    guard = EffectGuardMiddleware({"charge": policy(provider, **options)})
    return create_agent(model, tools=[charge], middleware=[*outer, guard, *inner],
                        checkpointer=saver)


def start(graph: Any) -> dict[str, Any]:
    return graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, durability="sync")


def settled_once(graph: Any, provider: FakeProvider, result: dict[str, Any],
                 saver: DurableSqliteSaver) -> None:
    """One charge, and the thread ends as the provider's contract allows: done with the
    receipt (lookup, dedupe), or paused on the unknown outcome (blind)."""
    assert provider.count() == 1, provider.requests()
    [record] = saver.effects("t")
    if provider.mode == "blind":
        [question] = result["__interrupt__"]
        assert question.value["type"] == "effect_unknown"
        assert "ConnectionError" in question.value["error"]
        graph.invoke(Command(resume={question.id: {"type": "applied",
                                                    "receipt": {"id": "payments-1"}}}),
                     CONFIG, durability="sync")
        [record] = saver.effects("t")
    else:
        assert result["messages"][-1].content == "done"
    assert record.status is EffectStatus.APPLIED
    assert provider.count() == 1


def test_retry_inside_the_guard_is_refused_before_a_second_send(saver, provider) -> None:
    wrong = agent(saver, provider, inner=[retry()])
    refused = None
    try:
        start(wrong)
    except MiddlewareOrderError as exc:
        refused = exc
    assert provider.count() == 1, provider.requests()  # a blind or looked-up retry charged twice
    assert len(provider.requests()) == 1  # the retry never reached the provider
    assert refused is not None, "the wrong order ran on"
    assert "List ToolRetryMiddleware (and any other middleware that re-calls tools or " \
        "answers for them) BEFORE EffectGuardMiddleware" in str(refused)
    assert "nothing was sent twice" in str(refused)
    assert refused.tool_call_id == "c1" and refused.thread_id == "t"
    [record] = saver.effects("t")
    assert (record.status, record.attempts) == (EffectStatus.IN_FLIGHT, 1)
    assert "ConnectionError" in (record.error or "")
    assert [e.kind for e in saver.events("t", record.key)][-1] == "refused"

    fixed = agent(saver, provider, outer=[retry()])
    settled_once(fixed, provider, fixed.invoke(None, CONFIG, durability="sync"), saver)


def test_retry_before_the_guard_reconciles_every_attempt_under_one_key(saver, provider) -> None:
    graph = agent(saver, provider, outer=[retry()])
    settled_once(graph, provider, start(graph), saver)
    assert {request["key"] for request in provider.requests()} == {saver.effects("t")[0].key}


@pytest.mark.parametrize("provider", ["blind"], indirect=True)
def test_a_timed_call_is_gated_too(saver, provider) -> None:
    """With a timeout the tool runs on a worker thread; the refusal crosses it."""
    wrong = agent(saver, provider, inner=[retry()], timeout=30.0)
    with pytest.raises(MiddlewareOrderError, match="List ToolRetryMiddleware"):
        start(wrong)
    assert provider.count() == 1 and len(provider.requests()) == 1


@pytest.mark.parametrize("provider", ["blind"], indirect=True)
def test_async_retry_inside_the_guard_is_refused(tmp_path, provider) -> None:
    async def main() -> None:
        async with AsyncDurableSqliteSaver.from_conn_string(str(tmp_path / "a.sqlite")) as saver:
            wrong = agent(saver, provider, inner=[retry()])
            with pytest.raises(MiddlewareOrderError, match="List ToolRetryMiddleware"):
                await wrong.ainvoke({"messages": [HumanMessage("go")]}, CONFIG,
                                    durability="sync")
            assert provider.count() == 1 and len(provider.requests()) == 1
            fixed = agent(saver, provider, outer=[retry()])
            result = await fixed.ainvoke(None, CONFIG, durability="sync")
            [question] = result["__interrupt__"]
            assert question.value["type"] == "effect_unknown"
            assert provider.count() == 1

    asyncio.run(main())


class CallTwice(AgentMiddleware):
    """A middleware of one's own that calls the handler again whatever happened."""

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        try:
            handler(request)
        except Exception:  # noqa: BLE001 - a careless retry, on purpose
            pass
        return handler(request)


@pytest.mark.parametrize("provider", ["blind"], indirect=True)
def test_any_middleware_that_calls_the_handler_again_is_refused(saver, provider) -> None:
    with pytest.raises(MiddlewareOrderError, match="a second time"):
        start(agent(saver, provider, inner=[CallTwice()]))
    assert provider.count() == 1 and len(provider.requests()) == 1


@pytest.mark.parametrize("provider", ["blind"], indirect=True)
def test_a_middleware_that_answers_for_a_failed_tool_inside_the_guard_is_refused(
        saver, provider) -> None:
    """Turning the lost answer into an error message would record `failed` (not applied)
    for a charge that was made, and the model would ask for it again under a new key."""
    errors = ToolErrorMiddleware(on_error=lambda exc, request: f"failed: {exc}")
    with pytest.raises(MiddlewareOrderError, match="in the tool's place"):
        start(agent(saver, provider, inner=[errors]))
    [record] = saver.effects("t")
    assert record.status is EffectStatus.IN_FLIGHT
    fixed = agent(saver, provider, outer=[errors])
    result = fixed.invoke(None, CONFIG, durability="sync")
    assert result["__interrupt__"][0].value["type"] == "effect_unknown"
    assert provider.count() == 1


@pytest.mark.parametrize("provider", ["blind"], indirect=True)
def test_retry_inside_the_guard_is_harmless_when_nothing_fails(saver, provider) -> None:
    with pytest.raises(ConnectionError):
        provider.apply("warm-up")  # uses up the scripted `lost` fault
    result = start(agent(saver, provider, inner=[retry()]))
    assert result["messages"][-1].content == "done"
    assert provider.count() == 2  # the warm-up and the one charge


@pytest.mark.parametrize("order", ["before", "after"])
def test_model_retry_middleware_is_harmless_in_either_order(saver, provider, order) -> None:
    """It calls the model again, never a tool: the calls it yields are keyed from the
    AIMessage the step checkpointed, whichever attempt produced it."""
    model_retry = ModelRetryMiddleware(max_retries=2, initial_delay=0, jitter=False)
    graph = agent(saver, provider, model_failures=1,
                  **{"outer" if order == "before" else "inner": [model_retry]})
    settled_once(graph, provider, start(graph), saver)
