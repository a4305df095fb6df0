"""PostgreSQL under concurrency: parallel turns on one connection pool, and recovery
throughput with 1, 2 and 4 worker processes.

A throwaway PostgreSQL server is started as in `benchmarks.turn_overhead_postgres`
(`graph_durable.testing.postgres.PostgresServer`: fresh cluster, 127.0.0.1, `fsync` and
`synchronous_commit` on) and stopped at the end. The server's processes share the
machine's CPUs with the benchmark (and with the worker processes of part 2).

1. Parallel turns in one process. `PARALLEL` (8) Python threads each run
   `BENCH_PARALLEL_TURNS` (default 40) turns of the 1-tool-call scenario of
   `turn_overhead` (model -> tools -> model, `durability="sync"`), every turn on a
   thread_id of its own, never used before, through ONE compiled graph whose saver sits
   on ONE `psycopg_pool.ConnectionPool(min_size=8, max_size=8)` opened as LangGraph
   expects (`autocommit=True, prepare_threshold=0, row_factory=dict_row`):

   - stock:   LangGraph `ToolNode` + `PostgresSaver(pool)`
   - guarded: `EffectGuardNode`, the tool declared `Effect(idempotent=True)`, +
              `DurablePostgresSaver(pool)`

   Each variant has its own database, `setup()` and one checked turn before timing and
   one untimed warm-up run of `WARMUP_TURNS` turns per thread. Then `REPETITIONS` runs
   per variant alternate (A B, B A, ...); a run is timed from releasing the 8 threads
   (a barrier) until the last one has finished, and its outputs are checked afterwards
   (untimed). Reported: the median over the runs of the wall time per turn (run time /
   turns of all threads). The project's target is on throughput, guarded/stock turns
   per second >= 0.8 (higher is better); the harness's ratio is measured/baseline with
   a target to stay at or below, so the row holds wall time per turn and its target is
   the same condition, guarded/stock time <= 1 / 0.8 = 1.25. The turns per second of
   both variants and their ratio are printed under the table and kept in
   `latest.json` (`details`).

   The same with asyncio: `PARALLEL` tasks on one event loop each run the turns of their
   own threads with `graph.ainvoke` (an async model node and an async tool, see
   `turn_overhead_postgres.compile_async`), through ONE graph whose saver sits on ONE
   `psycopg_pool.AsyncConnectionPool(min_size=8, max_size=8)`:

   - stock:   `ToolNode` + `AsyncPostgresSaver(pool)`
   - guarded: `EffectGuardNode` + `AsyncDurablePostgresSaver(pool)`

   Timed from releasing the tasks (an `asyncio.Event`) until the last has finished; the
   rest (checks, warm-up, alternation, medians, target) as for the threads. The loop runs
   in a thread of its own, as in `turn_overhead_postgres`.

2. Recovery throughput. For W in 1, 2 and 4 (interleaved over `BENCH_RECOVERY_REPS`
   repetitions, default 3), on a fresh database and provider folder each time: the
   ticket agent (`graph_durable.demo.ticket.build_ticket_agent`, tickets looked up by
   key, emails deduped) runs `BENCH_RECOVERY_THREADS` (default 60) threads in this
   process, each stopped by an injected crash right after its ticket reached the
   provider, before the receipt (as in tests/test_recover_postgres.py). Then W worker
   processes (`python -c`) each build the agent and loop `graph_durable.operators.recovery.recover`
   until no thread is orphaned or held. Timed: from starting the first worker to the
   last one exiting, so it includes each worker's interpreter start-up, imports and
   graph build (~1-2 s, paid in parallel by the W workers); the rows report threads
   recovered per second over that time, with W=1 as the baseline (the ratio is the
   speedup; no target). Under the table: the sweep alone (from the first worker's
   first `recover` to the last worker's end) and its speedup. After each run, untimed:
   every thread is `done`, each ticket and each email exists once at its provider, and
   the workers resumed every thread exactly once between them; otherwise the benchmark
   fails. The machine's CPU count bounds the scaling (2 cores: little beyond 2 workers).

Needs what `turn_overhead_postgres` needs (`pip install 'graph-durable[postgres]'`, which
brings psycopg_pool, and PostgreSQL's server binaries); without them it is skipped.

Run: `python -m benchmarks postgres_workers` (or `python -m benchmarks.postgres_workers`).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any


from benchmarks import _parallel
from benchmarks._parallel import (
    PARALLEL,
    REPETITIONS,
    TIMING,
    TURNS_PER_THREAD,
    WARMUP_TURNS,
    run_tasks,
    run_threads,
)
from benchmarks._runner import ROOT, Comparison, Timing, package_version, report, run_main
from benchmarks.turn_overhead import Agent, _compile, _guarded_node, _stock_node
from benchmarks.turn_overhead_postgres import (
    _Loop,
    _postgres_server,
    _require_postgres,
    _server_version,
    compile_async,
)
from graph_durable.testing.faults import ENV_FAULTS, ENV_TRACE
from graph_durable.testing.postgres import PostgresServer

__all__ = [
    "PARALLEL",
    "RECOVERY_REPETITIONS",
    "RECOVERY_THREADS",
    "REPETITIONS",
    "TARGET_THROUGHPUT",
    "TURNS_PER_THREAD",
    "WORKERS",
    "build_guarded",
    "build_stock",
    "main",
    "measure_parallel",
    "measure_parallel_async",
    "measure_recovery",
]

TARGET_THROUGHPUT = 0.8
"""The project's target: guarded/stock turns per second at least this."""

WORKERS: tuple[int, ...] = (1, 2, 4)
"""Worker process counts of the recovery sweep."""

RECOVERY_THREADS = int(os.environ.get("BENCH_RECOVERY_THREADS", "60"))
"""Orphaned threads per recovery run (`BENCH_RECOVERY_THREADS`)."""

RECOVERY_REPETITIONS = int(os.environ.get("BENCH_RECOVERY_REPS", "3"))
"""Recovery runs per worker count, interleaved (`BENCH_RECOVERY_REPS`)."""

LEASE_TTL = 10.0
"""Lease time-to-live of the workers (none is killed, so no lease has to expire)."""

WORKER_TIMEOUT = 180.0
"""A worker that has not finished the sweep after this many seconds gives up."""


_POOL_MODULES = ("psycopg_pool",)


# -- part 1: parallel turns on one pool --------------------------------------------------


def _pool(conninfo: str) -> Any:
    """`PARALLEL` connections, opened as LangGraph's `PostgresSaver` expects, all open."""
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    pool = ConnectionPool(
        conninfo, min_size=PARALLEL, max_size=PARALLEL, open=True,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
    )
    pool.wait(timeout=30)
    return pool


def build_stock(conninfo: str) -> Agent:
    """LangGraph's `ToolNode` with LangGraph's `PostgresSaver` on a pool of `PARALLEL`."""
    from langgraph.checkpoint.postgres import PostgresSaver

    pool = _pool(conninfo)
    saver = PostgresSaver(pool)
    saver.setup()
    return _compile("stock", _stock_node(), saver, pool, 1)


def build_guarded(conninfo: str) -> Agent:
    """`EffectGuardNode` with `DurablePostgresSaver` on a pool of `PARALLEL`."""
    from graph_durable.checkpointers.postgres import DurablePostgresSaver

    pool = _pool(conninfo)
    saver = DurablePostgresSaver(pool)
    saver.setup()
    return _compile("guarded", _guarded_node(), saver, pool, 1)


def measure_parallel(server: PostgresServer, *, timing: Timing = TIMING) -> Comparison:
    """Time `PARALLEL` threads of turns on one pool, stock and guarded runs alternating."""
    agents = {"stock": build_stock(server.create_database("parallel_stock")),
              "guarded": build_guarded(server.create_database("parallel_guarded"))}
    return _measure(agents, run_threads, "threads", timing)


# -- part 1, async: parallel tasks on one AsyncConnectionPool ----------------------------


def _build_async(name: str, conninfo: str, runner: Any) -> Any:
    """An `AsyncAgent` (stock or guarded, by `name`) on an `AsyncConnectionPool` of
    `PARALLEL`, all of its connections open."""
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    from graph_durable.checkpointers.postgres import AsyncDurablePostgresSaver

    async def build() -> Any:
        pool = AsyncConnectionPool(
            conninfo, min_size=PARALLEL, max_size=PARALLEL, open=False,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row})
        await pool.open(wait=True, timeout=30)
        saver = (AsyncDurablePostgresSaver if name == "guarded" else AsyncPostgresSaver)(pool)
        await saver.setup()
        return compile_async(name, saver, pool, 1, runner)

    return runner.run(build())


def measure_parallel_async(server: PostgresServer, *, timing: Timing = TIMING) -> Comparison:
    """Time `PARALLEL` asyncio tasks of turns on one pool, stock and guarded alternating."""
    runner = _Loop()
    try:
        agents = {"stock": _build_async("stock", server.create_database("aparallel_stock"),
                                        runner),
                  "guarded": _build_async("guarded",
                                          server.create_database("aparallel_guarded"), runner)}
        return _measure(agents, lambda agent, tag, turns: run_tasks(agent, tag, turns,
                                                                      runner.run),
                        "asyncio tasks", timing)
    finally:
        runner.stop()


def _measure(agents: dict[str, Any], run: Callable[[Any, str, int], float], workers: str,
             timing: Timing) -> Comparison:
    """`measure_parallel` of `_parallel`, `workers` naming what runs the turns."""
    return _parallel.measure_parallel(
        agents, run,
        f"postgres, {PARALLEL} {workers} on a pool of {PARALLEL}: wall time per turn, "
        "1 tool call",
        target_throughput=TARGET_THROUGHPUT, timing=timing,
        details={"workers": workers, "threads": PARALLEL, "parallel": PARALLEL,
                 "pool_size": PARALLEL, "turns_per_thread": timing.turns})


# -- part 2: recovery with worker processes ----------------------------------------------

WORKER = r"""
import json, sys, time
started = time.time()
from graph_durable.demo.ticket import build_ticket_agent
from graph_durable.operators.recovery import recover, thread_status

conninfo, provider_dir, owner = sys.argv[1], sys.argv[2], sys.argv[3]
ttl, timeout = float(sys.argv[4]), float(sys.argv[5])
agent = build_ticket_agent("unused", provider_dir, "lookup", "dedupe", postgres=conninfo)
ready = time.time()
resumed, sweeps, deadline = 0, 0, time.monotonic() + timeout
while True:
    outcomes = recover(agent.graph, agent.saver, owner, ttl=ttl)
    sweeps += 1
    resumed += sum(o.outcome == "resumed" for o in outcomes)
    errors = [f"{o.thread_id}: {o.error}" for o in outcomes if o.outcome == "error"]
    if errors:
        print(json.dumps({"owner": owner, "errors": errors[:3]}), flush=True)
        sys.exit(1)
    if not any(thread_status(agent.saver, t).status in ("orphaned", "running")
               for t in agent.saver.thread_ids()):
        break
    if time.monotonic() > deadline:
        print(json.dumps({"owner": owner, "errors": ["sweep timed out"]}), flush=True)
        sys.exit(2)
    time.sleep(0.05)
done = time.time()
agent.saver.conn.close()
print(json.dumps({"owner": owner, "resumed": resumed, "sweeps": sweeps,
                  "started": started, "ready": ready, "done": done}), flush=True)
"""
"""A worker process: build the ticket agent, `recover()` until nothing is left."""


def _orphan_threads(conninfo: str, provider_dir: str, n_threads: int) -> None:
    """Run `n_threads` ticket threads here, each stopped after its ticket, before the receipt."""
    from graph_durable.demo.ticket import build_ticket_agent
    from graph_durable.testing import FaultPlan, InjectedCrash, arm, disarm

    agent = build_ticket_agent("unused", provider_dir, "lookup", "dedupe", postgres=conninfo)
    try:
        for n in range(n_threads):
            arm(FaultPlan("after_effect", tool="create_ticket", action="raise"))
            try:
                agent.graph.invoke(agent.inputs, {"configurable": {"thread_id": f"t{n:03}"}},
                                   durability="sync")
            except InjectedCrash:
                pass
            else:
                raise RuntimeError(f"thread t{n:03} was not stopped by the injected crash")
            finally:
                disarm()
    finally:
        agent.saver.conn.close()


def _verify(conninfo: str, provider_dir: str, n_threads: int) -> None:
    """Every thread done; each ticket and each email applied once at its provider."""
    from graph_durable.checkpointers.postgres import DurablePostgresSaver
    from graph_durable.operators.recovery import thread_status
    from graph_durable.testing.providers import FakeProvider

    with DurablePostgresSaver.from_conn_string(conninfo) as saver:
        statuses = {t: thread_status(saver, t).status for t in saver.thread_ids()}
    not_done = {t: s for t, s in statuses.items() if s != "done"}
    if len(statuses) != n_threads or not_done:
        raise RuntimeError(f"after recovery: {len(statuses)} threads (expected {n_threads}), "
                           f"not done: {dict(list(not_done.items())[:5])}")
    for file, mode, name in (("tickets.sqlite", "lookup", "ticket"),
                             ("mail.sqlite", "dedupe", "email")):
        provider = FakeProvider(os.path.join(provider_dir, file), mode, name=name)
        counts = provider.counts()
        if provider.count() != n_threads or set(counts.values()) != {1}:
            wrong = {k: v for k, v in counts.items() if v != 1}
            raise RuntimeError(f"{name} provider: {provider.count()} applied for "
                               f"{n_threads} threads, keys not applied once: {wrong}")


def _recover_run(server: PostgresServer, workdir: str, workers: int, rep: int,
                 n_threads: int) -> dict[str, Any]:
    """Orphan `n_threads` threads on a fresh database, sweep them with `workers` processes."""
    conninfo = server.create_database(f"recover_w{workers}_r{rep}")
    provider_dir = os.path.join(workdir, f"providers-w{workers}-r{rep}")
    started = time.perf_counter()
    _orphan_threads(conninfo, provider_dir, n_threads)
    orphan_s = time.perf_counter() - started
    env = {k: v for k, v in os.environ.items() if k not in (ENV_FAULTS, ENV_TRACE)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    with tempfile.TemporaryFile("w+") as errfile:  # a file: a full pipe would block a worker
        t0 = time.time()
        start = time.perf_counter()
        procs = [subprocess.Popen(
            [sys.executable, "-c", WORKER, conninfo, provider_dir, f"worker-{i}",
             str(LEASE_TTL), str(WORKER_TIMEOUT)],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=errfile, text=True) for i in range(workers)]
        outs = [proc.communicate(timeout=WORKER_TIMEOUT + 60)[0] for proc in procs]
        wall_s = time.perf_counter() - start
        errfile.seek(0)
        err = errfile.read()
    failed = [(i, p.returncode, out) for i, (p, out) in enumerate(zip(procs, outs))
              if p.returncode != 0]
    if failed:
        raise RuntimeError(f"recovery worker(s) failed: {failed}\n{err[-3000:]}")
    reports = [json.loads(out.splitlines()[-1]) for out in outs]
    resumed = sum(r["resumed"] for r in reports)
    if resumed != n_threads:
        raise RuntimeError(f"{workers} workers resumed {resumed} threads, expected "
                           f"{n_threads}: {reports}")
    _verify(conninfo, provider_dir, n_threads)
    sweep_s = max(r["done"] for r in reports) - min(r["ready"] for r in reports)
    return {
        "wall_s": wall_s,
        "sweep_s": sweep_s,
        "startup_s": statistics.median(r["ready"] - t0 for r in reports),
        "orphan_s": orphan_s,
        "resumed": [r["resumed"] for r in reports],
        "sweeps": [r["sweeps"] for r in reports],
    }


def measure_recovery(
    server: PostgresServer,
    *,
    workers: tuple[int, ...] = WORKERS,
    repetitions: int = RECOVERY_REPETITIONS,
    n_threads: int = RECOVERY_THREADS,
    progress: Callable[[str], None] | None = print,
) -> list[Comparison]:
    """Recovery throughput for each worker count, runs interleaved; W = workers[0] is
    the baseline of every row."""
    runs: dict[int, list[dict[str, Any]]] = {w: [] for w in workers}
    with tempfile.TemporaryDirectory(prefix="graph-durable-pg-workers-") as workdir:
        for rep in range(repetitions):
            for w in workers if rep % 2 == 0 else tuple(reversed(workers)):
                runs[w].append(_recover_run(server, workdir, w, rep, n_threads))
            if progress is not None:
                progress(f"  rep {rep + 1}/{repetitions}: " + ", ".join(
                    f"{w}w {n_threads / runs[w][-1]['wall_s']:.1f} threads/s "
                    f"(sweep {n_threads / runs[w][-1]['sweep_s']:.1f}, resumed "
                    f"{'+'.join(map(str, runs[w][-1]['resumed']))})" for w in workers))
    rate = {w: [n_threads / r["wall_s"] for r in runs[w]] for w in workers}
    sweep_rate = {w: [n_threads / r["sweep_s"] for r in runs[w]] for w in workers}
    med = {w: statistics.median(rate[w]) for w in workers}
    sweep_med = {w: statistics.median(sweep_rate[w]) for w in workers}
    base = workers[0]

    def plural(w: int) -> str:
        return f"{w} worker{'s' if w > 1 else ''}"

    print(f"recovery speedup vs {plural(base)}: " + ", ".join(
        f"{plural(w)} x{med[w] / med[base]:.2f} (sweep alone x"
        f"{sweep_med[w] / sweep_med[base]:.2f})" for w in workers), flush=True)
    return [
        Comparison(
            scenario=f"recover {n_threads} orphaned threads, {plural(w)}: threads/s",
            stock_ms=med[base],
            guarded_ms=med[w],
            stock_samples_ms=rate[base],
            guarded_samples_ms=rate[w],
            labels=(plural(base), plural(w)),
            unit="threads/s",
            note=(f"from starting the workers to the last exit (start-up median "
                  f"{statistics.median(r['startup_s'] for r in runs[w]):.2f} s); the sweep "
                  f"alone {sweep_med[w]:.1f} threads/s, x{sweep_med[w] / sweep_med[base]:.2f}"
                  f" vs {plural(base)}; speedup = ratio, higher is better"),
            details={"runs": runs[w], "threads_per_s": rate[w],
                     "sweep_threads_per_s": sweep_rate[w], "workers": w,
                     "threads": n_threads, "lease_ttl": LEASE_TTL},
        )
        for w in workers
    ]


# -- the benchmark -----------------------------------------------------------------------


def main() -> list[Comparison]:
    """Run both parts on one throwaway server, print the table, append the rows."""
    _require_postgres(*_POOL_MODULES)
    comparisons: list[Comparison] = []
    with _postgres_server() as server:
        versions = {
            "postgres": _server_version(server),
            "psycopg": package_version("psycopg"),
            "psycopg-pool": package_version("psycopg-pool"),
            "langgraph-checkpoint-postgres": package_version("langgraph-checkpoint-postgres"),
        }
        print(f"{PARALLEL} threads on one pool of {PARALLEL}: a warm-up run of "
              f"{WARMUP_TURNS} turns per thread, then {REPETITIONS} runs x {TURNS_PER_THREAD} "
              "turns per thread per variant, runs alternating", flush=True)
        comparisons.append(measure_parallel(server))
        print(f"{PARALLEL} asyncio tasks on one AsyncConnectionPool of {PARALLEL}, the same "
              "runs", flush=True)
        comparisons.append(measure_parallel_async(server))
        print(f"recovery of {RECOVERY_THREADS} orphaned ticket threads by "
              f"{', '.join(map(str, WORKERS))} worker processes, {RECOVERY_REPETITIONS} "
              "runs each, interleaved, a fresh database each run", flush=True)
        comparisons.extend(measure_recovery(server))
    report(f"PostgreSQL under concurrency: {PARALLEL} threads (or asyncio tasks) on one "
           "pool, guarded (EffectGuardNode + DurablePostgresSaver, async: "
           "AsyncDurablePostgresSaver) vs stock (ToolNode + PostgresSaver, async: "
           f"AsyncPostgresSaver), durability='sync'; recovery by {'/'.join(map(str, WORKERS))} worker processes",
           comparisons, benchmark="postgres_workers", extra_versions=versions)
    return comparisons


if __name__ == "__main__":
    raise SystemExit(run_main(main))
