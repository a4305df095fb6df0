"""Crash tests on PostgreSQL: SIGKILL the agent process, resume it in a new one.

The same windows as `test_crash.py`, with checkpoints and ledger in a real PostgreSQL
server started by the tests; assertions are on the provider's side.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from graph_durable.checkpointers.postgres import DurablePostgresSaver
from graph_durable.testing import FakeProvider, FaultPlan
from graph_durable.testing.crash.child import run_child

pytestmark = pytest.mark.crash

TICKET = "graph_durable.demo.ticket:build_ticket_agent"
FAULTS = {
    "after_intent": FaultPlan("after_intent", tool="create_ticket"),
    "after_effect": FaultPlan("after_effect", tool="create_ticket"),
    # The tools task's own writes: the step that applied the ticket completes here.
    "before_put_writes": FaultPlan("before_put_writes", occurrence=3),
}
APPLIED_BEFORE_KILL = {"after_intent": 0, "after_effect": 1, "before_put_writes": 1}


def kwargs_for(tmp_path: Path, conninfo: str, mode: str) -> dict[str, Any]:
    return {"db_path": str(tmp_path / "unused.sqlite"), "provider_dir": str(tmp_path),
            "ticket_mode": mode, "email_mode": mode, "postgres": conninfo}


def ledger(conninfo: str) -> dict[str, str]:
    with DurablePostgresSaver.from_conn_string(conninfo) as saver:
        return {record.tool: record.status.value for record in saver.effects("t")}


@pytest.mark.parametrize("mode", ["dedupe", "lookup"])
@pytest.mark.parametrize("window", ["after_intent", "after_effect", "before_put_writes"])
def test_each_window_applies_each_effect_exactly_once_on_postgres(
    tmp_path: Path, postgres_conninfo: str, window: str, mode: str
) -> None:
    kwargs = kwargs_for(tmp_path, postgres_conninfo, mode)
    tickets = FakeProvider(str(tmp_path / "tickets.sqlite"), mode)
    mail = FakeProvider(str(tmp_path / "mail.sqlite"), mode)
    crashed = run_child(TICKET, kwargs, thread_id="t", fault=FAULTS[window])
    assert crashed.killed
    assert tickets.count() == APPLIED_BEFORE_KILL[window]
    # Before the step's writes, the ticket's receipt (deferred) is not committed yet.
    assert ledger(postgres_conninfo)["create_ticket"] == "in_flight"

    resumed = run_child(TICKET, kwargs, thread_id="t", action="resume")
    assert resumed.done, resumed.summary
    assert tickets.count() == 1 and list(tickets.counts().values()) == [1]
    assert mail.count() == 1
    assert ledger(postgres_conninfo) == {"create_ticket": "applied", "send_email": "applied"}


def test_blind_provider_pauses_instead_of_duplicating_on_postgres(
    tmp_path: Path, postgres_conninfo: str
) -> None:
    kwargs = kwargs_for(tmp_path, postgres_conninfo, "blind")
    tickets = FakeProvider(str(tmp_path / "tickets.sqlite"), "blind")

    assert run_child(TICKET, kwargs, thread_id="t",
                     fault=FaultPlan("after_effect", tool="create_ticket")).killed
    resumed = run_child(TICKET, kwargs, thread_id="t", action="resume")
    [question] = resumed.interrupts
    assert question["type"] == "effect_unknown" and question["name"] == "create_ticket"
    assert tickets.count() == 1  # applied once before the kill, never again
    assert ledger(postgres_conninfo)["create_ticket"] == "unknown"

    finished = run_child(TICKET, kwargs, thread_id="t", action="decide",
                         resume={"type": "applied", "receipt": {"id": "from the provider"}})
    assert finished.done, finished.summary
    assert tickets.count() == 1
    assert ledger(postgres_conninfo) == {"create_ticket": "applied", "send_email": "applied"}
