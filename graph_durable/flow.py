"""Flow versions: refuse to resume a thread under a graph it was not started with.

A thread first checkpointed under flow version V is pinned to V; a saver created with
another `flow_version` refuses to write to it (`FlowVersionMismatch`) unless V is in its
`compatible_flow_versions`. `flow_version_of(graph)` derives a version from what a
resumed thread depends on: the graph's nodes and edges and its tools' argument schemas.
"""

from __future__ import annotations

import hashlib
from typing import Any

from langgraph.prebuilt import ToolNode

from graph_durable.ledger import canonical_json

__all__ = ["flow_version_of"]


def _tool_schemas(graph: Any) -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for node in getattr(graph, "nodes", {}).values():
        bound = getattr(node, "bound", None)
        if isinstance(bound, ToolNode):
            for name, tool in bound.tools_by_name.items():
                schemas[name] = tool.args
    return schemas


def flow_version_of(graph: Any) -> str:
    """A version string for a compiled graph: changes when nodes, edges or tools change.

    Prompts, model settings and tool bodies do not count: they do not change which step a
    saved thread resumes at or what arguments its pending calls carry.
    """
    drawable = graph.get_graph()
    shape = {
        "nodes": sorted(drawable.nodes),
        "edges": sorted([e.source, e.target, bool(e.conditional)] for e in drawable.edges),
        "tools": _tool_schemas(graph),
    }
    digest = hashlib.sha256(canonical_json(shape).encode("utf-8")).hexdigest()
    return "fv-" + digest[:16]
