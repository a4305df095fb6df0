"""Everyday LangGraph / LangChain shapes for the explorer's agent: topologies and tools.

`scenario` builds the episode's tools and graph through this module, so that an
episode can put its guarded tools where applications put them and have them answer the
way LangChain lets tools answer:

- `topology` (`Episode.topology`): `flat` (model -> `EffectGuardNode` -> model, the
  thread's own graph), `subgraph` (that graph compiled as the node `payments` of a
  parent), `subgraph_nested` (two levels down: parent -> `billing` -> `payments`),
  `subgraph_send` (the parent fans out two `Send("payments", ...)` branches, each asking
  for the episode's calls under its own items `b0...` and `b1...`), `create_agent`
  (LangChain's `create_agent` with `EffectGuardMiddleware`, one task per call, the
  middleware listed as `Episode.stack` says).
- a write tool's `errors` (how it reports a provider error it cannot tell about, a
  `lost` answer after the write or a `hang` before it): `raise` (as is), `tool_exception`
  (`ToolException`, the tool built with `handle_tool_error=True`), `error_message`
  (returns `ToolMessage(status="error")`), `validation` (a pydantic `ValidationError`
  raised in the body).
- a write tool's `result`: `receipt` (the receipt dict, JSON content), `artifact`
  (`response_format="content_and_artifact"`: the receipt as content and as artifact),
  `non_json` (a dict with a `bytes` value: its content is the dict's `repr`), `command`
  (a `Command` whose update carries the answer, marked `additional_kwargs["command"]`,
  and whose `goto` is `followup`, a node that asks for one more guarded write, `audit`,
  of the same item with suffix `a`; an answer found by lookup or given by a person is
  no Command, and the thread goes on to the model).
- a looked-up tool's `lookup_faults`: the first lookups cannot tell (`LOOKUP_FAULTS`).
- `history` (`Episode.history`, flat graphs): `""` (`add_messages`, which gives every
  message an id), `trimmed` (a reducer that keeps the last `KEEP_LAST` messages and
  assigns no ids; the model's messages carry their own), `idless` (the same, the
  model's messages without ids: graph_durable refuses to key their calls,
  `UnkeyableToolCall`, before anything is sent).
"""

from __future__ import annotations

import ast
import asyncio
import json
import time
import uuid
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, StructuredTool, ToolException
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, Send
from pydantic import BaseModel, Field

from graph_durable.nodes import current_effect
from graph_durable.testing.models import ScriptedChatModel
from graph_durable.testing.providers import FakeProvider

__all__ = ["KEEP_LAST", "STACKS", "TrimmedState", "keep_last", "trimmed_agent", "SUBGRAPHS", "TOPOLOGIES", "UNSAFE_STACKS", "branch_items",
           "build_create_agent", "parse_answer", "script_for", "write_tool", "wrap_in_parent"]

TOPOLOGIES = ("flat", "subgraph", "subgraph_nested", "subgraph_send", "create_agent")
SUBGRAPHS = ("subgraph", "subgraph_nested", "subgraph_send")
BRANCHES = ("b0", "b1")
"""The item prefixes of the two `Send` branches of `subgraph_send`."""
FOLLOWUP_TOOL = "audit"
"""The write a `command` result's `goto` leads to (its own provider, `audit.sqlite`)."""


class _Receipt(BaseModel):
    id: str


def branch_items(item: str, topology: str) -> list[str]:
    """The provider operations (items) one scripted call becomes under `topology`."""
    if topology == "subgraph_send":
        return [f"{branch}{item}" for branch in BRANCHES]
    return [item]


LOOKUP_FAULTS = {"error": "transient", "bool": "permanent", "hang": "hang"}
"""How a lookup that cannot tell misbehaves (`lookup_faults` of a tool spec), as the
provider fault scripted under the operation `find`: it raises `ConnectionError`,
answers `True` (neither a receipt nor `None`), or answers only after `hang_seconds` and
then raises `TimeoutError`."""


def lookup_of(provider: FakeProvider) -> Any:
    """`provider.find`, misbehaving once per fault scripted under `find`."""

    def find(key: str) -> Any:
        fault = provider.take_fault("find")
        if fault == "transient":
            raise ConnectionError(f"{provider.name}: lookup connection reset")
        if fault == "permanent":
            return True
        if fault == "hang":
            time.sleep(provider.hang_seconds)
            raise TimeoutError(f"{provider.name}: lookup timed out")
        return provider.find(key)

    return find


def parse_answer(content: Any) -> Any:
    """A receipt from a ToolMessage's content: JSON, or the `repr` of a non-JSON dict."""
    if not isinstance(content, str):
        return None
    try:
        return json.loads(content)
    except ValueError:
        pass
    try:
        return ast.literal_eval(content)
    except (ValueError, SyntaxError):
        return None


def _report(errors: str, exc: Exception, name: str, tool_call_id: str) -> Any:
    """How a tool reports an error it cannot tell about (the module docstring)."""
    if errors == "tool_exception":
        raise ToolException(f"{name} failed: {exc}") from exc
    if errors == "error_message":
        return ToolMessage(content=f"Error: {name} failed: {exc}", tool_call_id=tool_call_id,
                           name=name, status="error")
    if errors == "validation":
        _Receipt.model_validate({"id": None})  # raises pydantic's ValidationError
    raise exc


def _shape(result: str, receipt: dict[str, Any], name: str, tool_call_id: str) -> Any:
    if result == "artifact":
        return json.dumps(receipt), {"receipt": receipt}
    if result == "non_json":
        return {**receipt, "raw": str(receipt["id"]).encode()}
    if result == "command":
        answer = ToolMessage(content=json.dumps(receipt), tool_call_id=tool_call_id, name=name,
                             additional_kwargs={"command": True})
        return Command(update={"messages": [answer]}, goto="followup")
    return receipt


def write_tool(provider: FakeProvider, spec: dict[str, Any]) -> StructuredTool:
    """The write tool of `provider`, reporting errors and shaping results as `spec` says."""
    errors, result = spec.get("errors", "raise"), spec.get("result", "receipt")
    name = provider.name

    def apply(item: str, n: int) -> dict[str, Any]:
        effect = current_effect()
        return provider.apply(effect.key, {"item": item, "n": n}, operation=item,
                              fencing_token=effect.fencing_token)

    def write(item: str, n: int, tool_call_id: Annotated[str, InjectedToolCallId]) -> Any:
        try:
            receipt = apply(item, n)
        except (ConnectionError, TimeoutError) as exc:
            return _report(errors, exc, name, tool_call_id)
        return _shape(result, receipt, name, tool_call_id)

    async def awrite(item: str, n: int,
                     tool_call_id: Annotated[str, InjectedToolCallId]) -> Any:
        # In a worker thread, as a network client would be: a timeout abandons the
        # attempt, which may still land, instead of blocking the event loop.
        try:
            receipt = await asyncio.to_thread(apply, item, n)
        except (ConnectionError, TimeoutError) as exc:
            return _report(errors, exc, name, tool_call_id)
        return _shape(result, receipt, name, tool_call_id)

    return StructuredTool.from_function(
        write, coroutine=awrite, name=name, description=f"Write one item to {name}.",
        handle_tool_error=errors == "tool_exception",
        response_format="content_and_artifact" if result == "artifact" else "content")


def followup_node(state: Any) -> dict[str, Any]:
    """After a `command` result: ask for one `audit` write per command answer of the
    last tools step (a message of its own, not the model's: `name="followup"`)."""
    messages = state["messages"]
    answers = []
    for message in reversed(messages):
        if message.type != "tool":
            break
        receipt = parse_answer(message.content)
        if message.additional_kwargs.get("command") and isinstance(receipt, dict):
            answers.append(receipt)
    calls = [{"name": FOLLOWUP_TOOL, "args": {"item": f"{r['item']}a", "n": 0},
              "id": f"audit_{r['item']}"} for r in reversed(answers)]
    return {"messages": [AIMessage(content="", name="followup", tool_calls=calls,
                                   id=f"followup-{uuid.uuid4().hex[:12]}")]}


def model_view(messages: list[Any]) -> list[Any]:
    """What the scripted model counts: the conversation without the follow-up's asks."""
    return [m for m in messages if getattr(m, "name", None) != "followup"]


def wrap_in_parent(inner: StateGraph, topology: str) -> StateGraph:
    """The parent graph `topology` puts the compiled `inner` graph in."""
    graph = inner.compile()
    if topology == "subgraph_nested":
        graph = _parent("payments", graph).compile()
        return _parent("billing", graph)
    if topology == "subgraph_send":
        builder = StateGraph(MessagesState)
        builder.add_node("payments", graph)

        def fan_out(state: MessagesState) -> list[Send]:
            return [Send("payments", {"messages": [HumanMessage(f"Go, branch {branch}.")]})
                    for branch in BRANCHES]

        builder.add_conditional_edges(START, fan_out, ["payments"])
        builder.add_edge("payments", END)
        return builder
    return _parent("payments", graph)


def _parent(name: str, graph: Any) -> StateGraph:
    builder = StateGraph(MessagesState)
    builder.add_node(name, graph)
    builder.add_edge(START, name)
    return builder


def branch_of(messages: list[Any]) -> str:
    """The `Send` branch a subgraph run serves (`""` outside `subgraph_send`)."""
    for message in messages:
        if isinstance(message, HumanMessage) and "branch " in str(message.content):
            return str(message.content).rsplit("branch ", 1)[1].rstrip(".")
    return ""


STACKS = {
    "guard": ("guard",),
    "tool_retry_outside": ("tool_retry", "guard"),
    "model_retry": ("model_retry", "guard"),
    "tool_retry_inside": ("guard", "tool_retry"),
    "hitl_before_guard": ("hitl", "guard"),
    "hitl_after_guard": ("guard", "hitl"),
}
"""`create_agent` middleware lists (first listed is outermost). `tool_retry_inside` lists
`ToolRetryMiddleware` after the guard, so a retry would re-send a call the guard
claimed once, and `hitl_after_guard` lists a per-call `HumanInTheLoopMiddleware` after it
(an edit would be sent unrecorded): graph_durable refuses those orders
(`MiddlewareOrderError`) before sending anything; the explorer then lists them in the
safe order and runs again. With `HumanInTheLoopMiddleware` (per call, no edit notice),
the tools that need approval are asked by it, not by the guard."""
UNSAFE_STACKS = ("tool_retry_inside", "hitl_after_guard")
SAFE_ORDER = {"tool_retry_inside": "tool_retry_outside", "hitl_after_guard": "hitl_before_guard"}
"""What an unsafe list becomes once graph_durable refused it (`MiddlewareOrderError`)."""


class _FlakyModel(ScriptedChatModel):
    """Fails the first time each turn is asked in a process (`ModelRetryMiddleware`
    asks again)."""

    failed: set[int] = Field(default_factory=set)

    def _generate(self, messages: list[Any], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> Any:
        turn = sum(1 for message in messages if isinstance(message, AIMessage))
        if turn not in self.failed:
            self.failed.add(turn)
            raise ConnectionError(f"model turn {turn}: connection reset (retried)")
        return super()._generate(messages, stop, run_manager, **kwargs)


def build_create_agent(saver: Any, turns: list[list[dict[str, Any]]], tools: list[Any],
                       effects: dict[str, Any], stack: str, approvals: Any = ()) -> Any:
    """LangChain's `create_agent` on the episode's tools, middleware as `stack` lists;
    `approvals` names the tools `HumanInTheLoopMiddleware` asks about, if listed."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import (
        HumanInTheLoopMiddleware,
        ModelRetryMiddleware,
        ToolRetryMiddleware,
    )

    from graph_durable.nodes import EffectGuardMiddleware

    names = STACKS[stack or "guard"]
    model_class = _FlakyModel if "model_retry" in names else ScriptedChatModel
    model = model_class(script=script_for(turns))
    made = {"guard": lambda: EffectGuardMiddleware(effects=effects),
            "tool_retry": lambda: ToolRetryMiddleware(max_retries=1, initial_delay=0.0,
                                                      jitter=False),
            "model_retry": lambda: ModelRetryMiddleware(max_retries=2, initial_delay=0.0,
                                                        jitter=False),
            "hitl": lambda: HumanInTheLoopMiddleware(
                dict.fromkeys(approvals, True), interrupt_mode="per_call", edit_notice=None)}
    return create_agent(model, tools=tools, middleware=[made[name]() for name in names],
                        checkpointer=saver)


KEEP_LAST = 6
"""How many messages a `trimmed` history keeps (a turn of five calls and its model
message fit)."""


def keep_last(left: list[Any] | None, right: Any) -> list[Any]:
    """A trimming reducer: append, keep the last `KEEP_LAST` (ids are not assigned)."""
    added = right if isinstance(right, list) else [right]
    return (list(left or []) + added)[-KEEP_LAST:]


class TrimmedState(TypedDict):
    """A state whose messages are trimmed; the model counts its turns itself."""

    messages: Annotated[list[Any], keep_last]
    turn: int


def trimmed_agent(script: list[AIMessage], idless: bool) -> Any:
    """The model node of a `trimmed` or `idless` history: the `turn`-th answer of the
    script, with a fresh id (as a model gives) or none."""

    def agent(state: TrimmedState) -> dict[str, Any]:
        turn = state.get("turn", 0)
        answer = script[min(turn, len(script) - 1)].model_copy(deep=True)
        answer.id = None if idless else f"ai-{uuid.uuid4().hex[:12]}"
        return {"messages": [answer], "turn": turn + 1}

    return agent


def script_for(turns: list[list[dict[str, Any]]], branch: str = "") -> list[AIMessage]:
    """One AIMessage per turn carrying its calls, then a closing answer; `branch`
    prefixes the items (a `Send` branch of `subgraph_send`)."""
    script = [
        AIMessage(content="", tool_calls=[
            {"name": call["tool"], "args": {"item": branch + call["item"], "n": call["n"]},
             "id": call["id"]}
            for call in calls
        ])
        for calls in turns
    ]
    return [*script, AIMessage(content="All done.")]
