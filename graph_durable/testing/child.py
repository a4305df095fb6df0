"""Run a scenario's graph in a child process, optionally armed to crash at a fault point.

A *scenario* is a module-level callable `factory(**kwargs)` returning an object with
`graph` (compiled with a durable saver) and `inputs`. Because the factory is importable
by name, a new process can rebuild the same graph on the same database and providers,
which is what resuming after a real crash means.

    result = run_child("graph_durable.demo.ticket:build_ticket_agent", kwargs,
                       thread_id="t1", action="start", fault=FaultPlan("after_effect"))
    assert result.killed
    result = run_child(..., action="resume")
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from graph_durable.testing.faults import ENV_FAULTS, ENV_TRACE, FaultPlan

__all__ = ["ChildResult", "load_factory", "run_child", "summarize"]

Action = Literal["start", "resume", "decide", "review"]


@dataclass
class ChildResult:
    """What a child run did: killed, or finished / paused with a summary of the state."""

    returncode: int
    killed: bool
    summary: dict[str, Any] = field(default_factory=dict)
    stderr: str = ""

    @property
    def interrupts(self) -> list[dict[str, Any]]:
        """Interrupt values pending when the child stopped."""
        return self.summary.get("interrupts", [])

    @property
    def done(self) -> bool:
        """Whether the thread ran to its end (no next node, nothing pending)."""
        return not self.killed and not self.summary.get("next") and not self.interrupts


def load_factory(spec: str) -> Any:
    """Import `module:attribute`."""
    module_name, _, attribute = spec.partition(":")
    if not attribute:
        raise ValueError(f"Scenario factory must be 'module:attribute', got {spec!r}")
    return getattr(importlib.import_module(module_name), attribute)


def summarize(state: Any) -> dict[str, Any]:
    """A thread's state snapshot as plain JSON: messages (no ids), next nodes, interrupts."""
    messages = []
    for message in state.values.get("messages", []):
        item = {"type": message.type, "content": message.content}
        if message.type == "tool":
            item.update(tool_call_id=message.tool_call_id, status=message.status)
        if message.type == "ai" and message.tool_calls:
            item["tool_calls"] = [
                {"name": c["name"], "args": c["args"], "id": c["id"]} for c in message.tool_calls
            ]
        messages.append(item)
    return {
        "messages": messages,
        "next": list(state.next),
        "interrupts": [interrupt.value for interrupt in state.interrupts],
    }


def run_child(
    factory: str,
    kwargs: dict[str, Any],
    *,
    thread_id: str,
    action: Action = "start",
    resume: Any = None,
    fault: FaultPlan | None = None,
    trace_path: str | None = None,
    hold: bool = False,
    timeout: float = 120.0,
) -> ChildResult:
    """Run one invocation of the scenario's graph in a new Python process.

    Args:
        factory: `module:attribute` of the scenario factory (an `async def` factory runs
            the graph with `ainvoke`).
        kwargs: JSON-serializable keyword arguments for the factory.
        thread_id: Thread to run.
        action: `start` (invoke the inputs), `resume` (invoke `None`: continue after a
            crash), `decide` (invoke `Command(resume=resume)`), or `review` (load
            `review(graph, config)` as a reviewer would, take the decisions in `resume`,
            a mapping `{tool_call_id: decision}`, and resume through it).
        resume: The resume value for `decide`, the decisions for `review`.
        fault: A plan that crashes the child (SIGKILL) at a fault point.
        trace_path: File to which the child appends every fault point it reaches.
        hold: Keep the child alive after its run (as a waiting worker would be) and kill
            it with SIGKILL once it has reported.
        timeout: Seconds before the child is killed and the run reported as an error.
    """
    env = {k: v for k, v in os.environ.items() if k not in (ENV_FAULTS, ENV_TRACE)}
    if fault is not None:
        env.update(fault.to_env())
    if trace_path is not None:
        env[ENV_TRACE] = trace_path
    spec = {"factory": factory, "kwargs": kwargs, "thread_id": thread_id, "action": action,
            "resume": resume, "hold": hold}
    with tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "graph_durable.testing.child", json.dumps(spec)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, text=True,
            env=env,
        )
        timed_out = threading.Event()

        def kill_on_timeout() -> None:
            timed_out.set()
            proc.kill()

        timer = threading.Timer(timeout, kill_on_timeout)
        timer.start()
        try:
            if hold:
                out = proc.stdout.readline() if proc.stdout else ""
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            else:
                out, _ = proc.communicate()
        finally:
            timer.cancel()
        stderr.seek(0)
        errors = stderr.read()
    if timed_out.is_set():
        raise TimeoutError(
            f"child run of {factory} (thread {thread_id!r}, {action}) did not finish within "
            f"{timeout} s and was killed:\n{errors[-4000:]}"
        )
    killed = proc.returncode == -signal.SIGKILL
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if (proc.returncode not in (0, -signal.SIGKILL)) or (hold and not lines):
        raise RuntimeError(
            f"child run of {factory} (thread {thread_id!r}, {action}) failed with exit code "
            f"{proc.returncode}:\n{errors[-4000:]}"
        )
    summary: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    return ChildResult(proc.returncode, killed and not hold, summary, errors)


def _graph_input(spec: dict[str, Any], scenario: Any, pending: Any) -> Any:
    from langgraph.types import Command

    if spec["action"] == "review":
        for tool_call_id, decision in spec["resume"].items():
            pending._decide(tool_call_id, dict(decision), None)
        return pending.command()
    return {"start": scenario.inputs, "resume": None,
            "decide": Command(resume=spec["resume"])}[spec["action"]]


def _report(summary: dict[str, Any], hold: bool) -> None:
    print(json.dumps(summary, default=str), flush=True)
    if hold:
        time.sleep(3600)


def _main_sync(spec: dict[str, Any], factory: Any, config: dict[str, Any]) -> None:
    from graph_durable.review import review

    scenario = factory(**spec["kwargs"])
    pending = review(scenario.graph, config) if spec["action"] == "review" else None
    scenario.graph.invoke(_graph_input(spec, scenario, pending), config, durability="sync")
    reviewed = [item.tool_call_id for item in pending.pending] if pending else []
    _report({**summarize(scenario.graph.get_state(config)), "reviewed": reviewed},
            spec["hold"])


async def _main_async(spec: dict[str, Any], factory: Any, config: dict[str, Any]) -> None:
    from graph_durable.review import areview

    scenario = await factory(**spec["kwargs"])
    pending = await areview(scenario.graph, config) if spec["action"] == "review" else None
    await scenario.graph.ainvoke(_graph_input(spec, scenario, pending), config,
                                 durability="sync")
    reviewed = [item.tool_call_id for item in pending.pending] if pending else []
    state = await scenario.graph.aget_state(config)
    # aiosqlite runs a non-daemon thread per connection: close it or the process lingers.
    conn = getattr(getattr(scenario, "saver", None), "conn", None)
    if conn is not None:
        await conn.close()
    _report({**summarize(state), "reviewed": reviewed}, spec["hold"])


def _main() -> None:
    spec = json.loads(sys.argv[1])
    factory = load_factory(spec["factory"])
    config = {"configurable": {"thread_id": spec["thread_id"]}}
    if inspect.iscoroutinefunction(factory):
        asyncio.run(_main_async(spec, factory, config))
    else:
        _main_sync(spec, factory, config)


if __name__ == "__main__":
    _main()
