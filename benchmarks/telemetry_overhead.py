"""What the guard's telemetry costs a turn: `turn_overhead`'s sync SQLite scenarios, run
once in a process where `opentelemetry` cannot be imported (as on an install without
`graph-durable[otel]`, and without LangSmith's or LangGraph's own use of it) and once
where it is installed with no SDK configured (the no-op tracer and meter a library sees
until the application sets providers up).

Each side runs in its own process, stock and guarded turns interleaved in the same run,
so each row is the guarded / stock ratio measured side by side; the two rows of a
scenario differ only in whether OpenTelemetry is there. The custom events, the stream
and the log are always on (they cost nothing without a handler, a stream or a logger
configured).

Run: `python -m benchmarks telemetry_overhead` (or `python -m benchmarks.telemetry_overhead`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from benchmarks._runner import Comparison, report

__all__ = ["main", "measure_in_process"]

_CHILD = """
import json, sys
if {blocked}:
    import importlib.abc
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ModuleNotFoundError(name)
            return None
    sys.meta_path.insert(0, Block())
from benchmarks.telemetry_overhead import measure_in_process
print(json.dumps(measure_in_process({workdir!r}, {n_calls})))
"""


def measure_in_process(workdir: str, n_calls: int) -> dict[str, Any]:
    """`turn_overhead`'s scenario with `n_calls` calls in this process; its samples, and
    whether the guard's telemetry found OpenTelemetry here."""
    from benchmarks.turn_overhead import measure_scenario
    from graph_durable.telemetry import _otel

    result = measure_scenario(workdir, n_calls, target=None)
    return {"stock": list(result.stock_samples_ms), "guarded": list(result.guarded_samples_ms),
            "otel": _otel.instruments() is not None}


def _side(n_calls: int, blocked: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gd-telemetry-") as workdir:
        code = _CHILD.format(blocked=blocked, workdir=workdir, n_calls=n_calls)
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                             text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> list[Comparison]:
    """Run both sides for 1 and 5 calls; print and record the rows."""
    rows = []
    for n_calls in (1, 5):
        for blocked in (True, False):
            side = _side(n_calls, blocked)
            assert side["otel"] is not blocked, side["otel"]
            what = "without opentelemetry" if blocked else "opentelemetry installed, no SDK"
            calls = "1 tool call" if n_calls == 1 else f"{n_calls} tool calls"
            rows.append(Comparison.of_samples(f"turn, {calls}, {what}", side["stock"],
                                              side["guarded"], target=None))
    report("telemetry overhead: guarded vs stock turns, with and without OpenTelemetry",
           rows, benchmark="telemetry_overhead")
    return rows


if __name__ == "__main__":
    main()
