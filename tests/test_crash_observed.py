"""What a resumed thread shows where operators look: a worker is SIGKILLed mid-effect,
and the new process that resumes it runs with a recording callback handler and the
OpenTelemetry SDK's in-memory exporters. Every guarded call of the thread is named with
what became of it, on each provider mode; the provider's side is checked too."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from graph_durable import telemetry
from graph_durable.demo.ticket import build_ticket_agent
from graph_durable.testing import FakeProvider, FaultPlan
from graph_durable.testing.crash.child import run_child

pytestmark = pytest.mark.crash

TICKET = "graph_durable.demo.ticket:build_ticket_agent"
CONFIG = {"configurable": {"thread_id": "t"}}


class Recorder(BaseCallbackHandler):
    """The custom events and tool runs a callback handler (LangSmith's, any) is told of."""

    def __init__(self) -> None:
        self.outcomes: list[dict[str, Any]] = []
        self.tool_runs: list[dict[str, Any]] = []

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        if name == telemetry.EVENT:
            self.outcomes.append(data)

    def on_tool_start(self, serialized: Any, input_str: str, *, metadata: Any = None,
                      **kwargs: Any) -> None:
        self.tool_runs.append(dict(metadata or {}))


@pytest.fixture
def otel() -> Iterator[tuple[InMemorySpanExporter, InMemoryMetricReader]]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    metrics = InMemoryMetricReader()
    telemetry.configure(tracer_provider=tracer_provider,
                        meter_provider=MeterProvider(metric_readers=[metrics]))
    yield spans, metrics
    telemetry.configure()


def counted(reader: InMemoryMetricReader) -> dict[tuple[str, str], int]:
    """`graph_durable.calls` by (tool, outcome)."""
    data = reader.get_metrics_data()
    found: dict[tuple[str, str], int] = {}
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != "graph_durable.calls":
                    continue
                for point in metric.data.data_points:
                    attributes = point.attributes or {}
                    slot = (str(attributes.get("graph_durable.tool")),
                            str(attributes.get("graph_durable.effect.outcome")))
                    found[slot] = found.get(slot, 0) + point.value
    return found


# The crash window, the provider's mode, and what the resumed run says of the ticket.
CASES = [
    ("after_effect", "dedupe", "resent"),      # re-sent under its key, deduplicated
    ("after_effect", "lookup", "reconciled"),  # found by a lookup, not sent again
    ("after_effect", "blind", "paused_unknown"),  # nobody can tell: a person decides
    ("after_receipt", "blind", "replayed"),    # the receipt was committed: replayed
]


@pytest.mark.parametrize(("window", "mode", "expected"), CASES)
def test_a_resumed_thread_names_every_guarded_call_with_its_outcome(
        tmp_path: Path, otel: tuple[InMemorySpanExporter, InMemoryMetricReader],
        caplog: pytest.LogCaptureFixture, window: str, mode: str, expected: str) -> None:
    spans, metrics = otel
    kwargs = {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path),
              "ticket_mode": mode, "email_mode": "dedupe"}
    tickets = FakeProvider(str(tmp_path / "tickets.sqlite"), mode)
    crashed = run_child(TICKET, kwargs, thread_id="t",
                        fault=FaultPlan(window, tool="create_ticket"))
    assert crashed.killed and tickets.count() == 1

    recorder = Recorder()
    agent = build_ticket_agent(**kwargs)
    with caplog.at_level(logging.INFO, logger="graph_durable"):
        agent.graph.invoke(None, {**CONFIG, "callbacks": [recorder]}, durability="sync")

    assert tickets.count() == 1, tickets.requests()  # never a second ticket
    outcomes = {event["tool"]: event for event in recorder.outcomes}
    ticket = outcomes["create_ticket"]
    assert ticket["outcome"] == expected, recorder.outcomes
    assert ticket["thread_id"] == "t" and ticket["key"] and ticket["tool_call_id"]
    if expected == "paused_unknown":
        assert "send_email" not in outcomes  # the thread waits for a person first
    else:
        assert outcomes["send_email"]["outcome"] == "sent"
        # The tool that did run carries the effect's key, tool_call_id and policy.
        [email_run] = [run for run in recorder.tool_runs
                       if run.get("graph_durable.tool_call_id")
                       == outcomes["send_email"]["tool_call_id"]]
        assert email_run["graph_durable.effect.key"] == outcomes["send_email"]["key"]
        assert email_run["graph_durable.effect.policy"] == "idempotent"
    if expected == "resent":
        # The re-send reached the provider: its run carries the same key as the first.
        assert [r["key"] for r in tickets.requests()] == [ticket["key"]] * 2

    # The same call as an OpenTelemetry span, with the provider calls as child spans.
    finished = spans.get_finished_spans()
    [span] = [s for s in finished if s.name == "guarded_call create_ticket"]
    assert span.attributes["graph_durable.effect.outcome"] == expected
    assert span.attributes["graph_durable.effect.key"] == ticket["key"]
    children = {s.name for s in finished if s.parent is not None
                and s.parent.span_id == span.context.span_id}
    if expected == "reconciled":
        assert "lookup" in children
    if expected == "resent":
        assert "provider_call" in children
    if expected == "replayed":
        assert not children  # nothing reached the provider
    assert counted(metrics)[("create_ticket", expected)] == 1

    # A recovery decision is logged with its thread, call and key as fields.
    if expected in ("reconciled", "resent", "paused_unknown"):
        [record] = [r for r in caplog.records if getattr(r, "tool", None) == "create_ticket"]
        assert (record.thread_id, record.key) == ("t", ticket["key"])
