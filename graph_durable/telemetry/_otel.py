"""OpenTelemetry, when `opentelemetry-api` is installed: loaded once, on first use.

Nothing here imports OpenTelemetry at module import time. The first guarded call (or
`configure`) tries `import opentelemetry`; without it, every later call costs one global
read. With it, spans and metrics go to the application's providers (the global ones,
or those given to `configure`); a library never chooses exporters, and the API's no-op
providers make them nearly free until the application installs an SDK.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Any

__all__ = ["Instruments", "configure", "instruments"]

SCOPE = "graph_durable"
"""The instrumentation scope of every tracer and meter this library gets."""


@dataclass(frozen=True)
class Instruments:
    """The tracer and the instruments guarded calls report to."""

    trace: Any
    """The `opentelemetry.trace` module (`set_span_in_context`, `Status`, ...)."""
    context: Any
    """The `opentelemetry.context` module (`attach`, `detach`)."""
    tracer: Any
    calls: Any
    """Counter `graph_durable.calls`: guarded calls by tool, outcome and kind."""
    provider_duration: Any
    """Histogram `graph_durable.provider.duration` (s): provider calls, lookups, undos."""
    meter: Any
    """The meter, for the gauges an application registers (`register_gauges`)."""


_UNLOADED: Any = object()
_state: Instruments | None = _UNLOADED
_disabled = False


def _load(tracer_provider: Any = None, meter_provider: Any = None) -> Instruments | None:
    try:
        from opentelemetry import context, metrics, trace
    except ImportError:
        return None
    try:
        __version__: str | None = importlib.metadata.version("graph-durable")
    except importlib.metadata.PackageNotFoundError:
        __version__ = None
    tracer = trace.get_tracer(SCOPE, __version__, tracer_provider=tracer_provider)
    meter = metrics.get_meter(SCOPE, __version__, meter_provider=meter_provider)
    calls = meter.create_counter(
        "graph_durable.calls", unit="{call}",
        description="Guarded calls by tool, outcome (sent, replayed, reconciled, resent, "
                    "paused_*, refused, failed, ...) and kind")
    duration = meter.create_histogram(
        "graph_durable.provider.duration", unit="s",
        description="Time of each provider call, lookup and undo a guarded call makes")
    return Instruments(trace, context, tracer, calls, duration, meter)


def instruments() -> Instruments | None:
    """The instruments, or `None` when OpenTelemetry is not installed or is turned off."""
    global _state
    state = _state
    if state is _UNLOADED:
        state = _state = None if _disabled else _load()
    return state


def configure(*, tracer_provider: Any = None, meter_provider: Any = None,
              enabled: bool = True) -> None:
    """Where guarded calls send their spans and metrics.

    By default they go to OpenTelemetry's global providers, as a library's should. Give
    providers here to use others (a test's in-memory exporter, an app that keeps its
    own), or `enabled=False` to send none (the LangChain events, the stream and the logs
    are unchanged). Gauges registered before keep their meter.

    Args:
        tracer_provider: The `TracerProvider` to get the tracer from (`None`: global).
        meter_provider: The `MeterProvider` to get the meter from (`None`: global).
        enabled: Whether to emit spans and metrics at all.
    """
    global _state, _disabled
    _disabled = not enabled
    _state = None if not enabled else _load(tracer_provider, meter_provider)
