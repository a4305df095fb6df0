"""The commits the guard relies on are durable whatever PostgreSQL's settings say.

With `synchronous_commit = off` (on the server, or on the role the workers log in as), a
commit returns before it reaches the disk: a server that stops then loses it. If the
lost commit is an intent, the resumed worker finds no trace of a call that did reach the
provider, and a blind call is sent a second time. The savers commit every ledger write
with `synchronous_commit` at least `on` (`DURABLE_COMMIT`), so here the worker is
SIGKILLed right after the provider applied a ticket, the server is stopped as by a power
cut (`pg_ctl stop -m immediate`) and started again, and the resumed worker pauses on
`unknown` (blind) or reconciles by lookup: one ticket, never two.

`wal_writer_delay` is at its longest (10 s) so that a commit that does not wait for the
disk is still in the server's memory when it stops: without the savers' durable
commits these tests fail (two tickets).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from graph_durable.checkpointers.postgres import DurablePostgresSaver
from graph_durable.testing import FakeProvider, FaultPlan
from graph_durable.testing.crash.child import run_child
from graph_durable.testing.postgres import PostgresServer

pytestmark = pytest.mark.crash

FACTORY = {"postgres": "graph_durable.demo.ticket:build_ticket_agent",
           "postgres-async": "graph_durable.demo.ticket:build_ticket_agent_async"}
LAZY_WAL_WRITER = {"wal_writer_delay": "10000ms"}


@pytest.fixture(params=["server", "role"])
def lazy_commits(request: pytest.FixtureRequest) -> Iterator[str]:
    """A database on a server whose sessions commit with `synchronous_commit = off`, set
    on the server itself or on the role the workers use."""
    where = request.param
    settings = {**LAZY_WAL_WRITER, **({"synchronous_commit": "off"} if where == "server" else {})}
    with PostgresServer(settings=settings) as server:
        conninfo = server.create_database("agent")
        if where == "role":
            with psycopg.connect(server.conninfo, autocommit=True) as conn:
                conn.execute("ALTER ROLE postgres SET synchronous_commit = off")
        with psycopg.connect(conninfo) as conn:  # the premise: a session commits lazily
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
        request.node.server = server
        yield conninfo


def _ledger(conninfo: str) -> dict[str, str]:
    with DurablePostgresSaver.from_conn_string(conninfo) as saver:
        return {record.tool: record.status.value for record in saver.effects("t")}


# The sync saver runs in make test; the async one in the sweeps (CI runs both), to keep
# make test under ten minutes (each case restarts a server).
@pytest.mark.parametrize("backend", ["postgres",
                                     pytest.param("postgres-async", marks=pytest.mark.sweep)])
@pytest.mark.parametrize("mode", ["blind", "lookup"])
def test_a_power_cut_after_the_send_loses_no_intent_whatever_synchronous_commit_says(
    tmp_path: Path, lazy_commits: str, request: pytest.FixtureRequest, backend: str,
    mode: str,
) -> None:
    server: PostgresServer = request.node.server
    kwargs: dict[str, Any] = {"db_path": str(tmp_path / "unused.sqlite"),
                              "provider_dir": str(tmp_path), "ticket_mode": mode,
                              "email_mode": "dedupe",
                              "saver": {"backend": backend, "conninfo": lazy_commits}}
    tickets = FakeProvider(str(tmp_path / "tickets.sqlite"), mode)

    crashed = run_child(FACTORY[backend], kwargs, thread_id="t",
                        fault=FaultPlan("after_effect", tool="create_ticket"))
    assert crashed.killed and tickets.count() == 1
    server.crash()
    server.start_again()
    assert _ledger(lazy_commits).get("create_ticket") == "in_flight", "the intent was lost"

    resumed = run_child(FACTORY[backend], kwargs, thread_id="t", action="resume")
    assert tickets.count() == 1, "the ticket was created again after the power cut"
    if mode == "blind":
        [question] = resumed.interrupts
        assert question["type"] == "effect_unknown" and question["name"] == "create_ticket"
        assert _ledger(lazy_commits)["create_ticket"] == "unknown"
    else:
        assert resumed.done, resumed.summary
        assert _ledger(lazy_commits) == {"create_ticket": "applied", "send_email": "applied"}
