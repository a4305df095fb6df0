"""Durable savers: LangGraph checkpointers that also keep the effect ledger.

`DurableSqliteSaver` and `AsyncDurableSqliteSaver` are the embedded default; the
PostgreSQL savers (sync and async) live in `graph_durable.checkpointers.postgres` (extra
`postgres`). Every saver verifies its database on demand: `saver.check()` (async savers:
`await saver.acheck()`) returns a `CheckReport`, each finding a `Damage`.
"""

from graph_durable.checkpointers._check import CheckReport
from graph_durable.checkpointers._decode import Damage
from graph_durable.checkpointers.sqlite import AsyncDurableSqliteSaver, DurableSqliteSaver

__all__ = ["AsyncDurableSqliteSaver", "CheckReport", "Damage", "DurableSqliteSaver"]
