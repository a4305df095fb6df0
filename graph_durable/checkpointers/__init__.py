"""Durable savers: LangGraph checkpointers that also keep the effect ledger.

`DurableSqliteSaver` and `AsyncDurableSqliteSaver` are the embedded default; the
PostgreSQL savers (sync and async) live in `graph_durable.checkpointers.postgres` (extra
`postgres`).
"""

from graph_durable.checkpointers.sqlite import AsyncDurableSqliteSaver, DurableSqliteSaver

__all__ = ["AsyncDurableSqliteSaver", "DurableSqliteSaver"]
