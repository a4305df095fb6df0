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
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from graph_durable.testing.crash.launcher import RUN_MODULES, launched
from graph_durable.testing.faults import ENV_FAULTS, ENV_TRACE, FaultPlan

__all__ = ["PRELOAD", "Child", "ChildResult", "child_spec", "load_factory", "run_child",
           "run_spec", "start_child", "summarize"]

Action = Literal["start", "resume", "decide", "review", "recover"]

PRELOAD = RUN_MODULES
"""Modules a child run imports only once it runs (this module imports them lazily, so
that the package stays cheap to import, and so do the libraries under it): a fork server
imports them before it forks, or every child would import them again, and compile them
where bytecode is not cached."""


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
    """A thread's state snapshot as plain JSON: messages (no ids), next nodes, interrupts;
    for a state without messages (a custom-node or functional-API graph), its values."""
    values = state.values if isinstance(state.values, dict) else {}
    messages = []
    for message in values.get("messages", []):
        item = {"type": message.type, "content": message.content}
        if message.type == "tool":
            item.update(tool_call_id=message.tool_call_id, status=message.status)
        if message.type == "ai" and message.tool_calls:
            item["tool_calls"] = [
                {"name": c["name"], "args": c["args"], "id": c["id"]} for c in message.tool_calls
            ]
        messages.append(item)
    summary: dict[str, Any] = {"messages": messages}
    if "messages" not in values and state.values is not None:
        summary["values"] = json.loads(json.dumps(state.values, default=str))
    return {
        **summary,
        "next": list(state.next),
        "interrupts": [interrupt.value for interrupt in state.interrupts],
    }


def run_child(factory: str, kwargs: dict[str, Any], **options: Any) -> ChildResult:
    """Run one invocation of the scenario's graph in a new process and wait for it.

    Same arguments as `start_child`.
    """
    return start_child(factory, kwargs, **options).wait()


def start_child(
    factory: str,
    kwargs: dict[str, Any],
    *,
    thread_id: str,
    action: Action = "start",
    resume: Any = None,
    fault: FaultPlan | None = None,
    trace_path: str | None = None,
    hold: bool = False,
    owner: str | None = None,
    ttl: float = 30.0,
    start_at: float | None = None,
    timeout: float = 120.0,
) -> Child:
    """Start one invocation of the scenario's graph in a new process (forked from a
    pre-imported launcher, or a new interpreter: see `launcher`).

    Args:
        factory: `module:attribute` of the scenario factory (an `async def` factory runs
            the graph with `ainvoke`).
        kwargs: JSON-serializable keyword arguments for the factory.
        thread_id: Thread to run.
        action: `start` (invoke the inputs), `resume` (invoke `None`: continue after a
            crash), `decide` (invoke `Command(resume=resume)`), `review` (load
            `review(graph, config)` as a reviewer would, take the decisions in `resume`,
            a mapping `{tool_call_id: decision}`, and resume through it), or `recover`
            (sweep with `recover(graph, saver, owner)`, or `arecover` for an async
            factory, reported as `recovered`).
        resume: The resume value for `decide`, the decisions for `review`.
        fault: A plan that crashes (or freezes) the child at a fault point.
        trace_path: File to which the child appends every fault point it reaches.
        hold: Keep the child alive after its run (as a waiting worker would be) and kill
            it with SIGKILL once it has reported.
        owner: Run under `saver.lease(thread_id, owner, ttl)`; the summary then reports
            `lease_held` or `lease_lost` instead of failing.
        ttl: Lease time to live, in seconds.
        start_at: Unix time at which the child starts its run (to line up several).
        timeout: Seconds before the child is killed and the run reported as an error.
    """
    env = {k: v for k, v in os.environ.items() if k not in (ENV_FAULTS, ENV_TRACE)}
    if fault is not None:
        env.update(fault.to_env())
    if trace_path is not None:
        env[ENV_TRACE] = trace_path
    spec = child_spec(factory, kwargs, thread_id=thread_id, action=action, resume=resume,
                      hold=hold, owner=owner, ttl=ttl, start_at=start_at)
    return Child(spec, env, timeout)


def child_spec(factory: str, kwargs: dict[str, Any], *, thread_id: str,
               action: Action = "start", resume: Any = None, hold: bool = False,
               owner: str | None = None, ttl: float = 30.0, start_at: float | None = None
               ) -> dict[str, Any]:
    """What one child run does, as JSON (see `start_child` for the fields)."""
    return {"factory": factory, "kwargs": kwargs, "thread_id": thread_id, "action": action,
            "resume": resume, "hold": hold, "owner": owner, "ttl": ttl, "start_at": start_at}


class Child:
    """A running child process (see `start_child`)."""

    def __init__(self, spec: dict[str, Any], env: dict[str, str], timeout: float) -> None:
        self.spec = spec
        self.proc = launched("graph_durable.testing.crash.child:_main", json.dumps(spec), env)
        self._timed_out = threading.Event()
        self._timer = threading.Timer(timeout, self._kill_on_timeout)
        self._timer.start()
        self.timeout = timeout

    @property
    def pid(self) -> int:
        """The child's process id (to signal it: SIGSTOP, SIGCONT, SIGKILL)."""
        return self.proc.pid

    def _kill_on_timeout(self) -> None:
        self._timed_out.set()
        self.proc.kill()

    def wait(self) -> ChildResult:
        """Wait for the child to end (or to report, with `hold`) and return what it did."""
        spec, proc = self.spec, self.proc
        try:
            if spec["hold"]:
                out = proc.first_line()
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            else:
                proc.wait()
                out = proc.stdout()
        finally:
            self._timer.cancel()
        errors = proc.stderr()
        proc.close()
        where = f"child run of {spec['factory']} (thread {spec['thread_id']!r}, {spec['action']})"
        if self._timed_out.is_set():
            raise TimeoutError(f"{where} did not finish within {self.timeout} s and was "
                               f"killed:\n{errors[-4000:]}")
        killed = proc.returncode == -signal.SIGKILL
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if proc.returncode not in (0, -signal.SIGKILL) or (spec["hold"] and not lines):
            raise RuntimeError(f"{where} failed with exit code {proc.returncode}:\n"
                               f"{errors[-4000:]}")
        summary: dict[str, Any] = json.loads(lines[-1]) if lines else {}
        assert proc.returncode is not None
        return ChildResult(proc.returncode, killed and not spec["hold"], summary, errors)


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


def _run_sync(spec: dict[str, Any], factory: Any, config: dict[str, Any]) -> dict[str, Any]:
    from graph_durable.operators.audit import logs_runs, run_log
    from graph_durable.checkpointers._base import durable_saver
    from graph_durable.errors import LeaseHeld, LeaseLost
    from graph_durable.operators.recovery import recover
    from graph_durable.operators.review import review

    scenario = factory(**spec["kwargs"])
    # The saver is the scenario's, or the one its graph was compiled with (a scenario
    # needs only `graph` and `inputs`).
    saver = getattr(scenario, "saver", None) or durable_saver(scenario.graph.checkpointer)
    # Log node runs and model calls, so an audit (and crash_matrix) can count what a
    # crash made run again.
    if saver is not None and not logs_runs(scenario.graph):
        config = {**config, "callbacks": [run_log(saver)]}
    if spec["start_at"]:
        time.sleep(max(0.0, spec["start_at"] - time.time()))
    if spec["action"] == "recover":
        outcomes = recover(scenario.graph, saver, spec["owner"], ttl=spec["ttl"])
        return {"recovered": [o.__dict__ for o in outcomes]}
    extra: dict[str, Any] = {}
    pending = review(scenario.graph, config) if spec["action"] == "review" else None
    graph_input = _graph_input(spec, scenario, pending)
    try:
        if spec["owner"]:
            with saver.lease(spec["thread_id"], spec["owner"], spec["ttl"]) as lease:
                scenario.graph.invoke(
                    graph_input, {**lease.config, **({"callbacks": config["callbacks"]}
                                                     if "callbacks" in config else {})},
                    durability="sync")
        else:
            scenario.graph.invoke(graph_input, config, durability="sync")
    except LeaseHeld as exc:
        extra["lease_held"] = exc.holder
    except LeaseLost as exc:
        extra["lease_lost"] = str(exc)
    reviewed = [item.tool_call_id for item in pending.pending] if pending else []
    return {**summarize(scenario.graph.get_state(config)), "reviewed": reviewed, **extra}


async def _run_async(spec: dict[str, Any], factory: Any, config: dict[str, Any]
                     ) -> dict[str, Any]:
    from graph_durable.operators.recovery import arecover
    from graph_durable.operators.review import areview

    scenario = await factory(**spec["kwargs"])
    try:
        if spec["action"] == "recover":
            outcomes = await arecover(scenario.graph, scenario.saver, spec["owner"],
                                      ttl=spec["ttl"])
            return {"recovered": [o.__dict__ for o in outcomes]}
        pending = await areview(scenario.graph, config) if spec["action"] == "review" else None
        await scenario.graph.ainvoke(_graph_input(spec, scenario, pending), config,
                                     durability="sync")
        reviewed = [item.tool_call_id for item in pending.pending] if pending else []
        return {**summarize(await scenario.graph.aget_state(config)), "reviewed": reviewed}
    finally:
        # aiosqlite runs a non-daemon thread per connection: close it, even after an
        # error, or the process lingers.
        conn = getattr(getattr(scenario, "saver", None), "conn", None)
        if conn is not None:
            await conn.close()


def _run(spec: dict[str, Any]) -> dict[str, Any]:
    factory = load_factory(spec["factory"])
    config = {"configurable": {"thread_id": spec["thread_id"]}}
    if inspect.iscoroutinefunction(factory):
        return asyncio.run(_run_async(spec, factory, config))
    return _run_sync(spec, factory, config)


def run_spec(spec: dict[str, Any], fault: dict[str, Any] | None = None,
             trace_path: str | None = None) -> dict[str, Any]:
    """One child run in a process forked by a `ForkServer` (see `crash_matrix`): arm the
    fault plan and the trace, run, and return the summary `start_child` would report."""
    from graph_durable.faults import FaultPlan, arm

    if fault is not None or trace_path is not None:
        arm(*([FaultPlan(**fault)] if fault is not None else []), trace_path=trace_path)
    return _run(spec)


def _main() -> None:
    spec = json.loads(sys.argv[-1])
    _report(_run(spec), spec["hold"])


if __name__ == "__main__":
    _main()
