"""One durable DBOS step vs one guarded effect's ledger writes, same machine, same run.

- DBOS: DBOS Transact (`pip install dbos`) with its system database on SQLite in a
  temporary directory (no server). A workflow runs `STEPS` trivial `@DBOS.step` calls;
  the per-step cost is (workflow with `STEPS` steps - workflow with 0 steps) / `STEPS`,
  so the workflow's own start and end records are not charged to its steps.
- graph_durable: what `EffectGuardNode` writes around one effect: an `IntentWrite`
  (status in_flight) then a `TransitionWrite` to applied with a small receipt and the
  tool's `ToolMessage` as result, i.e. two `DurableSqliteSaver.apply` transactions, on a
  file database (WAL, `synchronous=FULL`, as `setup()` leaves it). One timed call runs
  `STEPS` effects, so both sides are timed in calls of the same size.

DBOS is measured three times:

- `default`: as DBOS sets SQLite up itself (rollback journal, `journal_mode=delete`);
- `wal`: on a file put in WAL mode beforehand, which is what graph_durable's saver uses;
  SQLite's default `synchronous=FULL` applies (DBOS sets no such pragma), as for the
  ledger, so both sides are equally durable;
- `nosync`: both sides with `synchronous=OFF` (DBOS through a custom engine that repeats
  DBOS's own connect settings), i.e. the CPU cost without any fsync. No target: it
  shows how much of the durable numbers is fsync.

When the library's `TransitionWrite` has a `defer` field (the guard then defers the
receipt of an idempotent or looked-up effect: it is committed with the thread's next
write instead of on its own), a second ledger case is measured too: intent, then the
receipt with `defer=True`, one effect after the other on one thread, so each receipt
rides on the next intent's commit (steady state: one commit per effect). It is reported
as its own rows (`intent+deferred receipt`); the two-commit case stays the headline.

Where the time goes: counted with strace on this machine, one ledger effect makes 2
fsyncs (two commits), one DBOS step 4 with the rollback journal and 1 in WAL mode (a
workflow's start and end: 8 and 2). So on a disk whose fsync is slow (other processes
writing), a ledger effect costs about twice a DBOS step in WAL mode whatever the CPU
does; the ratio against the target is decided by the disk's commit latency, which is
printed (`commit` in the context column of results.md).

The three cases of each set-up (ledger, workflow with 0 steps, workflow with `STEPS`
steps) are timed in alternation call by call; per repetition the per-step and
per-effect means are computed, and the medians over the repetitions are reported, with
the ratio graph_durable / DBOS against the target 0.5.

The two do not record the same thing: DBOS records a step's result *after* the step
runs (a crash between the effect and the record re-runs the step), while graph_durable
records the intent and key *before* the effect and the receipt after it.

Run: `python -m benchmarks dbos_step` (or `python -m benchmarks.dbos_step`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import sqlite3
import statistics
import tempfile
from collections.abc import Callable
from typing import Any

from langchain_core.messages import ToolMessage

from benchmarks._runner import (
    BenchmarkSkipped,
    Comparison,
    commit_latency_ms,
    measure_interleaved,
    package_version,
    report,
    require,
    run_main,
)
from graph_durable import DurableSqliteSaver, EffectStatus
from graph_durable.ledger import IntentWrite, TransitionWrite, derive_key

__all__ = ["MODES", "REPETITIONS", "ROUNDS", "STEPS", "TARGET", "DbosApp", "LedgerEffects", "main"]

STEPS = 20
"""Steps per DBOS workflow, and effects per timed ledger call."""

REPETITIONS = 7
ROUNDS = int(os.environ.get("BENCH_DBOS_ROUNDS", "10"))
"""Calls of each case per repetition."""

WARMUP = 3
TARGET = 0.5
"""graph_durable's per-effect ledger cost should be at most this fraction of a DBOS step."""

TOOL = "record_note"

CRASH_NOTE = (
    "DBOS records a step's result after the step runs (a crash between the effect and "
    "the record re-runs the step); graph_durable records the intent and key before the "
    "effect and the receipt after it (a crash in between is reconciled under the same key)."
)


class LedgerEffects:
    """Writes what the guard writes around `n` effects: intent, then receipt, per effect."""

    def __init__(self, db_path: str, *, durable: bool = True, deferred: bool = False) -> None:
        self.deferred = deferred
        self.conn = sqlite3.connect(db_path, check_same_thread=False)
        self.saver = DurableSqliteSaver(self.conn)
        self.saver.setup()
        if not durable:
            self.conn.execute("PRAGMA synchronous=OFF")
        self._ids = itertools.count()

    def effects(self, n: int) -> None:
        """Record `n` effects, each as two durable transactions (intent, then receipt).

        With `deferred`, the receipt is written with `defer=True` and so committed with
        the next effect's intent.
        """
        apply = self.saver.apply
        extra = {"defer": True} if self.deferred else {}
        for _ in range(n):
            i = next(self._ids)
            call_id = f"call_{i}"
            args = {"note": f"note {i}"}
            key = derive_key(thread_id="bench", checkpoint_ns=f"tools:{i}",
                             tool_call_id=call_id, tool=TOOL, args=args)
            apply(IntentWrite(key=key, thread_id="bench", checkpoint_ns=f"tools:{i}",
                              tool_call_id=call_id, tool=TOOL, args=args,
                              status=EffectStatus.IN_FLIGHT))
            result = ToolMessage(content=f"recorded 'note {i}'", name=TOOL,
                                 tool_call_id=call_id)
            apply(TransitionWrite(thread_id="bench", key=key, to=EffectStatus.APPLIED,
                                  kind="receipt", receipt=result.content, result=result,
                                  data={"source": "tool"}, **extra))

    def check(self) -> None:
        """Fail loudly unless every effect written is applied with its receipt."""
        applied = self.saver.effects("bench", status="applied")
        total = self.saver.effects("bench")
        pending = 1 if self.deferred else 0  # the last deferred receipt awaits a next write
        if not applied or len(applied) != len(total) - pending or applied[-1].receipt is None:
            raise RuntimeError(f"ledger: {len(applied)} of {len(total)} effects applied")

    def close(self) -> None:
        self.conn.close()


_WORKFLOWS: dict[str, Callable[[int], Any]] = {}


def _dbos() -> Any:
    """The `DBOS` class, or `BenchmarkSkipped` saying why it cannot be imported."""
    try:
        from dbos import DBOS
    except Exception as exc:
        raise BenchmarkSkipped(
            f"dbos is installed but cannot be imported: {type(exc).__name__}: {exc}"
        ) from exc
    return DBOS


def _register() -> dict[str, Callable[[int], Any]]:
    """Decorate the DBOS step and workflow once per process (DBOS keeps a global registry)."""
    if not _WORKFLOWS:
        DBOS = _dbos()

        @DBOS.step()
        def bench_step(i: int) -> str:
            return f"recorded 'note {i}'"

        @DBOS.workflow()
        def bench_workflow(n: int) -> int:
            for i in range(n):
                bench_step(i)
            return n

        _WORKFLOWS["workflow"] = bench_workflow
    return _WORKFLOWS


def _nosync_engine(url: str) -> Any:
    """A SQLAlchemy engine set up as DBOS sets up its own SQLite engine, plus synchronous=OFF."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)

    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = "IMMEDIATE"
        dbapi_conn.execute("PRAGMA busy_timeout=30000")
        dbapi_conn.execute("PRAGMA foreign_keys=ON")
        dbapi_conn.execute("PRAGMA synchronous=OFF")

    return engine


class DbosApp:
    """A launched DBOS with its system database on SQLite at `path`.

    `mode`: `default` (DBOS's own set-up), `wal` (file in WAL mode beforehand), `nosync`
    (WAL and synchronous=OFF).
    """

    def __init__(self, path: str, mode: str) -> None:
        DBOS = _dbos()
        self.path = path
        self.mode = mode
        if mode in ("wal", "nosync"):
            with sqlite3.connect(path) as conn:
                conn.execute("PRAGMA journal_mode=WAL")
        logging.getLogger("dbos").setLevel(logging.WARNING)
        self.workflow = _register()["workflow"]
        url = f"sqlite:///{path}"
        config: dict[str, Any] = {"name": "graph-durable-bench", "log_level": "WARNING",
                                  "system_database_url": url}
        if mode == "nosync":
            config["system_database_engine"] = _nosync_engine(url)
        try:
            DBOS(config=config)  # type: ignore[arg-type]
            DBOS.launch()
        except Exception as exc:
            DBOS.destroy()
            raise BenchmarkSkipped(
                f"DBOS could not be set up with a SQLite system database at {path}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def run(self, n: int) -> None:
        self.workflow(n)

    def check(self) -> dict[str, Any]:
        """Fail loudly unless a workflow records one output per step; describe the file."""
        from dbos import SetWorkflowID

        workflow_id = f"bench-check-{self.mode}"
        with SetWorkflowID(workflow_id):
            self.workflow(STEPS)
        with sqlite3.connect(self.path) as conn:
            steps = conn.execute(
                "SELECT COUNT(*) FROM operation_outputs WHERE workflow_uuid = ?",
                (workflow_id,),
            ).fetchone()[0]
            journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
        if steps != STEPS:
            raise RuntimeError(f"DBOS recorded {steps} step outputs, expected {STEPS}")
        return {"journal_mode": journal, "step_outputs_recorded": steps}

    def close(self) -> None:
        from dbos import DBOS

        DBOS.destroy()


def defer_supported() -> bool:
    """Whether this graph_durable's `TransitionWrite` can defer a receipt."""
    return any(f.name == "defer" for f in dataclasses.fields(TransitionWrite))


def _measure(
    ledger: LedgerEffects, deferred: LedgerEffects | None, app: DbosApp
) -> dict[str, list[float]]:
    cases = {
        "ledger": lambda: ledger.effects(STEPS),
        "dbos_0": lambda: app.run(0),
        "dbos_n": lambda: app.run(STEPS),
    }
    if deferred is not None:
        cases["ledger_deferred"] = lambda: deferred.effects(STEPS)
    samples = measure_interleaved(
        cases, repetitions=REPETITIONS, turns=ROUNDS, warmup=WARMUP,
        progress=lambda line: print(line, flush=True),
    )
    out = {
        "per_effect": [s * 1000 / STEPS for s in samples["ledger"]],
        "per_step": [(n - z) * 1000 / STEPS
                     for z, n in zip(samples["dbos_0"], samples["dbos_n"])],
        "workflow_0": [s * 1000 for s in samples["dbos_0"]],
        "workflow_n": [s * 1000 for s in samples["dbos_n"]],
    }
    if deferred is not None:
        out["per_effect_deferred"] = [s * 1000 / STEPS for s in samples["ledger_deferred"]]
    return out


MODES = (
    ("default", "DBOS as it sets SQLite up (journal_mode=delete)", TARGET),
    ("wal", "DBOS on a WAL file (as graph_durable's saver), synchronous=FULL both", TARGET),
    ("nosync", "both with synchronous=OFF: CPU cost only, no fsync", None),
)


def main() -> list[Comparison]:
    """Measure the DBOS set-ups against the ledger, print and record the results."""
    require("dbos", why="DBOS Transact is what this benchmark compares against")
    default_sync = sqlite3.connect(":memory:").execute("PRAGMA synchronous").fetchone()[0]
    commit_before = commit_latency_ms()
    print(f"durable commit latency on this disk before the run: {commit_before:.2f} ms",
          flush=True)
    comparisons: list[Comparison] = []
    deferring = defer_supported()
    if not deferring:
        print("note: this graph_durable's TransitionWrite has no `defer`: only the "
              "two-commit effect is measured", flush=True)
    with tempfile.TemporaryDirectory(prefix="graph-durable-dbos-") as workdir:
        ledgers = {
            (durable, deferred): LedgerEffects(
                os.path.join(workdir, f"ledger-{'sync' if durable else 'nosync'}"
                                      f"{'-deferred' if deferred else ''}.sqlite"),
                durable=durable, deferred=deferred)
            for durable in (True, False) for deferred in ((False, True) if deferring else (False,))
        }
        try:
            for mode, what, target in MODES:
                print(f"{what}: {WARMUP} warm-up rounds, then {REPETITIONS} x {ROUNDS} "
                      f"rounds of (ledger x{STEPS}, workflow with 0 steps, workflow with "
                      f"{STEPS} steps), interleaved", flush=True)
                ledger = ledgers[(mode != "nosync", False)]
                deferred = ledgers.get((mode != "nosync", True))
                app = DbosApp(os.path.join(workdir, f"dbos-{mode}.sqlite"), mode)
                try:
                    described = app.check()
                    samples = _measure(ledger, deferred, app)
                finally:
                    app.close()
                sync = "synchronous=OFF" if mode == "nosync" else f"synchronous={default_sync}"
                comparisons.append(Comparison.of_samples(
                    f"DBOS step ({mode}) vs ledger effect", samples["per_step"],
                    samples["per_effect"], target=target,
                    labels=("DBOS step", "intent+receipt"),
                    note=(f"DBOS workflow with 0 steps "
                          f"{statistics.median(samples['workflow_0']):.2f} ms, with {STEPS} "
                          f"steps {statistics.median(samples['workflow_n']):.2f} ms; DBOS "
                          f"journal_mode={described['journal_mode']}, {sync}; ledger WAL, "
                          f"{'synchronous=OFF' if mode == 'nosync' else 'synchronous=FULL'}"),
                    details={**described, **samples, "steps": STEPS, "mode": mode,
                             "commit_ms_before": commit_before},
                ))
                if deferred is not None:
                    comparisons.append(Comparison.of_samples(
                        f"DBOS step ({mode}) vs effect, deferred receipt",
                        samples["per_step"], samples["per_effect_deferred"], target=target,
                        labels=("DBOS step", "intent+deferred receipt"),
                        note=("the receipt with defer=True (what the guard writes for "
                              "idempotent and looked-up tools), committed with the next "
                              "intent: one commit per effect"),
                        details={"mode": mode, "deferred": True},
                    ))
            for ledger in ledgers.values():
                ledger.check()
        finally:
            for ledger in ledgers.values():
                ledger.close()
    report("one durable DBOS step vs the guard's ledger writes for one effect "
           "(IntentWrite + TransitionWrite to applied), SQLite files", comparisons,
           benchmark="dbos_step", extra_versions={"dbos": package_version("dbos")})
    print(f"note: {CRASH_NOTE}")
    return comparisons


if __name__ == "__main__":
    raise SystemExit(run_main(main))
