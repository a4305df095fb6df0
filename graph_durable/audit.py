"""Deprecated path: the audit lives in `graph_durable.operators.audit`.

This module only re-exports it, with a `DeprecationWarning`.
"""

import warnings

from graph_durable.operators.audit import (
    AsyncRunLog,
    Audit,
    RunAudit,
    RunLog,
    audit_of,
    audited,
    logs_runs,
    run_log,
)

__all__ = ["AsyncRunLog", "Audit", "RunAudit", "RunLog", "audit_of", "audited", "logs_runs",
           "run_log"]

warnings.warn(
    "graph_durable.audit is deprecated: import from graph_durable.operators.audit",
    DeprecationWarning, stacklevel=2)
