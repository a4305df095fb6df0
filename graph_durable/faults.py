"""Named fault points and deterministic fault plans (production calls them; the test kit arms them).

The guard and the saver call `fault_point(name, tool=...)` at the edges of every crash
window. Unarmed, a fault point is one global check. Armed with a `FaultPlan` (in
process with `arm()`, or in a child process through the `GRAPH_DURABLE_FAULTS`
environment variable), at exactly the given occurrence of its point the plan kills the
process with SIGKILL (`action="kill"`), raises `InjectedCrash` (`action="raise"`, for
unit tests), or freezes it with SIGSTOP until SIGCONT (`action="stop"`, a zombie
worker). Setting `GRAPH_DURABLE_FAULT_TRACE` to a file path appends every point reached
to that file, which is how a sweep learns the points of a scenario.

Points: `before_intent`, `after_intent`, `after_decision`, `after_effect`,
`after_receipt` (guard); `before_put`, `after_put`, `before_put_writes`,
`after_put_writes` (saver).
"""

from __future__ import annotations

import json
import os
import signal
import threading
from dataclasses import asdict, dataclass
from typing import Literal

__all__ = [
    "ENV_FAULTS",
    "ENV_TRACE",
    "FAULT_POINTS",
    "FaultPlan",
    "InjectedCrash",
    "arm",
    "disarm",
    "fault_point",
]

ENV_FAULTS = "GRAPH_DURABLE_FAULTS"
ENV_TRACE = "GRAPH_DURABLE_FAULT_TRACE"

FAULT_POINTS = (
    "before_intent",
    "after_intent",
    "after_decision",
    "after_effect",
    "after_receipt",
    "before_put",
    "after_put",
    "before_put_writes",
    "after_put_writes",
)


class InjectedCrash(BaseException):
    """Raised by a fault point armed with `action="raise"` (a simulated crash)."""


@dataclass(frozen=True)
class FaultPlan:
    """Crash at the `occurrence`-th time `point` is reached (for `tool`, if given)."""

    point: str
    tool: str | None = None
    occurrence: int = 1
    action: Literal["kill", "raise", "stop"] = "kill"

    def __post_init__(self) -> None:
        if self.point not in FAULT_POINTS:
            raise ValueError(f"Unknown fault point {self.point!r}; known: {FAULT_POINTS}")
        if self.occurrence < 1:
            raise ValueError("FaultPlan.occurrence counts from 1")
        if self.action not in ("kill", "raise", "stop"):
            raise ValueError("FaultPlan.action is 'kill', 'raise' or 'stop'")

    def to_env(self) -> dict[str, str]:
        """Environment that arms this plan in a child process."""
        return {ENV_FAULTS: json.dumps([asdict(self)])}


class _Armed:
    def __init__(self, plans: list[FaultPlan], trace_path: str | None) -> None:
        self.plans = plans
        self.trace_path = trace_path
        self.counts: dict[tuple[str, str | None], int] = {}
        self.lock = threading.Lock()

    def reached(self, point: str, tool: str | None) -> None:
        with self.lock:
            if self.trace_path:
                with open(self.trace_path, "a", encoding="utf-8") as trace:
                    trace.write(json.dumps({"point": point, "tool": tool}) + "\n")
            for plan in self.plans:
                if plan.point != point or (plan.tool is not None and plan.tool != tool):
                    continue
                counter = (plan.point, plan.tool)
                self.counts[counter] = self.counts.get(counter, 0) + 1
                if self.counts[counter] == plan.occurrence:
                    if plan.action == "kill":
                        os.kill(os.getpid(), signal.SIGKILL)
                    if plan.action == "stop":
                        # A zombie worker: frozen until someone sends SIGCONT. Sent to
                        # this thread: sent to the process, the kernel may hand it to
                        # another thread, and this one runs on (a write sent past its
                        # point) until that thread is scheduled to stop the group.
                        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
                        return
                    raise InjectedCrash(f"injected crash at {point} (tool={tool})")


def _from_env() -> _Armed | None:
    raw = os.environ.get(ENV_FAULTS)
    trace_path = os.environ.get(ENV_TRACE)
    if not raw and not trace_path:
        return None
    plans = [FaultPlan(**item) for item in json.loads(raw)] if raw else []
    return _Armed(plans, trace_path)


_ARMED: _Armed | None = _from_env()


def _rearm_from_env() -> None:
    """Arm what the environment names now (a child forked from a process that imported
    this module under another environment)."""
    global _ARMED
    _ARMED = _from_env()


def arm(*plans: FaultPlan, trace_path: str | None = None) -> None:
    """Arm `plans` in this process (replacing any armed before)."""
    global _ARMED
    _ARMED = _Armed(list(plans), trace_path)


def disarm() -> None:
    """Disarm every fault point in this process."""
    global _ARMED
    _ARMED = None


def fault_point(point: str, *, tool: str | None = None) -> None:
    """Mark a named point; crashes here if an armed plan says so."""
    if _ARMED is not None:
        _ARMED.reached(point, tool)
