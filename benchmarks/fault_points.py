"""Unarmed fault points cost nothing measurable: a guarded turn with and without them.

The guard and the saver call `graph_durable.testing.faults.fault_point(name, ...)` at the
edges of every crash window; unarmed, each call is one global check. The "build without
them" is simulated by rebinding `fault_point` to a no-op (same signature, no global
check) in every module that imported it: `nodes/core.py`, `nodes/protocol.py`,
`checkpointers/sqlite/saver.py` and `checkpointers/sqlite/async_saver.py`.

Workload: the guarded turn of `turn_overhead` (`EffectGuardNode` + `DurableSqliteSaver`,
`durability="sync"`) with `TOOL_CALLS` tool calls, the variant that passes the most
fault points. Three cases are timed in alternation turn by turn, each on its own
database: `unarmed`, `unarmed (A/A)` (the same again, as a control that shows the
run-to-run noise) and `no-op`; each switches the modules' binding before its turn.

Reported: both medians, the ratio unarmed / no-op, the spread over repetitions, and
the A/A control's ratio. The verdict is `BELOW NOISE` when the unarmed / no-op ratio is
closer to 1 than the A/A ratios spread (max |A/A ratio - 1| over the repetitions, and
at least the spread of the unarmed / no-op ratio itself). A microbenchmark of one call,
unarmed and no-op, times the number of fault points one turn passes bounds the cost
from above (the whole call, as if the calls were deleted), independently of the noise.

Run: `python -m benchmarks fault_points` (or `python -m benchmarks.fault_points`).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import timeit
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType

from benchmarks._runner import Comparison, measure_interleaved, report, run_main
from benchmarks.turn_overhead import Agent, build_guarded
from graph_durable.checkpointers.sqlite import async_saver as aio_saver
from graph_durable.checkpointers.sqlite import saver as sqlite_saver
from graph_durable.nodes import core, protocol
from graph_durable.testing import faults

__all__ = ["MODULES", "TOOL_CALLS", "main", "no_fault_points"]

TOOL_CALLS = 5
REPETITIONS = 7
TURNS = int(os.environ.get("BENCH_FAULT_TURNS", "60"))
WARMUP = 10

MODULES: tuple[ModuleType, ...] = (core, protocol, sqlite_saver, aio_saver)
"""Modules that imported `fault_point` by name and call it."""

ORIGINAL = faults.fault_point


def _no_op(point: str, *, tool: str | None = None) -> None:
    """A fault point compiled out: same signature, nothing inside."""


def _bind(fn: Callable[..., None]) -> None:
    for module in MODULES:
        if getattr(module, "fault_point", None) is not None:
            module.fault_point = fn  # type: ignore[attr-defined]


@contextmanager
def no_fault_points() -> Iterator[None]:
    """Rebind every module's `fault_point` to a no-op for the duration."""
    _bind(_no_op)
    try:
        yield
    finally:
        _bind(ORIGINAL)


def _count_points(agent: Agent) -> Counter[str]:
    """How many fault points one guarded turn passes, by name."""
    seen: Counter[str] = Counter()

    def counting(point: str, *, tool: str | None = None) -> None:
        seen[point] += 1

    _bind(counting)
    try:
        agent.turn()
    finally:
        _bind(ORIGINAL)
    return seen


def _per_call_ns() -> dict[str, float]:
    """Best-of-5 time of one call, unarmed and no-op, in nanoseconds."""
    out = {}
    for name, fn in (("unarmed", ORIGINAL), ("no-op", _no_op)):
        best = min(timeit.repeat("fp('after_put', tool='t')", globals={"fp": fn},
                                 number=200_000, repeat=5))
        out[name] = best / 200_000 * 1e9
    return out


def main() -> list[Comparison]:
    """Time the guarded turn with unarmed and no-op fault points, interleaved; report."""
    if faults._ARMED is not None:  # armed through the environment: not what we measure
        print(f"note: fault points were armed ({faults.ENV_FAULTS} or {faults.ENV_TRACE} "
              "set); disarming them for this benchmark", flush=True)
        faults.disarm()
    with tempfile.TemporaryDirectory(prefix="graph-durable-faults-") as workdir:
        agents = {name: build_guarded(os.path.join(workdir, f"{i}.sqlite"), TOOL_CALLS)
                  for i, name in enumerate(("unarmed", "unarmed (A/A)", "no-op"))}
        try:
            points = _count_points(agents["unarmed"])
            print(f"one turn with {TOOL_CALLS} tool calls passes {sum(points.values())} fault "
                  f"points: {dict(points)}", flush=True)

            def unarmed(agent: Agent) -> Callable[[], object]:
                def run() -> object:
                    _bind(ORIGINAL)
                    return agent.turn()
                return run

            def no_op(agent: Agent) -> Callable[[], object]:
                def run() -> object:
                    _bind(_no_op)
                    try:
                        return agent.turn()
                    finally:
                        _bind(ORIGINAL)
                return run

            print(f"{WARMUP} warm-up turns, then {REPETITIONS} x {TURNS} turns per case, "
                  "interleaved turn by turn", flush=True)
            samples = measure_interleaved(
                {"unarmed": unarmed(agents["unarmed"]),
                 "unarmed (A/A)": unarmed(agents["unarmed (A/A)"]),
                 "no-op": no_op(agents["no-op"])},
                repetitions=REPETITIONS, turns=TURNS, warmup=WARMUP,
                progress=lambda line: print(line, flush=True),
            )
        finally:
            _bind(ORIGINAL)
            for agent in agents.values():
                agent.close()
    ms = {name: [s * 1000 for s in values] for name, values in samples.items()}
    ratios = [u / n for u, n in zip(ms["unarmed"], ms["no-op"])]
    aa = [b / a for a, b in zip(ms["unarmed"], ms["unarmed (A/A)"])]
    unarmed_ms = statistics.median(ms["unarmed"])
    no_op_ms = statistics.median(ms["no-op"])
    ratio = unarmed_ms / no_op_ms
    noise = max(max(abs(r - 1) for r in aa), (max(ratios) - min(ratios)) / 2)
    verdict = "BELOW NOISE" if abs(ratio - 1) <= noise else "ABOVE NOISE"
    per_call = _per_call_ns()
    n_points = sum(points.values())
    # Upper bound of what the calls cost at all, as if they were deleted from the source.
    bound_us = n_points * per_call["unarmed"] / 1000
    spread = {name: (max(v) - min(v)) / statistics.median(v) for name, v in ms.items()}
    comparison = Comparison(
        scenario=f"guarded turn, {TOOL_CALLS} tool calls",
        stock_ms=no_op_ms,
        guarded_ms=unarmed_ms,
        labels=("no-op", "unarmed"),
        verdict_text=verdict,
        stock_samples_ms=ms["no-op"],
        guarded_samples_ms=ms["unarmed"],
        note=(f"A/A control (unarmed vs unarmed) {statistics.median(ms['unarmed (A/A)']):.2f} "
              f"ms, its ratio per repetition {min(aa):.3f}..{max(aa):.3f}; noise "
              f"+-{noise * 100:.1f}%; run-to-run spread (max-min)/median: unarmed "
              f"{spread['unarmed'] * 100:.1f}%, no-op {spread['no-op'] * 100:.1f}%; "
              f"one call {per_call['unarmed']:.0f} ns unarmed, {per_call['no-op']:.0f} ns "
              f"no-op: {n_points} fault points per turn cost at most {bound_us:.2f} µs "
              f"even counting the whole call ({bound_us / 1000 / unarmed_ms * 100:.4f}% "
              "of the turn)"),
        details={"aa_ms": ms["unarmed (A/A)"], "aa_ratios": aa, "ratios": ratios,
                 "noise": noise, "points": dict(points), "per_call_ns": per_call,
                 "bound_us": bound_us, "spread": spread},
    )
    report("unarmed fault points vs none (fault_point rebound to a no-op), guarded turn, "
           "durability='sync'", [comparison], benchmark="fault_points")
    return [comparison]


if __name__ == "__main__":
    raise SystemExit(run_main(main))
