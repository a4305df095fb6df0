"""Run in a forked child of a test: what a child run imports that its server had not."""

from __future__ import annotations

import sys
from typing import Any

from graph_durable.testing.crash.child import run_spec


def modules_imported_by(spec: dict[str, Any]) -> list[str]:
    """Run `spec` as a sweep's child does; the modules it imported on the way."""
    before = set(sys.modules)
    run_spec(spec)
    return sorted(set(sys.modules) - before)


def crash_below_python() -> None:
    """Die of SIGSEGV inside a C call, as a faulty extension would."""
    import ctypes

    ctypes.string_at(0)
