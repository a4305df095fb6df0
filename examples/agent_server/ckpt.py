"""The durable saver the Agent Server runs the graph with (`langgraph.json`'s
`checkpointer.path`).

The server enters this async context manager once per event-loop thread and wraps the
saver it yields in its own adapter; the effect guard finds the durable saver behind it.
All instances share one SQLite file, so they share checkpoints, ledger and leases.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from graph_durable import AsyncDurableSqliteSaver


@asynccontextmanager
async def make_saver() -> AsyncIterator[AsyncDurableSqliteSaver]:
    path = os.environ.get("BILLING_AGENT_DB", "billing-agent.sqlite")
    async with AsyncDurableSqliteSaver.from_conn_string(path) as saver:
        yield saver
