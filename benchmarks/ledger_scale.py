"""Ledger reads do not grow with the ledger: 1,000 vs 1,000,000 effects in one database.

Two databases are set up with `DurableSqliteSaver.setup()` (LangGraph's tables and the
ledger migrations of `graph_durable/checkpointers/_schema.py`), then filled in bulk with
plain SQL in one transaction (`synchronous=OFF` and a rollback journal while loading,
WAL again afterwards): `SMALL` and `LARGE` applied effects in threads of
`PER_THREAD` effects, each effect with its two journal events (intent, receipt), rows
shaped like the guard's own: keys from `derive_key`, canonical JSON arguments, a JSON
receipt and the tool's `ToolMessage` serialized with the saver's serde as result. No
`ANALYZE` is run, as graph_durable does not run it either.

Timed, interleaved call by call between the two databases (warm OS page cache; the
saver's own connection, SQLite's default 2 MiB page cache), each call a batch of random
existing effects or threads:

- `saver.effect(key, thread_id)`: the guard's read before every effect (primary key);
- `saver.effects(thread_id)`: one thread's effects, oldest first (10 records);
- `saver.effect(key)`: lookup by key alone (index `effects_key`).

Target: large / small at most 2 for each. Also reported: the database's size per
effect in bytes (file size / effects), and how it splits into tables and indexes.

Run: `python -m benchmarks ledger_scale` (or `python -m benchmarks.ledger_scale`); set
`BENCH_LEDGER_ROWS` for another large size.
"""

from __future__ import annotations

import os
import random
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from langchain_core.messages import ToolMessage

from benchmarks._runner import Comparison, measure_interleaved, report, run_main
from graph_durable import DurableSqliteSaver
from graph_durable.checkpointers._sql import to_json
from graph_durable.ledger import canonical_json, derive_key

__all__ = ["LARGE", "PER_THREAD", "SMALL", "TARGET", "fill", "main"]

SMALL = 1_000
LARGE = int(os.environ.get("BENCH_LEDGER_ROWS", "1000000"))
PER_THREAD = 10
"""Effects per thread."""

TARGET = 2.0
REPETITIONS = 7
ROUNDS = 30
"""Calls of each case per repetition."""

BATCH = {"lookup": 200, "listing": 20, "lookup by key": 200}
"""Reads per timed call."""

TOOL = "record_note"

_INSERT_EFFECT = (
    "INSERT INTO effects (thread_id, key, checkpoint_ns, tool_call_id, tool, args, status, "
    "receipt, result_type, result, error, attempts, decision, asked, created_at, "
    "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_EVENT = (
    "INSERT INTO effect_events (key, thread_id, kind, data, at, owner, fencing_token) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def _thread_id(t: int) -> str:
    return f"thread-{t:09d}"


def _effect(i: int) -> tuple[str, str, str, str, dict[str, Any]]:
    """`(thread_id, key, checkpoint_ns, tool_call_id, args)` of effect `i`."""
    thread_id = _thread_id(i // PER_THREAD)
    checkpoint_ns = f"tools:{i:08x}-0000-4000-8000-{i:012x}"
    tool_call_id = f"call_{i:024x}"
    args = {"note": f"note {i}"}
    key = derive_key(thread_id=thread_id, checkpoint_ns=checkpoint_ns,
                     tool_call_id=tool_call_id, tool=TOOL, args=args)
    return thread_id, key, checkpoint_ns, tool_call_id, args


def fill(db_path: str, n: int) -> dict[str, Any]:
    """Create the schema with the saver and insert `n` applied effects and their events."""
    with DurableSqliteSaver.from_conn_string(db_path) as saver:
        saver.setup()
        result_type, result = saver.serde.dumps_typed(
            ToolMessage(content="recorded 'note 0'", name=TOOL, tool_call_id="call_0"))
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("PRAGMA cache_size=-262144")
        keys: list[tuple[str, str]] = []
        now = time.time() - n

        def effects() -> Iterator[tuple[Any, ...]]:
            for i in range(n):
                thread_id, key, ns, call_id, args = _effect(i)
                keys.append((thread_id, key))
                yield (thread_id, key, ns, call_id, TOOL, canonical_json(args), "applied",
                       to_json(f"recorded 'note {i}'"), result_type, result, None, 1, None,
                       0, now + i, now + i)

        def events() -> Iterator[tuple[Any, ...]]:
            for i, (thread_id, key) in enumerate(keys):
                intent = to_json({"status": "in_flight", "tool": TOOL,
                                  "tool_call_id": f"call_{i:024x}"})
                yield (key, thread_id, "intent", intent, now + i, None, None)
                yield (key, thread_id, "receipt",
                       to_json({"source": "tool", "status": "applied"}), now + i, None, None)

        conn.execute("BEGIN")
        conn.executemany(_INSERT_EFFECT, effects())
        conn.executemany(_INSERT_EVENT, events())
        conn.execute("COMMIT")
        conn.execute("PRAGMA journal_mode=WAL")
    finally:
        conn.close()
    return {"keys": keys, "bytes": os.path.getsize(db_path)}


def _space(db_path: str) -> dict[str, int]:
    """Bytes per table and index (SQLite's dbstat), or {} where dbstat is not compiled in."""
    with sqlite3.connect(db_path) as conn:
        try:
            rows = conn.execute(
                "SELECT name, SUM(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC"
            ).fetchall()
        except sqlite3.Error:
            return {}
    return dict(rows)


def _query_plans(saver: DurableSqliteSaver, thread_id: str, key: str) -> dict[str, str]:
    from graph_durable.checkpointers import _sql

    queries = {
        "lookup": (_sql.SELECT_EFFECT, (thread_id, key)),
        "listing": _sql.select_effects(thread_id, None),
        "lookup by key": (_sql.SELECT_EFFECT_BY_KEY, (key,)),
    }
    with saver.cursor(transaction=False) as cur:
        return {
            name: "; ".join(row[-1] for row in cur.execute(f"EXPLAIN QUERY PLAN {sql}", params))
            for name, (sql, params) in queries.items()
        }


class Reader:
    """The saver on one filled database, with random existing keys and threads to read."""

    def __init__(self, db_path: str, keys: list[tuple[str, str]], seed: int) -> None:
        self.conn = sqlite3.connect(db_path, check_same_thread=False)
        self.saver = DurableSqliteSaver(self.conn)
        self.saver.setup()
        rng = random.Random(seed)
        self.keys = rng.sample(keys, min(len(keys), 20_000))
        threads = sorted({thread_id for thread_id, _ in keys})
        self.threads = rng.sample(threads, min(len(threads), 5_000))
        self._k = 0
        self._t = 0

    def lookup(self) -> None:
        for _ in range(BATCH["lookup"]):
            thread_id, key = self.keys[self._k % len(self.keys)]
            self._k += 1
            if self.saver.effect(key, thread_id) is None:
                raise RuntimeError(f"effect {key} of {thread_id} not found")

    def lookup_by_key(self) -> None:
        for _ in range(BATCH["lookup by key"]):
            _, key = self.keys[self._k % len(self.keys)]
            self._k += 1
            if self.saver.effect(key) is None:
                raise RuntimeError(f"effect {key} not found")

    def listing(self) -> None:
        for _ in range(BATCH["listing"]):
            thread_id = self.threads[self._t % len(self.threads)]
            self._t += 1
            if len(self.saver.effects(thread_id)) != PER_THREAD:
                raise RuntimeError(f"thread {thread_id} does not have {PER_THREAD} effects")

    def close(self) -> None:
        self.conn.close()


def main() -> list[Comparison]:
    """Fill both databases, time the reads interleaved, report."""
    comparisons: list[Comparison] = []
    with tempfile.TemporaryDirectory(prefix="graph-durable-ledger-") as workdir:
        filled: dict[int, dict[str, Any]] = {}
        for n in (SMALL, LARGE):
            print(f"filling a ledger of {n:,} effects ({n // PER_THREAD:,} threads) ...",
                  flush=True)
            started = time.perf_counter()
            filled[n] = fill(os.path.join(workdir, f"ledger-{n}.sqlite"), n)
            print(f"  {time.perf_counter() - started:.1f} s, "
                  f"{filled[n]['bytes'] / 1e6:.1f} MB", flush=True)
        space = _space(os.path.join(workdir, f"ledger-{LARGE}.sqlite"))
        readers = {n: Reader(os.path.join(workdir, f"ledger-{n}.sqlite"), filled[n]["keys"],
                             seed=n) for n in (SMALL, LARGE)}
        for info in filled.values():
            info.pop("keys")
        try:
            thread_id, key = readers[LARGE].keys[0]
            plans = _query_plans(readers[LARGE].saver, thread_id, key)
            for name, plan in plans.items():
                print(f"  query plan, {name}: {plan}")
            cases: dict[str, Callable[[Reader], Callable[[], None]]] = {
                "lookup": lambda r: r.lookup,
                "listing": lambda r: r.listing,
                "lookup by key": lambda r: r.lookup_by_key,
            }
            scenario = {
                "lookup": "effect(key, thread_id)",
                "listing": "effects(thread_id), 10 effects",
                "lookup by key": "effect(key), no thread",
            }
            for name, method in cases.items():
                print(f"{scenario[name]}: {REPETITIONS} x {ROUNDS} calls of {BATCH[name]} "
                      "reads per database, interleaved", flush=True)
                samples = measure_interleaved(
                    {str(n): method(readers[n]) for n in (SMALL, LARGE)},
                    repetitions=REPETITIONS, turns=ROUNDS, warmup=3,
                    progress=lambda line: print(line, flush=True),
                )
                # per read, in microseconds
                per = {n: [s * 1e6 / BATCH[name] for s in samples[str(n)]]
                       for n in (SMALL, LARGE)}
                comparisons.append(Comparison.of_samples(
                    scenario[name], per[SMALL], per[LARGE], target=TARGET,
                    labels=(f"{SMALL:,} effects", f"{LARGE:,} effects"), unit="µs",
                    note=f"query plan: {plans[name]}",
                    details={"plan": plans[name], "batch": BATCH[name]},
                ))
        finally:
            for reader in readers.values():
                reader.close()
    per_effect = {n: filled[n]["bytes"] / n for n in (SMALL, LARGE)}
    ledger_bytes = {name: size for name, size in space.items()
                    if name.startswith(("effects", "effect_events", "sqlite_autoindex_effects"))}
    split = ", ".join(f"{name} {size / LARGE:.0f}" for name, size in ledger_bytes.items())
    comparisons.append(Comparison(
        scenario="database size per effect",
        stock_ms=per_effect[SMALL],
        guarded_ms=per_effect[LARGE],
        labels=(f"{SMALL:,} effects", f"{LARGE:,} effects"), unit="B",
        note=(f"file size / effects, each effect with 2 journal events; at {LARGE:,}: "
              f"{split} (bytes per effect, per table or index; the small file also holds "
              "the schema and LangGraph's empty tables)"),
        details={"bytes": {str(n): filled[n]["bytes"] for n in (SMALL, LARGE)},
                 "space": space},
    ))
    report(f"ledger reads with {SMALL:,} vs {LARGE:,} effects in the database "
           f"(threads of {PER_THREAD}), DurableSqliteSaver", comparisons,
           benchmark="ledger_scale")
    return comparisons


if __name__ == "__main__":
    raise SystemExit(run_main(main))
