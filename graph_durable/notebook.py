"""Deprecated path: the notebook views live in `graph_durable.operators.notebook`.

This module only re-exports them, with a `DeprecationWarning`.
"""

import warnings

from graph_durable.operators.notebook import (
    EXTRA,
    EffectTable,
    Inbox,
    InboxThread,
    Timeline,
    ainbox,
    args_schema,
    diff_html,
    effect_table,
    inbox,
    require_ipywidgets,
    timeline,
)

__all__ = ["EXTRA", "EffectTable", "Inbox", "InboxThread", "Timeline", "ainbox", "args_schema",
           "diff_html", "effect_table", "inbox", "require_ipywidgets", "timeline"]

warnings.warn(
    "graph_durable.notebook is deprecated: import from graph_durable.operators.notebook",
    DeprecationWarning, stacklevel=2)
