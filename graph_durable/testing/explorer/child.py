"""What one child process of an explorer episode does: run the graph one way, report.

`run_step(**spec)` is called in a forked child (see `forkserver`). It rebuilds the
episode's agent (`scenario`), runs one invocation of the thread the way
`spec["via"]` says, waits for abandoned tool attempts (a timed-out call may still
land, as it would in a server that keeps running), and returns the thread's state as
JSON: next nodes, pending interrupts (id and value), and the exception the invocation
raised, classified as one of graph_durable's documented errors or not.

Ways to run (`via`):

- `start`: invoke the inputs; `plain`: `invoke(None, {"thread_id"})`. Either starts the
  thread when it has no checkpoint yet (a crash before the input was saved: the client
  sends it again).
- `checkpoint_config`: `invoke(None, graph.get_state(config).config)`.
- `time_travel`: `invoke(None, snapshot.config)` of a tools step from
  `get_state_history` (the `pick`-th, modulo their number).
- `update_state`: fork that step with `update_state` (its AIMessage written again, as
  the model node) and invoke the fork.
- `recover`: `recover(graph, saver, owner)` under leases.
- `decide`: `invoke(Command(resume=...))`: `decisions` through `review()` (`style`
  `review`), as `{tool_call_id: decision}` or one bare decision (`raw`), or a
  `malformed` resume value as is.

`flavour="async"` builds the agent on `AsyncDurableSqliteSaver` and uses `ainvoke`;
`lease` (`{"owner", "ttl"}`) runs under `saver.lease`; `sequential` runs a step's tool
calls one at a time (`max_concurrency=1`), so a fault plan's occurrence names one call.
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from langgraph.types import Command

from graph_durable import errors
from graph_durable.operators.audit import run_log
from graph_durable.operators.recovery import recover
from graph_durable.operators.review import areview, review
from graph_durable.testing.explorer.model import SLOW_SECONDS
from graph_durable.testing.explorer.scenario import build_explorer_agent, build_explorer_agent_async
from graph_durable.testing.explorer.writes import WORKFLOW

__all__ = ["DOCUMENTED_ERRORS", "run_step"]

DOCUMENTED_ERRORS: tuple[type[BaseException], ...] = tuple(
    error for name in errors.__all__
    if isinstance(error := getattr(errors, name), type) and issubclass(error, BaseException)
    and error not in (errors.NotApplied, errors.Retryable)  # tool outcomes, not raised out
)
"""Exceptions graph_durable documents as raised to its callers (`graph_durable.errors`)."""


def _with_options(config: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """`config` plus the episode's run options (one tool call at a time, if sequential;
    a functional-API agent orders its tasks itself, and one slot would leave them none)."""
    if spec.get("sequential", True) and spec.get("topology") != "functional":
        return {**config, "max_concurrency": 1}
    return dict(config)


def _thread_config(spec: dict[str, Any]) -> dict[str, Any]:
    return _with_options({"configurable": {"thread_id": spec["thread_id"]}}, spec)


def _checkpointed(state: Any) -> bool:
    return bool(state.config.get("configurable", {}).get("checkpoint_id"))


TOOL_STEPS = frozenset({"tools", "payments", "billing", WORKFLOW})
"""Nodes whose step runs the guarded tools: the tools node (a custom node under
`guarded_node`), the subgraph holding it, or the `functional` entrypoint."""


def _tools_steps(history: list[Any]) -> list[Any]:
    """Snapshots about to run the tools (of the top graph: a subgraph's parent steps),
    oldest first."""
    return [snap for snap in reversed(history) if snap.next and set(snap.next) <= TOOL_STEPS]


def _fork_update(snap: Any, spec: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """`(values, as_node)` of an `update_state` fork of `snap`: its last AIMessage
    written again by the model node; an update that adds nothing above a subgraph."""
    topology = spec.get("topology", "flat")
    if spec.get("history"):
        return {"messages": []}, "agent"  # a trimming reducer appends, never replaces
    if topology in ("flat", "create_agent", "guarded_node"):
        node = "model" if topology == "create_agent" else "agent"
        return {"messages": [snap.values["messages"][-1]]}, node
    return {"messages": []}, None


def _builder_args(spec: dict[str, Any]) -> tuple[Any, ...]:
    return (spec["db_path"], spec["provider_dir"], spec["tools"], spec["turns"],
            spec.get("sealed", False), spec.get("topology", "flat"), spec.get("stack", ""),
            spec.get("history", ""), spec.get("fresh_ids", False), spec.get("sequential", True),
            spec.get("pool", False))


def _classify(exc: BaseException) -> dict[str, Any]:
    kind = type(exc)
    return {"type": kind.__name__, "module": kind.__module__, "message": str(exc)[:2000],
            "documented": isinstance(exc, DOCUMENTED_ERRORS),
            "traceback": traceback.format_exc()[-3000:]}


def _summary(state: Any, thread_id: str) -> dict[str, Any]:
    # (A functional-API entrypoint's thread has no values until it returns.)
    messages = (state.values or {}).get("messages", [])
    # `next` alone is not enough: a step whose tasks all wrote, but whose checkpoint was
    # never saved, has no next task and has not finished.
    ended = bool(messages) and messages[-1].type == "ai" and not messages[-1].tool_calls
    return {"thread_id": thread_id, "next": list(state.next), "checkpointed": _checkpointed(state),
            "done": ended and not state.next and not state.interrupts,
            "interrupts": [{"id": i.id, "value": i.value} for i in state.interrupts]}


def _asked_calls(state: Any) -> list[str]:
    """The tool_call_ids the messages of `state`, and of the subgraphs it is running (a
    snapshot read with `subgraphs=True`), ask for: the calls a question may name."""
    values = state.values if isinstance(state.values, dict) else {}
    asked = [call["id"] for message in values.get("messages", [])
             for call in getattr(message, "tool_calls", None) or []]
    for task in state.tasks:
        if task.state is not None and hasattr(task.state, "values"):
            asked += _asked_calls(task.state)
    return asked


def _wait_for_abandoned_attempts() -> int:
    """Join tool attempts a timeout abandoned; how many are still running after that."""
    deadline = time.monotonic() + 4 * SLOW_SECONDS + 1.0
    strays = [t for t in threading.enumerate()
              if t is not threading.current_thread() and t.name.startswith("graph-durable-")
              and not t.name.startswith("graph-durable-lease-")]
    for stray in strays:
        stray.join(max(0.0, deadline - time.monotonic()))
    return sum(1 for stray in strays if stray.is_alive())


def _decision_command(spec: dict[str, Any], pending: Any) -> Command:
    """The resume command: decisions taken through `Review`'s methods, or sent as is."""
    if spec["style"] != "review":
        return Command(resume=spec["decisions"])
    for call, decision in spec["decisions"].items():
        kind = decision["type"]
        if kind == "edit":
            pending.edit(call, decision["edited_action"]["args"])
        elif kind == "applied":
            pending.mark_applied(call, decision["receipt"])
        elif kind in ("reject", "skip", "respond"):
            getattr(pending, kind)(call, decision.get("message", ""))
        else:
            getattr(pending, kind)(call)  # approve, retry
    return pending.command()


def run_step(**spec: Any) -> dict[str, Any]:
    """Run one invocation of an episode's thread (see the module docstring)."""
    if spec.get("flavour") == "async" and spec["via"] != "recover":
        report = asyncio.run(_run_async(spec))
    else:
        report = _run_sync(spec)
    report["strays"] = _wait_for_abandoned_attempts()
    return report


def _leased_config(lease: Any, config: dict[str, Any]) -> dict[str, Any]:
    return {**config, "configurable": {**lease.config["configurable"], **config["configurable"]}}


@contextmanager
def _leased(saver: Any, spec: dict[str, Any], config: dict[str, Any]) -> Iterator[Any]:
    """The config to run with: under `saver.lease` if the spec asks for one."""
    if not spec.get("lease"):
        yield config
        return
    with saver.lease(spec["thread_id"], spec["lease"]["owner"], spec["lease"]["ttl"]) as lease:
        yield _leased_config(lease, config)


@asynccontextmanager
async def _aleased(saver: Any, spec: dict[str, Any], config: dict[str, Any]
                   ) -> AsyncIterator[Any]:
    """`_leased` on an async saver."""
    if not spec.get("lease"):
        yield config
        return
    async with saver.alease(spec["thread_id"], spec["lease"]["owner"],
                            spec["lease"]["ttl"]) as lease:
        yield _leased_config(lease, config)


def _run_sync(spec: dict[str, Any]) -> dict[str, Any]:
    agent = build_explorer_agent(*_builder_args(spec))
    graph, saver = agent.graph, agent.saver
    report: dict[str, Any] = {"via": spec["via"]}
    try:
        if spec["via"] == "recover":
            outcomes = recover(graph, saver, spec["lease"]["owner"], ttl=spec["lease"]["ttl"])
            report["recovered"] = [o.__dict__ for o in outcomes]
        else:
            graph_input, config, report["via"] = _prepare(agent, spec)
            with _leased(saver, spec, config) as run_config:
                graph.invoke(graph_input, {**run_config, "callbacks": [run_log(saver)]},
                             durability="sync")
    except (Exception, errors.LeaseLost) as exc:  # reported: the driver judges it
        report["raised"] = _classify(exc)
    report.update(_summary(graph.get_state(_thread_config(spec)), spec["thread_id"]))
    if report["interrupts"]:
        report["asked_calls"] = _asked_calls(
            graph.get_state(_thread_config(spec), subgraphs=True))
    saver.conn.close()
    return report


def _prepare(agent: Any, spec: dict[str, Any]) -> tuple[Any, dict[str, Any], str]:
    """`(graph input, config, how it runs)` of a sync run."""
    graph, via, config = agent.graph, spec["via"], _thread_config(spec)
    if via == "decide":
        pending = review(graph, config) if spec["style"] == "review" else None
        return _decision_command(spec, pending), config, via
    if via == "checkpoint_config":
        config = _with_options(graph.get_state(config).config, spec)
    elif via in ("time_travel", "update_state"):
        steps = _tools_steps(list(graph.get_state_history(config)))
        if steps:
            snap = steps[spec.get("pick", 0) % len(steps)]
            fork = snap.config if via == "time_travel" else graph.update_state(
                snap.config, *_fork_update(snap, spec))
            config = _with_options(fork, spec)
        else:
            via = "plain"
    if via == "start" or not _checkpointed(graph.get_state(config)):
        return agent.inputs, config, via if via == "start" else "restart"
    return None, config, via


async def _run_async(spec: dict[str, Any]) -> dict[str, Any]:
    agent = await build_explorer_agent_async(*_builder_args(spec))
    graph, saver = agent.graph, agent.saver
    report: dict[str, Any] = {"via": spec["via"]}
    try:
        graph_input, config, report["via"] = await _aprepare(agent, spec)
        async with _aleased(saver, spec, config) as run_config:
            await graph.ainvoke(graph_input, {**run_config, "callbacks": [run_log(saver)]},
                                durability="sync")
    except (Exception, errors.LeaseLost) as exc:  # reported: the driver judges it
        report["raised"] = _classify(exc)
    report.update(_summary(await graph.aget_state(_thread_config(spec)), spec["thread_id"]))
    if report["interrupts"]:
        report["asked_calls"] = _asked_calls(
            await graph.aget_state(_thread_config(spec), subgraphs=True))
    # aiosqlite runs a non-daemon thread per connection: close it or the loop lingers.
    await saver.conn.close()
    return report


async def _aprepare(agent: Any, spec: dict[str, Any]) -> tuple[Any, dict[str, Any], str]:
    """`_prepare` of an async run."""
    graph, via, config = agent.graph, spec["via"], _thread_config(spec)
    if via == "decide":
        pending = await areview(graph, config) if spec["style"] == "review" else None
        return _decision_command(spec, pending), config, via
    if via == "checkpoint_config":
        config = _with_options((await graph.aget_state(config)).config, spec)
    elif via in ("time_travel", "update_state"):
        steps = _tools_steps([snap async for snap in graph.aget_state_history(config)])
        if steps:
            snap = steps[spec.get("pick", 0) % len(steps)]
            fork = snap.config if via == "time_travel" else await graph.aupdate_state(
                snap.config, *_fork_update(snap, spec))
            config = _with_options(fork, spec)
        else:
            via = "plain"
    if via == "start" or not _checkpointed(await graph.aget_state(config)):
        return agent.inputs, config, via if via == "start" else "restart"
    return None, config, via
