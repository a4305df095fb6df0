"""Test kit shipped with graph_durable: fake providers, deterministic fault injection,
and crash sweeps (`crash_matrix`) over a scenario's every fault point."""

from graph_durable.testing.crash import (
    CrashPoint,
    CrashReport,
    CrashRow,
    crash_matrix,
    default_resolver,
)
from graph_durable.testing.faults import FaultPlan, InjectedCrash, arm, disarm, fault_point
from graph_durable.testing.providers import FakeProvider

__all__ = [
    "CrashPoint",
    "CrashReport",
    "CrashRow",
    "FakeProvider",
    "FaultPlan",
    "InjectedCrash",
    "arm",
    "crash_matrix",
    "default_resolver",
    "disarm",
    "fault_point",
]
