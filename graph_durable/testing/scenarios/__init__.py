"""Ready-made scenarios for crash tests, each a factory a child process rebuilds by name
(`"graph_durable.testing.scenarios.effects:build_effects_agent"`).

- `effects`: the ReAct-style effects agent every other scenario builds on
  (`build_effects_agent`, `EffectsAgent`, `react_graph`), re-exported here.
- `extra`: `create_agent` guarded by the middleware, a stock graph, two writes per call.
- `commands`: a looked-up tool returning a `Command`.
- `forks`: one charge, then the thread re-run from a named checkpoint.
- `subgraphs`: the guarded tools node inside a subgraph.
- `writes`: writes made by `guarded` functions, not by tool calls.
- `saga`: a charge then a ticket, each with its compensation.
- `secrets`: tool calls carrying secrets, for what the ledger keeps at rest.
"""

from graph_durable.testing.scenarios import effects
from graph_durable.testing.scenarios.effects import (
    AgentOptions,
    EffectsAgent,
    build_effects_agent,
    build_effects_agent_async,
    policy_for_mode,
    react_graph,
    script_of,
)

__all__ = list(effects.__all__)
