"""What a crash run left behind, read by the sweep between and after its processes: the
fault points a child's trace reached, the run's database opened read-only, its ledger,
its providers' effects, the snapshot compared with the fault-free run, and what the
resumes cost.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any

from graph_durable.testing.crash.report import CrashPoint, Snapshot, normalize
from graph_durable.testing.providers import FakeProvider

__all__ = [
    "ledger_of",
    "provider_effects",
    "providers_in",
    "read_only",
    "resume_costs",
    "snapshot_of",
    "thread_started",
    "trace_points",
]


def providers_in(provider_dir: str) -> dict[str, FakeProvider]:
    if not os.path.isdir(provider_dir):
        return {}
    stems = sorted(n.removesuffix(".sqlite") for n in os.listdir(provider_dir)
                   if n.endswith(".sqlite"))
    # Opened to read; "lookup" lets a resolver call find() whatever the scenario's mode.
    return {stem: FakeProvider(os.path.join(provider_dir, f"{stem}.sqlite"), "lookup",
                               name=stem) for stem in stems}

def trace_points(path: str, phase: int) -> list[CrashPoint]:
    """Points of a trace file, with occurrences counted as `FaultPlan` counts them."""
    if not os.path.exists(path):
        return []
    seen: dict[tuple[str, str | None], int] = {}
    points = []
    with open(path, encoding="utf-8") as trace:
        for line in trace:
            entry = json.loads(line)
            point, tool = entry["point"], entry["tool"]
            # A plan without a tool counts every tool's visits; a plan with one, its own.
            for counter in {(point, None), (point, tool)}:
                seen[counter] = seen.get(counter, 0) + 1
            points.append(CrashPoint(point, tool, seen[(point, tool)], phase))
    return points

@contextmanager
def read_only(kwargs: Mapping[str, Any]) -> Iterator[Any]:
    """The run's database, opened to read only (`None` if no process created it yet):
    the SQLite file at `db_path`, or the PostgreSQL database of a `saver` spec.

    Between two processes the parent only looks: it never creates, migrates or writes
    the database, so the next process finds the files as the last one left them.
    """
    # Imported here: the saver module imports graph_durable.testing.faults, which loads
    # this package, so a module-level import would be circular.
    from graph_durable.checkpointers.sqlite import DurableSqliteSaver

    spec = kwargs.get("saver") or {}
    if spec.get("backend", "sqlite") != "sqlite":
        with _postgres_reader(spec["conninfo"]) as saver:
            yield saver
        return
    db_path = kwargs["db_path"]
    if not os.path.exists(db_path):
        yield None
        return
    saver = DurableSqliteSaver.open_read_only(db_path)
    try:
        yield saver
    finally:
        saver.conn.close()


@contextmanager
def _postgres_reader(conninfo: str) -> Iterator[Any]:
    """`DurablePostgresSaver` on `conninfo`, or `None` while no process set it up."""
    import psycopg

    from graph_durable.checkpointers.postgres import DurablePostgresSaver

    with psycopg.connect(conninfo, autocommit=True) as conn:
        found = conn.execute("SELECT to_regclass('checkpoints') IS NOT NULL "
                             "AND to_regclass('effects') IS NOT NULL").fetchone()
    if not found or not found[0]:
        yield None
        return
    with DurablePostgresSaver.from_conn_string(conninfo) as saver:
        yield saver

def thread_started(kwargs: Mapping[str, Any], thread_id: str) -> bool:
    """Whether the run's database holds a checkpoint of `thread_id` (its input was saved)."""
    with read_only(kwargs) as saver:
        config = {"configurable": {"thread_id": thread_id}}
        return saver is not None and saver.get_tuple(config) is not None


def ledger_of(saver: Any, thread_id: str) -> dict[str, str]:
    """Each tool call's ledger statuses (`a/b` for several effects), by tool_call_id."""
    statuses: dict[str, list[str]] = {}
    for record in saver.effects(thread_id) if saver is not None else ():
        statuses.setdefault(record.tool_call_id, []).append(record.status.value)
    return {call: "/".join(found) for call, found in sorted(statuses.items())}


def provider_effects(provider_dir: str
                     ) -> tuple[dict[str, dict[str, dict[str, int]]], list[str]]:
    """Effects per provider, operation and key; and every receipt id handed out."""
    counts: dict[str, dict[str, dict[str, int]]] = {}
    receipt_ids: list[str] = []
    for name, provider in providers_in(provider_dir).items():
        ops = counts.setdefault(name, {})
        for effect in provider.effects():
            keys = ops.setdefault(effect["operation"], {})
            keys[effect["key"]] = keys.get(effect["key"], 0) + 1
            receipt = effect["receipt"]
            if isinstance(receipt, dict) and isinstance(receipt.get("id"), str):
                receipt_ids.append(receipt["id"])
    return counts, receipt_ids


def snapshot_of(kwargs: Mapping[str, Any], thread_id: str, summary: Mapping[str, Any],
                saver: Any) -> Snapshot:
    """What a run of thread `thread_id` left, as a sweep compares it: its final state
    (`summary`, normalized), its ledger (read through `saver`) and its providers' effects."""
    counts, receipt_ids = provider_effects(kwargs["provider_dir"])
    state = {k: summary.get(k) for k in ("messages", "next", "interrupts")}
    return Snapshot(normalize(state, receipt_ids), ledger_of(saver, thread_id), counts)

def resume_costs(kwargs: Mapping[str, Any], thread_id: str, saver: Any) -> dict[str, int]:
    """What the resumes of the row's thread cost (`saver.audit`, as `CrashRow.audit`),
    read through `saver`, or a reader of its own if the run failed before it had one."""
    try:
        with ExitStack() as stack:
            if saver is None:
                saver = stack.enter_context(read_only(kwargs))
            if saver is None:
                return {}
            runs = saver.audit(thread_id).runs
    except Exception:  # a database the failed run left unreadable: no costs to show
        return {}
    return {"models": sum(r.model_calls_repeated or 0 for r in runs),
            "nodes": sum(len(r.nodes_rerun) for r in runs),
            "replayed": sum(len(r.replayed) for r in runs),
            "reconciled": sum(len(r.reconciled) for r in runs),
            "resent": sum(len(r.resent) for r in runs)}
