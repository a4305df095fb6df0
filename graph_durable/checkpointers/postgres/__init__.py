"""The PostgreSQL savers: `DurablePostgresSaver` (psycopg) and `AsyncDurablePostgresSaver`
(psycopg's async API), for workers on several machines.

Install with `pip install 'graph-durable[postgres]'`. Both keep LangGraph's PostgreSQL
tables and the effect ledger in one database and share the statements in PostgreSQL's
dialect (`_sql`, with `pg_sql`, which turns a ledger statement into PostgreSQL's), and
the leases on the server's clock (`_leases`); the async saver's group commit is in
`_group`.
"""

# The sync saver first: without psycopg, its import is the ImportError naming the extra.
from graph_durable.checkpointers.postgres.saver import DurablePostgresSaver  # noqa: I001
from graph_durable.checkpointers.postgres.async_saver import AsyncDurablePostgresSaver
from graph_durable.checkpointers.postgres._sql import pg_sql

__all__ = ["AsyncDurablePostgresSaver", "DurablePostgresSaver", "pg_sql"]
