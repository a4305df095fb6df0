"""Crash tests: SIGKILL a real agent process at each crash window, resume in a new one.

Every assertion is on the provider's side (how many effects it applied, which keys it
saw), never on what the agent believes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from graph_durable.testing import FakeProvider, FaultPlan
from graph_durable.testing.crash.child import run_child

pytestmark = pytest.mark.crash

WINDOWS = ["before_intent", "after_intent", "after_effect", "after_receipt"]
# Where the effect certainly reached the provider before the kill.
APPLIED_BEFORE_KILL = {"before_intent": 0, "after_intent": 0, "after_effect": 1,
                       "after_receipt": 1}


@pytest.fixture
def factories(saver_backend: str) -> tuple[str, str]:
    """The ticket and effects scenarios the children run: with `ainvoke` on the async
    PostgreSQL saver, with `invoke` on the others."""
    suffix = "_async" if saver_backend == "postgres-async" else ""
    return (f"graph_durable.demo.ticket:build_ticket_agent{suffix}",
            f"graph_durable.testing.scenarios.effects:build_effects_agent{suffix}")


@pytest.fixture
def ticket(factories: tuple[str, str]) -> str:
    return factories[0]


@pytest.fixture
def effects(factories: tuple[str, str]) -> str:
    return factories[1]


@pytest.fixture
def kwargs_of(tmp_path: Path, saver_spec: Any) -> Callable[..., dict[str, Any]]:
    """`kwargs_of(**kwargs)`: a scenario's kwargs on this test's saver."""
    def make(**kwargs: Any) -> dict[str, Any]:
        return {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path),
                "saver": saver_spec, **kwargs}

    return make


def providers(tmp_path: Path, mode: str) -> tuple[FakeProvider, FakeProvider]:
    return (FakeProvider(str(tmp_path / "tickets.sqlite"), mode),
            FakeProvider(str(tmp_path / "mail.sqlite"), mode))


def ledger(make_saver: Callable[..., Any], thread_id: str = "t") -> dict[str, str]:
    return {record.tool: record.status.value for record in make_saver().effects(thread_id)}


@pytest.mark.parametrize("mode", ["dedupe", "lookup"])
@pytest.mark.parametrize("window", WINDOWS)
def test_each_window_applies_each_effect_exactly_once(
    tmp_path: Path, ticket, kwargs_of, make_saver, window: str, mode: str
) -> None:
    kwargs = kwargs_of(ticket_mode=mode, email_mode=mode)
    tickets, mail = providers(tmp_path, mode)

    crashed = run_child(ticket, kwargs, thread_id="t",
                        fault=FaultPlan(window, tool="create_ticket"))
    assert crashed.killed
    assert tickets.count() == APPLIED_BEFORE_KILL[window]

    resumed = run_child(ticket, kwargs, thread_id="t", action="resume")
    assert resumed.done, resumed.summary
    assert tickets.count() == 1 and list(tickets.counts().values()) == [1]
    assert mail.count() == 1
    assert ledger(make_saver) == {"create_ticket": "applied", "send_email": "applied"}
    assert resumed.summary["messages"][-1]["content"] == "Ticket opened and customer informed."


@pytest.mark.parametrize("window", WINDOWS)
def test_blind_provider_pauses_instead_of_duplicating(
    tmp_path: Path, ticket, kwargs_of, make_saver, window: str
) -> None:
    kwargs = kwargs_of(ticket_mode="blind", email_mode="blind")
    tickets, mail = providers(tmp_path, "blind")

    assert run_child(ticket, kwargs, thread_id="t",
                     fault=FaultPlan(window, tool="create_ticket")).killed
    applied_before = tickets.count()
    resumed = run_child(ticket, kwargs, thread_id="t", action="resume")

    if window in ("before_intent", "after_receipt"):
        # Nothing ambiguous: not yet requested, or the receipt is durable.
        assert resumed.done
        assert tickets.count() == 1
        return
    # The intent is durable without a receipt and the provider cannot be asked.
    [question] = resumed.interrupts
    assert question["type"] == "effect_unknown"
    assert question["name"] == "create_ticket"
    assert question["allowed_decisions"] == ["applied", "retry", "skip"]
    assert tickets.count() == applied_before  # no second effect
    assert ledger(make_saver)["create_ticket"] == "unknown"

    requests_before = len(tickets.requests())
    finished = run_child(ticket, kwargs, thread_id="t", action="decide",
                         resume={"type": "applied", "receipt": {"id": "ticket-1"}})
    assert finished.done, finished.summary
    assert len(tickets.requests()) == requests_before  # the tool was not called again
    assert tickets.count() == applied_before
    assert mail.count() == 1
    tool_message = finished.summary["messages"][2]
    assert tool_message["content"] == '{"id": "ticket-1"}'


@pytest.mark.parametrize("mode", ["dedupe", "lookup"])
def test_crash_during_recovery_itself(tmp_path: Path, ticket, kwargs_of, mode: str) -> None:
    """Killed before sending; the recovering process is killed after re-sending."""
    kwargs = kwargs_of(ticket_mode=mode, email_mode=mode)
    tickets, mail = providers(tmp_path, mode)

    assert run_child(ticket, kwargs, thread_id="t",
                     fault=FaultPlan("after_intent", tool="create_ticket")).killed
    assert tickets.count() == 0
    assert run_child(ticket, kwargs, thread_id="t", action="resume",
                     fault=FaultPlan("after_effect", tool="create_ticket")).killed
    assert tickets.count() == 1
    resumed = run_child(ticket, kwargs, thread_id="t", action="resume")
    assert resumed.done
    assert tickets.count() == 1 and mail.count() == 1


def test_idempotent_resend_carries_the_same_key(tmp_path: Path, ticket, kwargs_of) -> None:
    kwargs = kwargs_of(ticket_mode="dedupe", email_mode="dedupe")
    tickets, _ = providers(tmp_path, "dedupe")

    assert run_child(ticket, kwargs, thread_id="t",
                     fault=FaultPlan("after_effect", tool="create_ticket")).killed
    assert run_child(ticket, kwargs, thread_id="t", action="resume").done

    requests = tickets.requests()
    assert [r["outcome"] for r in requests] == ["applied", "deduplicated"]
    assert requests[0]["key"] == requests[1]["key"]
    assert tickets.count() == 1


@pytest.mark.parametrize("mode", ["dedupe", "lookup"])
def test_two_parallel_calls_one_applied_before_the_crash(
    tmp_path: Path, effects, kwargs_of, make_saver, mode: str
) -> None:
    """ToolNode runs both calls of one AIMessage at once; the slow one is killed."""
    kwargs = kwargs_of(turns=[[["fast", "a"], ["slow", "b"]]],
                       modes={"fast": mode, "slow": mode}, delays={"slow": 0.5})
    fast = FakeProvider(str(tmp_path / "fast.sqlite"), mode)
    slow = FakeProvider(str(tmp_path / "slow.sqlite"), mode)
    assert run_child(effects, kwargs, thread_id="t",
                     fault=FaultPlan("after_effect", tool="slow")).killed
    assert fast.count() == 1 and slow.count() == 1  # both reached the provider
    # The receipts of reconcilable effects ride on the step's commit, which never came.
    assert ledger(make_saver) == {"fast": "in_flight", "slow": "in_flight"}

    resumed = run_child(effects, kwargs, thread_id="t", action="resume")
    assert resumed.done
    assert fast.count() == 1 and slow.count() == 1
    outcomes = [r["outcome"] for r in fast.requests()]
    # lookup finds the effect (no new request); dedupe sees the same key again.
    assert outcomes == (["applied"] if mode == "lookup" else ["applied", "deduplicated"])
    assert len({r["key"] for r in fast.requests()}) == 1
    tool_messages = [m for m in resumed.summary["messages"] if m["type"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_0_0", "call_0_1"]


def test_two_parallel_blind_calls_pause_together_and_resolve_by_id(
    tmp_path: Path, effects, kwargs_of
) -> None:
    kwargs = kwargs_of(turns=[[["alpha", "a"], ["beta", "b"]]],
                       modes={"alpha": "blind", "beta": "blind"}, delays={"beta": 0.3})
    assert run_child(effects, kwargs, thread_id="t",
                     fault=FaultPlan("after_effect", tool="beta")).killed
    paused = run_child(effects, kwargs, thread_id="t", action="resume")
    # alpha finished before the kill (its receipt is durable); beta is unknown.
    assert [q["tool_call_id"] for q in paused.interrupts] == ["call_0_1"]
    finished = run_child(effects, kwargs, thread_id="t", action="decide",
                         resume={"call_0_1": {"type": "applied", "receipt": "done"}})
    assert finished.done
    assert FakeProvider(str(tmp_path / "alpha.sqlite"), "blind").count() == 1
    assert FakeProvider(str(tmp_path / "beta.sqlite"), "blind").count() == 1
