"""HTML reprs (review, inbox, effects, journal, audit, crash report) escape every value
and keep to translucent backgrounds over the theme's own text colour; `repr(Review)`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from graph_durable import review
from graph_durable.operators.notebook import effect_table, inbox, timeline
from graph_durable.testing.crash.report import (
    CrashPoint,
    CrashReport,
    CrashRow,
    Reference,
    Snapshot,
)
from tests.test_notebook_widget import PAY, build_agent

SCRIPT = "<script>alert(1)</script>"


def assert_safe(html: str) -> None:
    """No markup of ours from the values, and colours that suit light and dark themes."""
    assert "<script" not in html.lower(), html
    assert "&lt;script&gt;" in html
    assert not re.search(r"(?<![-\w])color\s*:", html), "text colour must be inherited"
    backgrounds = re.findall(r"background:\s*([^;\"]+)", html)
    assert all(b.startswith("rgba(") and float(b.rstrip(") ").rsplit(",", 1)[1]) < 0.5
               for b in backgrounds), backgrounds


@pytest.fixture
def paused(tmp_path: Path) -> Any:
    """A thread named with markup, paused on two approvals whose args hold markup."""
    agent = build_agent(str(tmp_path / "agent.sqlite"), str(tmp_path / "providers"),
                        mail_approval=True, pay={**PAY, "to": SCRIPT})
    agent.graph.invoke(agent.inputs, {"configurable": {"thread_id": SCRIPT}},
                       durability="sync")
    return agent


def test_review_escapes_values_and_shows_decisions(paused: Any) -> None:
    r = review(paused.graph, {"configurable": {"thread_id": SCRIPT}})
    assert_safe(r._repr_html_())
    r.approve("call_pay", reviewer=SCRIPT).reject("call_mail", SCRIPT)
    html = r._repr_html_()
    assert_safe(html)
    assert "approve by &lt;script&gt;" in html and "2 decided" in html
    r.resume()
    audit = paused.saver.audit(SCRIPT)
    assert_safe(audit._repr_html_())
    assert repr(audit) == (f"<Audit of thread {SCRIPT!r}: 1 run(s), "  # not audited: one
                           "0 effect(s) sent more than once>")
    assert_safe(effect_table(paused.saver, SCRIPT)._repr_html_())
    assert_safe(timeline(paused.saver, SCRIPT)._repr_html_())


def test_inbox_cards_escape_values_and_edits(paused: Any) -> None:
    box = inbox(paused.graph, paused.saver)
    assert_safe(box._repr_html_())
    box.threads[SCRIPT].review.edit("call_pay", {**PAY, "to": "ACME</td><script>"})
    html = box._repr_html_()
    assert_safe(html)
    assert "ACME&lt;/td&gt;&lt;script&gt;" in html


def test_review_repr_is_short(paused: Any) -> None:
    r = review(paused.graph, {"configurable": {"thread_id": SCRIPT}})
    assert repr(r) == (f"Review(thread={SCRIPT!r}, pending=[call_pay approval send_payment, "
                       "call_mail approval send_email], decided=0)")
    assert repr(r.approve("call_pay")).endswith("decided=1)")


def test_crash_report_escapes_and_colours_duplicates() -> None:
    reference = Reference(Snapshot({}, {}, {}), (), (), 0.1)
    rows = [CrashRow((CrashPoint("after_effect", SCRIPT),), "mismatch", duplicates=1,
                     diff=f"DUPLICATE {SCRIPT}"),
            CrashRow((CrashPoint("before_put_writes", None, 3),), "ok"),
            CrashRow((CrashPoint("before_put_writes", None, 4),), "ok")]
    report = CrashReport(f"agent:{SCRIPT}", reference, rows, 1.0)
    html = report._repr_html_()
    assert_safe(html)
    grid = report.grid()
    assert grid.counts == {
        f"after_effect({SCRIPT})": {"ok": 0, "duplicate": 1, "mismatch": 0, "error": 0},
        "before_put_writes": {"ok": 2, "duplicate": 0, "mismatch": 0, "error": 0}}
    red = re.findall(r'background: rgba\(248,81,73,[0-9.]+\)">([^<]*)<', grid._repr_html_())
    assert red == ["1"], "the duplicate, and only it, is red"
    assert "before_put_writes" in str(grid) and repr(grid) == str(grid)
    assert repr(report) == f"<CrashReport {report.summary()}>"
