"""Two threads that share a key (a thread and its copy, or a fork) claim it at the same
moment, each through its own saver and connection, as two processes would: one creates
the intent and may send the call; the other takes that intent over and never sends it.

A key embeds its key thread, so the same key in two threads is the same requested call
(`_sql.plan_inherit`). On SQLite the write lock of the file serializes the two claims. On
PostgreSQL each claim holds only its own thread's advisory lock, so without a lock on the
key itself both could look for the other's row before either committed, find none, and
both insert: the call sent twice.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from graph_durable.ledger import EffectStatus, IntentWrite

TRIALS = 40


def _intent(thread_id: str, key: str) -> IntentWrite:
    return IntentWrite(key=key, thread_id=thread_id, checkpoint_ns="tools:x",
                       tool_call_id="call-1", tool="pay", args={"cents": 5},
                       status=EffectStatus.IN_FLIGHT)


def _claim_together(savers: list[Any], key: str) -> list[bool]:
    """Claim `key` in thread `t0` and thread `t1` at once; whether each created it."""
    barrier = threading.Barrier(len(savers))
    created: list[bool | None] = [None] * len(savers)
    errors: list[BaseException] = []

    def claim(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            [(_, created[i])] = savers[i].claim_many([_intent(f"t{i}", key)])
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    workers = [threading.Thread(target=claim, args=(i,)) for i in range(len(savers))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    if errors:
        raise errors[0]
    assert all(c is not None for c in created), f"a claim of {key!r} did not return"
    return [bool(c) for c in created]


def test_two_threads_claiming_one_key_at_once_send_it_once(make_saver: Any) -> None:
    savers = [make_saver(), make_saver()]
    both = []
    for trial in range(TRIALS):
        key = f"family-key-{trial}"
        created = _claim_together(savers, key)
        if created.count(True) != 1:
            both.append((key, created))
        # The one that did not create it holds the other's intent, as it stands there.
        records = [saver.effect(key, f"t{i}") for i, saver in enumerate(savers)]
        assert all(r is not None and r.status is EffectStatus.IN_FLIGHT for r in records)
    assert both == [], (f"{len(both)} of {TRIALS} keys were created in both threads, so "
                        f"both would send the call: {both[:3]}")


@pytest.fixture(autouse=True)
def _backend(saver_backend: str) -> str:
    return saver_backend
