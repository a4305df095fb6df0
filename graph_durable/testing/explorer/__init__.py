"""A randomized, model-based explorer: generated episodes, real crashes, invariants.

    report = explore(episodes=300, seed=1, workers=2)     # stable path classes
    assert report.ok, report.render()

    python -m graph_durable.testing.explorer --episodes 300 --seed 1

How it works is told in `runner` (which runs episodes, shrinks and replays failures, and
holds the command line). The other modules, in the order an episode meets them:

- `classes`, `model`: the path classes (and `KNOWN_BUGS`); what an episode is and how a
  seed generates it.
- `scenario`, `shapes`, `writes`: the agent built from an episode (its topology, its
  tools, its guarded writes), rebuildable by name in a child process.
- `driver`, `child`: one episode driven through real child processes; what each child does.
- `reviewer`: answers the episode's pauses.
- `checks`: the invariants checked after every episode.

`runner`'s names are re-exported here.
"""

from graph_durable.testing.explorer import runner
from graph_durable.testing.explorer.runner import (
    ALL_PATHS,
    KNOWN_BUGS,
    STABLE_PATHS,
    Episode,
    ExplorerReport,
    Failure,
    explore,
    generate,
    main,
    replay,
    shrink,
)

__all__ = list(runner.__all__)
