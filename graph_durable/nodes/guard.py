"""The guard core shared by `EffectGuardNode`, `EffectGuardMiddleware` and `guarded`.

One implementation of the protocol (`protocol.run_call`), two drivers holding only
I/O, and the task-level step that turns a resume value into journaled decisions:

- `task.py`: the task a call runs in (config, saver, requesting checkpoint, leases);
- `call_keys.py`, `write_keys.py`: where a call's key comes from (the keying strategy
  a guard is given: tool calls, guarded writes);
- `answers.py`: matching this run's resume value to the task's questions;
- `interrupts.py`: interrupt ids, raising them, placeholders, withdrawals;
- `outcomes.py`: what a call came back with (`classify`);
- `core.py` (`GuardBase`): the decisions between I/O operations, as generators of
  operations;
- `sync_driver.py`, `async_driver.py`: each performs those operations in one place.

`GuardCore` is `GuardBase` with both drivers.
"""

from __future__ import annotations

from graph_durable.nodes.async_driver import AsyncDriver
from graph_durable.nodes.sync_driver import SyncDriver

__all__ = ["GuardCore"]


class GuardCore(SyncDriver, AsyncDriver):
    """Routes each guarded call through the ledger according to its `Effect` policy, sync
    (`run`, `claim_step`, `resolve_decisions`) or async (`arun`, `aclaim_step`,
    `aresolve_decisions`); its keys come from the `CallKeys` it is given (tool calls by
    default)."""
