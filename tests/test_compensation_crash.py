"""Crash tests of a two-step saga: `cancel()` SIGKILLed at every point, then run again.

The saga agent (`graph_durable.testing.scenarios.saga`) charges a customer and opens a
ticket, both applied. A child process then cancels the thread and is SIGKILLed at one
fault point of the cancel (every point the cancel reaches, each occurrence); a new process
runs the cancel again on the same files. Every assertion is on the providers' side:

- where the compensating provider dedupes or can be looked up, each effect is undone
  exactly once, and never undone when it did not happen;
- where it can do neither (blind), an undo is never sent twice: a crash that leaves its
  outcome open pauses it as `compensation_unknown` for a human.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from graph_durable import DurableSqliteSaver, EffectStatus, thread_status
from graph_durable.testing import FaultPlan
from graph_durable.testing.faults import ENV_TRACE
from graph_durable.testing.crash.forkserver import ChildOutcome, ForkServer
from graph_durable.testing.scenarios.saga import SAGA_THREAD, saga_providers

pytestmark = pytest.mark.crash

S = EffectStatus
UNDO = {"call_charge": ("refunds", "compensate:call_charge"),
        "call_ticket": ("closures", "compensate:call_ticket")}


STEP = "graph_durable.testing.scenarios.saga:saga_step"


@pytest.fixture(scope="module")
def server():
    """Children forked from a server that imported the scenario once."""
    with ForkServer(["graph_durable.testing.scenarios.saga"]) as forks:
        yield forks


def saga(server: ForkServer, folder: Path, action: str, modes: tuple[str, str],
         fault: FaultPlan | None = None) -> ChildOutcome:
    return server.run(STEP, {"action": action, "db_path": str(folder / "agent.sqlite"),
                             "provider_dir": str(folder), "refund_mode": modes[0],
                             "close_mode": modes[1], "ttl": 0.4}, fault=fault)


def cancel_again(server: ForkServer, folder: Path, modes: tuple[str, str],
                 action: str = "cancel") -> ChildOutcome:
    """Run the cancel in a new process once the killed one's lease has expired."""
    deadline = time.monotonic() + 30
    while True:
        done = saga(server, folder, action, modes)
        held = done.result is not None and done.result["outcome"] == "held_elsewhere"
        if not held or time.monotonic() > deadline:
            assert done.exitcode == 0 and done.result["outcome"] == "cancelled", done
            return done
        time.sleep(0.2)


def points_of_a_cancel(base: Path, scratch: Path, modes: tuple[str, str],
                       action: str = "cancel") -> list[FaultPlan]:
    """Every fault point an undisturbed cancel reaches, each occurrence a plan."""
    shutil.copytree(base, scratch)
    trace = scratch / "trace.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "graph_durable.testing.scenarios.saga", action,
         str(scratch / "agent.sqlite"), str(scratch), *modes],
        env={**os.environ, ENV_TRACE: str(trace)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen: Counter[tuple[str, str | None]] = Counter()
    plans = []
    for line in trace.read_text().splitlines():
        point = json.loads(line)
        seen[(point["point"], point["tool"])] += 1
        plans.append(FaultPlan(point["point"], point["tool"], seen[(point["point"], point["tool"])]))
    return plans


def ledger(folder: Path) -> dict[str, object]:
    with DurableSqliteSaver.from_conn_string(str(folder / "agent.sqlite")) as saver:
        return {r.tool_call_id: r for r in saver.effects(SAGA_THREAD)}


@pytest.fixture
def applied_saga(tmp_path: Path, server: ForkServer):
    """A folder where the saga ran to its end: a charge and a ticket, both applied."""
    def make(modes: tuple[str, str]) -> Path:
        base = tmp_path / "base"
        base.mkdir()
        ran = saga(server, base, "run", modes)
        assert ran.exitcode == 0, ran
        providers = saga_providers(str(base), *modes)
        assert providers["charges"].count() == 1 and providers["tickets"].count() == 1
        return base
    return make


@pytest.mark.parametrize(("modes", "action"), [(("dedupe", "lookup"), "cancel"),
                                               (("lookup", "dedupe"), "cancel"),
                                               (("dedupe", "lookup"), "acancel")])
def test_a_cancel_killed_anywhere_undoes_each_effect_exactly_once(
        tmp_path: Path, server: ForkServer, applied_saga, modes: tuple[str, str],
        action: str) -> None:
    """`acancel` (on an async saver's event loop) is killed and run again the same way."""
    base = applied_saga(modes)
    plans = points_of_a_cancel(base, tmp_path / "trace", modes, action)
    assert {p.point for p in plans} >= {"before_intent", "after_intent", "after_effect",
                                        "after_receipt"}
    assert {p.tool for p in plans} == {"refund", "close_ticket"}
    for n, plan in enumerate(plans):
        work = tmp_path / f"run{n}"
        shutil.copytree(base, work)
        killed = saga(server, work, action, modes, plan)
        assert killed.killed, (plan, killed)
        cancel_again(server, work, modes, action)
        providers = saga_providers(str(work), *modes)
        records = ledger(work)
        for call, (provider, undo_call) in UNDO.items():
            assert records[call].status is S.COMPENSATED, (plan, records[call])
            key = records[undo_call].key
            assert providers[provider].count(key) == 1, (plan, provider, providers[provider].requests())
            assert providers[provider].count() == 1, (plan, provider)
        # The model's effects were applied once and never again.
        assert providers["charges"].count() == 1 and providers["tickets"].count() == 1
        with DurableSqliteSaver.from_conn_string(str(work / "agent.sqlite")) as saver:
            assert thread_status(saver, SAGA_THREAD).status == "cancelled"


@pytest.mark.parametrize("action", ["cancel", "acancel"])
def test_a_blind_compensation_killed_anywhere_is_never_sent_twice(
        tmp_path: Path, server: ForkServer, applied_saga, action: str) -> None:
    modes = ("blind", "blind")
    base = applied_saga(modes)
    plans = points_of_a_cancel(base, tmp_path / "trace", modes, action)
    paused_after_effect = 0
    for n, plan in enumerate(plans):
        work = tmp_path / f"run{n}"
        shutil.copytree(base, work)
        assert saga(server, work, action, modes, plan).killed, plan
        again = cancel_again(server, work, modes, action)
        providers = saga_providers(str(work), *modes)
        records = ledger(work)
        for call, (provider, undo_call) in UNDO.items():
            undo = records.get(undo_call)
            sent = providers[provider].count()
            assert sent <= 1, (plan, provider, providers[provider].requests())
            if records[call].status is S.COMPENSATED:
                assert sent == 1 and undo is not None and undo.status is S.APPLIED, plan
            else:
                # An undo whose outcome the crash left open waits for a human.
                assert records[call].status is S.COMPENSATION_UNKNOWN, (plan, records[call])
                assert undo is not None and undo.status is S.UNKNOWN, (plan, undo)
                if plan.point == "after_effect":
                    assert sent == 1
                    paused_after_effect += 1
        assert "needs a human" in again.result["summary"]
    assert paused_after_effect == 2  # the kill after each undo reached its provider
