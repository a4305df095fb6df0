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

import importlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

from graph_durable.testing.faults import ENV_FAULTS, ENV_TRACE, FaultPlan

__all__ = ["ChildResult", "load_factory", "run_child", "summarize"]

Action = Literal["start", "resume", "decide"]


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


def summarize(graph: Any, config: dict[str, Any]) -> dict[str, Any]:
    """The thread's state as plain JSON: messages (without ids), next nodes, interrupts."""
    state = graph.get_state(config)
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
    timeout: float = 120.0,
) -> ChildResult:
    """Run one invocation of the scenario's graph in a new Python process.

    Args:
        factory: `module:attribute` of the scenario factory.
        kwargs: JSON-serializable keyword arguments for the factory.
        thread_id: Thread to run.
        action: `start` (invoke the inputs), `resume` (invoke `None`: continue after a
            crash), or `decide` (invoke `Command(resume=resume)`).
        resume: The resume value for `decide`.
        fault: A plan that crashes the child (SIGKILL) at a fault point.
        trace_path: File to which the child appends every fault point it reaches.
        timeout: Seconds before the child is killed and the run reported as an error.
    """
    env = {k: v for k, v in os.environ.items() if k not in (ENV_FAULTS, ENV_TRACE)}
    if fault is not None:
        env.update(fault.to_env())
    if trace_path is not None:
        env[ENV_TRACE] = trace_path
    spec = {"factory": factory, "kwargs": kwargs, "thread_id": thread_id, "action": action,
            "resume": resume}
    proc = subprocess.run(
        [sys.executable, "-m", "graph_durable.testing.child"],
        input=json.dumps(spec), capture_output=True, text=True, env=env, timeout=timeout,
    )
    killed = proc.returncode == -signal.SIGKILL
    if proc.returncode not in (0, -signal.SIGKILL):
        raise RuntimeError(
            f"child run of {factory} (thread {thread_id!r}, {action}) failed with exit code "
            f"{proc.returncode}:\n{proc.stderr[-4000:]}"
        )
    summary: dict[str, Any] = {}
    if not killed:
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        summary = json.loads(lines[-1])
    return ChildResult(proc.returncode, killed, summary, proc.stderr)


def _main() -> None:
    from langgraph.types import Command

    spec = json.loads(sys.stdin.read())
    scenario = load_factory(spec["factory"])(**spec["kwargs"])
    config = {"configurable": {"thread_id": spec["thread_id"]}}
    graph_input: Any = {
        "start": scenario.inputs,
        "resume": None,
        "decide": Command(resume=spec["resume"]),
    }[spec["action"]]
    scenario.graph.invoke(graph_input, config, durability="sync")
    print(json.dumps(summarize(scenario.graph, config), default=str), flush=True)


if __name__ == "__main__":
    _main()
