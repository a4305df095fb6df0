"""The ledger's gauges, orphans counted: for a monitor, a cron job, or OpenTelemetry.

    stats = ledger_stats(saver)              # effects by status, questions, orphans
    print(stats.summary())                   # or: graph-durable stats --db ... [--json]
    register_gauges(saver)                   # the same, as OpenTelemetry gauges

`saver.stats()` reads the ledger alone; an orphan (an open effect no pending task will
run again) is told from the checkpoints, which is why it is counted here, above the
savers (`graph_durable.operators.orphans`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

from graph_durable._extras import require
from graph_durable.operators.orphans import find_orphans
from graph_durable.telemetry import _otel
from graph_durable.telemetry.model import ATTRIBUTES
from graph_durable.telemetry.stats import LedgerStats

__all__ = ["Gauges", "aledger_stats", "ledger_stats", "register_gauges"]


def ledger_stats(saver: Any) -> LedgerStats:
    """`saver.stats()` with the orphans counted. Reads only (read-only savers work).

    Args:
        saver: A durable saver (sync, or an async one called from another thread).
    """
    stats = saver.stats()
    return dataclasses.replace(stats, orphans=len(find_orphans(saver)))


async def aledger_stats(saver: Any) -> LedgerStats:
    """Async `ledger_stats`: the orphans are read on a worker thread, whose saver calls an
    async saver answers on this loop, which the await leaves free."""
    stats = await saver.astats()
    return dataclasses.replace(stats, orphans=len(await asyncio.to_thread(find_orphans, saver)))


class Gauges:
    """The observable gauges `register_gauges` made; `close()` stops them reading."""

    def __init__(self, saver: Any, max_age: float) -> None:
        self.saver = saver
        """The saver the gauges read."""
        self.max_age = max_age
        """Seconds a read serves every gauge of one collection before the next read."""
        self._lock = threading.Lock()
        self._last: LedgerStats | None = None
        self._at = 0.0
        self.closed = False
        """Whether `close()` was called (the gauges then report nothing)."""

    def close(self) -> None:
        """Stop reading the saver (OpenTelemetry has no way to drop a gauge: they report
        nothing from now on)."""
        self.closed = True

    def stats(self) -> LedgerStats | None:
        """The latest read, read again when older than `max_age` (`None` once closed)."""
        if self.closed:
            return None
        with self._lock:
            now = time.monotonic()
            if self._last is None or now - self._at > self.max_age:
                self._last, self._at = ledger_stats(self.saver), now
            return self._last

    def _observe(self, value: Any) -> Any:
        def callback(options: Any) -> Iterator[Any]:
            from opentelemetry.metrics import Observation

            stats = self.stats()
            if stats is not None:
                for amount, attributes in value(stats):
                    if amount is not None:
                        yield Observation(amount, attributes)
        return callback


def register_gauges(saver: Any, meter: Any = None, *, max_age: float = 1.0) -> Gauges:
    """Export the ledger's state as OpenTelemetry observable gauges, read from `saver`
    each time the application's metric reader collects:

    - `graph_durable.effects` (`{effect}`), by `graph_durable.effect.status`;
    - `graph_durable.questions.waiting` (`{question}`);
    - `graph_durable.questions.oldest_age` (`s`), absent while none waits;
    - `graph_durable.orphans` (`{effect}`).

    One read (`ledger_stats`) serves every gauge of a collection. Give the saver a
    connection of its own (a read-only one will do) if the graph's saver is busy.

    Args:
        saver: A durable saver.
        meter: The meter to create the gauges on (`None`: graph_durable's meter on the
            global provider, or the one given to `graph_durable.telemetry.configure`).
        max_age: Seconds one read serves the gauges before they read again.

    Raises:
        ImportError: `opentelemetry-api` is not installed (the `otel` extra).
    """
    require("otel", "register_gauges", "opentelemetry.metrics")
    if meter is None:
        otel = _otel.instruments()
        if otel is None:
            raise ValueError("OpenTelemetry is turned off (telemetry.configure(enabled="
                             "False)): pass a meter to register_gauges")
        meter = otel.meter
    gauges = Gauges(saver, max_age)
    status = ATTRIBUTES["status"]
    meter.create_observable_gauge(
        "graph_durable.effects", unit="{effect}", description="Effects in the ledger by status",
        callbacks=[gauges._observe(lambda s: [(count, {status: name})
                                              for name, count in s.effects.items()])])
    meter.create_observable_gauge(
        "graph_durable.questions.waiting", unit="{question}",
        description="Calls waiting for a person's decision (approval, outcome unknown)",
        callbacks=[gauges._observe(lambda s: [(s.questions_waiting, {})])])
    meter.create_observable_gauge(
        "graph_durable.questions.oldest_age", unit="s",
        description="How long the oldest waiting question has waited",
        callbacks=[gauges._observe(lambda s: [(s.oldest_question_age, {})])])
    meter.create_observable_gauge(
        "graph_durable.orphans", unit="{effect}",
        description="Open effects no pending task will run again",
        callbacks=[gauges._observe(lambda s: [(s.orphans, {})])])
    return gauges
