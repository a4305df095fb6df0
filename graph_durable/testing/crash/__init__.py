"""Crash sweeps in real processes: kill a scenario at its fault points, resume, compare.

- `matrix`: `crash_matrix` (every fault point of one scenario, and pairs of points),
  `run_schedule`, `reference_run`, the default pause resolver.
- `child`: `run_child`, one child process running a scenario's graph, optionally armed
  to crash at a fault point; `load_factory` resolves a `"module:function"` factory.
- `reads`: what a run left, read between and after its processes (its database
  read-only, ledger, provider effects, resume costs).
- `report`: what a sweep reports (`CrashPoint`, `CrashRow`, `CrashReport`).
- `forkserver`: `ForkServer`, children forked from a pre-imported server, one at a time.
- `launcher`: where `run_child`'s children come from: forked from a pre-imported
  launcher, several at once, each signalled by its pid (`GRAPH_DURABLE_CHILDREN=spawn`
  starts new interpreters instead).

The sweep's names are re-exported here (and from `graph_durable.testing`).
"""

from graph_durable.testing.crash import matrix
from graph_durable.testing.crash.matrix import (
    GUARD_POINTS,
    SAVER_POINTS,
    CrashPoint,
    CrashReport,
    CrashRow,
    Reference,
    Resolver,
    crash_matrix,
    default_resolver,
    reference_run,
    run_schedule,
)

__all__ = list(matrix.__all__)
