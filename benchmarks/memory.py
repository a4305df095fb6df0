"""Memory stays flat: resident set size of a process running 10,000 guarded turns.

A child process (so that nothing of the benchmark runner is counted) builds the guarded
agent of `turn_overhead` (`EffectGuardNode` + `DurableSqliteSaver` on a SQLite file,
`durability="sync"`, one tool call per turn) and runs `TURNS` turns, each on a new
thread_id, so the checkpoints and the effect ledger grow by one thread per turn. Every
`SAMPLE_EVERY` turns it collects garbage and samples its current RSS (psutil, or
/proc/self/statm without it) and its peak RSS (VmHWM of /proc/self/status on Linux,
`resource.getrusage` elsewhere: on Linux ru_maxrss keeps the parent's peak across exec).

Both children commit with `synchronous=OFF` (set `BENCH_MEMORY_FSYNC=1` to keep the
saver's `synchronous=FULL`): fsync changes how long a turn takes, not what the process
holds in memory (written pages sit in the kernel's page cache, which is not the
process's RSS), and without it 10,000 turns fit in the time budget on a busy disk.

The stock agent (`ToolNode` + LangGraph's `SqliteSaver`) runs the same way in a second
child at the same time, as a reference: growth both show is LangGraph's (or Python's),
growth only the guarded one shows is graph_durable's.

Reported: RSS and peak RSS after 1,000 turns vs after the last sample (10,000 turns, or
fewer when the time budget `BENCH_MEMORY_SECONDS`, 150 s by default, runs out first:
then the turns reached are said). Target (ours, not given by the brief): the guarded
child's RSS at the end at most 1.10 x its RSS after 1,000 turns.

Run: `python -m benchmarks memory` (or `python -m benchmarks.memory`).
"""

from __future__ import annotations

import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks._runner import Comparison, missing_packages, report, run_main, spawn_child

__all__ = ["BUDGET_S", "SAMPLE_EVERY", "TARGET", "TURNS", "main"]

TURNS = int(os.environ.get("BENCH_MEMORY_TURNS", "10000"))
SAMPLE_EVERY = 500
BUDGET_S = float(os.environ.get("BENCH_MEMORY_SECONDS", "150"))
"""Seconds of turns per child; it stops at the next sample once they are spent."""

TARGET = 1.10
BASE_TURNS = 1000
"""The sample the growth is measured from (after warm-up of caches and allocators)."""

FSYNC = os.environ.get("BENCH_MEMORY_FSYNC", "") not in ("", "0")



def _rss_bytes() -> tuple[int, str]:
    """Current resident set size in bytes, and how it was read."""
    try:
        import psutil
    except ImportError:
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE"), "/proc/self/statm"
    return psutil.Process().memory_info().rss, "psutil"


def _peak_bytes() -> int:
    """Peak RSS of this process image.

    On Linux, VmHWM of /proc/self/status: `getrusage`'s ru_maxrss survives `exec`, so a
    child started by a parent that once held 600 MB reports 600 MB from its first turn.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux: KiB


def _child(spec: dict[str, Any]) -> None:
    from benchmarks.turn_overhead import build_guarded, build_stock

    build = build_guarded if spec["variant"] == "guarded" else build_stock
    agent = build(spec["db"], 1)
    if not spec["fsync"]:
        agent.conn.execute("PRAGMA synchronous=OFF")
    started = time.perf_counter()
    try:
        for turn in range(1, spec["turns"] + 1):
            agent.turn()
            if turn % spec["every"] == 0 or turn == 1:
                gc.collect()
                rss, how = _rss_bytes()
                elapsed = time.perf_counter() - started
                print(json.dumps({
                    "turns": turn, "rss": rss, "peak": _peak_bytes(), "how": how,
                    "elapsed_s": elapsed, "db_bytes": os.path.getsize(spec["db"]),
                }), flush=True)
                if elapsed > spec["budget_s"] and turn >= BASE_TURNS:
                    break
    finally:
        agent.close()


def _spawn(variant: str, db: str) -> subprocess.Popen[str]:
    spec = {"variant": variant, "db": db, "turns": TURNS, "every": SAMPLE_EVERY,
            "budget_s": BUDGET_S, "fsync": FSYNC}
    return spawn_child("benchmarks.memory", spec, env=os.environ)


def _at(samples: list[dict[str, Any]], turns: int) -> dict[str, Any]:
    """The first sample at or after `turns` turns."""
    return next(s for s in samples if s["turns"] >= turns)


def main() -> list[Comparison]:
    """Run both children side by side, collect their samples, report the growth."""
    if missing_packages("psutil"):
        print("note: psutil is not installed; reading RSS from /proc/self/statm "
              "(pip install -r benchmarks/requirements.txt for psutil)", flush=True)
    print(f"{TURNS:,} turns (1 tool call, new thread each) in a child per variant, side "
          f"by side, RSS sampled every {SAMPLE_EVERY} turns; time budget {BUDGET_S:.0f} s "
          f"per child; synchronous={'FULL' if FSYNC else 'OFF'}", flush=True)
    samples: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="graph-durable-memory-") as workdir:
        procs = {variant: _spawn(variant, os.path.join(workdir, f"{variant}.sqlite"))
                 for variant in ("guarded", "stock")}
        for variant, proc in procs.items():
            out, err = proc.communicate(timeout=BUDGET_S * 3 + 120)
            if proc.returncode != 0:
                raise RuntimeError(f"{variant} child exited with {proc.returncode}:\n"
                                   f"{err[-3000:]}")
            samples[variant] = [json.loads(line) for line in out.splitlines()
                                if line.startswith("{")]
    for variant, rows in samples.items():
        marks = [s for s in rows if s["turns"] in (1, 1000, 5000, 10000) or s is rows[-1]]
        print(f"  {variant}: " + ", ".join(
            f"{s['turns']:,} turns {s['rss'] / 2**20:.1f} MiB (peak {s['peak'] / 2**20:.1f})"
            for s in marks) + f"; {rows[-1]['elapsed_s']:.0f} s, "
            f"database {rows[-1]['db_bytes'] / 1e6:.0f} MB", flush=True)
    comparisons: list[Comparison] = []
    for variant in ("guarded", "stock"):
        rows = samples[variant]
        base, last = _at(rows, BASE_TURNS), rows[-1]
        mid = next((s for s in rows if s["turns"] >= 5000), None)
        cut = "" if last["turns"] >= TURNS else (
            f" (stopped at {last['turns']:,} of {TURNS:,} turns: time budget "
            f"{BUDGET_S:.0f} s spent)")
        per_k = (last["rss"] - base["rss"]) / 1024 / max((last["turns"] - base["turns"]) / 1000, 1)
        for what, key in (("RSS", "rss"), ("peak RSS", "peak")):
            comparisons.append(Comparison(
                scenario=f"{variant}: {what}",
                stock_ms=base[key] / 2**20,
                guarded_ms=last[key] / 2**20,
                target=TARGET if variant == "guarded" else None,
                labels=(f"{base['turns']:,} turns", f"{last['turns']:,} turns"), unit="MiB",
                note=(f"{what} at 1 turn {rows[0][key] / 2**20:.1f} MiB, "
                      + (f"at {mid['turns']:,} {mid[key] / 2**20:.1f} MiB, " if mid else "")
                      + f"growth {(last[key] - base[key]) / 2**20:+.1f} MiB from "
                      f"{base['turns']:,} to {last['turns']:,} turns"
                      + (f" ({per_k:+.0f} KiB per 1,000 turns)" if key == "rss" else "")
                      + cut),
                details={"samples": rows, "how": last["how"]},
            ))
    report(f"memory of a process running guarded (and, for reference, stock) turns, new "
           f"thread per turn, synchronous={'FULL' if FSYNC else 'OFF'}, RSS read with "
           f"{samples['guarded'][-1]['how']}", comparisons,
           benchmark="memory")
    return comparisons


if __name__ == "__main__":
    raise SystemExit(run_main(main, child=_child))
