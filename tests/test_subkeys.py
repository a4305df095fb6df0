"""`current_effect().subkey(name)`: stable keys for a tool that makes several provider writes.

One guarded call has one key; a tool that charges and then emails the receipt passes a
sub-key of it to each write. The crash tests kill the agent with SIGKILL between the two
writes and after both, resume in a new process on the same database, and count on the
provider's side: each write applied exactly once.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from graph_durable.nodes.context import EffectContext
from graph_durable.testing import FakeProvider, FaultPlan
from graph_durable.testing.crash.child import run_child
from graph_durable.testing.scenarios.extra import BETWEEN_WRITES, build_two_writes_agent

TWO_WRITES = "graph_durable.testing.scenarios.extra:build_two_writes_agent"


def context(key: str) -> EffectContext:
    return EffectContext(key=key, thread_id="t", tool_call_id="c1", tool="pay", attempt=1)


KEY = "gd-" + "0123456789" * 4


def test_a_subkey_is_stable_for_the_same_key_and_name() -> None:
    assert context(KEY).subkey("charge") == context(KEY).subkey("charge")
    # Not a function of anything but the key and the name (not the attempt, not the thread).
    other_run = EffectContext(key=KEY, thread_id="copy", tool_call_id="c1", tool="pay",
                              attempt=3, fencing_token=7)
    assert other_run.subkey("charge") == context(KEY).subkey("charge")


def test_subkeys_differ_by_name_and_by_key_and_look_like_keys() -> None:
    names = ["charge", "email", "Charge", "charge ", "1"]
    keys = {context(KEY).subkey(name) for name in names}
    keys |= {context("gd-" + "9" * 40).subkey(name) for name in names}
    assert len(keys) == 2 * len(names)
    assert KEY not in keys
    assert all(re.fullmatch(r"gd-[0-9a-f]{40}", key) for key in keys)


def test_a_subkey_needs_a_name() -> None:
    with pytest.raises(ValueError, match="non-empty name"):
        context(KEY).subkey("")


def kwargs(tmp_path: Path) -> dict[str, str]:
    return {"db_path": str(tmp_path / "agent.sqlite"), "provider_dir": str(tmp_path)}


def provider(tmp_path: Path) -> FakeProvider:
    return FakeProvider(str(tmp_path / "payments.sqlite"), "dedupe", name="payments")


@pytest.mark.crash
@pytest.mark.parametrize("crash", [FaultPlan("after_effect", tool=BETWEEN_WRITES),
                                   FaultPlan("after_effect", tool="pay_and_notify")],
                         ids=["between_the_writes", "after_both_writes"])
def test_each_write_lands_once_across_a_sigkill(tmp_path: Path, crash: FaultPlan) -> None:
    payments = provider(tmp_path)
    crashed = run_child(TWO_WRITES, kwargs(tmp_path), thread_id="t", fault=crash)
    assert crashed.killed, crashed.stderr[-2000:]
    assert payments.count(operation="charge") == 1
    assert payments.count(operation="receipt") == (1 if crash.tool == "pay_and_notify" else 0)

    resumed = run_child(TWO_WRITES, kwargs(tmp_path), thread_id="t", action="resume")
    assert resumed.done, resumed.stderr[-2000:]
    assert payments.count(operation="charge") == 1, payments.requests()
    assert payments.count(operation="receipt") == 1, payments.requests()
    # The resumed run sent the charge again under the same sub-key; the provider deduped it.
    charges = [r for r in payments.requests() if r["operation"] == "charge"]
    assert [r["outcome"] for r in charges] == ["applied", "deduplicated"]

    agent = build_two_writes_agent(**kwargs(tmp_path))
    [record] = agent.saver.effects("t")
    expected = {"charge": context(record.key).subkey("charge"),
                "receipt": context(record.key).subkey("receipt")}
    assert {e["operation"]: e["key"] for e in payments.effects()} == expected
    assert record.receipt == {"charge": "payments-1", "email": "payments-2"}
