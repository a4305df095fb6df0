"""`python -m graph_durable.testing.explorer`: see `graph_durable.testing.explorer.runner`."""

import sys

from graph_durable.testing.explorer.runner import main

sys.exit(main())
