"""The SQLite savers: `DurableSqliteSaver` (sqlite3) and `AsyncDurableSqliteSaver`
(aiosqlite), the embedded default.

Both keep LangGraph's SQLite tables and the effect ledger in one file, and share the
transactions they run (`_txn`), the read-only mode and migrations (`_readonly`); the
async saver runs each transaction whole on aiosqlite's thread (`_aiosqlite`).
"""

from graph_durable.checkpointers.sqlite.async_saver import AsyncDurableSqliteSaver
from graph_durable.checkpointers.sqlite.saver import DurableSqliteSaver

__all__ = ["AsyncDurableSqliteSaver", "DurableSqliteSaver"]
