"""`python -m graph_durable.testing.upstream`: see `run.py`."""

import sys

from graph_durable.testing.upstream.run import main

sys.exit(main())
