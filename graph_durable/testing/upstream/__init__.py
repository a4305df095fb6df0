"""LangGraph's own test suites, run on the stock savers and on graph_durable's.

`python -m graph_durable.testing.upstream` (`make test-upstream`) fetches the sdists of
the installed langgraph, langgraph-checkpoint-sqlite and langgraph-checkpoint-postgres,
runs their tests once as shipped and once with our savers swapped in, and prints every
test whose outcome differs. The known, documented divergences are in `known.py`.
Needs the suites' own test dependencies (requirements/upstream.txt) and PostgreSQL's
server binaries (see `graph_durable.testing.postgres`).
"""
