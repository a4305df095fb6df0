"""The public export list is pinned: tests outside this repository use these names."""

import graph_durable

EXPECTED = [
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


def test_all_is_sorted_and_pinned() -> None:
    assert graph_durable.__all__ == sorted(graph_durable.__all__)
    assert graph_durable.__all__ == EXPECTED


def test_every_export_resolves() -> None:
    for name in graph_durable.__all__:
        assert getattr(graph_durable, name) is not None
