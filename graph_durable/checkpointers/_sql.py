"""SQL shared by the sync and async SQLite savers, and the ledger transitions as plans.

A *plan* is a list of `(sql, params)` statements computed from the current row; the
sync saver runs it on a `sqlite3` cursor and the async saver on an `aiosqlite` one,
both inside one `BEGIN IMMEDIATE` transaction, so the lifecycle rules live here once.

This module is over 400 lines: every ledger statement is here once, so every engine
runs the same ones (PostgreSQL translates them, `postgres/_sql.pg_sql`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import chain
from typing import Any, NamedTuple

from graph_durable._langgraph import CALLED_TASK_PATH
from graph_durable.checkpointers._decode import PLAIN, effect_from_row, event_from_row
from graph_durable.errors import IllegalTransition
from graph_durable.ledger import EffectRecord, EffectStatus, trusted_record
from graph_durable.secrets import LedgerCodec, column_json

__all__ = [
    "EFFECT_COLUMNS",
    "Journaled",
    "Statement",
    "effect_from_row",
    "event_from_row",
    "insert_events",
    "plan_intent",
    "plan_update",
    "refusal",
    "transition_event",
]

Statement = tuple[str, tuple[Any, ...]]

NULL_TASK_ID = "00000000-0000-0000-0000-000000000000"
RESUME_CHANNEL = "__resume__"

EFFECT_COLUMNS = (
    "key, thread_id, checkpoint_ns, tool_call_id, tool, args, status, receipt, error, "
    "attempts, decision, asked, created_at, updated_at"
)
EVENT_COLUMNS = "seq, key, thread_id, kind, data, at, owner, fencing_token"

SELECT_EFFECT = f"SELECT {EFFECT_COLUMNS} FROM effects WHERE thread_id = ? AND key = ?"
SELECT_EFFECT_BY_KEY = (
    f"SELECT {EFFECT_COLUMNS} FROM effects WHERE key = ? ORDER BY created_at LIMIT 1"
)
# The same requested call, sent (or on its way) by another thread of the family, as
# asked or as a reviewer edited it there. `skipped` is either (an unknown outcome left
# in place, or an edit sent under another key); `failed` and `rejected` were not sent.
# Every such row, oldest first: the caller passes by a call paused there on its tool's
# own question (`sent_from`), which the decision column, sealed or not, tells.
SELECT_SENT_IN_FAMILY = (
    f"SELECT {EFFECT_COLUMNS} FROM effects WHERE key = ? AND thread_id <> ? "
    "AND status IN ('in_flight', 'unknown', 'applied', 'skipped', 'compensated', "
    "'compensation_failed', 'compensation_unknown') "
    "ORDER BY created_at"
)
SELECT_RESULT = ("SELECT result_type, result, receipt, tool, tool_call_id FROM effects "
                 "WHERE thread_id = ? AND key = ?")
SELECT_ASKED_IN_TASK = (
    f"SELECT {EFFECT_COLUMNS} FROM effects "
    "WHERE thread_id = ? AND checkpoint_ns = ? AND asked = 1 ORDER BY created_at"
)
SELECT_CHECKPOINT_EXISTS = (
    "SELECT 1 FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"
)
# Tasks another task called (`CALLED_TASK_PATH`), by the path saved with their writes.
SELECT_CALLED_TASKS = (
    "SELECT DISTINCT task_id FROM writes WHERE thread_id = ? AND checkpoint_ns = ? "
    f"AND checkpoint_id = ? AND substr(task_path, 1, {len(CALLED_TASK_PATH)}) = "
    f"'{CALLED_TASK_PATH}'"
)
DELETE_NULL_RESUME = (
    "DELETE FROM writes WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ? "
    f"AND task_id = '{NULL_TASK_ID}' AND channel = '{RESUME_CHANNEL}'"
)

DELETE_THREAD_LEDGER: tuple[str, ...] = (
    "DELETE FROM effects WHERE thread_id = ?",
    "DELETE FROM effect_events WHERE thread_id = ?",
    "DELETE FROM thread_flow_versions WHERE thread_id = ?",
    "DELETE FROM thread_origins WHERE thread_id = ?",
    "DELETE FROM legacy_key_threads WHERE thread_id = ?",
    "DELETE FROM task_runs WHERE thread_id = ?",
    "DELETE FROM copy_points WHERE thread_id = ?",
)
# Key-scheme pins are kept when a thread is deleted: its copies keep its keys.
# Keys are derived from a thread's origin: the thread itself, or for a copy, the thread
# its history came from (transitively), so the copy finds its source's effects.
SELECT_ORIGIN = "SELECT origin_thread_id FROM thread_origins WHERE thread_id = ?"
# The key thread, whether effects of its family may carry legacy keys (migration 3),
# the key scheme it is pinned to, and the database's own key secret (migration 4).
SELECT_KEYING = (
    "SELECT k.key_thread, EXISTS (SELECT 1 FROM legacy_key_threads l "
    "WHERE l.thread_id IN (?, k.key_thread)), (SELECT s.scheme FROM thread_key_schemes s "
    "WHERE s.thread_id = k.key_thread), (SELECT m.value FROM ledger_meta m "
    "WHERE m.name = 'key_secret') FROM (SELECT COALESCE((SELECT origin_thread_id "
    "FROM thread_origins WHERE thread_id = ?), ?) AS key_thread) k"
)
PIN_KEY_SCHEME = (
    "INSERT OR IGNORE INTO thread_key_schemes (thread_id, scheme, pinned_at) VALUES "
    "(COALESCE((SELECT origin_thread_id FROM thread_origins WHERE thread_id = ?), ?), ?, ?)"
)
INSERT_DB_KEY_SECRET = (
    "INSERT OR IGNORE INTO ledger_meta (name, value) VALUES ('key_secret', ?)"
)
ORIGIN_OF_COPY = (
    "COALESCE((SELECT origin_thread_id FROM thread_origins WHERE thread_id = ?), ?)"
)
UPSERT_ORIGIN = (
    "INSERT INTO thread_origins (thread_id, origin_thread_id, copied_at) "
    f"VALUES (?, {ORIGIN_OF_COPY}, ?) ON CONFLICT (thread_id) DO UPDATE SET "
    "origin_thread_id = excluded.origin_thread_id, copied_at = excluded.copied_at"
)
# A copied thread shares its source's history, so it shares the effects of that history
# under the same keys: a fork must replay a receipt, never send again under a new key.
COPY_THREAD_LEDGER: tuple[str, ...] = (
    "INSERT OR IGNORE INTO effects (thread_id, key, checkpoint_ns, tool_call_id, tool, args, "
    "status, receipt, result_type, result, error, attempts, decision, edited_key, asked, "
    "created_at, updated_at) SELECT ?, key, checkpoint_ns, tool_call_id, tool, args, status, "
    "receipt, result_type, result, error, attempts, decision, edited_key, asked, created_at, "
    "updated_at FROM effects WHERE thread_id = ?",
    "INSERT INTO effect_events (key, thread_id, kind, data, at, owner, fencing_token) "
    "SELECT key, ?, kind, data, at, owner, fencing_token FROM effect_events "
    "WHERE thread_id = ? ORDER BY seq",
    "INSERT OR IGNORE INTO copy_points (thread_id, checkpoint_id, writes_digest, copied_at) "
    "SELECT ?, checkpoint_id, writes_digest, copied_at FROM copy_points WHERE thread_id = ?",
)
COPY_THREAD_CHECKPOINTS: tuple[str, ...] = (
    "INSERT OR REPLACE INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, "
    "parent_checkpoint_id, type, checkpoint, metadata) SELECT ?, checkpoint_ns, "
    "checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata FROM checkpoints "
    "WHERE thread_id = ?",
    "INSERT OR REPLACE INTO writes (thread_id, checkpoint_ns, checkpoint_id, task_id, "
    "task_path, idx, channel, type, value) SELECT ?, checkpoint_ns, checkpoint_id, task_id, "
    "task_path, idx, channel, type, value FROM writes WHERE thread_id = ?",
)
SELECT_RUN_CHECKPOINTS = (
    "SELECT thread_id, checkpoint_ns, checkpoint_id FROM checkpoints "
    "WHERE json_extract(CAST(metadata AS TEXT), '$.run_id') = ?"
)
DELETE_CHECKPOINT = (
    "DELETE FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"
)
DELETE_CHECKPOINT_WRITES = (
    "DELETE FROM writes WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"
)
# keep_latest: everything but the newest checkpoint of each namespace of the thread.
SELECT_PRUNABLE = (
    "SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id FROM checkpoints c "
    "WHERE c.thread_id = ? AND c.checkpoint_id < (SELECT MAX(m.checkpoint_id) FROM checkpoints m "
    "WHERE m.thread_id = c.thread_id AND m.checkpoint_ns = c.checkpoint_ns)"
)
DELETE_THREAD_CHECKPOINTS: tuple[str, ...] = (
    "DELETE FROM checkpoints WHERE thread_id = ?",
    "DELETE FROM writes WHERE thread_id = ?",
)

SELECT_LEASE = "SELECT owner, token, expires_at FROM thread_leases WHERE thread_id = ?"
UPSERT_LEASE = (
    "INSERT INTO thread_leases (thread_id, owner, token, expires_at, acquired_at) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (thread_id) DO UPDATE SET owner = excluded.owner, "
    "token = excluded.token, expires_at = excluded.expires_at, "
    "acquired_at = excluded.acquired_at"
)
# An expired lease is not revived: writes after expiry were already refused.
RENEW_LEASE = (
    "UPDATE thread_leases SET expires_at = ? WHERE thread_id = ? AND token = ? "
    "AND expires_at > ?"
)
RELEASE_LEASE = "UPDATE thread_leases SET expires_at = 0 WHERE thread_id = ? AND token = ?"
# Copy points and step anchors (`graph_durable.nodes.write_keys`): where a thread was
# copied, or copied from (the source's newest root checkpoint and a digest of the
# writes saved under it then), for the source and the copy, carried to later copies;
# a step made again after such a point, anchored once for the family.
SELECT_NEWEST_ROOT = (
    "SELECT checkpoint_id FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = '' "
    "ORDER BY checkpoint_id DESC LIMIT 1"
)
RECORD_COPY_POINT = (
    "INSERT OR IGNORE INTO copy_points (thread_id, checkpoint_id, writes_digest, copied_at) "
    "VALUES (?, ?, ?, ?)"
)
SELECT_STEP_ANCHOR = (
    "SELECT (SELECT a.anchor FROM step_anchors a WHERE a.key_thread = "
    f"{ORIGIN_OF_COPY} AND a.checkpoint_id = ?), EXISTS (SELECT 1 FROM copy_points p "
    "WHERE p.thread_id = ? AND p.checkpoint_id = ?)"
)
SELECT_COPY_POINT = (
    "SELECT 1 FROM copy_points WHERE thread_id = ? AND checkpoint_id = ? AND writes_digest = ?"
)
SELECT_COPY_POINT_STEPS = (
    "SELECT c.checkpoint_id, c.parent_checkpoint_id FROM checkpoints c "
    "WHERE c.thread_id = ? AND c.checkpoint_ns = '' AND c.parent_checkpoint_id IN "
    "(SELECT p.checkpoint_id FROM copy_points p WHERE p.thread_id = ?) "
    "AND json_extract(CAST(c.metadata AS TEXT), '$.source') = 'loop'"
)
RECORD_STEP_ANCHOR = (
    "INSERT OR IGNORE INTO step_anchors (key_thread, checkpoint_id, anchor, anchored_at) "
    f"VALUES ({ORIGIN_OF_COPY}, ?, ?, ?)"
)
SELECT_STEP_WRITES = (
    "SELECT task_id, idx, channel, type, value FROM writes "
    "WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id = ?"
)
# The run log of audited graphs (`graph_durable.operators.audit`).
INSERT_TASK_RUN = (
    "INSERT INTO task_runs (thread_id, run_id, checkpoint_ns, node, kind, at) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
SELECT_TASK_RUNS = (
    "SELECT seq, run_id, checkpoint_ns, node, kind, at FROM task_runs WHERE thread_id = ? "
    "ORDER BY seq"
)
SELECT_LIVE_LEASES = "SELECT thread_id, owner, token, expires_at FROM thread_leases WHERE expires_at > ?"
SELECT_FLOW_VERSION = "SELECT flow_version FROM thread_flow_versions WHERE thread_id = ?"
SELECT_FLOW_VERSIONS = "SELECT thread_id, flow_version FROM thread_flow_versions"
INSERT_FLOW_VERSION = (
    "INSERT INTO thread_flow_versions (thread_id, flow_version, pinned_at) VALUES (?, ?, ?)"
)
# The gauges of `saver.stats()`: effects by status, the questions no decision has
# answered yet (and when the oldest was asked), and the threads with effects.
SELECT_STATUS_COUNTS = "SELECT status, COUNT(*) FROM effects GROUP BY status"
SELECT_WAITING_QUESTIONS = (
    "SELECT COUNT(*), MIN(updated_at) FROM effects WHERE asked = 1 AND decision IS NULL "
    "AND status IN ('awaiting_approval', 'unknown')"
)
SELECT_EFFECT_THREADS = "SELECT COUNT(DISTINCT thread_id) FROM effects"
SELECT_THREAD_IDS = "SELECT DISTINCT thread_id FROM checkpoints WHERE checkpoint_ns = '' ORDER BY thread_id"
UPSERT_CHECKPOINT = (
    "INSERT OR REPLACE INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, "
    "parent_checkpoint_id, type, checkpoint, metadata) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
REPLACE_WRITES = (
    "INSERT OR REPLACE INTO writes (thread_id, checkpoint_ns, checkpoint_id, task_id, "
    "task_path, idx, channel, type, value) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
IGNORE_WRITES = REPLACE_WRITES.replace("INSERT OR REPLACE", "INSERT OR IGNORE")

INSERT_EVENT = (
    "INSERT INTO effect_events (key, thread_id, kind, data, at, owner, fencing_token) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
INSERT_INTENT = (
    "INSERT OR IGNORE INTO effects (thread_id, key, checkpoint_ns, tool_call_id, tool, "
    "args, status, attempts, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# `INSERT_INTENT` for a key no thread holds yet, its parameters followed by the key and
# the thread again: no row is inserted if this thread or another of its family holds the
# key (then `plan_inherit`'s rules decide), so a claim needs no inherit statement when
# the key is new, as it nearly always is.
INSERT_NEW_INTENT = (
    "INSERT OR IGNORE INTO effects (thread_id, key, checkpoint_ns, tool_call_id, tool, "
    "args, status, attempts, created_at, updated_at) SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ? "
    "WHERE NOT EXISTS (SELECT 1 FROM effects WHERE key = ? AND thread_id <> ?)"
)
_EVENTS_PER_INSERT = 100
"""Journal entries per `insert_events` statement (7 parameters each: far below the
999 parameters the oldest SQLite allows a statement)."""


def insert_events(entries: Sequence[tuple[Any, ...]]) -> list[Statement]:
    """Statements inserting journal entries (each `INSERT_EVENT`'s parameters) in their
    order: one per hundred entries, instead of one per entry."""
    statements: list[Statement] = []
    for start in range(0, len(entries), _EVENTS_PER_INSERT):
        chunk = entries[start:start + _EVENTS_PER_INSERT]
        values = ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * len(chunk))
        statements.append((
            "INSERT INTO effect_events (key, thread_id, kind, data, at, owner, fencing_token) "
            f"VALUES {values}", tuple(chain.from_iterable(chunk))))
    return statements


def select_effects(thread_id: str | None, status: str | None) -> Statement:
    """Query listing effects, oldest first, optionally by thread and status."""
    where, params = _where(thread_id=thread_id, status=status)
    return f"SELECT {EFFECT_COLUMNS} FROM effects {where} ORDER BY created_at, key", params


def select_events(thread_id: str | None, key: str | None) -> Statement:
    """Query listing journal events in order, optionally by thread and key."""
    where, params = _where(thread_id=thread_id, key=key)
    return f"SELECT {EVENT_COLUMNS} FROM effect_events {where} ORDER BY seq", params


def _where(**equal: str | None) -> tuple[str, tuple[str, ...]]:
    """A `WHERE` clause (or none) matching each column given a value that is not None."""
    given = {column: value for column, value in equal.items() if value is not None}
    clauses = " AND ".join(f"{column} = ?" for column in given)
    return (f"WHERE {clauses}" if given else ""), tuple(given.values())


def to_json(value: Any) -> str:
    """JSON for a ledger column; values JSON cannot hold are stored as their `str()`."""
    return column_json(value)


def plan_intent(
    *,
    key: str,
    thread_id: str,
    checkpoint_ns: str,
    tool_call_id: str,
    tool: str,
    args: dict[str, Any],
    args_text: str,
    status: EffectStatus,
    now: float,
    actor: tuple[str | None, int | None],
    codec: LedgerCodec = PLAIN,
    data: dict[str, Any] | None = None,
) -> tuple[list[Statement], EffectRecord]:
    """Insert a new effect row (the intent) and its `intent` event; return the record.

    `args_text` is the args column as stored (JSON, redacted or sealed as the saver
    and the tool's policy say); the record carries `args`. `data` adds details to the
    intent's journal entry (a compensation names the effect it undoes, and who decided).
    """
    attempts = 1 if status is EffectStatus.IN_FLIGHT else 0
    record = trusted_record(
        key=key, thread_id=thread_id, checkpoint_ns=checkpoint_ns, tool_call_id=tool_call_id,
        tool=tool, args=args, status=status, attempts=attempts,
        created_at=now, updated_at=now,
    )
    return [
        (
            INSERT_INTENT,
            (thread_id, key, checkpoint_ns, tool_call_id, tool, args_text, status._value_,
             attempts, now, now),
        ),
        (
            INSERT_EVENT,
            (key, thread_id, "intent", codec.dump_event({"status": status._value_, "tool": tool,
                                                         "tool_call_id": tool_call_id,
                                                         **(data or {})}),
             now, *actor),
        ),
    ], record


def plan_inherit(
    *, key: str, thread_id: str, checkpoint_ns: str, now: float,
    actor: tuple[str | None, int | None],
) -> tuple[Statement, Statement]:
    """Take over the effect a thread of the same family (a copy, or the thread a copy
    came from) already recorded under `key`; run before `plan_intent`'s insert.

    Keys embed the key thread, so a row with this key in another thread is the same
    requested call, claimed there: the claim gets that row's status, receipt and
    stored result, and resumes it (a receipt is replayed; an outcome not known yet is
    reconciled), so the call is sent at most once across a thread and its copies.
    Decisions are not inherited: a question is answered in the thread that asks it. A
    call rejected there, or edited there into another call, was not sent under this key:
    it is asked anew here. A call whose unknown outcome was skipped there may exist: it
    is `unknown` here, and a human decides again.
    The insert changes no row when no other thread holds the key.
    """
    skipped = "status = 'skipped'"
    insert = (
        "INSERT OR IGNORE INTO effects (thread_id, key, checkpoint_ns, tool_call_id, tool, "
        "args, status, receipt, result_type, result, error, attempts, asked, created_at, "
        f"updated_at) SELECT ?, key, ?, tool_call_id, tool, args, CASE WHEN {skipped} THEN "
        f"'unknown' ELSE status END, receipt, CASE WHEN {skipped} THEN NULL ELSE result_type "
        f"END, CASE WHEN {skipped} THEN NULL ELSE result END, error, attempts, 0, ?, ? "
        "FROM effects WHERE key = ? AND thread_id <> ? AND status <> 'rejected' "
        f"AND NOT ({skipped} AND edited_key IS NOT NULL) "
        "ORDER BY created_at LIMIT 1",
        (thread_id, checkpoint_ns, now, now, key, thread_id),
    )
    event = (
        "INSERT INTO effect_events (key, thread_id, kind, data, at, owner, fencing_token) "
        "SELECT key, thread_id, 'intent', '{\"inherited\": true, \"status\": \"' || status "
        "|| '\", \"tool\": \"' || tool || '\"}', ?, ?, ? FROM effects "
        "WHERE thread_id = ? AND key = ?",
        (now, *actor, thread_id, key),
    )
    return insert, event


def refusal(
    row: Sequence[Any] | None, *, thread_id: str, key: str, to: EffectStatus,
) -> IllegalTransition:
    """Why an effect (selected with `EFFECT_COLUMNS`, or missing) cannot become `to`."""
    if row is None:
        return IllegalTransition(
            f"No effect {key!r} in thread {thread_id!r}: it was never recorded, or the "
            "thread's ledger was deleted.",
            thread_id=thread_id,
        )
    record = effect_from_row(row)
    refused = IllegalTransition(
        f"Effect {key!r} (tool call {record.tool_call_id!r}, thread {thread_id!r}) is "
        f"{record.status.value}; it cannot become {to.value}.",
        thread_id=thread_id,
        tool_call_id=record.tool_call_id,
    )
    refused.status = record.status
    return refused


_SOURCES: dict[EffectStatus, tuple[str, ...]] = {
    to: tuple(sorted(status.value for status in EffectStatus if status.can_become(to)))
    for to in EffectStatus
}
"""The statuses an effect may leave for each status."""
_SOURCE_MARKS: dict[EffectStatus, str] = {
    to: ", ".join("?" for _ in sources) for to, sources in _SOURCES.items()}
"""`_SOURCES`' placeholders in a statement, by status."""


def update_sources(to: EffectStatus) -> tuple[str, ...]:
    """The statuses an effect may leave for `to` (what `plan_update` checks)."""
    return _SOURCES[to]


def plan_update(
    *,
    thread_id: str,
    key: str,
    to: EffectStatus,
    now: float,
    columns: dict[str, Any],
    bump_attempts: bool = False,
    returning: str | None = EFFECT_COLUMNS,
) -> Statement:
    """Move an effect to `to`, setting `columns`, if its current status allows it.

    One conditional `UPDATE ... RETURNING` the updated row (`EFFECT_COLUMNS`, or the
    columns `returning` names), so the lifecycle is checked without reading the row
    first; no row back means no such effect or a forbidden move (`refusal` says which).
    With `returning=None` nothing comes back, and the row count says whether it moved.
    `bump_attempts` counts one more call of the tool (a new attempt with the same key).
    """
    sources = _SOURCES[to]
    assignments = {"status": to._value_, "updated_at": now, **columns}
    sets = [f"{name} = ?" for name in assignments]
    if bump_attempts:
        sets.append("attempts = attempts + 1")
    marks = _SOURCE_MARKS[to]
    tail = f" RETURNING {returning}" if returning else ""
    return (
        f"UPDATE effects SET {', '.join(sets)} WHERE thread_id = ? AND key = ? "
        f"AND status IN ({marks}){tail}",
        (*assignments.values(), thread_id, key, *sources),
    )


class Journaled(NamedTuple):
    """What a transition's journal entry (`transition_event`) reads of the effect it
    left, when the caller has no record of it: the write says all but `attempts`."""

    key: str
    thread_id: str
    status: EffectStatus
    attempts: int


def transition_event(
    record: EffectRecord | Journaled, *, kind: str, data: dict[str, Any], now: float,
    actor: tuple[str | None, int | None], bump_attempts: bool = False,
    codec: LedgerCodec = PLAIN,
) -> Statement:
    """The journal entry of a transition that left `record` (the updated effect)."""
    if bump_attempts:
        data = {**data, "attempt": record.attempts}
    return (
        INSERT_EVENT,
        (record.key, record.thread_id, kind,
         codec.dump_event({"status": record.status._value_, **data}), now, *actor),
    )
