"""What operators use on threads, above the guard and the savers: `review` and `inbox`
(answering a thread's questions), `recovery` (`thread_status`, `recover`), `orphans`,
`compensation` (`compensate`, `cancel`, with the driver that runs compensation
protocols outside a graph), `audit`, and the notebook views with the inbox widget.

Import the functions from `graph_durable` (`from graph_durable import review`); this
package re-exports nothing, so no function here shares its name with a module.
"""
