"""`graph_durable.telemetry`: a guarded call's report reaches LangChain's callbacks, the
custom stream, OpenTelemetry and the logs, each quiet when it has nowhere to go; and
nothing it carries says more than the ledger keeps in the clear."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from typing import Any, TypedDict

import pytest
from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.tools import tool
from langgraph.graph import START, StateGraph
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from graph_durable import Effect, telemetry
from graph_durable.telemetry import CallInfo, CallOutcome, CallReport, observe

REFUND = CallInfo("t1", "refund", "call_1", "gd-0123abcd", "lookup")


class Recorder(BaseCallbackHandler):
    """Every custom event and tool run start a handler is told of."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.tool_runs: list[tuple[dict[str, Any], list[str]]] = []

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        self.events.append((name, data))

    def on_tool_start(self, serialized: Any, input_str: str, *, metadata: Any = None,
                      tags: Any = None, **kwargs: Any) -> None:
        self.tool_runs.append((dict(metadata or {}), list(tags or [])))


class AsyncRecorder(AsyncCallbackHandler):
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    async def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        self.events.append((name, data))


class State(TypedDict):
    done: int


def graph_of(node: Any) -> Any:
    return StateGraph(State).add_node("n", node).add_edge(START, "n").compile()


def reconciling_node(state: State, config: RunnableConfig) -> State:
    with observe(REFUND, config) as call:
        call.event("intent_claimed")
        with call.lookup():
            pass
        call.outcome(CallOutcome.RECONCILED, attempts=1)
    return {"done": 1}


def points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    return [point for resource in data.resource_metrics for scope in resource.scope_metrics
            for metric in scope.metrics if metric.name == name
            for point in metric.data.data_points]


def test_a_callback_handler_sees_the_outcome_as_a_custom_event_of_the_run() -> None:
    recorder = Recorder()
    graph_of(reconciling_node).invoke({"done": 0}, {"callbacks": [recorder]})
    [(name, data)] = recorder.events
    assert name == telemetry.EVENT == "graph_durable.outcome"
    assert data["outcome"] == "reconciled" and data["key"] == REFUND.key
    assert (data["thread_id"], data["tool"], data["tool_call_id"], data["policy"]) == (
        "t1", "refund", "call_1", "lookup")
    assert data["attempts"] == 1 and data["duration"] >= 0


def test_stream_mode_custom_clients_get_the_same_payload() -> None:
    chunks = list(graph_of(reconciling_node).stream({"done": 0}, stream_mode="custom"))
    [chunk] = chunks
    assert chunk["event"] == telemetry.EVENT and chunk["outcome"] == "reconciled"
    assert chunk["key"] == REFUND.key


async def test_async_code_reports_through_async_handlers_and_astream_events() -> None:
    async def node(state: State, config: RunnableConfig) -> State:
        async with observe(REFUND, config) as call:
            call.outcome(CallOutcome.PAUSED_UNKNOWN, attempts=2)
        return {"done": 1}

    recorder = AsyncRecorder()
    graph = graph_of(node)
    await graph.ainvoke({"done": 0}, {"callbacks": [recorder]})
    assert [(n, d["outcome"]) for n, d in recorder.events] == [(telemetry.EVENT,
                                                                "paused_unknown")]
    seen = [e async for e in graph.astream_events({"done": 0}, version="v2")
            if e["event"] == "on_custom_event"]
    assert [(e["name"], e["data"]["outcome"]) for e in seen] == [(telemetry.EVENT,
                                                                  "paused_unknown")]


def test_outside_any_run_a_report_is_quiet() -> None:
    rep = CallReport(REFUND, CallOutcome.SENT)
    telemetry.report(rep)
    telemetry.report(rep, {})
    telemetry.report(rep, {"callbacks": [Recorder()]})  # handlers, but no parent run
    with observe(REFUND) as call:
        call.outcome(CallOutcome.SENT)


def test_a_guarded_tool_run_carries_the_key_tool_call_id_and_policy() -> None:
    @tool
    def refund(amount: int) -> str:
        """Refund."""
        return "ok"

    recorder = Recorder()

    def node(state: State, config: RunnableConfig) -> State:
        refund.invoke({"amount": 5}, telemetry.with_run_metadata(config, REFUND))
        return {"done": 1}

    graph_of(node).invoke({"done": 0}, {"callbacks": [recorder]})
    [(metadata, tags)] = recorder.tool_runs
    assert metadata["graph_durable.effect.key"] == REFUND.key
    assert metadata["graph_durable.tool_call_id"] == "call_1"
    assert metadata["graph_durable.effect.policy"] == "lookup"
    assert telemetry.RUN_TAG in tags
    assert "langgraph_node" in metadata  # the run's own metadata is kept


def test_policy_labels_name_what_settles_an_unknown_outcome() -> None:
    assert telemetry.policy_label(None) == "blind"
    assert telemetry.policy_label(Effect()) == "blind"
    assert telemetry.policy_label(Effect(read_only=True)) == "read_only"
    assert telemetry.policy_label(Effect(idempotent=True, lookup=lambda key: None,
                                         approval=True)) == "idempotent+lookup+approval"
    assert telemetry.policy_label(Effect(compensate=lambda r, x: None)) == "blind+compensable"


def test_opentelemetry_gets_a_span_per_call_with_child_spans_events_and_metrics(
        otel: tuple[InMemorySpanExporter, InMemoryMetricReader]) -> None:
    spans, metrics = otel
    with observe(REFUND) as call:
        call.event("intent_claimed")
        with call.provider_call():
            pass
        call.event("receipt_recorded")
        call.outcome(CallOutcome.SENT, attempts=1)
    [child, span] = spans.get_finished_spans()
    assert span.name == "guarded_call refund" and child.name == "provider_call"
    assert child.parent.span_id == span.context.span_id
    assert span.attributes["graph_durable.effect.outcome"] == "sent"
    assert span.attributes["graph_durable.effect.key"] == REFUND.key
    assert span.attributes["graph_durable.tool_call_id"] == "call_1"
    assert [e.name for e in span.events] == ["intent_claimed", "receipt_recorded"]
    assert span.status.status_code is StatusCode.UNSET
    [count] = points(metrics, "graph_durable.calls")
    assert count.value == 1 and count.attributes["graph_durable.effect.outcome"] == "sent"
    assert count.attributes["graph_durable.tool"] == "refund"
    [timing] = points(metrics, "graph_durable.provider.duration")
    assert timing.count == 1 and timing.attributes["graph_durable.operation"] == "send"


def test_the_span_joins_the_callers_trace(
        otel: tuple[InMemorySpanExporter, InMemoryMetricReader]) -> None:
    spans, _ = otel
    from opentelemetry import trace

    outer = trace.get_tracer("app", tracer_provider=TracerProvider())
    with outer.start_as_current_span("request") as request:
        with observe(REFUND) as call:
            call.outcome(CallOutcome.REPLAYED)
    [span] = spans.get_finished_spans()
    assert span.context.trace_id == request.get_span_context().trace_id
    assert span.parent.span_id == request.get_span_context().span_id


def test_a_block_left_by_an_error_reports_aborted_and_never_its_text(
        otel: tuple[InMemorySpanExporter, InMemoryMetricReader],
        caplog: pytest.LogCaptureFixture) -> None:
    spans, metrics = otel
    recorder = Recorder()

    def node(state: State, config: RunnableConfig) -> State:
        with observe(REFUND, config) as call, call.provider_call():
            raise ValueError("card 4242-4242 declined")

    caplog.set_level(logging.DEBUG, logger="graph_durable")
    with pytest.raises(ValueError, match="4242"):
        graph_of(node).invoke({"done": 0}, {"callbacks": [recorder]})
    [(_, data)] = recorder.events
    assert data["outcome"] == "aborted" and data["error_type"] == "ValueError"
    child, span = spans.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert child.attributes["error.type"] == "ValueError"
    everything = json.dumps([data, [dict(s.attributes) for s in (span, child)],
                             [e.name for e in span.events], [r.getMessage() for r in caplog.records],
                             [str(p.attributes) for p in points(metrics, "graph_durable.calls")]])
    assert "4242" not in everything and "declined" not in everything


def test_recovery_decisions_are_logged_with_structured_fields(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="graph_durable")
    telemetry.report(CallReport(REFUND, CallOutcome.SENT))
    telemetry.report(CallReport(REFUND, CallOutcome.RECONCILED, attempts=1))
    telemetry.report(CallReport(REFUND, CallOutcome.PAUSED_UNKNOWN, attempts=1))
    telemetry.log_lease_takeover("t1", "worker-2", "worker-1", 7)
    records = [r for r in caplog.records if r.name == "graph_durable"]
    assert [r.levelno for r in records] == [logging.INFO, logging.WARNING, logging.WARNING]
    reconciled = records[0]
    assert (reconciled.thread_id, reconciled.tool_call_id, reconciled.key) == (  # type: ignore[attr-defined]
        "t1", "call_1", REFUND.key)
    assert reconciled.outcome == "reconciled"  # type: ignore[attr-defined]
    assert "reconciled" in reconciled.getMessage() and "call_1" in reconciled.getMessage()
    assert records[2].previous_owner == "worker-1"  # type: ignore[attr-defined]


def run_python(code: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    """Run `code` (dedented) after `prelude` (dedented) in a new interpreter."""
    source = textwrap.dedent(prelude) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", source],
                          capture_output=True, text=True, timeout=120)


def test_the_logger_is_silent_unless_the_application_configures_logging() -> None:
    out = run_python("""
        from graph_durable.telemetry import CallInfo, CallOutcome, CallReport, report
        report(CallReport(CallInfo("t", "pay", "c", "gd-1"), CallOutcome.PAUSED_UNKNOWN))
        """)
    assert out.returncode == 0, out.stderr
    assert out.stderr == "" and out.stdout == ""


BLOCK_OTEL = """
    import sys
    class NoOpenTelemetry:
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ImportError(f"no module named {name!r} (blocked)")
    sys.meta_path.insert(0, NoOpenTelemetry())
"""


def test_without_opentelemetry_everything_else_works_and_gauges_name_the_extra() -> None:
    out = run_python("""
        from typing import TypedDict
        from langchain_core.callbacks import BaseCallbackHandler
        from langgraph.graph import START, StateGraph
        from graph_durable import register_gauges
        from graph_durable.telemetry import CallInfo, CallOutcome, _otel, observe

        class State(TypedDict):
            done: int

        class Recorder(BaseCallbackHandler):
            events = []
            def on_custom_event(self, name, data, **kwargs):
                self.events.append(data["outcome"])

        def node(state, config):
            with observe(CallInfo("t", "pay", "c", "gd-1"), config) as call:
                call.event("intent_claimed")
                with call.provider_call():
                    pass
                call.outcome(CallOutcome.SENT)
            return {"done": 1}

        graph = StateGraph(State).add_node("n", node).add_edge(START, "n").compile()
        graph.invoke({"done": 0}, {"callbacks": [Recorder()]})
        assert Recorder.events == ["sent"], Recorder.events
        assert _otel.instruments() is None
        try:
            register_gauges(object())
        except ImportError as exc:
            assert "graph-durable[otel]" in str(exc), exc
        else:
            raise AssertionError("register_gauges without OpenTelemetry")
        print("ok")
        """, prelude=BLOCK_OTEL)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_importing_the_telemetry_module_does_not_import_opentelemetry() -> None:
    """Only the first guarded call (or `configure`) tries it: loading the module is free."""
    out = run_python("""
        import sys
        import graph_durable.telemetry.emit, graph_durable.telemetry.spans
        from graph_durable.telemetry import _otel
        print(_otel._state is _otel._UNLOADED)
        """)
    assert out.stdout.strip() == "True", out.stderr


def test_configure_can_turn_opentelemetry_off(
        otel: tuple[InMemorySpanExporter, InMemoryMetricReader]) -> None:
    spans, _ = otel
    telemetry.configure(enabled=False)
    with observe(REFUND) as call:
        call.outcome(CallOutcome.SENT)
    assert spans.get_finished_spans() == ()


def test_a_report_carries_no_args_receipt_or_error_text(
        otel: tuple[InMemorySpanExporter, InMemoryMetricReader]) -> None:
    """What a report can carry is fixed: the ledger's clear columns, never its sealed ones."""
    spans, _ = otel
    rep = CallReport(REFUND, CallOutcome.FAILED, 0.1, 1, "NotApplied")
    assert set(rep.payload()) == {"thread_id", "tool", "tool_call_id", "key", "policy",
                                  "kind", "outcome", "duration", "attempts", "error_type"}
    with observe(REFUND) as call:
        call.outcome(CallOutcome.FAILED, error=ValueError("card 4242"))
    [span] = spans.get_finished_spans()
    assert span.attributes["error.type"] == "ValueError"
    assert span.status.status_code is StatusCode.ERROR
    assert "4242" not in json.dumps(dict(span.attributes))


def test_a_runnable_outside_a_graph_reports_to_its_handlers_too() -> None:
    recorder = Recorder()

    def body(x: int, config: RunnableConfig) -> int:
        with observe(REFUND, config) as call:
            call.outcome(CallOutcome.REPLAYED)
        return x

    RunnableLambda(body).invoke(1, {"callbacks": [recorder]})
    assert [d["outcome"] for _, d in recorder.events] == ["replayed"]


def test_global_providers_set_after_the_first_call_are_used_from_then_on() -> None:
    """Until the application sets a global provider, the guard tells so without asking
    the API (whose getters read the environment on every call); one set later, after
    calls were observed, gets the spans and measurements of the calls after it."""
    out = run_python("""
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from graph_durable.telemetry import CallInfo, CallOutcome, observe

        def one_call():
            with observe(CallInfo("t", "pay", "c", "gd-1")) as call:
                with call.provider_call():
                    pass
                call.outcome(CallOutcome.SENT)

        one_call()
        exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        one_call()
        names = sorted(span.name for span in exporter.get_finished_spans())
        data = reader.get_metrics_data()
        measured = sorted(metric.name for rm in data.resource_metrics
                          for sm in rm.scope_metrics for metric in sm.metrics)
        print(names, measured)
        """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("['guarded_call pay', 'provider_call'] "
                                  "['graph_durable.calls', 'graph_durable.provider.duration']")


def test_a_global_tracer_provider_named_in_the_environment_is_loaded() -> None:
    """`OTEL_PYTHON_TRACER_PROVIDER` names the global provider the API loads on first
    use: the guard's spans go to it, though nothing set one in code."""
    out = run_python("""
        import os
        os.environ["OTEL_PYTHON_TRACER_PROVIDER"] = "sdk_tracer_provider"
        from opentelemetry import trace
        from graph_durable.telemetry import CallInfo, CallOutcome, observe

        with observe(CallInfo("t", "pay", "c", "gd-1")) as call:
            call.outcome(CallOutcome.SENT)
        print(type(trace.get_tracer_provider()).__module__, call._span is not None)
        """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["opentelemetry.sdk.trace", "True"]


# -- a call nobody watches: its outcome kept for the log alone ---------------------------


def lazily_observed(config: RunnableConfig, outcome: CallOutcome,
                    made: list[CallInfo]) -> Any:
    """`observe_lazily` around one call; `made` gets each `CallInfo` it made."""
    def make() -> CallInfo:
        made.append(REFUND)
        return REFUND

    with telemetry.observe_lazily(make, config) as call:
        with call.provider_call() as provider:
            pass
        call.outcome(outcome, attempts=1)
    assert provider.duration is not None and provider.duration >= 0
    return call


def test_a_call_nobody_watches_is_observed_quietly_and_logged_when_the_log_listens(
        caplog: pytest.LogCaptureFixture) -> None:
    observed: list[Any] = []
    made: list[CallInfo] = []

    def node(state: State, config: RunnableConfig) -> State:
        observed.append(lazily_observed(config, CallOutcome.SENT, made))
        return {"done": 1}

    graph_of(node).invoke({"done": 0})
    assert isinstance(observed[-1], telemetry.QuietCall) and made == []
    caplog.set_level(logging.DEBUG, logger="graph_durable")
    graph_of(node).invoke({"done": 0})
    assert isinstance(observed[-1], telemetry.QuietCall) and made == [REFUND]
    [record] = [r for r in caplog.records if r.name == "graph_durable"]
    assert record.outcome == "sent" and record.key == REFUND.key  # type: ignore[attr-defined]


@pytest.mark.parametrize("listener", ["callbacks", "custom stream", "opentelemetry"])
def test_any_listener_gets_the_whole_observation(
        request: pytest.FixtureRequest, listener: str) -> None:
    observed: list[Any] = []
    made: list[CallInfo] = []

    def node(state: State, config: RunnableConfig) -> State:
        observed.append(lazily_observed(config, CallOutcome.RECONCILED, made))
        return {"done": 1}

    graph = graph_of(node)
    if listener == "callbacks":
        recorder = Recorder()
        graph.invoke({"done": 0}, {"callbacks": [recorder]})
        heard = [data["outcome"] for _, data in recorder.events]
    elif listener == "custom stream":
        heard = [chunk["outcome"] for chunk in graph.stream({"done": 0}, stream_mode="custom")]
    else:
        spans, _ = request.getfixturevalue("otel")
        graph.invoke({"done": 0})
        heard = [span.attributes["graph_durable.effect.outcome"]
                 for span in spans.get_finished_spans() if span.name.startswith("guarded")]
    assert heard == ["reconciled"]
    assert not isinstance(observed[-1], telemetry.QuietCall) and made == [REFUND]


def test_only_a_writer_that_does_nothing_counts_as_nobody_streaming() -> None:
    from functools import partial

    from graph_durable.telemetry.emit import _silent

    class Writer:
        def write(self, chunk: Any) -> None:
            pass

    seen: list[Any] = []

    def keep(chunk: Any) -> None:
        seen.append(chunk)

    def documented(chunk: Any) -> None:
        """Does nothing, but says so."""

    assert _silent(lambda chunk: None) and _silent(Writer().write)
    assert not _silent(keep) and not _silent(lambda chunk: print(chunk))
    assert not _silent(documented)  # judged by its code alone: anything more is a listener

    class Forwarding:
        """A wrapper that shows its wrapped function's `__code__` but does more."""

        __code__ = (lambda chunk: None).__code__

        def __call__(self, chunk: Any) -> None:
            seen.append(chunk)

    assert not _silent(Forwarding())
    assert not _silent(lambda chunk: 1) and not _silent(partial(keep)) and not _silent(None)


def test_a_guarded_tool_call_nobody_watches_makes_no_report(
        tmp_path: Any, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under `EffectGuardNode` a call run with no handler, no `custom` stream and no
    OpenTelemetry provider makes no `CallInfo` and no report unless the log takes its
    outcome; a `custom` stream in the same process still hears of every call."""
    from graph_durable.nodes import core
    from graph_durable.testing.scenarios.effects import build_effects_agent

    made: list[str | None] = []
    call_info = core.call_info

    def counted(task: Any, key: str | None, *args: Any) -> CallInfo:
        made.append(key)
        return call_info(task, key, *args)

    monkeypatch.setattr(core, "call_info", counted)
    agent = build_effects_agent(str(tmp_path / "agent.db"), str(tmp_path),
                                [[["ticket", "a"], ["ticket", "b"]]], {"ticket": "dedupe"})
    agent.graph.invoke(agent.inputs, {"configurable": {"thread_id": "quiet"}},
                       durability="sync")
    assert made == [] and agent.providers["ticket"].count() == 2
    streamed = [chunk for chunk in agent.graph.stream(
        agent.inputs, {"configurable": {"thread_id": "streamed"}}, stream_mode="custom",
        durability="sync")
        if chunk.get("event") == telemetry.EVENT]
    assert [c["outcome"] for c in streamed] == ["sent", "sent"] and len(made) == 2
    caplog.set_level(logging.DEBUG, logger="graph_durable")
    agent.graph.invoke(agent.inputs, {"configurable": {"thread_id": "logged"}},
                       durability="sync")
    logged = [r for r in caplog.records if r.name == "graph_durable"
              and getattr(r, "thread_id", None) == "logged"]
    assert [r.outcome for r in logged] == ["sent", "sent"]  # type: ignore[attr-defined]
    assert [r.key for r in logged] == made[2:]  # type: ignore[attr-defined]
