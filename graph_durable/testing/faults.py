"""The fault points and plans, for the test kit's users: all of `graph_durable.faults`.

They live on the ground floor (`graph_durable.faults`), because production code calls
`fault_point`; the test kit re-exports them from there, never the other way round.
"""

from graph_durable.faults import *  # noqa: F403 - the whole module, re-exported
from graph_durable.faults import __all__ as __all__
