"""The explorer's guarded-write shapes: the episode's writes made by `guarded` functions.

Where `shapes` puts the episode's tools under `EffectGuardNode` or
`EffectGuardMiddleware`, these two topologies make the same writes from code that is
not a tool node, as applications do with `graph_durable.guarded`:

- `guarded_node`: the flat graph (scripted model -> tools -> model) whose tools node is a
  custom `StateGraph` node: it calls one `guarded` function per tool call of the last
  AIMessage, one after the other in one task, and answers each call with a ToolMessage
  (the receipt as JSON; an error ToolMessage when the function raises `NotApplied`).
- `functional`: LangGraph's functional-API agent, as its tutorials build it: an
  `@entrypoint` (`workflow`) that calls the model in a `@task` and each tool call in a
  `@task` of its own, each calling the `guarded` function, and returns
  `{"messages": [...]}`. With `sequential` each tool task is awaited before the next
  starts (`max_concurrency=1` would leave the entrypoint's tasks no slot to run in);
  otherwise all of a turn's tasks start, then are awaited.

The guarded functions are named after the episode's tools (so fault plans name them as
they name tools) and write to the same providers with `operation=item`; a read-only
tool is `guarded(Effect(read_only=True))`. The tools' own answer shapes (`errors`,
`result`) are ToolNode's and are not drawn here. An `update_state` fork of a
`functional` thread is not generated: an entrypoint has a single node, and an update
writes its return value, leaving nothing to run.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import tools_condition

from graph_durable.errors import NotApplied
from graph_durable.nodes.context import current_effect
from graph_durable.nodes.writes import GuardedWrite, guarded
from graph_durable.policy import Effect
from graph_durable.testing.models import ScriptedChatModel
from graph_durable.testing.providers import FakeProvider

__all__ = ["GUARDED_TOPOLOGIES", "WORKFLOW", "build_guarded_agent", "guarded_writes"]

GUARDED_TOPOLOGIES = ("guarded_node", "functional")
WORKFLOW = "workflow"
"""The `functional` entrypoint's node name (a step that runs the guarded writes)."""


def guarded_writes(providers: dict[str, FakeProvider], effects: dict[str, Effect],
                   is_async: bool) -> dict[str, GuardedWrite]:
    """One `guarded` function per tool of the episode, named after it."""
    writes: dict[str, GuardedWrite] = {}
    for name, effect in effects.items():
        provider = providers.get(name)
        writes[name] = guarded(effect, name=name)(_write_of(provider, name, is_async))
    return writes


def _write_of(provider: FakeProvider | None, name: str, is_async: bool) -> Any:
    def apply(item: str, n: int) -> dict[str, Any]:
        if provider is None:  # a read-only tool
            return {"read": item, "n": n}
        effect = current_effect()
        return provider.apply(effect.key, {"item": item, "n": n}, operation=item,
                              fencing_token=effect.fencing_token)

    if is_async:
        async def awrite(item: str, n: int) -> dict[str, Any]:
            # In a worker thread, as a network client would be: a timeout abandons the
            # attempt, which may still land, instead of blocking the event loop.
            return await asyncio.to_thread(apply, item, n)

        awrite.__doc__ = f"Write one item to {name}."
        return awrite

    def write(item: str, n: int) -> dict[str, Any]:
        return apply(item, n)

    write.__doc__ = f"Write one item to {name}."
    return write


def _answer(call: dict[str, Any], value: Any = None, refused: NotApplied | None = None
            ) -> ToolMessage:
    """The ToolMessage answering `call`: the guarded function's value, or its refusal."""
    if refused is not None:
        return ToolMessage(content=f"Error: {refused}", tool_call_id=call["id"],
                           name=call["name"], status="error")
    content = value if isinstance(value, str) else json.dumps(value, default=str)
    return ToolMessage(content=content, tool_call_id=call["id"], name=call["name"])


def _call(writes: dict[str, GuardedWrite], call: dict[str, Any]) -> ToolMessage:
    try:
        return _answer(call, writes[call["name"]](**call["args"]))
    except NotApplied as refused:
        return _answer(call, refused=refused)


async def _acall(writes: dict[str, GuardedWrite], call: dict[str, Any]) -> ToolMessage:
    try:
        return _answer(call, await writes[call["name"]](**call["args"]))
    except NotApplied as refused:
        return _answer(call, refused=refused)


def _node_graph(saver: Any, model: ScriptedChatModel, writes: dict[str, GuardedWrite],
                is_async: bool) -> Any:
    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def tools(state: MessagesState) -> dict[str, Any]:
        calls = state["messages"][-1].tool_calls
        return {"messages": [_call(writes, call) for call in calls]}

    async def atools(state: MessagesState) -> dict[str, Any]:
        calls = state["messages"][-1].tool_calls
        return {"messages": [await _acall(writes, call) for call in calls]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", atools if is_async else tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


def _functional_graph(saver: Any, model: ScriptedChatModel, writes: dict[str, GuardedWrite],
                      is_async: bool, sequential: bool) -> Any:
    if is_async:
        @task(name="model")
        async def acall_model(messages: list[Any]) -> AIMessage:
            return await model.ainvoke(messages)

        @task(name="tool")
        async def acall_tool(call: dict[str, Any]) -> ToolMessage:
            return await _acall(writes, call)

        @entrypoint(checkpointer=saver)
        async def workflow(inputs: dict[str, Any]) -> dict[str, Any]:
            messages = list(inputs["messages"])
            while True:
                answer = await acall_model(messages)
                messages = add_messages(messages, [answer])
                if not answer.tool_calls:
                    return {"messages": messages}
                if sequential:
                    answers = [await acall_tool(call) for call in answer.tool_calls]
                else:
                    answers = await asyncio.gather(*(acall_tool(call)
                                                     for call in answer.tool_calls))
                messages = add_messages(messages, list(answers))

        return workflow

    @task(name="model")
    def call_model(messages: list[Any]) -> AIMessage:
        return model.invoke(messages)

    @task(name="tool")
    def call_tool(call: dict[str, Any]) -> ToolMessage:
        return _call(writes, call)

    @entrypoint(checkpointer=saver)
    def workflow(inputs: dict[str, Any]) -> dict[str, Any]:
        messages = list(inputs["messages"])
        while True:
            answer = call_model(messages).result()
            messages = add_messages(messages, [answer])
            if not answer.tool_calls:
                return {"messages": messages}
            if sequential:
                answers = [call_tool(call).result() for call in answer.tool_calls]
            else:
                futures = [call_tool(call) for call in answer.tool_calls]
                answers = [future.result() for future in futures]
            messages = add_messages(messages, answers)

    return workflow


def build_guarded_agent(saver: Any, providers: dict[str, FakeProvider],
                        effects: dict[str, Effect], script: list[AIMessage], topology: str,
                        is_async: bool, sequential: bool = True) -> Any:
    """The compiled graph of `topology` (`guarded_node` or `functional`) on `saver`."""
    writes = guarded_writes(providers, effects, is_async)
    model = ScriptedChatModel(script=script)
    if topology == "guarded_node":
        return _node_graph(saver, model, writes, is_async)
    if topology == "functional":
        return _functional_graph(saver, model, writes, is_async, sequential)
    raise ValueError(f"not a guarded-write topology: {topology!r}")
