"""Test kit shipped with graph_durable: fake providers, deterministic fault injection,
crash sweeps (`crash_matrix`) over a scenario's every fault point, and a randomized
explorer (`explore`) of generated episodes."""

from typing import Any

from graph_durable.testing.crash.matrix import (
    CrashPoint,
    CrashReport,
    CrashRow,
    crash_matrix,
    default_resolver,
)
from graph_durable.testing.faults import FaultPlan, InjectedCrash, arm, disarm, fault_point
from graph_durable.testing.models import ScriptedChatModel
from graph_durable.testing.providers import FakeProvider

__all__ = [
    "CrashPoint",
    "CrashReport",
    "CrashRow",
    "ExplorerReport",
    "FakeProvider",
    "FaultPlan",
    "InjectedCrash",
    "ScriptedChatModel",
    "arm",
    "crash_matrix",
    "default_resolver",
    "disarm",
    "explore",
    "fault_point",
]

_EXPLORER = ("ExplorerReport", "explore")


def __getattr__(name: str) -> Any:
    """The explorer's names, imported on first use: `python -m
    graph_durable.testing.explorer` must find its module not yet imported."""
    if name in _EXPLORER:
        from graph_durable.testing import explorer

        return getattr(explorer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
