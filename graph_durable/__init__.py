"""graph_durable: LangGraph agents that are safe to crash.

A durable checkpointer keeps an effect ledger beside the checkpoints; an effect guard
records the intent and idempotency key of every external write before the call and its
receipt after, replays receipts on resume, and pauses for a human when an outcome is
unknown or a write needs approval.
"""

from typing import Any

from graph_durable.checkpointers.aio import AsyncDurableSqliteSaver
from graph_durable.checkpointers.sqlite import DurableSqliteSaver
from graph_durable.errors import (
    DurabilityError,
    FlowVersionMismatch,
    GraphDurableError,
    InvalidDecision,
    LeaseHeld,
    LeaseLost,
    NotApplied,
    Retryable,
)
from graph_durable.ledger import EffectEvent, EffectRecord, EffectStatus
from graph_durable.nodes import EffectGuardNode, current_effect
from graph_durable.flow import flow_version_of
from graph_durable.policy import Effect
from graph_durable.recovery import RecoveryOutcome, ThreadStatus, recover, thread_status
from graph_durable.review import Review, areview, review

__all__ = [
    "AsyncDurableSqliteSaver",
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
    "InvalidDecision",
    "LeaseHeld",
    "LeaseLost",
    "NotApplied",
    "RecoveryOutcome",
    "Retryable",
    "Review",
    "ThreadStatus",
    "areview",
    "current_effect",
    "flow_version_of",
    "recover",
    "review",
    "thread_status",
]


def __getattr__(name: str) -> Any:
    # The middleware needs `langchain` (extra `agents`); import it only when asked for.
    if name == "EffectGuardMiddleware":
        from graph_durable.nodes.middleware import EffectGuardMiddleware

        return EffectGuardMiddleware
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
