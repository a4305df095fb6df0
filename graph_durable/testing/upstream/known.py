"""The divergences between the stock savers and ours that are known and documented.

Each is matched by suite and test id (`fnmatch` pattern on the id pytest prints) and
carries the reason; the runner lists them apart and fails on any other divergence.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

__all__ = ["KNOWN", "Known", "known_reason"]


@dataclass(frozen=True)
class Known:
    suite: str
    test: str
    reason: str


KNOWN: tuple[Known, ...] = (
    Known(
        "sqlite", "tests/test_sqlite.py::*test_informative_async_errors",
        "By design: DurableSqliteSaver also serves async calls (it runs its sync "
        "methods), so `ainvoke` works with it; the stock SqliteSaver raises "
        "NotImplementedError there and points to AsyncSqliteSaver.",
    ),
)


def known_reason(suite: str, test: str) -> str | None:
    """The documented reason `test` of `suite` may diverge, or None."""
    for known in KNOWN:
        if known.suite == suite and fnmatch.fnmatchcase(test, known.test):
            return known.reason
    return None
