"""Leases on PostgreSQL are decided by the server's clock, not the workers' (both savers).

Two real worker processes share one thread; each has its wall clock (`time.time`) faked
60 s fast or 60 s slow before anything is imported. The holder keeps its lease (renewing
it) while the other tries again and again, for 3 s, to take the thread; then the holder
checks its lease and makes a fenced write. On the workers' own clocks,
a slow holder's lease looks expired to a fast worker at once: two owners (the slow-holder
case fails on the previous release). With expiry on the server's clock, a fast holder must
judge its own lease by the deadline the server granted, not by its wall clock, or it would
think its live lease lost (the fast-holder case).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("psycopg")

WORKER = r"""
import json, sys, time
offset = float(sys.argv[1])
_real = time.time
time.time = lambda: _real() + offset  # this process's wall clock is off by `offset`
from graph_durable.errors import LeaseHeld, LeaseLost
from graph_durable.ledger import EffectStatus, IntentWrite
from graph_durable.testing.savers import open_saver

spec, role, seconds = json.loads(sys.argv[2]), sys.argv[3], float(sys.argv[4])
saver = open_saver(spec, "unused")
report = {"role": role}
if role == "hold":
    import select
    with saver.lease("t", "holder", ttl=2.0) as lease:
        print(json.dumps({"held": True}), flush=True)
        checks = []
        # Hold (renewing) until the test says the other worker is done, at most `seconds`.
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not select.select([sys.stdin], [], [], 0.2)[0]:
            checks.append(lease.is_valid())
        try:
            lease.check()
            saver.claim(IntentWrite(key="gd-k", thread_id="t", checkpoint_ns="",
                                    tool_call_id="c1", tool="pay", args={},
                                    status=EffectStatus.IN_FLIGHT), lease.config)
            report["write"] = "ok"
        except LeaseLost as exc:
            report["write"] = f"LeaseLost: {exc}"
        report["valid_throughout"] = all(checks)
else:
    taken = 0
    print(json.dumps({"ready": True}), flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            lease = saver.acquire_lease("t", "grabber", ttl=2.0)
            taken += 1
            saver.release_lease(lease)
        except LeaseHeld:
            pass
        time.sleep(0.1)
    report["taken"] = taken
print(json.dumps(report), flush=True)
"""


def worker(spec: dict, offset: float, role: str, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", WORKER, str(offset), json.dumps(spec),
                             role, str(seconds)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("saver_backend", ["postgres", "postgres-async"], indirect=True)
@pytest.mark.parametrize("holder_offset", [-60.0, 60.0], ids=["slow holder", "fast holder"])
def test_workers_with_skewed_clocks_never_share_a_thread_nor_lose_a_live_lease(
        saver_spec, make_saver, holder_offset: float) -> None:
    assert make_saver().thread_ids() == []  # the schema is created here, before the workers
    holder = worker(saver_spec, holder_offset, "hold", 60.0)
    assert json.loads(holder.stdout.readline()) == {"held": True}, holder.stderr.read()
    grabber = worker(saver_spec, -holder_offset, "grab", 3.0)
    # The grabber tries for 3 s once it is up; the holder holds until it is done.
    grabbed = json.loads(grabber.communicate(timeout=60)[0].splitlines()[-1])
    held = json.loads(holder.communicate("done\n", timeout=60)[0].splitlines()[-1])
    assert grabbed["taken"] == 0, "two workers held the thread at once"
    assert held["valid_throughout"] and held["write"] == "ok", held
    # Once the holder is done, the other worker takes the thread at once.
    late = worker(saver_spec, -holder_offset, "grab", 0.5)
    assert json.loads(late.communicate(timeout=60)[0].splitlines()[-1])["taken"] >= 1
