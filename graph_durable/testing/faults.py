"""The fault points and plans, for the test kit's users.

They live on the ground floor (`graph_durable.faults`), because production code calls
`fault_point`; the test kit imports them from there, never the other way round.
"""

from graph_durable.faults import (
    ENV_FAULTS,
    ENV_TRACE,
    FAULT_POINTS,
    FaultPlan,
    InjectedCrash,
    arm,
    disarm,
    fault_point,
)

__all__ = [
    "ENV_FAULTS",
    "ENV_TRACE",
    "FAULT_POINTS",
    "FaultPlan",
    "InjectedCrash",
    "arm",
    "disarm",
    "fault_point",
]
