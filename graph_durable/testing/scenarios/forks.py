"""Scenarios for fork tests: one charge, then re-running the thread from a named checkpoint.

`build_charge_agent` builds a ReAct-style graph (model -> EffectGuardNode -> model) with
one tool, `charge`, writing to a `FakeProvider` (file `<provider_dir>/charge.sqlite`).
Its scripted model asks for the same call, with the same tool_call_id and args, in two
turns: the first user message gets a charge then an answer, and a second user message
gets the same call again, in a new AIMessage. The scripted AIMessages carry no ids, so
each model turn gets its own message id (a fixed id would make the second message
replace the first in the state).

`run_fork_child` runs one invocation in a new process, like
`graph_durable.testing.crash.child.run_child`, with one more way to resume:
`resume_at_checkpoint` invokes `None` with the config returned by `get_state`, which
names the latest checkpoint id (a run that names a checkpoint id is a fork in
LangGraph's eyes, even when it names the latest one).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from typing import Any, Literal

import aiosqlite
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import StructuredTool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from graph_durable.checkpointers.sqlite import AsyncDurableSqliteSaver
from graph_durable.checkpointers.sqlite import DurableSqliteSaver
from graph_durable.nodes import EffectGuardNode, current_effect
from graph_durable.policy import Effect
from graph_durable.testing.crash.child import ChildResult, load_factory, summarize
from graph_durable.testing.crash.launcher import launched
from graph_durable.testing.faults import ENV_FAULTS, ENV_TRACE, FaultPlan
from graph_durable.testing.models import ScriptedChatModel
from graph_durable.testing.providers import FakeProvider
from graph_durable.testing.scenarios.effects import EffectsAgent

__all__ = [
    "CHARGE_ARGS",
    "CHARGE_CALL_ID",
    "assemble_charge_agent",
    "build_charge_agent",
    "build_charge_agent_async",
    "build_nested_charge_agent",
    "charge_script",
    "run_fork_child",
]

CHARGE_CALL_ID = "call_charge"
CHARGE_ARGS = {"customer": "ana", "cents": 500}

ForkAction = Literal["start", "resume", "resume_at_checkpoint", "time_travel", "update_fork"]


def charge_script() -> list[AIMessage]:
    """Turn 0 asks for the charge, turn 1 answers; turns 2 and 3 repeat both, with the
    same tool_call_id and args in a new AIMessage."""
    call = {"name": "charge", "args": dict(CHARGE_ARGS), "id": CHARGE_CALL_ID}
    return [
        AIMessage(content="", tool_calls=[dict(call)]),
        AIMessage(content="Charged."),
        AIMessage(content="", tool_calls=[dict(call)]),
        AIMessage(content="Charged again."),
    ]


def _policy(mode: str, provider: FakeProvider) -> Effect:
    if mode == "dedupe":
        return Effect(idempotent=True)
    if mode == "blind":
        return Effect()
    if mode == "lookup":
        return Effect(lookup=provider.find)
    raise ValueError(f"charge agent mode is 'dedupe', 'blind' or 'lookup', not {mode!r}")


def _with_fresh_ids(message: Any) -> Any:
    """`message` with new tool_call_ids, as a real model gives each time it is asked."""
    if not getattr(message, "tool_calls", None):
        return message
    calls = [{**call, "id": f"call_{uuid.uuid4().hex[:12]}"} for call in message.tool_calls]
    return message.model_copy(update={"tool_calls": calls})


def assemble_charge_agent(saver: Any, provider_dir: str, mode: str,
                          fresh_ids: bool = False) -> EffectsAgent:
    """The charge agent on a given saver (sync or async); `fresh_ids` gives the model's
    tool calls new ids each time it is asked, where the script repeats them."""
    os.makedirs(provider_dir, exist_ok=True)
    provider = FakeProvider(os.path.join(provider_dir, "charge.sqlite"), mode,  # type: ignore[arg-type]
                            name="charge")

    def charge(customer: str, cents: int) -> dict[str, Any]:
        return provider.apply(current_effect().key, {"customer": customer, "cents": cents})

    async def acharge(customer: str, cents: int) -> dict[str, Any]:
        return provider.apply(current_effect().key, {"customer": customer, "cents": cents})

    tool = StructuredTool.from_function(charge, coroutine=acharge, name="charge",
                                        description="Charge a customer.")
    model = ScriptedChatModel(script=charge_script())

    answer = _with_fresh_ids if fresh_ids else (lambda message: message)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [answer(model.invoke(state["messages"]))]}

    async def aagent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [answer(await model.ainvoke(state["messages"]))]}

    is_async = isinstance(saver, AsyncDurableSqliteSaver)
    builder = StateGraph(MessagesState)
    builder.add_node("agent", aagent if is_async else agent)
    builder.add_node("tools", EffectGuardNode([tool], effects={"charge": _policy(mode, provider)}))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return EffectsAgent(graph=builder.compile(checkpointer=saver), saver=saver,
                        providers={"charge": provider},
                        inputs={"messages": [HumanMessage("Charge Ana 5 EUR.")]})


def build_charge_agent(db_path: str, provider_dir: str, mode: str = "blind") -> EffectsAgent:
    """The charge agent on a `DurableSqliteSaver` at `db_path`.

    Args:
        db_path: The agent's SQLite database (checkpoints and ledger).
        provider_dir: Folder of the provider's database (`charge.sqlite`).
        mode: `blind` (`Effect()`, no dedupe, no lookup), `dedupe` (`Effect(idempotent=True)`)
            or `lookup` (`Effect(lookup=...)`, the provider found by key, no dedupe).
    """
    saver = DurableSqliteSaver(sqlite3.connect(db_path, check_same_thread=False))
    return assemble_charge_agent(saver, provider_dir, mode)


def build_nested_charge_agent(db_path: str, provider_dir: str,
                              mode: str = "blind") -> EffectsAgent:
    """The charge agent as subgraph `child` of a parent graph on a `DurableSqliteSaver`
    at `db_path` (the subgraph has no saver of its own: it uses its parent's). The
    guarded call runs in namespace `child:<task_id>|tools:<task_id>`; resuming the parent
    from a named checkpoint restarts the subgraph. Arguments as `build_charge_agent`."""
    saver = DurableSqliteSaver(sqlite3.connect(db_path, check_same_thread=False))
    inner = assemble_charge_agent(None, provider_dir, mode)
    builder = StateGraph(MessagesState)
    builder.add_node("child", inner.graph)
    builder.add_edge(START, "child")
    return EffectsAgent(graph=builder.compile(checkpointer=saver), saver=saver,
                        providers=inner.providers, inputs=inner.inputs)


async def build_charge_agent_async(db_path: str, provider_dir: str,
                                   mode: str = "blind") -> EffectsAgent:
    """`build_charge_agent` on an `AsyncDurableSqliteSaver` (close `saver.conn` after)."""
    saver = AsyncDurableSqliteSaver(aiosqlite.connect(db_path))
    return assemble_charge_agent(saver, provider_dir, mode)


# -- child process -----------------------------------------------------------------------


def run_fork_child(
    factory: str,
    kwargs: dict[str, Any],
    *,
    thread_id: str,
    action: ForkAction = "start",
    fault: FaultPlan | None = None,
    timeout: float = 60.0,
) -> ChildResult:
    """Run one invocation of a sync scenario's graph in a new process and wait for it.

    Args:
        factory: `module:attribute` of the scenario factory.
        kwargs: JSON-serializable keyword arguments for the factory.
        thread_id: Thread to run.
        action: `start` (invoke the inputs), `resume` (invoke `None` with the plain
            thread config), `resume_at_checkpoint` (invoke `None` with
            `graph.get_state(config).config`, which names the latest checkpoint id),
            `time_travel` (the newest checkpoint of `get_state_history`) or
            `update_fork` (an `update_state` of the latest checkpoint that adds nothing).
        fault: A plan that kills the child at a fault point.
        timeout: Seconds before the child is killed and the run reported as an error.
    """
    env = {k: v for k, v in os.environ.items() if k not in (ENV_FAULTS, ENV_TRACE)}
    if fault is not None:
        env.update(fault.to_env())
    spec = {"factory": factory, "kwargs": kwargs, "thread_id": thread_id, "action": action}
    proc = launched("graph_durable.testing.scenarios.forks:main", json.dumps(spec), env)
    try:
        returncode = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        proc.close()
        raise
    out, errors = proc.stdout(), proc.stderr()
    proc.close()
    killed = returncode == -signal.SIGKILL
    if returncode not in (0, -signal.SIGKILL):
        raise RuntimeError(f"fork child of {factory} (thread {thread_id!r}, {action}) failed "
                           f"with exit code {returncode}:\n{errors[-4000:]}")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    summary: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    return ChildResult(returncode, killed, summary, errors)


def _fork_config(graph: Any, config: dict[str, Any], action: str) -> dict[str, Any] | None:
    """The config a fork child's run names (`None`: run `inputs`)."""
    if action == "start":
        return None
    if action == "resume":
        return config
    latest = graph.get_state(config).config
    if action == "resume_at_checkpoint":
        return latest
    if action == "time_travel":
        return next(iter(graph.get_state_history(config))).config
    if action == "update_fork":
        return graph.update_state(latest, {})
    raise ValueError(f"unknown action {action!r}")


async def _afork_config(graph: Any, config: dict[str, Any], action: str
                        ) -> dict[str, Any] | None:
    if action in ("start", "resume"):
        return None if action == "start" else config
    latest = (await graph.aget_state(config)).config
    if action == "resume_at_checkpoint":
        return latest
    if action == "time_travel":
        return [s async for s in graph.aget_state_history(config, limit=1)][0].config
    if action == "update_fork":
        return await graph.aupdate_state(latest, {})
    raise ValueError(f"unknown action {action!r}")


async def _amain(spec: dict[str, Any]) -> None:
    scenario = await load_factory(spec["factory"])(**spec["kwargs"])
    graph = scenario.graph
    config = {"configurable": {"thread_id": spec["thread_id"]}}
    try:
        run_at = await _afork_config(graph, config, spec["action"])
        inputs = scenario.inputs if spec["action"] == "start" else None
        await graph.ainvoke(inputs, run_at or config, durability="sync")
        print(json.dumps(summarize(await graph.aget_state(config)), default=str), flush=True)
    finally:
        await scenario.saver.conn.close()


def main() -> None:
    """Child entry point of `run_fork_child` (the spec is the last argument, as JSON).

    Besides `start`, `resume` and `resume_at_checkpoint`, the child can run from the
    newest checkpoint of `get_state_history` (`time_travel`) or continue an
    `update_state` fork of the latest checkpoint (`update_fork`); an `async def` factory
    runs the graph with `ainvoke`.
    """
    spec = json.loads(sys.argv[-1])
    factory = load_factory(spec["factory"])
    if inspect.iscoroutinefunction(factory):
        asyncio.run(_amain(spec))
        return
    scenario = factory(**spec["kwargs"])
    graph = scenario.graph
    config = {"configurable": {"thread_id": spec["thread_id"]}}
    run_at = _fork_config(graph, config, spec["action"])
    graph.invoke(scenario.inputs if spec["action"] == "start" else None, run_at or config,
                 durability="sync")
    print(json.dumps(summarize(graph.get_state(config)), default=str), flush=True)
