"""A failover loses no intent when the standby is synchronous; an asynchronous standby
can, and the durability report says so before it happens.

A primary and a standby are started from the machine's PostgreSQL binaries
(`pg_basebackup -R`, streaming replication). A worker is SIGKILLed right after a blind
provider created a ticket, the primary is stopped as by a power cut, the standby is
promoted and a new worker resumes the thread on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from graph_durable.checkpointers.postgres import DurablePostgresSaver
from graph_durable.testing import FakeProvider, FaultPlan
from graph_durable.testing.crash.child import run_child
from graph_durable.testing.pg_standby import StandbyServer, make_synchronous
from graph_durable.testing.postgres import PostgresServer

pytestmark = pytest.mark.crash

TICKET = "graph_durable.demo.ticket:build_ticket_agent"
ROOT = Path(__file__).resolve().parents[1]


def _kwargs(tmp_path: Path, conninfo: str, mode: str) -> dict[str, Any]:
    return {"db_path": str(tmp_path / "unused.sqlite"), "provider_dir": str(tmp_path),
            "ticket_mode": mode, "email_mode": "dedupe",
            "saver": {"backend": "postgres", "conninfo": conninfo}}


def _ledger(conninfo: str) -> dict[str, str]:
    with DurablePostgresSaver.from_conn_string(conninfo) as saver:
        return {record.tool: record.status.value for record in saver.effects("t")}


def _report(conninfo: str) -> Any:
    with DurablePostgresSaver.from_conn_string(conninfo) as saver:
        return saver.durability()


# One combination runs in make test; the others in the sweeps (CI runs both), to keep make
# test under ten minutes (each starts a primary and a standby).
@pytest.mark.parametrize(("mode", "commit"), [
    ("blind", "on"),
    *(pytest.param(mode, commit, marks=pytest.mark.sweep)
      for mode, commit in (("blind", "local"), ("lookup", "on"), ("lookup", "local")))])
def test_a_failover_to_a_synchronous_standby_sends_nothing_twice(
    tmp_path: Path, mode: str, commit: str
) -> None:
    # `local` would let a commit return before the standby has it: the savers raise it
    # to `on` for every ledger write.
    with PostgresServer(settings={"synchronous_commit": commit}) as primary:
        conninfo = primary.create_database("agent")
        with StandbyServer(primary) as standby:
            make_synchronous(primary)
            report = _report(conninfo)
            assert report.ok, report.summary()
            assert [s.value for s in report.settings if s.name.startswith("standby ")] == ["sync"]
            tickets = FakeProvider(str(tmp_path / "tickets.sqlite"), mode)

            crashed = run_child(TICKET, _kwargs(tmp_path, conninfo, mode), thread_id="t",
                                fault=FaultPlan("after_effect", tool="create_ticket"))
            assert crashed.killed and tickets.count() == 1
            primary.crash()
            standby.promote()

            promoted = standby.database_conninfo("agent")
            assert _ledger(promoted) == {"create_ticket": "in_flight"}
            resumed = run_child(TICKET, _kwargs(tmp_path, promoted, mode), thread_id="t",
                                action="resume")
            assert tickets.count() == 1
            if mode == "blind":
                [question] = resumed.interrupts
                assert question["type"] == "effect_unknown"
                assert _ledger(promoted)["create_ticket"] == "unknown"
            else:
                assert resumed.done, resumed.summary
                assert _ledger(promoted) == {"create_ticket": "applied",
                                             "send_email": "applied"}


def test_an_asynchronous_standby_is_named_as_a_risk_and_a_failover_to_it_can_send_twice(
    tmp_path: Path,
) -> None:
    with PostgresServer() as primary:
        conninfo = primary.create_database("agent")
        with StandbyServer(primary) as standby:
            report = _report(conninfo)
            [risk] = report.risks
            assert risk.name.startswith("standby ") and risk.value == "async"
            assert "a blind effect may be sent again" in risk.meaning
            tickets = FakeProvider(str(tmp_path / "tickets.sqlite"), "blind")
            kwargs = _kwargs(tmp_path, conninfo, "blind")

            # The model's step is saved and replicated; then the standby falls behind
            # (stopped here, as a slow or partitioned replica would be).
            assert run_child(TICKET, kwargs, thread_id="t",
                             fault=FaultPlan("before_intent", tool="create_ticket")).killed
            standby.wait_caught_up()
            standby.crash()
            assert run_child(TICKET, kwargs, thread_id="t", action="resume",
                             fault=FaultPlan("after_effect", tool="create_ticket")).killed
            assert tickets.count() == 1
            primary.crash()
            standby.start_again()
            standby.promote()

            promoted = standby.database_conninfo("agent")
            assert _ledger(promoted) == {}  # the intent never reached the standby
            resumed = run_child(TICKET, _kwargs(tmp_path, promoted, "blind"), thread_id="t",
                                action="resume")
            assert resumed.done, resumed.summary
            assert tickets.count() == 2  # what the report warned of: sent again
    page = (ROOT / "docs" / "concepts" / "guarantees.md").read_text()
    assert "asynchronous standby can lose the last intents" in page
