"""Tool outcomes once the body has run, and lookups that cannot tell.

Once a tool's body has been entered, only `NotApplied` (and `Retryable`, once attempts
run out) means "not applied". An error the tool reports any other way, after the
provider may have applied the effect, is an unknown outcome that the guard reconciles:
found by a lookup, re-sent under the same key to a provider that dedupes, or left to a
human. Never `failed`: a model that sees a failure tries again, under a new key.

Every assertion that matters is on the provider's side: how many effects it applied.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool, InjectedToolCallId, StructuredTool, ToolException
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt import InjectedState
from langgraph.prebuilt.tool_node import ToolCallRequest
from pydantic import BaseModel, ConfigDict, Field, field_validator

from graph_durable import Effect, EffectGuardMiddleware, EffectStatus, NotApplied, Retryable
from graph_durable import current_effect
from graph_durable.nodes.outcomes import refused_args
from graph_durable.testing import FakeProvider, FaultPlan
from graph_durable.testing.crash.child import run_child
from graph_durable.testing.scenarios.effects import EffectsAgent, react_graph
from graph_durable.testing.savers import open_saver

CONFIG = {"configurable": {"thread_id": "t"}}
START = {"messages": [HumanMessage("charge 5 euros")]}
MODES = ["dedupe", "lookup", "blind"]


class RetryingModel(BaseChatModel):
    """Asks for one charge, and for another (a new tool_call_id) each time the answer is
    an error, as a model does after a failed call; at most three. Its answers follow
    from the conversation alone, so a resumed process gets the same ones."""

    @property
    def _llm_type(self) -> str:
        return "retrying"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        asked = sum(1 for m in messages if isinstance(m, AIMessage) and m.tool_calls)
        last = messages[-1]
        retry = isinstance(last, ToolMessage) and last.status == "error" and asked < 3
        if asked == 0 or retry:
            answer = AIMessage(content="", tool_calls=[
                {"name": "charge", "args": {"cents": 500}, "id": f"charge-{asked + 1}"}])
        else:
            answer = AIMessage(content="done")
        return ChatResult(generations=[ChatGeneration(message=answer)])

    def bind_tools(self, tools: Any, **kwargs: Any) -> RetryingModel:
        return self


class Receipt(BaseModel):
    id: int  # the provider's ids are strings: validating one raises in the body


def charge_tool(provider: FakeProvider, how: str) -> BaseTool:
    """`charge`, which applies the charge and then reports an error `how`:

    - `tool_exception`: the connection drops after the provider applied it, and the tool
      raises `ToolException`, which `handle_tool_error=True` turns into an error message;
    - `error_message`: the same drop, answered with an error ToolMessage of its own;
    - `validation_error`: the body validates the provider's answer, which fails.
    """
    def apply(cents: int) -> dict[str, Any]:
        return provider.apply(current_effect().key, {"cents": cents})

    if how == "tool_exception":
        def charge(cents: int) -> str:
            try:
                return f"charged {apply(cents)['id']}"
            except ConnectionError as exc:
                raise ToolException(f"payment API: {exc}") from exc

        return StructuredTool.from_function(charge, name="charge", description="Charge.",
                                            handle_tool_error=True)
    if how == "error_message":
        def charge_msg(cents: int, tool_call_id: Annotated[str, InjectedToolCallId]) -> Any:
            try:
                return f"charged {apply(cents)['id']}"
            except ConnectionError as exc:
                return ToolMessage(f"payment API: {exc}", tool_call_id=tool_call_id,
                                   status="error")

        return StructuredTool.from_function(charge_msg, name="charge", description="Charge.")

    def charge_checked(cents: int) -> str:
        return f"charged {Receipt.model_validate(apply(cents)).id}"

    return StructuredTool.from_function(charge_checked, name="charge", description="Charge.")


def policy(provider: FakeProvider) -> Effect:
    return {"dedupe": Effect(idempotent=True), "lookup": Effect(lookup=provider.find),
            "blind": Effect()}[provider.mode]


def build_charge_agent(db_path: str, provider_dir: str, mode: str,
                       how: str = "tool_exception") -> EffectsAgent:
    """The retrying model and `charge_tool(how)` on a provider in `mode` whose first
    request is applied and then loses its answer (a scenario for child processes)."""
    provider = FakeProvider(str(Path(provider_dir) / "charge.sqlite"), mode,  # type: ignore[arg-type]
                            name="charge")
    saver = open_saver(None, db_path)
    graph = react_graph(RetryingModel(), [charge_tool(provider, how)],
                        {"charge": policy(provider)}, saver)
    return EffectsAgent(graph, saver, {"charge": provider}, START)


def provider_in(tmp_path: Path, mode: str, *faults: str) -> FakeProvider:
    provider = FakeProvider(str(tmp_path / "charge.sqlite"), mode, name="charge")  # type: ignore[arg-type]
    provider.script_faults(*faults)  # type: ignore[arg-type]
    return provider


def question(result: dict[str, Any]) -> dict[str, Any]:
    [interrupt] = result["__interrupt__"]
    return interrupt.value


# -- 1. an error reported after the write is unknown, never failed -------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", ["tool_exception", "error_message"])
def test_an_error_reported_after_the_write_never_charges_twice(
        make_saver, tmp_path, mode, how) -> None:
    provider = provider_in(tmp_path, mode, "lost")
    tool = charge_tool(provider, how)
    graph = react_graph(RetryingModel(), [tool], {"charge": policy(provider)}, make_saver())

    result = graph.invoke(START, CONFIG, durability="sync")

    assert provider.count() == 1, provider.requests()
    [record] = graph.checkpointer.effects("t")
    if mode == "blind":
        asked = question(result)
        assert asked["type"] == "effect_unknown" and asked["tool_call_id"] == "charge-1"
        assert record.status is EffectStatus.UNKNOWN
        assert "reported an error after it started" in record.error
        assert "payment API" in record.error
    else:
        assert result["messages"][-1].content == "done"
        assert record.status is EffectStatus.APPLIED and "charge-1" in str(record.receipt)
        assert {r["key"] for r in provider.requests()} == {record.key}


@pytest.mark.parametrize("mode", ["lookup", "blind"])
def test_a_validation_error_raised_in_the_body_is_not_bad_arguments(
        make_saver, tmp_path, mode) -> None:
    """ToolNode reports a `ValidationError` from `tool.invoke` as bad arguments; raised by
    the body after the provider applied the charge, it is an unknown outcome."""
    provider = provider_in(tmp_path, mode)
    graph = react_graph(RetryingModel(), [charge_tool(provider, "validation_error")],
                        {"charge": policy(provider)}, make_saver())

    result = graph.invoke(START, CONFIG, durability="sync")

    assert provider.count() == 1, provider.requests()
    [record] = graph.checkpointer.effects("t")
    if mode == "blind":
        assert question(result)["type"] == "effect_unknown"
        assert record.status is EffectStatus.UNKNOWN
    else:
        assert record.status is EffectStatus.APPLIED and result["messages"][-1].content == "done"


async def test_an_error_message_of_an_async_tool_is_reconciled(amake_saver, tmp_path) -> None:
    provider = provider_in(tmp_path, "lookup", "lost")

    async def charge(cents: int) -> str:
        try:
            return f"charged {provider.apply(current_effect().key, {'cents': cents})['id']}"
        except ConnectionError as exc:
            raise ToolException(str(exc)) from exc

    tool = StructuredTool.from_function(coroutine=charge, name="charge", description="Charge.",
                                        handle_tool_error=True)
    graph = react_graph(RetryingModel(), [tool], {"charge": policy(provider)},
                        await amake_saver())

    result = await graph.ainvoke(START, CONFIG, durability="sync")

    assert provider.count() == 1 and result["messages"][-1].content == "done"
    [record] = await graph.checkpointer.aeffects("t")
    assert record.status is EffectStatus.APPLIED


def test_create_agent_pauses_on_an_error_reported_after_a_blind_write(tmp_path) -> None:
    provider = provider_in(tmp_path, "blind", "lost")
    saver = open_saver(None, str(tmp_path / "agent.sqlite"))
    agent = create_agent(RetryingModel(), tools=[charge_tool(provider, "tool_exception")],
                         middleware=[EffectGuardMiddleware({"charge": Effect()})],
                         checkpointer=saver)

    result = agent.invoke(START, CONFIG, durability="sync")

    assert provider.count() == 1
    assert question(result)["type"] == "effect_unknown"
    [record] = saver.effects("t")
    assert record.status is EffectStatus.UNKNOWN


# -- 2. what still means "not applied" -----------------------------------------------------


@pytest.mark.parametrize("how", ["tool_exception", "error_message"])
def test_args_that_fail_the_schema_are_refused_before_the_body(make_saver, tmp_path,
                                                               how) -> None:
    """Checked before sending, so nothing is sent. The `error_message` tool has an
    injected tool_call_id: its absence from the model's args is no error."""
    provider = provider_in(tmp_path, "blind")
    tool = charge_tool(provider, how)
    graph = react_graph(RetryingModel(), [tool], {"charge": Effect()}, make_saver())
    calls = [{"name": "charge", "args": {"cents": "lots"}, "id": "bad"}]
    state = {"messages": [HumanMessage("go"), AIMessage(content="", tool_calls=calls)]}
    graph.update_state(CONFIG, state, as_node="agent")

    result = graph.invoke(None, CONFIG, durability="sync")

    answer = next(m for m in result["messages"] if isinstance(m, ToolMessage))
    assert answer.status == "error" and "cents" in answer.content
    refused, charged = graph.checkpointer.effects("t")
    assert refused.status is EffectStatus.FAILED and refused.attempts == 1
    assert charged.status is EffectStatus.APPLIED  # the model's next call, with good args
    assert provider.count() == 1 and len(provider.requests()) == 1


def test_create_agent_refuses_bad_args_before_the_body(tmp_path) -> None:
    provider = provider_in(tmp_path, "blind")
    entered: list[int] = []

    def charge(cents: int) -> str:
        entered.append(cents)
        return "charged"

    saver = open_saver(None, str(tmp_path / "agent.sqlite"))
    agent = create_agent(RetryingModel(), tools=[StructuredTool.from_function(
        charge, name="charge", description="Charge.")],
        middleware=[EffectGuardMiddleware()], checkpointer=saver)
    agent.update_state(CONFIG, {"messages": [HumanMessage("go"), AIMessage(
        content="", tool_calls=[{"name": "charge", "args": {"cents": "x"}, "id": "bad"}])]},
        as_node="model")
    agent.invoke(None, CONFIG, durability="sync")
    refused = saver.effects("t")[0]
    assert refused.status is EffectStatus.FAILED and entered == [500]
    assert provider.count() == 0


class AliasedArgs(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    from_: str = Field(alias="from")
    cents: int

    @field_validator("cents")
    @classmethod
    def positive(cls, cents: int) -> int:
        if cents <= 0:
            raise ValueError("must be positive")
        return cents


def transfer(**kwargs: Any) -> str:
    """Transfer."""
    return "moved"


def with_injected(cents: int, state: Annotated[dict, InjectedState],
                  call_id: Annotated[str, InjectedToolCallId]) -> str:
    """Charge, with injected args."""
    return "charged"


@pytest.mark.parametrize(("tool", "args", "refused"), [
    (StructuredTool.from_function(transfer, args_schema=AliasedArgs),
     {"from": "a", "cents": 5}, False),  # an alias, and the schema's own validator
    (StructuredTool.from_function(transfer, args_schema=AliasedArgs),
     {"from": "a", "cents": -5}, True),
    (StructuredTool.from_function(with_injected), {"cents": 5}, False),  # injected: no error
    (StructuredTool.from_function(with_injected), {"cents": "x"}, True),
])
def test_the_argument_check_is_the_tools_own_and_no_stricter(tool, args, refused) -> None:
    request = ToolCallRequest(tool_call={"name": tool.name, "args": args, "id": "c"},
                              tool=tool, state=None, runtime=None)  # type: ignore[arg-type]
    error = refused_args(request)
    assert (error is not None) is refused
    if refused:
        assert "cents" in str(error)


class ErrorsAsMessages(AgentMiddleware):
    """Turns a tool's exceptions into error ToolMessages, as `handle_tool_errors=True`
    does; listed after the guard, it runs inside it."""

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        try:
            return handler(request)
        except GraphBubbleUp:
            raise
        except Exception as exc:
            return ToolMessage(f"Error: {exc!r}", tool_call_id=request.tool_call["id"],
                               name=request.tool_call["name"], status="error")


@pytest.mark.parametrize("fault", ["permanent", "transient"])
def test_not_applied_turned_into_a_message_still_reads_as_not_applied(tmp_path,
                                                                      fault) -> None:
    provider = provider_in(tmp_path, "blind", fault)
    saver = open_saver(None, str(tmp_path / "agent.sqlite"))
    tool = charge_tool(provider, "tool_exception")
    agent = create_agent(RetryingModel(), tools=[tool],
                         middleware=[EffectGuardMiddleware({"charge": Effect(retries=1)}),
                                     ErrorsAsMessages()], checkpointer=saver)

    result = agent.invoke(START, CONFIG, durability="sync")

    assert "__interrupt__" not in result and result["messages"][-1].content == "done"
    records = saver.effects("t")
    if fault == "permanent":  # NotApplied: failed, and the model's next call charges
        assert [r.status for r in records] == [EffectStatus.FAILED, EffectStatus.APPLIED]
    else:  # Retryable: the same call again, same key
        assert [(r.status, r.attempts) for r in records] == [(EffectStatus.APPLIED, 2)]
    assert provider.count() == 1


# -- 3. lookups ----------------------------------------------------------------------------


def flaky_charge(provider: FakeProvider) -> BaseTool:
    """Applies the charge, then the connection drops (an unknown outcome)."""
    def charge(cents: int) -> str:
        return f"charged {provider.apply(current_effect().key, {'cents': cents})['id']}"

    return StructuredTool.from_function(charge, name="charge", description="Charge.")


def test_a_bool_from_a_lookup_cannot_tell(make_saver, tmp_path) -> None:
    provider = provider_in(tmp_path, "blind", "lost")
    graph = react_graph(RetryingModel(), [flaky_charge(provider)],
                        {"charge": Effect(lookup=lambda key: False)}, make_saver())

    result = graph.invoke(START, CONFIG, durability="sync")

    assert question(result)["type"] == "effect_unknown" and provider.count() == 1
    [record] = graph.checkpointer.effects("t")
    assert record.status is EffectStatus.UNKNOWN
    for named in ("'charge'", "False", "'charge-1'", "'t'", "None"):
        assert named in record.error


@pytest.mark.parametrize("receipt", [{}, 0, ""])
def test_a_falsy_receipt_that_is_not_none_is_a_receipt(make_saver, tmp_path, receipt) -> None:
    provider = provider_in(tmp_path, "blind", "lost")
    graph = react_graph(RetryingModel(), [flaky_charge(provider)],
                        {"charge": Effect(lookup=lambda key: receipt)}, make_saver())

    result = graph.invoke(START, CONFIG, durability="sync")

    assert result["messages"][-1].content == "done" and provider.count() == 1
    [record] = graph.checkpointer.effects("t")
    assert record.status is EffectStatus.APPLIED and record.receipt == receipt


def test_a_lookup_that_hangs_is_timed_out(make_saver, tmp_path) -> None:
    provider = provider_in(tmp_path, "lookup", "lost")
    released = threading.Event()

    def hanging(key: str) -> Any:
        released.wait(20)
        return provider.find(key)

    graph = react_graph(RetryingModel(), [flaky_charge(provider)],
                        {"charge": Effect(lookup=hanging, timeout=0.5)}, make_saver())
    try:
        result = graph.invoke(START, CONFIG, durability="sync")
    finally:
        released.set()

    assert question(result)["type"] == "effect_unknown" and provider.count() == 1
    [record] = graph.checkpointer.effects("t")
    assert record.status is EffectStatus.UNKNOWN and "timeout" in record.error


async def test_an_async_lookup_that_hangs_is_timed_out(amake_saver, tmp_path) -> None:
    provider = provider_in(tmp_path, "lookup", "lost")

    async def hanging(key: str) -> Any:
        await asyncio.sleep(20)
        return provider.find(key)

    graph = react_graph(RetryingModel(), [flaky_charge(provider)],
                        {"charge": Effect(lookup=hanging, timeout=0.5)}, await amake_saver())

    result = await asyncio.wait_for(graph.ainvoke(START, CONFIG, durability="sync"), 15)

    assert question(result)["type"] == "effect_unknown" and provider.count() == 1


@pytest.mark.parametrize("lookup_fails", ["raises", "hangs"])
def test_idempotent_tool_whose_lookup_cannot_tell_resends_with_the_same_key(
        make_saver, tmp_path, lookup_fails) -> None:
    provider = provider_in(tmp_path, "dedupe", "lost")
    released = threading.Event()

    def lookup(key: str) -> Any:
        if lookup_fails == "hangs":
            released.wait(20)
        raise ConnectionError("lookup API down")

    policy = Effect(idempotent=True, lookup=lookup, timeout=0.5)
    graph = react_graph(RetryingModel(), [flaky_charge(provider)], {"charge": policy},
                        make_saver())
    try:
        result = graph.invoke(START, CONFIG, durability="sync")
    finally:
        released.set()

    assert "__interrupt__" not in result and result["messages"][-1].content == "done"
    [record] = graph.checkpointer.effects("t")
    assert record.status is EffectStatus.APPLIED and record.attempts == 2
    assert provider.count() == 1 and [r["key"] for r in provider.requests()] == [record.key] * 2


@pytest.mark.parametrize("applied_first", [True, False])
async def test_a_cancelled_call_is_looked_up_on_resume(amake_saver, tmp_path,
                                                       applied_first) -> None:
    provider = provider_in(tmp_path, "lookup")

    async def charge(cents: int) -> str:
        key = current_effect().key
        if applied_first:
            provider.apply(key, {"cents": cents})
        await asyncio.sleep(30)  # the answer never comes back: the run is cancelled
        return "charged"

    tool = StructuredTool.from_function(coroutine=charge, name="charge", description="Charge.")
    graph = react_graph(RetryingModel(), [tool], {"charge": Effect(lookup=provider.find)},
                        await amake_saver())
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(graph.ainvoke(START, CONFIG, durability="sync"), 1.0)
    [record] = await graph.checkpointer.aeffects("t")
    assert record.status is EffectStatus.UNKNOWN

    result = await graph.ainvoke(None, CONFIG, durability="sync")

    [record] = await graph.checkpointer.aeffects("t")
    if applied_first:  # found: applied, and the model goes on
        assert "__interrupt__" not in result and result["messages"][-1].content == "done"
        assert record.status is EffectStatus.APPLIED
    else:  # a miss while the attempt may still land: a human decides, nothing is re-sent
        assert question(result)["type"] == "effect_unknown"
        assert record.status is EffectStatus.UNKNOWN
    assert provider.count() == int(applied_first)


# -- 4. a real crash -----------------------------------------------------------------------


@pytest.mark.crash
@pytest.mark.parametrize("mode", MODES)
def test_killed_after_an_error_reported_after_the_write_charges_once(tmp_path, mode) -> None:
    """The provider applies the charge, the answer is lost, the tool reports an error;
    the process is SIGKILLed before the tools step is saved. The resumed process never
    charges a second time: found by a lookup, deduplicated, or left to a human."""
    kwargs = {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path),
              "mode": mode}
    provider = provider_in(tmp_path, mode, "lost")
    factory = "tests.nodes.test_outcomes:build_charge_agent"

    crashed = run_child(factory, kwargs, thread_id="t",
                        fault=FaultPlan("before_put_writes", occurrence=3))
    assert crashed.killed and provider.count() == 1

    resumed = run_child(factory, kwargs, thread_id="t", action="resume")

    assert not resumed.killed, resumed.stderr[-2000:]
    assert provider.count() == 1, provider.requests()
    if mode == "blind":
        [asked] = resumed.interrupts
        assert asked["type"] == "effect_unknown" and asked["tool_call_id"] == "charge-1"
    else:
        assert resumed.done and resumed.summary["messages"][-1]["content"] == "done"
