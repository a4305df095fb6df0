"""`python -m graph_durable.cli`: the `graph-durable` command."""

import sys

from graph_durable.cli import main

sys.exit(main())
