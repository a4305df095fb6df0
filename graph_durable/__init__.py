"""graph_durable: LangGraph agents that are safe to crash.

A durable checkpointer keeps an effect ledger beside the checkpoints; an effect guard
records the intent and idempotency key of every external write before the call and its
receipt after, replays receipts on resume, and pauses for a human when an outcome is
unknown or a write needs approval.

Names are imported on first use, so importing the package (as the pytest plugin does)
does not load LangGraph until something needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
"""This release (also the distribution's version: pyproject reads it from here)."""

__all__ = [
    "AsyncDurableSqliteSaver",
    "CancelReport",
    "Compensation",
    "DurabilityError",
    "DurableSqliteSaver",
    "Effect",
    "EffectEvent",
    "EffectGuardMiddleware",
    "EffectGuardNode",
    "EffectRecord",
    "EffectStatus",
    "FlowVersionMismatch",
    "GraphDurableError",
    "InboxItem",
    "InvalidDecision",
    "LeaseHeld",
    "LeaseLost",
    "LedgerDamaged",
    "LedgerStats",
    "NotApplied",
    "Orphan",
    "RecoveryOutcome",
    "Retryable",
    "Review",
    "SecretUnavailable",
    "ThreadCancelled",
    "ThreadStatus",
    "acancel",
    "acompensate",
    "afind_orphans",
    "ainbox",
    "aledger_stats",
    "arecord_decisions",
    "arecover",
    "aresolve_orphan",
    "areview",
    "athread_status",
    "cancel",
    "compensate",
    "current_effect",
    "find_orphans",
    "flow_version_of",
    "guarded",
    "inbox",
    "ledger_stats",
    "record_decisions",
    "recover",
    "redact_keys",
    "register_gauges",
    "resolve_orphan",
    "review",
    "sync_by_default",
    "thread_status",
]

# Where each public name lives, imported on first use by `__getattr__`.
_HOMES = {
    "AsyncDurableSqliteSaver": "graph_durable.checkpointers.sqlite",
    "CancelReport": "graph_durable.operators.compensation",
    "Compensation": "graph_durable.policy",
    "DurableSqliteSaver": "graph_durable.checkpointers.sqlite",
    "Effect": "graph_durable.policy",
    "EffectEvent": "graph_durable.ledger",
    "EffectGuardMiddleware": "graph_durable.nodes.middleware",
    "EffectGuardNode": "graph_durable.nodes.node",
    "EffectRecord": "graph_durable.ledger",
    "EffectStatus": "graph_durable.ledger",
    "InboxItem": "graph_durable.operators.inbox",
    "LedgerStats": "graph_durable.telemetry.stats",
    "Orphan": "graph_durable.operators.orphans",
    "RecoveryOutcome": "graph_durable.operators.recovery",
    "Review": "graph_durable.operators.review",
    "SecretUnavailable": "graph_durable.secrets",
    "ThreadStatus": "graph_durable.operators.recovery",
    "acancel": "graph_durable.operators.compensation",
    "acompensate": "graph_durable.operators.compensation",
    "afind_orphans": "graph_durable.operators.orphans",
    "ainbox": "graph_durable.operators.inbox",
    "aledger_stats": "graph_durable.operators.stats",
    "arecord_decisions": "graph_durable.operators.inbox",
    "arecover": "graph_durable.operators.recovery",
    "aresolve_orphan": "graph_durable.operators.orphans",
    "areview": "graph_durable.operators.review",
    "athread_status": "graph_durable.operators.recovery",
    "cancel": "graph_durable.operators.compensation",
    "compensate": "graph_durable.operators.compensation",
    "current_effect": "graph_durable.nodes.context",
    "find_orphans": "graph_durable.operators.orphans",
    "flow_version_of": "graph_durable.flow",
    "guarded": "graph_durable.nodes.writes",
    "inbox": "graph_durable.operators.inbox",
    "ledger_stats": "graph_durable.operators.stats",
    "record_decisions": "graph_durable.operators.inbox",
    "recover": "graph_durable.operators.recovery",
    "redact_keys": "graph_durable.secrets",
    "register_gauges": "graph_durable.operators.stats",
    "resolve_orphan": "graph_durable.operators.orphans",
    "review": "graph_durable.operators.review",
    "sync_by_default": "graph_durable.durability",
    "thread_status": "graph_durable.operators.recovery",
    **{name: "graph_durable.errors" for name in (
        "DurabilityError", "FlowVersionMismatch", "GraphDurableError", "InvalidDecision",
        "LeaseHeld", "LeaseLost", "LedgerDamaged", "NotApplied", "Retryable",
        "ThreadCancelled")},
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from graph_durable.checkpointers.sqlite import AsyncDurableSqliteSaver, DurableSqliteSaver
    from graph_durable.durability import sync_by_default
    from graph_durable.errors import (
        DurabilityError,
        FlowVersionMismatch,
        GraphDurableError,
        InvalidDecision,
        LeaseHeld,
        LeaseLost,
        LedgerDamaged,
        NotApplied,
        Retryable,
        ThreadCancelled,
    )
    from graph_durable.flow import flow_version_of
    from graph_durable.ledger import EffectEvent, EffectRecord, EffectStatus
    from graph_durable.nodes.context import current_effect
    from graph_durable.nodes.middleware import EffectGuardMiddleware
    from graph_durable.nodes.node import EffectGuardNode
    from graph_durable.nodes.writes import guarded
    from graph_durable.operators.compensation import (
        CancelReport,
        acancel,
        acompensate,
        cancel,
        compensate,
    )
    from graph_durable.operators.inbox import (
        InboxItem,
        ainbox,
        arecord_decisions,
        inbox,
        record_decisions,
    )
    from graph_durable.operators.orphans import (
        Orphan,
        afind_orphans,
        aresolve_orphan,
        find_orphans,
        resolve_orphan,
    )
    from graph_durable.operators.recovery import (
        RecoveryOutcome,
        ThreadStatus,
        arecover,
        athread_status,
        recover,
        thread_status,
    )
    from graph_durable.operators.review import Review, areview, review
    from graph_durable.operators.stats import aledger_stats, ledger_stats, register_gauges
    from graph_durable.policy import Compensation, Effect
    from graph_durable.secrets import SecretUnavailable, redact_keys
    from graph_durable.telemetry.stats import LedgerStats
