"""Effect guards: `EffectGuardNode` (a ToolNode) and `EffectGuardMiddleware` (create_agent)."""

from typing import Any

from graph_durable.nodes.context import EffectContext, current_effect
from graph_durable.nodes.node import EffectGuardNode

__all__ = ["EffectContext", "EffectGuardMiddleware", "EffectGuardNode", "current_effect"]


def __getattr__(name: str) -> Any:
    # The middleware needs `langchain` (extra `agents`); import it only when asked for.
    if name == "EffectGuardMiddleware":
        from graph_durable.nodes.middleware import EffectGuardMiddleware

        return EffectGuardMiddleware
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
