"""The one place a guarded call reports what became of it.

Every guarded call (a tool call under `EffectGuardNode` or `EffectGuardMiddleware`, a
`guarded` write, an undo) is observed from the guard's first look at it to its outcome:

    info = CallInfo(thread_id, tool, tool_call_id, key, policy_label(policy))
    with observe(info, config) as call:                 # or: async with observe(...)
        call.event("intent_claimed")
        with call.provider_call():                      # call.lookup(), call.undo()
            ...
        call.event("receipt_recorded")
        call.outcome(CallOutcome.SENT, attempts=1)

and its `CallReport` goes, when the block ends (`report`/`areport` directly when there is
no block), to:

1. LangChain's callbacks, as the custom event `graph_durable.outcome` of the run (so
   LangSmith, Langfuse, any `BaseCallbackHandler` and `astream_events` see it);
2. LangGraph's custom stream, `{"event": "graph_durable.outcome", ...}` for
   `graph.stream(..., stream_mode="custom")` clients;
3. OpenTelemetry, when `opentelemetry-api` is installed (`graph-durable[otel]`): a span
   `guarded_call <tool>` in the caller's trace with child spans `provider_call`,
   `lookup` and `undo` and span events, the counter `graph_durable.calls` and the
   histogram `graph_durable.provider.duration`; `configure` picks other providers;
4. the `graph_durable` logger, for recovery decisions (silent unless the application
   configures logging).

A tool run that does run carries `run_metadata(info)` (`with_run_metadata(config, info)`).
Nothing here carries a tool's args, its receipt or an error's text; the key is the one the
provider sees (an HMAC under the saver's key secret when one is set). `LedgerStats` is what
`saver.stats()` reads; `graph_durable.register_gauges` exports it as gauges.
"""

from __future__ import annotations

from graph_durable.telemetry._otel import configure
from graph_durable.telemetry.emit import (
    EVENT,
    RUN_TAG,
    areport,
    log_lease_takeover,
    logger,
    report,
    run_metadata,
    with_run_metadata,
)
from graph_durable.telemetry.model import (
    ATTRIBUTES,
    CallInfo,
    CallKind,
    CallOutcome,
    CallReport,
    policy_label,
)
from graph_durable.telemetry.spans import (
    CallEvent,
    ObservedCall,
    ProviderSpan,
    QuietCall,
    observe,
    observe_lazily,
)
from graph_durable.telemetry.stats import LedgerStats

__all__ = [
    "ATTRIBUTES",
    "EVENT",
    "RUN_TAG",
    "CallEvent",
    "CallInfo",
    "CallKind",
    "CallOutcome",
    "CallReport",
    "LedgerStats",
    "ObservedCall",
    "ProviderSpan",
    "QuietCall",
    "areport",
    "configure",
    "log_lease_takeover",
    "logger",
    "observe",
    "observe_lazily",
    "policy_label",
    "report",
    "run_metadata",
    "with_run_metadata",
]
