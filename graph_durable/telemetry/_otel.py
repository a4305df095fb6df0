"""OpenTelemetry, when `opentelemetry-api` is installed: loaded once, on first use.

Nothing here imports OpenTelemetry at module import time. The first guarded call (or
`configure`) tries `import opentelemetry`; without it, every later call costs one global
read. With it, spans and metrics go to the application's providers (the global ones,
or those given to `configure`); a library never chooses exporters, and the API's no-op
providers make them nearly free until the application installs an SDK.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

__all__ = ["Instruments", "configure", "instruments"]

SCOPE = "graph_durable"
"""The instrumentation scope of every tracer and meter this library gets."""


def _never() -> bool:
    return False


def _unset_global(module: ModuleType, name: str, env: str) -> Callable[[], bool]:
    """What tells, in one read, that the API's global provider `module.<name>` is still
    unset: while it is, the API's getter looks for `env` in the environment on every
    call (and loads the provider it names, once). Without `env` at first use, a global
    provider appears only by `set_*_provider` (or a getter another caller made load
    it), which sets `<name>`; with it, or an API without that global, the getter is
    asked every time, as before."""
    if env in os.environ or getattr(module, name, _MISSING) is not None:
        return _never
    return lambda: getattr(module, name, None) is None


_MISSING = object()


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
    own_tracer: bool = False
    """The tracer came from a provider given to `configure` (not the global one)."""
    own_meter: bool = False
    """The meter came from a provider given to `configure`."""
    metrics: Any = None
    """The `opentelemetry.metrics` module."""
    proxies: tuple[Any, Any] = (None, None)
    """The API's proxy tracer and meter provider classes: the global providers until the
    application sets its own."""
    unset_globals: tuple[Callable[[], bool], Callable[[], bool]] = (_never, _never)
    """Whether the global tracer (meter) provider is certainly still unset, told without
    asking the API: its getter reads the environment on every call until one is set
    (`_unset_global`)."""
    _set: list[bool] = field(default_factory=lambda: [False, False])

    def tracing(self) -> bool:
        """Whether spans are recorded: a provider was given to `configure`, or the
        application set a global one (once set, it stays). Until then the API's proxy
        makes non-recording spans, which are not worth making, nor their context."""
        if self.own_tracer or self._set[0]:
            return True
        if self.unset_globals[0]():
            return False
        self._set[0] = not isinstance(self.trace.get_tracer_provider(), self.proxies[0])
        return self._set[0]

    def metering(self) -> bool:
        """Whether measurements are recorded (as `tracing`, for the meter provider)."""
        if self.own_meter or self._set[1]:
            return True
        if self.unset_globals[1]():
            return False
        self._set[1] = not isinstance(self.metrics.get_meter_provider(), self.proxies[1])
        return self._set[1]


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
    try:
        from opentelemetry.metrics._internal import _ProxyMeterProvider as proxy_meters
    except ImportError:  # pragma: no cover - an API that moved it: always measure
        proxy_meters = type(None)
    try:
        from opentelemetry.environment_variables import (
            OTEL_PYTHON_METER_PROVIDER,
            OTEL_PYTHON_TRACER_PROVIDER,
        )
        from opentelemetry.metrics import _internal as metrics_internal
        unset = (_unset_global(trace, "_TRACER_PROVIDER", OTEL_PYTHON_TRACER_PROVIDER),
                 _unset_global(metrics_internal, "_METER_PROVIDER", OTEL_PYTHON_METER_PROVIDER))
    except ImportError:  # pragma: no cover - an API that moved them: always ask
        unset = (_never, _never)
    return Instruments(trace, context, tracer, calls, duration, meter,
                       own_tracer=tracer_provider is not None,
                       own_meter=meter_provider is not None, metrics=metrics,
                       proxies=(trace.ProxyTracerProvider, proxy_meters),
                       unset_globals=unset)


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
