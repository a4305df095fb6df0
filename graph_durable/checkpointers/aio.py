"""Deprecated path: `AsyncDurableSqliteSaver` lives in `graph_durable.checkpointers.sqlite`.

Import it from `graph_durable` or `graph_durable.checkpointers.sqlite`; this module only
re-exports it, with a `DeprecationWarning`.
"""

import warnings

from graph_durable.checkpointers.sqlite import AsyncDurableSqliteSaver

__all__ = ["AsyncDurableSqliteSaver"]

warnings.warn(
    "graph_durable.checkpointers.aio is deprecated: import AsyncDurableSqliteSaver from "
    "graph_durable or graph_durable.checkpointers.sqlite",
    DeprecationWarning, stacklevel=2)
