"""Test kit shipped with graph_durable: fake providers, deterministic fault injection,
crash sweeps (`crash_matrix`) over a scenario's every fault point, and a randomized
explorer (`explore`) of generated episodes. Production code never imports it.

The building blocks sit at the top; the three machines built on them are subpackages:

- `providers` (`FakeProvider`), `faults` (`FaultPlan`, the fault points), `models`
  (`ScriptedChatModel`), `savers` (open a saver by name, SQLite or PostgreSQL).
- `postgres` (`PostgresServer`, a throwaway cluster for tests) and `pg_trace` (round
  trips a PostgreSQL saver makes); `plugin`, the pytest plugin (the `crash_matrix`
  fixture and the `crash` marker).
- `crash/`: `matrix` (`crash_matrix`), `child` (`run_child`: one child process, armed to
  crash at a fault point), `reads` (what a run left), `report`, `forkserver`.
- `explorer/`: `explore`, the randomized explorer (`python -m graph_durable.testing.explorer`).
- `scenarios/`: ready-made scenario factories for child processes, named as
  `"graph_durable.testing.scenarios.<module>:<factory>"`.
- `upstream/`: LangGraph's own saver test suites, run on graph_durable's savers.
"""

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
    """The explorer's names, imported on first use: importing the kit does not load the
    explorer's modules."""
    if name in _EXPLORER:
        from graph_durable.testing import explorer

        return getattr(explorer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
