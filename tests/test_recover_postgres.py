"""Sweeps that split the work: 4 worker processes recover 200 orphaned threads on
PostgreSQL, one of them SIGKILLed mid-sweep.

Each thread of the ticket agent was stopped right after its ticket reached the provider,
before the receipt (set up in this process with an injected crash: the set-up needs no
proof). The ticket provider answers lookups by key, the email provider dedupes. Then four
real worker processes run `recover()` until no thread is orphaned; worker 0 is SIGKILLed
mid-sweep (after the 12th step it saved), leaving a lease that expires on the server's
clock, and the others recover its thread too.

On the providers' side, each thread's ticket and email exist once. From the journal: every
fencing token of a thread was used by one owner, and tokens never go back, so no thread
was held by two workers at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict

import pytest

from graph_durable.testing import FaultPlan, InjectedCrash, arm, disarm

pytest.importorskip("psycopg")
pytestmark = pytest.mark.crash

THREADS = 200
WORKERS = 4

SWEEPER = r"""
import json, sys, time
from graph_durable.demo.ticket import build_ticket_agent
from graph_durable.operators.recovery import recover, thread_status

conninfo, provider_dir, owner = sys.argv[1], sys.argv[2], sys.argv[3]
agent = build_ticket_agent("unused", provider_dir, "lookup", "dedupe", postgres=conninfo)
resumed, deadline = 0, time.monotonic() + 120
while time.monotonic() < deadline:
    outcomes = recover(agent.graph, agent.saver, owner, ttl=1.5)
    resumed += sum(o.outcome == "resumed" for o in outcomes)
    errors = [o.error for o in outcomes if o.outcome == "error"]
    if errors:
        print(json.dumps({"errors": errors[:3]}), flush=True)
        sys.exit(1)
    if not any(thread_status(agent.saver, t).status in ("orphaned", "running")
               for t in agent.saver.thread_ids()):
        break
    time.sleep(0.3)
print(json.dumps({"owner": owner, "resumed": resumed}), flush=True)
"""


def orphan_threads(conninfo: str, provider_dir: str) -> None:
    from graph_durable.demo.ticket import build_ticket_agent

    agent = build_ticket_agent("unused", provider_dir, "lookup", "dedupe", postgres=conninfo)
    try:
        for n in range(THREADS):
            arm(FaultPlan("after_effect", tool="create_ticket", action="raise"))
            with pytest.raises(InjectedCrash):
                agent.graph.invoke(agent.inputs, {"configurable": {"thread_id": f"t{n:03}"}},
                                   durability="sync")
    finally:
        disarm()
        agent.saver.conn.close()


@pytest.mark.long
def test_four_workers_recover_two_hundred_threads_one_killed_mid_sweep(
        postgres_conninfo: str, tmp_path) -> None:
    from graph_durable.checkpointers.postgres import DurablePostgresSaver
    from graph_durable.operators.recovery import thread_status
    from graph_durable.testing.providers import FakeProvider

    provider_dir = str(tmp_path / "providers")
    orphan_threads(postgres_conninfo, provider_dir)
    tickets = FakeProvider(os.path.join(provider_dir, "tickets.sqlite"), "lookup", name="ticket")
    assert tickets.count() == THREADS
    started = time.monotonic()
    workers = []
    for n in range(WORKERS):
        env = dict(os.environ)
        if n == 0:  # killed mid-sweep, holding a thread's lease
            env.update(FaultPlan("after_put_writes", occurrence=12).to_env())
        workers.append(subprocess.Popen(
            [sys.executable, "-c", SWEEPER, postgres_conninfo, provider_dir, f"worker-{n}"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = [w.communicate(timeout=240) for w in workers]
    elapsed = time.monotonic() - started
    assert workers[0].returncode == -9, results[0]
    reports = [json.loads(out.splitlines()[-1]) for out, _ in results[1:]]
    assert all(w.returncode == 0 for w in workers[1:]), results
    assert sum(r["resumed"] for r in reports) >= THREADS - 5, reports
    assert sum(r["resumed"] > 0 for r in reports) >= 2, reports  # the work was split

    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as saver:
        statuses = {t: thread_status(saver, t).status for t in saver.thread_ids()}
        assert set(statuses.values()) == {"done"}, statuses
        events = saver.events()
    mail = FakeProvider(os.path.join(provider_dir, "mail.sqlite"), "dedupe", name="email")
    assert tickets.count() == THREADS and set(tickets.counts().values()) == {1}
    assert mail.count() == THREADS and set(mail.counts().values()) == {1}
    owners: dict[tuple[str, int], set[str]] = defaultdict(set)
    last_token: dict[str, int] = {}
    for event in events:
        if event.fencing_token is None:
            continue
        owners[(event.thread_id, event.fencing_token)].add(event.owner)
        assert event.fencing_token >= last_token.get(event.thread_id, 0), event
        last_token[event.thread_id] = event.fencing_token
    assert all(len(names) == 1 for names in owners.values()), owners
    print(f"4 workers recovered {THREADS} threads in {elapsed:.1f} s")
