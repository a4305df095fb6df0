"""What a crash sweep reports: normalization, comparison, resolver, rendering (no processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graph_durable.testing import FakeProvider
from graph_durable.testing.crash.matrix import CrashPoint, default_resolver
from graph_durable.testing.crash.report import (
    CrashReport,
    CrashRow,
    Reference,
    Snapshot,
    compare,
    normalize,
)

KEY_A, KEY_B = "gd-" + "a" * 40, "gd-" + "b" * 40


def state(*contents: str) -> dict:
    return {"messages": [{"type": "tool", "content": c} for c in contents], "next": [],
            "interrupts": []}


def receipt(key: str, n: int, **extra: str) -> str:
    return json.dumps({"id": f"ticket-{n}", "key": key, **extra})


def test_normalize_renames_keys_and_receipt_ids_by_first_appearance() -> None:
    one = normalize(state(receipt(KEY_A, 1), receipt(KEY_B, 2)), ["ticket-1", "ticket-2"])
    other = normalize(state(receipt(KEY_B, 7), receipt(KEY_A, 12)), ["ticket-7", "ticket-12"])
    assert one == other
    assert one["messages"][0]["content"] == '{"id": "<id1>", "key": "<key1>"}'


def test_normalize_keeps_two_calls_under_one_key_apart_from_two_keys() -> None:
    shared = normalize(state(receipt(KEY_A, 1), receipt(KEY_A, 1)), ["ticket-1"])
    distinct = normalize(state(receipt(KEY_A, 1), receipt(KEY_B, 2)), ["ticket-1", "ticket-2"])
    assert shared != distinct


def test_normalize_ignores_the_key_order_of_json_contents() -> None:
    tool_order = receipt(KEY_A, 1, title="t", body="b")
    human_order = json.dumps(json.loads(tool_order), sort_keys=True)
    assert normalize(state(tool_order), ["ticket-1"]) == normalize(state(human_order),
                                                                    ["ticket-1"])
    assert normalize(state("ticket-10"), ["ticket-1"]) == state("ticket-10")  # whole ids only


def snapshot(counts: dict, ledger: dict | None = None, content: str = "done") -> Snapshot:
    return Snapshot(state(content), ledger or {"c1": "applied"}, counts)


def test_compare_names_a_duplicate_and_every_difference() -> None:
    reference = snapshot({"tickets": {"apply": {KEY_A: 1}}})
    got = snapshot({"tickets": {"apply": {KEY_B: 2}}}, {"c1": "unknown"}, "other")
    lines, duplicates = compare(reference, got)
    assert duplicates == 1
    assert lines[0] == (f"DUPLICATE  tickets/apply: key {KEY_B} applied 2 times "
                        "(fault-free run: at most 1)")
    assert "effects    tickets/apply: 2 applied, fault-free run applied 1" in lines
    assert "ledger     c1: unknown (fault-free run: applied)" in lines
    assert any(line.startswith("state") for line in lines)
    assert "  --- fault-free run" in lines and "  +++ this run" in lines
    assert '  -   "content": "done"' in lines and '  +   "content": "other"' in lines
    assert compare(reference, snapshot({"tickets": {"apply": {KEY_B: 1}}})) == ([], 0)


def test_default_resolver(tmp_path: Path) -> None:
    provider = FakeProvider(str(tmp_path / "tickets.sqlite"), "blind", name="ticket")
    stored = provider.apply(KEY_A, {"title": "t"})
    providers = {"tickets": provider}
    for kind in ("tool_approval", "effect_approval"):  # today's shape, and earlier releases'
        assert default_resolver({"type": kind, "key": KEY_B}, providers) == {"type": "approve"}
    assert default_resolver({"type": "effect_unknown", "key": KEY_A}, providers) == {
        "type": "applied", "receipt": stored}
    assert default_resolver({"type": "effect_unknown", "key": KEY_B}, providers) == {
        "type": "retry"}
    with pytest.raises(ValueError, match="pass resolver="):
        default_resolver({"type": "my_question"}, providers)


def report() -> CrashReport:
    reference = Reference(snapshot({"tickets": {"apply": {KEY_A: 1}}}),
                          (CrashPoint("after_effect", "create_ticket"),), (), 1.0)
    rows = [
        CrashRow((CrashPoint("after_effect", "create_ticket"),), "ok", {"tickets": 1},
                 questions=[{"type": "effect_unknown"}], runs=3, fired=1, duration=2.5,
                 audit={"models": 1, "nodes": 2, "replayed": 0, "reconciled": 1}),
        CrashRow((CrashPoint("after_put", None, 2, phase=1),
                  CrashPoint("after_intent", "<script>")), "mismatch", {"tickets": 2},
                 duplicates=1, runs=4, fired=1, duration=3.0,
                 diff="DUPLICATE  tickets/apply: key <b> applied 2 times"),
    ]
    return CrashReport("pkg:<factory>", reference, rows, 5.5)


def test_render_is_a_table_with_the_differences_below() -> None:
    text = str(report())
    lines = text.splitlines()
    assert lines[0] == ("crash matrix pkg:<factory>: 1 points, 1 pairs; 1 ok, 1 mismatch, "
                        "0 error; 1 duplicate effects; 1 model calls paid again; 1 scheduled "
                        "crashes not reached; 5.5 s")
    assert lines[1].split() == ["#", "crash", "point(s)", "outcome", "effects", "pauses",
                                "crashed", "runs", "ran", "again", "time"]
    assert lines[2].split() == ["1", "after_effect(create_ticket)#1", "ok", "tickets:1",
                                "unknown", "1/1", "3", "models:1", "nodes:2", "reconciled:1",
                                "2.5s"]
    assert lines[3].split()[1:4] == ["p1:after_put#2", "->", "after_intent(<script>)#1"]
    assert text.endswith("p1:after_put#2 -> after_intent(<script>)#1: mismatch\n"
                         "DUPLICATE  tickets/apply: key <b> applied 2 times")
    assert not report().ok and report().duplicates == 1


def test_html_escapes_every_value() -> None:
    page = report()._repr_html_()
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "&lt;factory&gt;" in page and "&lt;b&gt;" in page
    # The colour grid (a header and a row per fault point), then the rows' table.
    assert page.count("<tr>") == 1 + len(report().grid().counts) + 3 and "<pre>" in page
