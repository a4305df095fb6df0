"""The guard core shared by `EffectGuardNode` and `EffectGuardMiddleware`.

One implementation of the protocol (`protocol.run_call`), two drivers holding only
I/O, and the task-level step that turns a resume value into journaled decisions:

- `task.py`: the task a call runs in (config, saver, requesting checkpoint, leases);
- `answers.py`: matching this run's resume value to the task's questions;
- `interrupts.py`: interrupt ids, raising them, placeholders, withdrawals;
- `core.py` (`GuardBase`): the decisions between I/O operations, as generators of
  operations;
- `sync_driver.py`, `async_driver.py`: each performs those operations in one place.

`GuardCore` is `GuardBase` with both drivers; the names other modules import from here
are re-exported.
"""

from __future__ import annotations

from graph_durable.nodes.async_driver import AsyncDriver
from graph_durable.nodes.async_driver import aperform_reads as _aperform_reads
from graph_durable.nodes.core import Started
from graph_durable.nodes.interrupts import (
    OnAsk,
    interrupt_id_for,
    pending_placeholder,
    raise_interrupts,
    withdrawal,
)
from graph_durable.nodes.sync_driver import SyncDriver
from graph_durable.nodes.sync_driver import perform_reads as _perform_reads
from graph_durable.nodes.task import Task as _Task
from graph_durable.nodes.task import config_of as _config_of

__all__ = [
    "GuardCore",
    "withdrawal",
    "OnAsk",
    "Started",
    "interrupt_id_for",
    "pending_placeholder",
    "raise_interrupts",
]

# Names other modules of the package import from here.
_REEXPORTED = (_Task, _config_of, _perform_reads, _aperform_reads)


class GuardCore(SyncDriver, AsyncDriver):
    """Routes each tool call through the ledger according to its `Effect` policy, sync
    (`run`, `claim_step`, `resolve_decisions`) or async (`arun`, `aclaim_step`,
    `aresolve_decisions`)."""
