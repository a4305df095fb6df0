"""What a resumed thread shows where operators look: a worker is SIGKILLed mid-effect,
and the new process that resumes it runs with a recording callback handler and the
OpenTelemetry SDK's in-memory exporters. Every guarded call of the thread is named with
what became of it, on each provider mode; the provider's side is checked too."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from graph_durable import telemetry
from graph_durable.testing import FakeProvider, FaultPlan
from graph_durable.testing.crash.child import load_factory, run_child
from graph_durable.testing.savers import aclose_saver

pytestmark = pytest.mark.crash

TICKET = "graph_durable.demo.ticket:build_ticket_agent"
WRITES = "graph_durable.testing.scenarios.writes:build_write_graph"
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


def resume_observed(factory: str, kwargs: dict[str, Any], runner: str,
                    recorder: Recorder) -> None:
    """Resume thread `t` in this process (a new one: the crashed child is gone) with
    `recorder` attached, by `invoke` or `ainvoke` (on the async twin of `factory`)."""
    config = {**CONFIG, "callbacks": [recorder]}
    if runner == "invoke":
        agent = load_factory(factory)(**kwargs)
        agent.graph.invoke(None, config, durability="sync")
        return

    async def resume() -> None:
        agent = await load_factory(factory + "_async")(**kwargs)
        try:
            await agent.graph.ainvoke(None, config, durability="sync")
        finally:
            await aclose_saver(agent.saver)

    asyncio.run(resume())


def crash_and_resume(factory: str, kwargs: dict[str, Any], runner: str, window: str,
                     tool: str) -> Recorder:
    """SIGKILL a child running `factory` at `window` of `tool`, resume, what was told."""
    child = factory if runner == "invoke" else factory + "_async"
    crashed = run_child(child, kwargs, thread_id="t", fault=FaultPlan(window, tool=tool))
    assert crashed.killed, crashed.stderr[-2000:]
    recorder = Recorder()
    resume_observed(factory, kwargs, runner, recorder)
    return recorder


def check_span(spans: InMemorySpanExporter, tool: str, outcome: dict[str, Any]) -> set[str]:
    """The call's span says what its event says; the names of its child spans."""
    finished = spans.get_finished_spans()
    [span] = [s for s in finished if s.name == f"guarded_call {tool}"]
    assert span.attributes["graph_durable.effect.outcome"] == outcome["outcome"]
    assert span.attributes["graph_durable.effect.key"] == outcome["key"]
    assert span.attributes["graph_durable.call.kind"] == outcome["kind"]
    return {s.name for s in finished if s.parent is not None
            and s.parent.span_id == span.context.span_id}


@pytest.fixture
def runner(request: pytest.FixtureRequest, saver_backend: str) -> str:
    """How the resumed process runs the graph: `invoke`, or `ainvoke` on an async saver."""
    chosen = request.param
    if saver_backend == "postgres-async" and chosen == "invoke":
        pytest.skip("the async PostgreSQL saver runs under ainvoke")
    if saver_backend == "postgres" and chosen == "ainvoke":
        pytest.skip("the sync PostgreSQL saver runs under invoke")
    return chosen


# The crash window, the provider's mode, and what the resumed run says of the ticket.
CASES = [
    ("after_effect", "dedupe", "resent"),      # re-sent under its key, deduplicated
    ("after_effect", "lookup", "reconciled"),  # found by a lookup, not sent again
    ("after_effect", "blind", "paused_unknown"),  # nobody can tell: a person decides
    ("after_receipt", "blind", "replayed"),    # the receipt was committed: replayed
]


# Under ainvoke in the sweeps (CI runs them), to keep make test under ten minutes.
RUNNERS = ["invoke", pytest.param("ainvoke", marks=pytest.mark.sweep)]


@pytest.mark.parametrize("runner", RUNNERS, indirect=True)
@pytest.mark.parametrize(("window", "mode", "expected"), CASES)
def test_a_resumed_thread_names_every_guarded_call_with_its_outcome(
        tmp_path: Path, otel: tuple[InMemorySpanExporter, InMemoryMetricReader],
        caplog: pytest.LogCaptureFixture, saver_spec: Any, runner: str, window: str,
        mode: str, expected: str) -> None:
    spans, metrics = otel
    kwargs = {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path),
              "ticket_mode": mode, "email_mode": "dedupe", "saver": saver_spec}
    tickets = FakeProvider(str(tmp_path / "tickets.sqlite"), mode)
    with caplog.at_level(logging.INFO, logger="graph_durable"):
        recorder = crash_and_resume(TICKET, kwargs, runner, window, "create_ticket")

    assert tickets.count() == 1, tickets.requests()  # never a second ticket
    outcomes = {event["tool"]: event for event in recorder.outcomes}
    ticket = outcomes["create_ticket"]
    assert ticket["outcome"] == expected, recorder.outcomes
    assert ticket["thread_id"] == "t" and ticket["key"] and ticket["tool_call_id"]
    assert ticket["kind"] == "tool"
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
    children = check_span(spans, "create_ticket", ticket)
    if expected == "reconciled":
        assert "lookup" in children
    if expected == "resent":
        assert "provider_call" in children
    if expected == "replayed":
        assert not children  # nothing reached the provider
    assert counted(metrics)[("create_ticket", expected)] == 1

    # A recovery decision is logged with its thread, call and key as fields.
    if expected in ("reconciled", "resent", "paused_unknown"):
        [record] = [r for r in caplog.records if getattr(r, "tool", None) == "create_ticket"
                    and getattr(r, "outcome", None) == expected]
        assert (record.thread_id, record.key) == ("t", ticket["key"])


@pytest.mark.parametrize("runner", RUNNERS, indirect=True)
@pytest.mark.parametrize(("mode", "expected"), [("dedupe", "resent"),
                                                ("lookup", "reconciled"),
                                                ("blind", "paused_unknown")])
def test_guarded_writes_of_a_functional_agent_report_their_outcome(
        tmp_path: Path, otel: tuple[InMemorySpanExporter, InMemoryMetricReader],
        saver_spec: Any, runner: str, mode: str, expected: str) -> None:
    spans, metrics = otel
    kwargs = {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path),
              "mode": mode, "shape": "functional", "saver": saver_spec}
    invoices = FakeProvider(str(tmp_path / "invoice.sqlite"), mode)
    recorder = crash_and_resume(WRITES, kwargs, runner, "after_effect", "create_invoice")

    assert invoices.count() == 1, invoices.requests()
    outcomes = {event["tool"]: event for event in recorder.outcomes}
    invoice = outcomes["create_invoice"]
    assert (invoice["outcome"], invoice["kind"]) == (expected, "guarded"), recorder.outcomes
    assert invoice["key"] and invoice["tool_call_id"].startswith("create_invoice#0@")
    if expected != "paused_unknown":
        assert outcomes["send_receipt"]["outcome"] == "sent"
    check_span(spans, "create_invoice", invoice)
    assert counted(metrics)[("create_invoice", expected)] == 1


def test_telemetry_of_an_encrypted_ledger_carries_no_args_or_receipt(
        tmp_path: Path, otel: tuple[InMemorySpanExporter, InMemoryMetricReader],
        caplog: pytest.LogCaptureFixture) -> None:
    """A charge whose card number is a secret, on an encrypted ledger: killed after the
    charge, then resumed and reconciled by lookup. No event, run, span, metric or log
    record the resumed run makes holds the card or the receipt."""
    from graph_durable.testing.scenarios.secrets import SECRETS

    spans, metrics = otel
    factory = "graph_durable.testing.scenarios.secrets:build_secrets_agent"
    kwargs = {"db_path": str(tmp_path / "agent.sqlite"),
              "provider_dir": str(tmp_path / "providers"), "mode": "lookup", "encrypt": True}
    with caplog.at_level(logging.DEBUG, logger="graph_durable"):
        recorder = crash_and_resume(factory, kwargs, "invoke", "after_effect", "charge")

    [charge] = [event for event in recorder.outcomes if event["tool"] == "charge"]
    assert charge["outcome"] == "reconciled"
    seen = repr([recorder.outcomes, recorder.tool_runs,
                 [(s.name, dict(s.attributes or {}), [(e.name, dict(e.attributes or {}))
                                                      for e in s.events])
                  for s in spans.get_finished_spans()],
                 metrics.get_metrics_data().to_json(),
                 [(r.getMessage(), vars(r)) for r in caplog.records]])
    assert "guarded_call charge" in seen and charge["key"] in seen  # what was seen
    assert not [secret for secret in SECRETS if secret in seen]
