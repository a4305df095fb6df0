"""Run LangGraph's own test suites on the stock savers and on ours, side by side.

    python -m graph_durable.testing.upstream [--subset ci|full] [--suite NAME ...]

For each suite (langgraph's tests, langgraph-checkpoint-sqlite's and
langgraph-checkpoint-postgres's saver tests) at the installed version: fetch its sdist
(`fetch.py`), run its tests twice at once, in two pytest processes, one as shipped
(`stock`) and one with graph_durable's savers swapped in (`ours`, see `plugin.py`), then
print a table per saver configuration and every test whose outcome differs. A
divergence listed in `known.py` is shown with its reason; any other makes the exit
status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graph_durable.testing.upstream import plugin
from graph_durable.testing.upstream.fetch import installed, unpacked_tests
from graph_durable.testing.upstream.known import known_reason

__all__ = ["SUITES", "Suite", "main"]


@dataclass(frozen=True)
class Suite:
    name: str
    dist: str
    full: tuple[str, ...]
    ci: tuple[str, ...]
    savers_only: bool = False  # keep only the tests parametrised by our savers


_SQLITE_TESTS = (
    "tests/test_sqlite.py", "tests/test_aiosqlite.py", "tests/test_conformance_delta.py",
    "tests/test_delta_channel_migration.py", "tests/test_delta_parent_walk.py",
    "tests/test_get_delta_channel_history.py", "tests/test_writes_task_path_migration.py",
)
_POSTGRES_TESTS = (
    "tests/test_sync.py", "tests/test_async.py", "tests/test_conformance_delta.py",
    "tests/test_delta_pagination.py", "tests/test_delta_plain_value_seed.py",
    "tests/test_prune.py",
)
SUITES = (
    # CI: time travel and interruption, on every saver; the full run takes every test.
    Suite("langgraph", "langgraph", ("tests",),
          ("tests/test_time_travel.py", "tests/test_time_travel_async.py",
           "tests/test_interruption.py"), savers_only=True),
    # The saver tests of both packages (not their stores'), whole in CI too.
    Suite("sqlite", "langgraph-checkpoint-sqlite", _SQLITE_TESTS, _SQLITE_TESTS),
    Suite("postgres", "langgraph-checkpoint-postgres", _POSTGRES_TESTS, _POSTGRES_TESTS),
)
SIDES = ("stock", "ours")


def _pytest(suite: Suite, src: Path, paths: tuple[str, ...], side: str,
            out: Path, name: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env[plugin.SIDE] = side
    env[plugin.REPORT] = str(out / f"{name}-{side}.json")
    env[plugin.FILTER] = "savers" if suite.savers_only else ""
    env.pop("PYTEST_ADDOPTS", None)
    (out / f"{name}-{side}.json").unlink(missing_ok=True)
    existing = [p for p in paths if "::" in p or (src / p).exists()]
    if not existing:
        raise RuntimeError(f"{suite.name}: none of {paths} is in its sdist ({src})")
    cmd = [sys.executable, "-m", "pytest", "-p", "graph_durable.testing.upstream.plugin",
           "-p", "no:cacheprovider", "-o", "addopts=", "-q", "-W", "ignore",
           "--continue-on-collection-errors", "--rootdir", str(src),
           "-c", str(src / "pyproject.toml"), *existing]
    with open(out / f"{name}-{side}.log", "wb") as log:
        return subprocess.Popen(cmd, cwd=src, env=env, stdout=log, stderr=subprocess.STDOUT)


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """Interrupt the runs (so each stops its PostgreSQL server), then kill what is left."""
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    for proc in procs.values():
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _config(suite: str, test: str) -> str:
    """The saver configuration a test runs on, from its id."""
    params = set(re.split(r"[-\[\]]", test.partition("[")[2]))
    if suite == "langgraph":
        found = sorted(params & plugin.SAVER_PARAMS)
        return found[0] if found else "?"
    if suite == "sqlite":
        return "sqlite_aio" if "aiosqlite" in test or "async" in test else "sqlite"
    aio = "_aio" if "test_async" in test or any(p.startswith("aio") for p in params) else ""
    for mode in ("pool", "pipe", "shallow"):
        if mode in params or f"aio_{mode}" in params:
            return f"postgres{aio}_{mode}"
    return f"postgres{aio}"


@dataclass
class Result:
    suite: str
    version: str
    stock: dict[str, dict[str, Any]]
    ours: dict[str, dict[str, Any]]
    seconds: float
    # Divergences that did not reproduce when run again on both sides, with what happened.
    flaky: dict[str, str] = field(default_factory=dict)


def _run_both(suite: Suite, src: Path, paths: tuple[str, ...], out: Path, name: str,
              deadline: float) -> dict[str, dict[str, dict[str, Any]]]:
    """Run `paths` (files or test ids) on both sides at once; their outcomes by side."""
    procs = {side: _pytest(suite, src, paths, side, out, name) for side in SIDES}
    outcomes = {}
    for side, proc in procs.items():
        log = out / f"{name}-{side}.log"
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _stop(procs)
            raise RuntimeError(f"{suite.name} ({side}) ran past its time box; see {log}") \
                from None
        report = out / f"{name}-{side}.json"
        if not report.exists():
            raise RuntimeError(f"{suite.name} ({side}) wrote no report (exit "
                               f"{proc.returncode}); see {log}")
        outcomes[side] = json.loads(report.read_text())
    return outcomes


def _outcome(side: dict[str, dict[str, Any]], test: str) -> str:
    return str(side.get(test, {}).get("outcome", "absent"))


def run_suite(suite: Suite, subset: str, cache: Path, timeout: float) -> Result:
    """Run `suite` on both sides; then run each test whose outcome differs (and is not
    documented) once more on both, to tell a divergence from a timing flake."""
    version = installed(suite.dist)
    src = unpacked_tests(suite.dist, version, cache)
    out = cache / "runs"
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    deadline = started + timeout
    paths = suite.ci if subset == "ci" else suite.full
    first = _run_both(suite, src, paths, out, suite.name, deadline)
    stock, ours = first["stock"], first["ours"]
    diverging = sorted(t for t in set(stock) | set(ours)
                       if _outcome(stock, t) != _outcome(ours, t)
                       and known_reason(suite.name, t) is None)
    flaky: dict[str, str] = {}
    if diverging:
        again = _run_both(suite, src, tuple(diverging), out, f"{suite.name}-rerun", deadline)
        for test in diverging:
            if _outcome(again["stock"], test) == _outcome(again["ours"], test) != "absent":
                flaky[test] = (f"on a rerun both {_outcome(again['stock'], test)}; the first "
                               f"run's {_outcome(stock, test)}/{_outcome(ours, test)} was "
                               "timing")
    return Result(suite.name, version, stock, ours, time.monotonic() - started, flaky)


def _short(counts: Counter[str]) -> str:
    return "/".join(str(counts[k]) for k in ("passed", "failed", "skipped", "error"))


def summarize(results: list[Result]) -> tuple[str, int]:
    """The side-by-side summary and the number of divergences not in `known.py`."""
    lines: list[str] = []
    unexpected = 0
    for res in results:
        tests = sorted(set(res.stock) | set(res.ours))
        lines.append(f"\n== {res.suite} {res.version}: {len(tests)} tests, "
                     f"{res.seconds:.0f} s (pass/fail/skip/error) ==")
        lines.append(f"{'config':<22}{'tests':>6}  {'stock':<16}{'ours':<16}"
                     f"{'divergent':>9}{'known':>7}{'s stock':>9}{'s ours':>8}")
        rows: dict[str, list[Counter[Any]]] = {}
        diverging: list[tuple[str, str, str, str | None, bool]] = []
        for test in tests:
            stock = res.stock.get(test, {"outcome": "absent"})["outcome"]
            ours = res.ours.get(test, {"outcome": "absent"})["outcome"]
            row = rows.setdefault(_config(res.suite, test),
                                  [Counter(), Counter(), Counter(), Counter()])
            row[0]["tests"] += 1
            row[0]["s stock"] += res.stock.get(test, {}).get("seconds", 0.0)
            row[0]["s ours"] += res.ours.get(test, {}).get("seconds", 0.0)
            row[1][stock] += 1
            row[2][ours] += 1
            if stock != ours:
                reason = known_reason(res.suite, test)
                flake = res.flaky.get(test)
                row[3]["known" if reason else "flaky" if flake else "divergent"] += 1
                diverging.append((test, stock, ours, reason or flake, bool(flake)))
        for config, (n, stock_c, ours_c, div) in sorted(rows.items()):
            lines.append(f"{config:<22}{n['tests']:>6}  {_short(stock_c):<16}"
                         f"{_short(ours_c):<16}{div['divergent']:>9}{div['known']:>7}"
                         f"{n['s stock']:>9.0f}{n['s ours']:>8.0f}")
        both = sum(1 for t in tests if res.stock.get(t, {}).get("outcome") in
                   ("failed", "error") and res.ours.get(t, {}).get("outcome") in
                   ("failed", "error"))
        if both:
            lines.append(f"({both} fail on both sides: not a divergence)")
        if res.flaky:
            lines.append(f"({len(res.flaky)} diverged once but not when run again on both "
                         "sides: timing, listed as flaky)")
        for test, stock, ours, reason, flake in diverging:
            tag = "flaky" if flake else "known" if reason else "DIVERGES"
            lines.append(f"  {tag}: {test}: stock {stock}, ours {ours}")
            if reason:
                lines.append(f"      why: {reason}")
            for side, got in (("stock", res.stock), ("ours", res.ours)):
                msg = got.get(test, {}).get("message")
                if msg and (not reason or flake):
                    lines.append(f"      {side}: {msg}")
            unexpected += reason is None
    lines.append(f"\n{unexpected} divergence(s) outside the documented list "
                 "(graph_durable/testing/upstream/known.py).")
    return "\n".join(lines), unexpected


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graph_durable.testing.upstream",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--subset", choices=("ci", "full"), default="full")
    parser.add_argument("--suite", action="append", choices=[s.name for s in SUITES],
                        help="run only this suite (repeatable)")
    parser.add_argument("--cache", type=Path, default=Path(".upstream"),
                        help="sdists, unpacked tests and run logs (default .upstream)")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds one suite may run (both sides at once)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        results = [run_suite(s, args.subset, args.cache.resolve(), args.timeout)
                   for s in SUITES if not args.suite or s.name in args.suite]
    except RuntimeError as exc:
        print(f"upstream suites: {exc}", file=sys.stderr)
        return 2
    text, unexpected = summarize(results)
    print(text)
    print(f"upstream suites ({args.subset}) on {sys.executable}: "
          f"{time.monotonic() - started:.0f} s")
    return 1 if unexpected else 0
