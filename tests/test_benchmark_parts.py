"""The guard's cost breakdown times functions by name: each name must still exist.

`python -m benchmarks guard_breakdown` lists a renamed function under its parts table
instead of failing (a benchmark run is long to repeat), and the function's time falls to
its caller's part. A rename that is not carried into `PARTS` fails here instead.
"""

from __future__ import annotations

from benchmarks.guard_breakdown import PARTS, _resolve


def test_every_function_the_breakdown_times_exists() -> None:
    missing = [spec for _, specs in PARTS for spec in specs if _resolve(spec) is None]
    assert missing == [], f"rename these in benchmarks/guard_breakdown.py PARTS: {missing}"
