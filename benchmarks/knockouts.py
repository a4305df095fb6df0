"""What each part of the guard costs a turn, measured by taking it out.

`guard_breakdown` times the guard's parts with timers around them, which slow what they
time and count CPU, not a turn's wall time. This benchmark measures the other way: each
knockout replaces one part of the guard with nothing (in the measuring child only: the
guard is then **not safe**, and the child checks that the part is really gone), and
times `turn_overhead`'s turn against stock LangGraph as `benchmarks.revisions` does: in
each round one child process per knockout and one with the whole guard (`none`), in
alternating order, each reporting guarded / stock from stock turns interleaved in its
own process. What a part costs is the whole guard's ratio minus the ratio without it.

The knockouts (`KNOCKOUTS`):

- `claim`: the step's claim (`claim_many`) writes and commits nothing; its intents are
  taken as new. What is left is what no claim costs; the floor (`turn_overhead`'s
  `FloorToolNode`) is what the least claim costs.
- `receipts`: a deferred receipt is dropped instead of riding on the step's write.
- `fence read`: a fenced write does not read the thread's lease row.
- `telemetry`: a call is observed by an object that does nothing.
- `protocol`: a claimed call runs the tool directly, without the protocol (no
  receipt, no run-once, no telemetry): the claim is all that is left of the guard.

Run: `python -m benchmarks.knockouts [--calls 1 5] [--rounds 4] [--only claim receipts]`.
Nothing is written to `results.md`: these are guards no one should run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks._runner import ROOT
from benchmarks.guard_breakdown import _resolve
from benchmarks.revisions import Round, measure, summary

__all__ = ["KNOCKOUTS", "NONE", "main", "prelude", "take_out", "targets"]

NONE = "none"
"""The whole guard: what each knockout is compared with."""

KNOCKOUTS: dict[str, str] = {
    "claim": "the step's claim writes and commits nothing",
    "receipts": "deferred receipts are dropped, never written",
    "fence read": "a fenced write does not read the lease row",
    "telemetry": "calls are observed by an object that does nothing",
    "protocol": "a claimed call runs the tool directly, without the protocol",
}
"""Each knockout, and what it takes out of the guard."""

_TARGETS: dict[str, tuple[str, ...]] = {
    "claim": ("graph_durable.checkpointers.sqlite.saver:DurableSqliteSaver.claim_many",
              "graph_durable.checkpointers._base:DurableSaverMixin._plan_intents"),
    "receipts": ("graph_durable.checkpointers._base:DurableSaverMixin._defer",),
    "fence read": ("graph_durable.checkpointers.sqlite._txn:SqliteTransactions._check_write_txn",
                   "graph_durable.checkpointers._base:DurableSaverMixin._needs_flow_check",
                   "graph_durable.checkpointers._base:DurableSaverMixin._flow_statements",
                   "graph_durable.checkpointers.sqlite._txn:"
                   "SqliteTransactions._flush_deferred_txn"),
    "telemetry": ("graph_durable.nodes.core:GuardBase._observing",),
    "protocol": ("graph_durable.nodes.sync_driver:SyncDriver.run",),
}
"""What each knockout replaces or relies on (`module:qualname`)."""

_APPLIED_LEFT = {NONE: True, "claim": False, "receipts": False, "fence read": True,
                 "telemetry": True, "protocol": False}
"""Whether a turn still leaves its calls applied in the ledger with the knockout."""


def targets(name: str) -> list[Any]:
    """What knockout `name` replaces or relies on, resolved (`guard_breakdown`'s
    resolution); `LookupError` if the guard no longer has it."""
    found = []
    for target in _TARGETS[name]:
        resolved = _resolve(target)
        if resolved is None:
            raise LookupError(f"knockout {name!r}: {target} is no longer in the guard")
        found.append(resolved[2])
    return found


class _Unobserved:
    """An observed call that records nothing (the `telemetry` knockout)."""

    recording = False
    call = None

    def __enter__(self) -> _Unobserved:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def provider_call(self) -> _Unobserved:
        return self

    def lookup(self) -> _Unobserved:
        return self

    def outcome(self, outcome: Any) -> None:
        return None


def _patches(name: str) -> list[tuple[Any, str, Callable[..., Any]]]:
    """`(owner, attribute, replacement)` for knockout `name`."""
    from graph_durable.checkpointers import _sql
    from graph_durable.checkpointers._base import DurableSaverMixin
    from graph_durable.checkpointers.sqlite._txn import SqliteTransactions
    from graph_durable.checkpointers.sqlite.saver import DurableSqliteSaver
    from graph_durable.ledger import TransitionWrite
    from graph_durable.nodes.context import _CURRENT, EffectContext
    from graph_durable.nodes.core import GuardBase
    from graph_durable.nodes.sync_driver import SyncDriver

    def claim_many(self: Any, intents: Sequence[Any], config: Any = None) -> list[Any]:
        return [(planned[2], True) for planned in self._plan_intents(list(intents),
                                                                      (None, None))]

    def defer(self: Any, write: Any, config: Any) -> bool:
        return isinstance(write, TransitionWrite) and write.defer

    def check_write_txn(self: Any, cur: Any, thread_id: str, config: Any) -> None:
        if self._needs_flow_check(thread_id):
            row = cur.execute(_sql.SELECT_FLOW_VERSION, (thread_id,)).fetchone()
            for statement in self._flow_statements(row, thread_id):
                cur.execute(*statement)
        self._flush_deferred_txn(cur, thread_id)

    unobserved = _Unobserved()

    def run(self: Any, request: Any, execute: Callable[[Any], Any], on_ask: Any,
            started: Any = None, repeats: bool = True) -> Any:
        if started is None:
            return execute(request)
        ctx = started.ctx  # the key the tool reads, as the protocol would hand it
        token = _CURRENT.set(EffectContext(
            key=ctx.key, thread_id=ctx.thread_id, tool_call_id=ctx.tool_call_id,
            tool=ctx.tool, attempt=1, fencing_token=None))
        try:
            return execute(request)
        finally:
            _CURRENT.reset(token)

    return {
        "claim": [(DurableSqliteSaver, "claim_many", claim_many)],
        "receipts": [(DurableSaverMixin, "_defer", defer)],
        "fence read": [(SqliteTransactions, "_check_write_txn", check_write_txn)],
        "telemetry": [(GuardBase, "_observing", lambda self, started: unobserved)],
        "protocol": [(SyncDriver, "run", run)],
    }[name]


def _checked(name: str) -> Callable[[Any, int], None]:
    """`turn_overhead._check`, for a guard with `name` taken out: the turn answers as
    before, and the ledger shows the part gone (no applied call where it wrote them)."""
    from benchmarks import turn_overhead

    check = turn_overhead._check
    return lambda agent, n_calls: check(agent, n_calls,
                                        n_calls if _APPLIED_LEFT[name] else 0)


def take_out(name: str) -> None:
    """Take knockout `name` out of the guard in this process (`NONE`: nothing), and
    make `turn_overhead`'s check expect it. Not safe: for a measuring child only."""
    from benchmarks import turn_overhead

    checked = _checked(name)
    if name != NONE:
        targets(name)
        for owner, attribute, replacement in _patches(name):
            setattr(owner, attribute, replacement)
    turn_overhead._check = checked  # type: ignore[assignment]


def prelude(name: str) -> str:
    """The code a measuring child runs first, for knockout `name`."""
    return f"from benchmarks.knockouts import take_out\ntake_out({name!r})\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Alternate the whole guard and the knockouts, one child each per round; print the
    table and what each part costs."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.knockouts",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, nargs="+", default=[1, 5],
                        help="tool calls per turn (default: 1 5)")
    parser.add_argument("--only", nargs="+", choices=sorted(KNOCKOUTS),
                        default=list(KNOCKOUTS), help="the knockouts to measure")
    parser.add_argument("--rounds", type=int, default=4, help="children per knockout")
    parser.add_argument("--turns", type=int, default=150, help="turns per repetition")
    parser.add_argument("--repetitions", type=int, default=3,
                        help="repetitions in each child (its median is the round's)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed turns per side")
    args = parser.parse_args(argv)
    names = [NONE, *args.only]
    rounds: list[Round] = []
    for n_calls in args.calls:
        for index in range(args.rounds):
            for name in names if index % 2 == 0 else names[::-1]:
                one = measure(ROOT, name, n_calls, turns=args.turns,
                              repetitions=args.repetitions, warmup=args.warmup,
                              encrypted=False, prelude=prelude(name))
                rounds.append(one)
                print(f"  {name} {n_calls} call(s), round {index + 1}: wall {one.wall:.3f}, "
                      f"CPU {one.cpu:.3f}", flush=True)
    print("\n".join(summary(rounds, names)))
    print("\n".join(costs(rounds, names)))
    return 0


def costs(rounds: Sequence[Round], names: Sequence[str]) -> list[str]:
    """What each part costs: the whole guard's median ratio minus the median without it,
    wall and CPU, per calls per turn."""
    lines = [f"{'taken out':<14}{'calls':>6}{'wall cost':>11}{'CPU cost':>10}  what"]
    for n_calls in sorted({one.n_calls for one in rounds}):
        def median(name: str, field: str) -> float | None:
            mine = [getattr(one, field) for one in rounds
                    if one.revision == name and one.n_calls == n_calls]
            return statistics.median(mine) if mine else None

        whole_wall, whole_cpu = median(NONE, "wall"), median(NONE, "cpu")
        for name in names:
            wall, cpu = median(name, "wall"), median(name, "cpu")
            if name == NONE or None in (wall, cpu, whole_wall, whole_cpu):
                continue
            lines.append(f"{name:<14}{n_calls:>6}{whole_wall - wall:>+11.3f}"  # type: ignore[operator]
                         f"{whole_cpu - cpu:>+10.3f}  {KNOCKOUTS[name]}")  # type: ignore[operator]
    return lines


if __name__ == "__main__":
    sys.exit(main())
