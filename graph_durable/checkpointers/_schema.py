"""Numbered schema migrations for the ledger tables (append-only: never edit a shipped entry).

LangGraph's own `checkpoints` and `writes` tables are created by LangGraph's saver
`setup()`; these migrations add graph_durable's tables beside them in the same file, and
the version applied is recorded in `graph_durable_migrations`.

This module is over 400 lines: the migrations are append-only, one numbered list per
engine, and are read in order.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Collection
from typing import Any

from graph_durable.errors import GraphDurableError

__all__ = [
    "LEDGER_TABLES",
    "MIGRATIONS",
    "MIGRATIONS_TABLE",
    "PG_MIGRATIONS",
    "PG_MIGRATIONS_TABLE",
    "PG_RUNS_FROM",
    "RUNS_FROM",
    "SETUP_STATE",
    "SETUP_TABLES",
    "SQLITE_READABLE_FROM",
    "SQLITE_RUNS_FROM",
    "UPSERT_RUNS_FROM",
    "check_readable",
    "is_current",
    "runs_from_value",
    "runs_on",
    "statements",
]

# What `setup()` reads first: on a database already up to date it writes nothing (no
# write lock taken, so it neither waits behind a writer nor fails on a read-only
# connection). Run only once `graph_durable_migrations` and `ledger_meta` exist.
SETUP_STATE = (
    "SELECT (SELECT COALESCE(MAX(v), -1) FROM graph_durable_migrations), "
    "(SELECT COUNT(*) FROM ledger_meta WHERE name = 'key_secret'), "
    "(SELECT value FROM ledger_meta WHERE name = 'runs_from')"
)
SETUP_TABLES = frozenset({"graph_durable_migrations", "ledger_meta"})


def is_current(tables: Collection[str], state: Callable[[], Any], migrations: int) -> bool:
    """Whether the ledger's schema is up to date and the database's key secret stored:
    `tables` are the database's tables, `state()` the row of `SETUP_STATE` (only asked
    once the tables are there), `migrations` how many this release has."""
    if not SETUP_TABLES <= set(tables):
        return False
    applied, secrets, runs_from = state()
    if applied + 1 > migrations and not runs_on(runs_from, applied, migrations - 1):
        _newer_schema(applied, migrations)
    return applied + 1 >= migrations and secrets > 0


RUNS_FROM = "runs_from"
"""The `ledger_meta` row saying which releases run on the database as the newest
release that migrated it left it: `{"schema": S, "runs_from": R}` (JSON), written by
each release that migrates, for its schema S. A release whose latest migration is
older than S but at least R reads and writes such a database as its own (S only added
or dropped an index, say). A row written for another schema than the database's says
nothing (a release that migrated later did not write one). Releases before this row
existed do not read it."""

SQLITE_RUNS_FROM = 8
"""`RUNS_FROM`'s `runs_from` for a SQLite database this release migrates: migration 9
only drops an index, so a release whose schema is 8 uses such a database as its own."""

UPSERT_RUNS_FROM = (
    "INSERT INTO ledger_meta (name, value) VALUES ('runs_from', ?) "
    "ON CONFLICT (name) DO UPDATE SET value = excluded.value"
)
"""Record `RUNS_FROM` (its parameter: `runs_from_value`)."""


def runs_from_value(schema: int, runs_from: int) -> str:
    """The `RUNS_FROM` row's value for a database at `schema` that releases from
    `runs_from` on use as their own."""
    return json.dumps({"schema": schema, "runs_from": runs_from})


def runs_on(value: Any, applied: int, known: int) -> bool:
    """Whether a release whose latest migration is `known` runs on a database at schema
    `applied` whose `RUNS_FROM` row holds `value` (`None`: no row, so only releases of
    its own schema do)."""
    try:
        said = json.loads(value) if isinstance(value, str) else None
    except (ValueError, RecursionError):
        said = None
    if not isinstance(said, dict):
        return False  # no row, or one this release cannot read: it cannot tell
    schema, runs_from = said.get("schema"), said.get("runs_from")
    return (type(schema) is int and type(runs_from) is int  # noqa: E721 - not bools
            and schema == applied and runs_from <= known)


_log = logging.getLogger("graph_durable")


def _newer_schema(applied: int, migrations: int) -> None:
    """Say, once per saver set up, that a newer release migrated this database: this one
    runs on it (as during a rolling upgrade), and reports as damaged a row in a form
    it does not know."""
    _log.warning(
        "This database's ledger schema is version %d, newer than this graph_durable "
        "knows (%d): a newer release migrated it. This release goes on, but a row in a "
        "form it does not know is reported damaged (LedgerDamaged; `graph-durable "
        "check` lists them). Upgrade graph_durable on every worker that opens it.",
        applied, migrations - 1)


LEDGER_TABLES = frozenset({"effects", "effect_events", "graph_durable_migrations"})
LATEST_APPLIED = "SELECT COALESCE(MAX(v), -1) FROM graph_durable_migrations"


def check_readable(where: str, saver: str, tables: Collection[str],
                   applied: Callable[[], Any], migrations: int,
                   readable_from: int | None = None) -> None:
    """Refuse to read a database without graph_durable's ledger, or with one an older
    release wrote and no writer has migrated (a reader never creates or migrates).

    `tables` are the database's tables, `applied()` reads the latest migration applied
    (only asked once the ledger is there), `migrations` is how many this release has,
    `readable_from` the oldest schema it reads as it is (by default its latest).
    """
    if not LEDGER_TABLES <= set(tables):
        what = ("a LangGraph database without graph_durable's ledger"
                if "checkpoints" in tables else "not a graph_durable database")
        raise GraphDurableError(
            f"{where!r} is {what}. Point --db at the database your {saver} writes; read "
            "commands never add tables.")
    version = applied()
    oldest = migrations - 1 if readable_from is None else readable_from
    if version < oldest:
        raise GraphDurableError(
            f"{where!r} holds a ledger of an older graph_durable (schema {version}, this "
            f"one reads {oldest} and later). Run your agent (or any writer) on it once to "
            "migrate; read commands never migrate.")



def statements(script: str) -> list[str]:
    """The statements of a migration script, one by one (drivers run one at a time).

    Splits on `;` outside PostgreSQL dollar-quoted bodies (`$fn$ ... $fn$`).
    """
    parts: list[str] = []
    current: list[str] = []
    for piece in re.split(r"(\$[A-Za-z_]*\$|;)", script):
        if piece == ";" and not _inside_dollar_quote(current):
            parts.append("".join(current))
            current = []
        else:
            current.append(piece)
    parts.append("".join(current))
    return [part.strip() for part in parts if part.strip()]


def _inside_dollar_quote(pieces: list[str]) -> bool:
    return sum(1 for piece in pieces if re.fullmatch(r"\$[A-Za-z_]*\$", piece)) % 2 == 1


MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS graph_durable_migrations (
    v INTEGER PRIMARY KEY,
    applied_at REAL NOT NULL
)
"""

_STEP_ANCHORS = """
    CREATE TABLE copy_points (
        thread_id TEXT NOT NULL,
        checkpoint_id TEXT NOT NULL,
        writes_digest TEXT NOT NULL,
        copied_at {real} NOT NULL,
        PRIMARY KEY (thread_id, checkpoint_id, writes_digest)
    );
    CREATE TABLE step_anchors (
        key_thread TEXT NOT NULL,
        checkpoint_id TEXT NOT NULL,
        anchor TEXT NOT NULL,
        anchored_at {real} NOT NULL,
        PRIMARY KEY (key_thread, checkpoint_id)
    );
"""
"""Where each thread was copied, or copied from (the checkpoint, and a digest of the
writes saved under it then), and the steps made again after such a point, anchored
once for the family (SQLite's migration 8, PostgreSQL's 13; see
`graph_durable.nodes.write_keys`), given the type of a time."""

MIGRATIONS: list[str] = [
    # 0: the effect ledger and its append-only journal.
    """
    CREATE TABLE effects (
        thread_id TEXT NOT NULL,
        key TEXT NOT NULL,
        checkpoint_ns TEXT NOT NULL,
        tool_call_id TEXT NOT NULL,
        tool TEXT NOT NULL,
        args TEXT NOT NULL,
        status TEXT NOT NULL,
        receipt TEXT,
        result_type TEXT,
        result BLOB,
        error TEXT,
        attempts INTEGER NOT NULL DEFAULT 0,
        decision TEXT,
        asked INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (thread_id, key)
    );
    CREATE INDEX effects_key ON effects (key);
    CREATE INDEX effects_thread_status ON effects (thread_id, status);
    CREATE TABLE effect_events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        key TEXT NOT NULL,
        thread_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        data TEXT NOT NULL,
        at REAL NOT NULL,
        owner TEXT,
        fencing_token INTEGER
    );
    CREATE INDEX effect_events_thread ON effect_events (thread_id, seq);
    CREATE INDEX effect_events_key ON effect_events (key, seq);
    """,
    # 1: one owner per thread (leases with fencing tokens) and flow-version pins.
    # Lease rows are kept after release so tokens keep increasing.
    """
    CREATE TABLE thread_leases (
        thread_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        token INTEGER NOT NULL,
        expires_at REAL NOT NULL,
        acquired_at REAL NOT NULL
    );
    CREATE TABLE thread_flow_versions (
        thread_id TEXT PRIMARY KEY,
        flow_version TEXT NOT NULL,
        pinned_at REAL NOT NULL
    );
    """,
    # 2: the thread a copied thread descends from, whose keys its effects keep.
    """
    CREATE TABLE thread_origins (
        thread_id TEXT PRIMARY KEY,
        origin_thread_id TEXT NOT NULL,
        copied_at REAL NOT NULL
    );
    """,
    # 3: keys are anchored to the requesting message since this version. Threads with
    # effects from before keep finding them under their legacy keys (task namespace).
    """
    CREATE TABLE legacy_key_threads (thread_id TEXT PRIMARY KEY);
    INSERT INTO legacy_key_threads (thread_id) SELECT DISTINCT thread_id FROM effects;
    """,
    # 4: secrets. Decisions may be sealed, so the key an edit was sent under gets a clear
    # column; keys are an HMAC under a key secret, and each key thread is pinned to the
    # scheme of its first intent (threads with effects from before keep plain SHA-256
    # keys); `ledger_meta` holds the database's own key secret.
    """
    ALTER TABLE effects ADD COLUMN edited_key TEXT;
    UPDATE effects SET edited_key = json_extract(decision, '$.edited_key')
        WHERE decision LIKE '%"edited_key"%';
    CREATE TABLE thread_key_schemes (
        thread_id TEXT PRIMARY KEY,
        scheme TEXT NOT NULL,
        pinned_at REAL NOT NULL
    );
    INSERT INTO thread_key_schemes (thread_id, scheme, pinned_at)
        SELECT DISTINCT COALESCE(o.origin_thread_id, e.thread_id), 'sha256', 0 FROM effects e
        LEFT JOIN thread_origins o ON o.thread_id = e.thread_id;
    CREATE TABLE ledger_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
    """,
    # 5: the run log of audited graphs (`graph_durable.audit`): every node run and model
    # call, by run, so an audit can tell what ran again after a crash.
    """
    CREATE TABLE task_runs (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        thread_id TEXT NOT NULL,
        run_id TEXT NOT NULL,
        checkpoint_ns TEXT NOT NULL,
        node TEXT NOT NULL,
        kind TEXT NOT NULL,
        at REAL NOT NULL
    );
    CREATE INDEX task_runs_thread ON task_runs (thread_id, seq);
    """,
    # 6: a stored result may be rebuilt from its receipt (`result_type` 'gd-receipt', no
    # result bytes). No table changes; a release before this one cannot read such a row,
    # and learns from this version that a newer release writes here.
    "",
    # 7: sealed values written together may share one sealed set
    # (`gd-sealed:set.<index>:...`, see `graph_durable.secrets`). No table changes; a
    # release before this one cannot open such a value, and learns from this version
    # that a newer release writes here.
    "",
    # 8: the checkpoint each copy was made at (`copy_thread`), and the anchor of a step
    # that a thread of the family made again after it, recorded when first used (the
    # guarded writes of `graph_durable.nodes.write_keys`).
    _STEP_ANCHORS.format(real="REAL"),
    # 9: the journal is no longer indexed by key alone. The index took a tenth of a large
    # ledger's file and a page written with every entry, for one read no part of the
    # library makes (a key's entries across threads), which now scans the journal.
    # Readers read a database a writer has not migrated yet (`SQLITE_READABLE_FROM`).
    "DROP INDEX IF EXISTS effect_events_key",
]

SQLITE_READABLE_FROM = 8
"""The oldest SQLite ledger schema this release reads as it is (`check_readable`):
migration 9 only drops an index, so a database no writer of this release has migrated
yet reads the same."""

# Pieces the two claim functions (migrations 8 and 10) share, written once; each is
# joined into its migration's text exactly as that migration shipped.
_CLAIM_SIGNATURE = """        p_thread_id TEXT, p_keys TEXT[], p_namespaces TEXT[], p_tool_call_ids TEXT[],
        p_tools TEXT[], p_args TEXT[], p_statuses TEXT[], p_attempts INTEGER[],
        p_events TEXT[], p_schemes TEXT[], p_nows DOUBLE PRECISION[], p_owner TEXT,
        p_token BIGINT)
    RETURNS TABLE (e_claimed BOOLEAN, e_key TEXT, e_thread_id TEXT, e_checkpoint_ns TEXT,
                   e_tool_call_id TEXT, e_tool TEXT, e_args TEXT, e_status TEXT,
                   e_receipt TEXT, e_error TEXT, e_attempts INTEGER, e_decision TEXT,
                   e_asked INTEGER, e_created_at DOUBLE PRECISION,
                   e_updated_at DOUBLE PRECISION)
    LANGUAGE plpgsql VOLATILE AS $fn$
    DECLARE
        i INTEGER;
"""
_LOCK_KEYS = """        -- Lock the keys first, in one order (`_pg.lock_keys`, class id `_pg.KEY_LOCKS`):
        -- a thread of the family claiming one of them at once waits for this
        -- transaction, and its statements then see the rows this one inserts.
        PERFORM pg_advisory_xact_lock(1735680001, hashtext(k))
            FROM (SELECT DISTINCT unnest(p_keys) AS k ORDER BY k) AS keys;
        FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
"""
_INHERIT_FROM_FAMILY = """            INSERT INTO effects (thread_id, key, checkpoint_ns, tool_call_id, tool, args,
                                 status, receipt, result_type, result, error, attempts,
                                 asked, created_at, updated_at)
                SELECT p_thread_id, f.key, p_namespaces[i], f.tool_call_id, f.tool, f.args,
                    CASE WHEN f.status = 'skipped' THEN 'unknown' ELSE f.status END,
                    f.receipt,
                    CASE WHEN f.status = 'skipped' THEN NULL ELSE f.result_type END,
                    CASE WHEN f.status = 'skipped' THEN NULL ELSE f.result END,
                    f.error, f.attempts, 0, p_nows[i], p_nows[i]
                FROM effects f WHERE f.key = p_keys[i] AND f.thread_id <> p_thread_id
                    AND f.status <> 'rejected'
                    AND NOT (f.status = 'skipped' AND f.edited_key IS NOT NULL)
                ORDER BY f.created_at LIMIT 1
                ON CONFLICT DO NOTHING;
            IF FOUND THEN
"""
_INHERITED_EVENT = """                    SELECT e.key, e.thread_id, 'intent', '{"inherited": true, "status": "'
                        || e.status || '", "tool": "' || e.tool || '"}', p_nows[i], p_owner,
                        p_token
                    FROM effects e WHERE e.thread_id = p_thread_id AND e.key = p_keys[i];
"""

_FENCE = """
    {create} FUNCTION graph_durable_fence(p_thread_id TEXT, p_token BIGINT)
    RETURNS DOUBLE PRECISION
    LANGUAGE plpgsql VOLATILE AS $fn$
    DECLARE
        now_at DOUBLE PRECISION;
        lease thread_leases%ROWTYPE;
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtextextended(p_thread_id, 0));
        now_at := extract(epoch FROM clock_timestamp())::DOUBLE PRECISION;
        SELECT * INTO lease FROM thread_leases l WHERE l.thread_id = p_thread_id;
        IF (NOT FOUND AND p_token IS NOT NULL)
            OR (FOUND AND p_token IS NULL
                AND (lease.owner LIKE 'cancelled-by:%' OR lease.expires_at > now_at))
            OR (FOUND AND p_token IS NOT NULL
                AND (p_token <> lease.token OR lease.expires_at <= now_at)) THEN
            RAISE EXCEPTION 'graph_durable refused a write to thread %', p_thread_id
                USING ERRCODE = 'GD001';
        END IF;
{mark}        RETURN now_at;
    END
    $fn$
"""
"""`graph_durable_fence` (PostgreSQL migration 7; migration 15 makes it mark the
transaction fenced, `_MARK_FENCED`)."""
_MARK_FENCED = """        PERFORM set_config('graph_durable.fenced', 'f:' || p_thread_id, true);
"""
_ROW_FENCE = """
    CREATE TRIGGER graph_durable_fence BEFORE INSERT ON {table} FOR EACH ROW
        WHEN (current_setting('graph_durable.fenced', true) IS DISTINCT FROM
              'f:' || NEW.thread_id)
        EXECUTE FUNCTION graph_durable_fence_row();
"""
"""PostgreSQL migration 15's trigger on one of LangGraph's tables."""

# PostgreSQL: the same tables in PostgreSQL's types, numbered on their own.
PG_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS graph_durable_migrations (
    v INTEGER PRIMARY KEY,
    applied_at DOUBLE PRECISION NOT NULL
)
"""

PG_MIGRATIONS: list[str] = [
    # 0: the effect ledger, its append-only journal, leases and flow-version pins.
    # `seq` comes from a sequence: never reused, and in commit order within a thread
    # (writes of one thread are serialized by a transaction-level advisory lock).
    """
    CREATE TABLE effects (
        thread_id TEXT NOT NULL,
        key TEXT NOT NULL,
        checkpoint_ns TEXT NOT NULL,
        tool_call_id TEXT NOT NULL,
        tool TEXT NOT NULL,
        args TEXT NOT NULL,
        status TEXT NOT NULL,
        receipt TEXT,
        result_type TEXT,
        result BYTEA,
        error TEXT,
        attempts INTEGER NOT NULL DEFAULT 0,
        decision TEXT,
        asked INTEGER NOT NULL DEFAULT 0,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (thread_id, key)
    );
    CREATE INDEX effects_key ON effects (key);
    CREATE INDEX effects_thread_status ON effects (thread_id, status);
    CREATE TABLE effect_events (
        seq BIGSERIAL PRIMARY KEY,
        key TEXT NOT NULL,
        thread_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        data TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        owner TEXT,
        fencing_token BIGINT
    );
    CREATE INDEX effect_events_thread ON effect_events (thread_id, seq);
    CREATE INDEX effect_events_key ON effect_events (key, seq);
    CREATE TABLE thread_leases (
        thread_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        token BIGINT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL,
        acquired_at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE thread_flow_versions (
        thread_id TEXT PRIMARY KEY,
        flow_version TEXT NOT NULL,
        pinned_at DOUBLE PRECISION NOT NULL
    );
    """,
    # 1: lock a thread for the rest of the transaction and read its lease, in one round
    # trip. A volatile function reads with a new snapshot after the lock is granted, so
    # a lease committed while it waited is seen.
    """
    CREATE FUNCTION graph_durable_lock_thread(p_thread_id TEXT)
    RETURNS TABLE (owner TEXT, token BIGINT, expires_at DOUBLE PRECISION)
    LANGUAGE plpgsql VOLATILE AS $fn$
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtextextended(p_thread_id, 0));
        RETURN QUERY SELECT l.owner, l.token, l.expires_at FROM thread_leases l
            WHERE l.thread_id = p_thread_id;
    END
    $fn$
    """,
    # 2: the thread a copied thread descends from, whose keys its effects keep.
    """
    CREATE TABLE thread_origins (
        thread_id TEXT PRIMARY KEY,
        origin_thread_id TEXT NOT NULL,
        copied_at DOUBLE PRECISION NOT NULL
    );
    """,
    # 3: keys are anchored to the requesting message since this version. Threads with
    # effects from before keep finding them under their legacy keys (task namespace).
    """
    CREATE TABLE legacy_key_threads (thread_id TEXT PRIMARY KEY);
    INSERT INTO legacy_key_threads (thread_id) SELECT DISTINCT thread_id FROM effects;
    """,
    # 4: secrets (see the SQLite migration 4).
    """
    ALTER TABLE effects ADD COLUMN edited_key TEXT;
    UPDATE effects SET edited_key = decision::json->>'edited_key'
        WHERE decision LIKE '%"edited_key"%';
    CREATE TABLE thread_key_schemes (
        thread_id TEXT PRIMARY KEY,
        scheme TEXT NOT NULL,
        pinned_at DOUBLE PRECISION NOT NULL
    );
    INSERT INTO thread_key_schemes (thread_id, scheme, pinned_at)
        SELECT DISTINCT COALESCE(o.origin_thread_id, e.thread_id), 'sha256', 0 FROM effects e
        LEFT JOIN thread_origins o ON o.thread_id = e.thread_id;
    CREATE TABLE ledger_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
    """,
    # 5: the run log of audited graphs (see the SQLite migration 5).
    """
    CREATE TABLE task_runs (
        seq BIGSERIAL PRIMARY KEY,
        thread_id TEXT NOT NULL,
        run_id TEXT NOT NULL,
        checkpoint_ns TEXT NOT NULL,
        node TEXT NOT NULL,
        kind TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX task_runs_thread ON task_runs (thread_id, seq);
    """,
    # 6: leases on the server's clock. `graph_durable_lock_thread` also says what time
    # the server has (its own row even when the thread has no lease yet); a new function,
    # so a worker of the previous release keeps calling the old one while both run.
    """
    CREATE FUNCTION graph_durable_lock_thread_at(p_thread_id TEXT)
    RETURNS TABLE (owner TEXT, token BIGINT, expires_at DOUBLE PRECISION,
                   now_at DOUBLE PRECISION)
    LANGUAGE plpgsql VOLATILE AS $fn$
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtextextended(p_thread_id, 0));
        RETURN QUERY SELECT l.owner, l.token, l.expires_at,
            extract(epoch FROM clock_timestamp())::DOUBLE PRECISION
            FROM (SELECT 1) AS one LEFT JOIN thread_leases l ON l.thread_id = p_thread_id;
    END
    $fn$
    """,
    # 7: a fenced write in one round trip. Lock the thread and check its fence on the
    # server (`graph_durable.leases.check_fence`'s rules, on the server's clock), raising
    # SQLSTATE GD001 when it refuses, so the writes sent after it in the same
    # transaction never commit; the writer then reads the lease row to say why.
    _FENCE.format(create="CREATE", mark=""),
    # 8: a step's claim in one round trip. For each intent in order, what `claim_many`
    # does statement by statement: take the effect over from a thread of the family that
    # holds its key (`_sql.plan_inherit`'s rules), else insert it, journal it and pin its
    # key scheme (`_sql.plan_intent`); then return its row, and whether this call
    # inserted it. The caller fences the transaction first (`graph_durable_fence`).
    """
    CREATE FUNCTION graph_durable_claim(
"""
    + _CLAIM_SIGNATURE
    + """        claimed BOOLEAN;
    BEGIN
"""
    + _LOCK_KEYS
    + """            claimed := false;
"""
    + _INHERIT_FROM_FAMILY
    + """                INSERT INTO effect_events (key, thread_id, kind, data, at, owner,
                                           fencing_token)
"""
    + _INHERITED_EVENT
    + """            ELSE
                INSERT INTO effects (thread_id, key, checkpoint_ns, tool_call_id, tool, args,
                                     status, attempts, created_at, updated_at)
                    VALUES (p_thread_id, p_keys[i], p_namespaces[i], p_tool_call_ids[i],
                            p_tools[i], p_args[i], p_statuses[i], p_attempts[i], p_nows[i],
                            p_nows[i])
                    ON CONFLICT DO NOTHING;
                IF FOUND THEN
                    claimed := true;
                    INSERT INTO effect_events (key, thread_id, kind, data, at, owner,
                                               fencing_token)
                        VALUES (p_keys[i], p_thread_id, 'intent', p_events[i], p_nows[i],
                                p_owner, p_token);
                    IF p_schemes[i] IS NOT NULL THEN
                        INSERT INTO thread_key_schemes (thread_id, scheme, pinned_at)
                            VALUES (COALESCE((SELECT o.origin_thread_id FROM thread_origins o
                                              WHERE o.thread_id = p_thread_id), p_thread_id),
                                    p_schemes[i], p_nows[i])
                            ON CONFLICT DO NOTHING;
                    END IF;
                END IF;
            END IF;
            RETURN QUERY SELECT claimed, e.key, e.thread_id, e.checkpoint_ns, e.tool_call_id,
                e.tool, e.args, e.status, e.receipt, e.error, e.attempts, e.decision, e.asked,
                e.created_at, e.updated_at
                FROM effects e WHERE e.thread_id = p_thread_id AND e.key = p_keys[i];
        END LOOP;
    END
    $fn$
    """,
    # 9: a fenced write without `BEGIN` and `COMMIT`: its statements, sent together up to
    # one sync, are one implicit transaction. `graph_durable_fence`, after checking that
    # this transaction is READ COMMITTED (the fence must see a lease committed while it
    # waited for the lock); if it is not (the server's default isolation is another),
    # SQLSTATE GD002 aborts the transaction and the writer sends the write again inside
    # `BEGIN ISOLATION LEVEL READ COMMITTED`.
    """
    CREATE FUNCTION graph_durable_fence_read_committed(p_thread_id TEXT, p_token BIGINT)
    RETURNS DOUBLE PRECISION
    LANGUAGE plpgsql VOLATILE AS $fn$
    BEGIN
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION 'graph_durable writes thread % READ COMMITTED, not %',
                p_thread_id, current_setting('transaction_isolation')
                USING ERRCODE = 'GD002';
        END IF;
        RETURN graph_durable_fence(p_thread_id, p_token);
    END
    $fn$
    """,
    # 10: a step's claim that fences its transaction itself (`graph_durable_fence_read_
    # committed`), so a claim with no deferred receipt to carry is one statement. The
    # same rules as `graph_durable_claim`, in fewer statements per intent: the insert and
    # its journal entry in one, the key scheme pinned once per scheme, and no row read
    # back for an intent this call inserted (the caller has its record; the row returned
    # is the flag and NULLs).
    """
    CREATE FUNCTION graph_durable_fenced_claim(
"""
    + _CLAIM_SIGNATURE
    + """        pinned TEXT;
    BEGIN
        PERFORM graph_durable_fence_read_committed(p_thread_id, p_token);
"""
    + _LOCK_KEYS
    + _INHERIT_FROM_FAMILY
    + """                INSERT INTO effect_events (key, thread_id, kind, data, at, owner, fencing_token)
"""
    + _INHERITED_EVENT
    + """                e_claimed := false;
            ELSE
                WITH inserted AS (
                    INSERT INTO effects (thread_id, key, checkpoint_ns, tool_call_id, tool, args,
                                         status, attempts, created_at, updated_at)
                    VALUES (p_thread_id, p_keys[i], p_namespaces[i], p_tool_call_ids[i],
                            p_tools[i], p_args[i], p_statuses[i], p_attempts[i], p_nows[i],
                            p_nows[i])
                    ON CONFLICT DO NOTHING RETURNING key)
                INSERT INTO effect_events (key, thread_id, kind, data, at, owner, fencing_token)
                    SELECT inserted.key, p_thread_id, 'intent', p_events[i], p_nows[i], p_owner,
                           p_token FROM inserted;
                e_claimed := FOUND;
                IF e_claimed AND p_schemes[i] IS NOT NULL
                        AND p_schemes[i] IS DISTINCT FROM pinned THEN
                    INSERT INTO thread_key_schemes (thread_id, scheme, pinned_at)
                        VALUES (COALESCE((SELECT o.origin_thread_id FROM thread_origins o
                                          WHERE o.thread_id = p_thread_id), p_thread_id),
                                p_schemes[i], p_nows[i])
                        ON CONFLICT DO NOTHING;
                    pinned := p_schemes[i];
                END IF;
            END IF;
            IF e_claimed THEN
                RETURN NEXT;
            ELSE
                RETURN QUERY SELECT false, e.key, e.thread_id, e.checkpoint_ns, e.tool_call_id,
                    e.tool, e.args, e.status, e.receipt, e.error, e.attempts, e.decision, e.asked,
                    e.created_at, e.updated_at
                    FROM effects e WHERE e.thread_id = p_thread_id AND e.key = p_keys[i];
            END IF;
        END LOOP;
    END
    $fn$
    """,
    # 11: a stored result may be rebuilt from its receipt (`result_type` 'gd-receipt', no
    # result bytes). No table changes; a release before this one cannot read such a row,
    # and learns from this version that a newer release writes here.
    "",
    # 12: sealed values written together may share one sealed set
    # (`gd-sealed:set.<index>:...`, see `graph_durable.secrets`). No table changes; a
    # release before this one cannot open such a value, and learns from this version
    # that a newer release writes here.
    "",
    # 13: copy points and step anchors, as SQLite's migration 8.
    _STEP_ANCHORS.format(real="DOUBLE PRECISION"),
    # 14: a step's claim made with a predicted keying (`predicted_keying`: the thread
    # keyed by its own id, not legacy, under scheme `p_scheme`) checks it after the claim,
    # in the same transaction: SQLSTATE GD003 aborts the claim, nothing of it written,
    # when the thread is keyed otherwise, and the writer reads the keying and claims again.
    """
    CREATE FUNCTION graph_durable_keyed_as(p_thread_id TEXT, p_scheme TEXT)
    RETURNS void
    LANGUAGE plpgsql STABLE AS $fn$
    BEGIN
        IF EXISTS (SELECT 1 FROM thread_origins WHERE thread_id = p_thread_id)
                OR EXISTS (SELECT 1 FROM legacy_key_threads WHERE thread_id = p_thread_id)
                OR EXISTS (SELECT 1 FROM thread_key_schemes
                           WHERE thread_id = p_thread_id AND scheme IS DISTINCT FROM p_scheme)
        THEN
            RAISE EXCEPTION 'graph_durable: thread % is not keyed as its claim predicted',
                p_thread_id USING ERRCODE = 'GD003';
        END IF;
    END
    $fn$
    """,
    # 15: LangGraph's own tables fence the rows written to them. A trigger on
    # `checkpoints`, `checkpoint_blobs` and `checkpoint_writes` fences the transaction
    # that inserts a thread's row, as `graph_durable_fence_read_committed` does for a
    # writer without a fencing token, unless the transaction has already fenced that
    # thread: `graph_durable_fence` and `graph_durable_lock_thread_at` now mark it so
    # (`graph_durable.fenced`, local to the transaction). A checkpoint write without a
    # token then needs no fence statement of its own, and no writer (LangGraph's savers
    # included) inserts a row into a thread whose lease another worker holds.
    _FENCE.format(create="CREATE OR REPLACE", mark=_MARK_FENCED)
    + """;
    CREATE OR REPLACE FUNCTION graph_durable_lock_thread_at(p_thread_id TEXT)
    RETURNS TABLE (owner TEXT, token BIGINT, expires_at DOUBLE PRECISION,
                   now_at DOUBLE PRECISION)
    LANGUAGE plpgsql VOLATILE AS $fn$
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtextextended(p_thread_id, 0));
        -- The caller checks the fence with the row below and refuses (rolls back) there.
        PERFORM set_config('graph_durable.fenced', 'f:' || p_thread_id, true);
        RETURN QUERY SELECT l.owner, l.token, l.expires_at,
            extract(epoch FROM clock_timestamp())::DOUBLE PRECISION
            FROM (SELECT 1) AS one LEFT JOIN thread_leases l ON l.thread_id = p_thread_id;
    END
    $fn$;
    CREATE FUNCTION graph_durable_fence_row()
    RETURNS trigger
    LANGUAGE plpgsql VOLATILE AS $fn$
    BEGIN
        PERFORM graph_durable_fence_read_committed(NEW.thread_id, NULL);  -- marks it
        RETURN NEW;
    END
    $fn$;
    -- In the order LangGraph's `put` writes the tables, so that a write under way
    -- finishes first (a deadlock with another order is retried by `setup()`).
    """
    + "".join(_ROW_FENCE.format(table=table)
              for table in ("checkpoint_blobs", "checkpoints", "checkpoint_writes")),
    # 16: a step's claim in one statement: `graph_durable_fenced_claim`'s, after the
    # transaction's commit is made durable (`_pg.DURABLE_COMMIT`'s rule) and followed by
    # `graph_durable_keyed_as` when `p_keyed_as` names a predicted keying's scheme; the
    # statements a claim sent around it before.
    """
    CREATE FUNCTION graph_durable_claim_step(
        p_thread_id TEXT, p_keys TEXT[], p_namespaces TEXT[], p_tool_call_ids TEXT[],
        p_tools TEXT[], p_args TEXT[], p_statuses TEXT[], p_attempts INTEGER[],
        p_events TEXT[], p_schemes TEXT[], p_nows DOUBLE PRECISION[], p_owner TEXT,
        p_token BIGINT, p_keyed_as TEXT)
    RETURNS TABLE (e_claimed BOOLEAN, e_key TEXT, e_thread_id TEXT, e_checkpoint_ns TEXT,
                   e_tool_call_id TEXT, e_tool TEXT, e_args TEXT, e_status TEXT,
                   e_receipt TEXT, e_error TEXT, e_attempts INTEGER, e_decision TEXT,
                   e_asked INTEGER, e_created_at DOUBLE PRECISION,
                   e_updated_at DOUBLE PRECISION)
    LANGUAGE plpgsql VOLATILE AS $fn$
    BEGIN
        PERFORM set_config('synchronous_commit', 'on', true)
            WHERE current_setting('synchronous_commit') IN ('off', 'local', 'remote_write');
        RETURN QUERY SELECT * FROM graph_durable_fenced_claim(
            p_thread_id, p_keys, p_namespaces, p_tool_call_ids, p_tools, p_args,
            p_statuses, p_attempts, p_events, p_schemes, p_nows, p_owner, p_token);
        IF p_keyed_as IS NOT NULL THEN  -- after the claim, which took the thread's lock
            PERFORM graph_durable_keyed_as(p_thread_id, p_keyed_as);
        END IF;
    END
    $fn$
    """,
]


PG_RUNS_FROM = len(PG_MIGRATIONS) - 1
"""`RUNS_FROM` of a PostgreSQL database this release migrates: its own schema only."""
