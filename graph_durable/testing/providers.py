"""`FakeProvider`: an external system in its own SQLite file, for crash tests.

It survives the death of the process that called it (not of the machine: its commits
are not fsynced, since a SIGKILLed process leaves its committed writes in the operating
system's cache, and a crash test then pays no disk flush per effect) and honours one of
three contracts a real provider offers:

- `dedupe`: idempotent by key, like Stripe: the same key returns the first result.
- `lookup`: no dedupe, but `find(key)` answers whether the keyed effect exists.
- `blind`: neither; a repeated request is a second effect.

It counts applied effects per key and logs every request, so a test asserts on the
provider's side ("exactly one ticket") rather than on the agent's belief.

Faults a real provider shows can be scripted per operation (`script_faults`), and are
kept in the provider's file so a child process sees them:

- `slow`: answers correctly after `slow_seconds`.
- `hang`: never answers in time (sleeps `hang_seconds`), nothing applied: a timeout.
- `transient`: raises `Retryable`, nothing applied.
- `permanent`: raises `NotApplied`, nothing applied.
- `lost`: applies the effect, then raises `ConnectionError` (the caller cannot tell).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import Any, Literal

from graph_durable.errors import NotApplied, Retryable

__all__ = ["FakeProvider", "ProviderMode", "ProviderFault"]

ProviderMode = Literal["dedupe", "lookup", "blind"]
ProviderFault = Literal["slow", "hang", "transient", "permanent", "lost"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    n INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    operation TEXT NOT NULL,
    payload TEXT NOT NULL,
    receipt TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS effects_key ON effects (key);
CREATE TABLE IF NOT EXISTS requests (
    n INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    operation TEXT NOT NULL,
    outcome TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS fences (
    key TEXT PRIMARY KEY,
    token INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS faults (
    n INTEGER PRIMARY KEY AUTOINCREMENT,
    operation TEXT NOT NULL,
    fault TEXT NOT NULL
);
"""


class FakeProvider:
    """A fake external system whose state lives in `path` and survives process death.

    Args:
        path: SQLite file of the provider (separate from the agent's database).
        mode: `dedupe`, `lookup` or `blind` (see the module docstring).
        name: Prefix of the ids it hands out (`ticket` -> `ticket-1`, ...).
        slow_seconds: Delay of a `slow` fault.
        hang_seconds: Delay of a `hang` fault.
        fencing: Reject a request whose fencing token is lower than the highest seen
            for its key (`NotApplied`), as a provider that supports fencing does.
    """

    def __init__(
        self,
        path: str,
        mode: ProviderMode = "dedupe",
        *,
        name: str = "effect",
        slow_seconds: float = 0.2,
        hang_seconds: float = 5.0,
        fencing: bool = False,
    ) -> None:
        if mode not in ("dedupe", "lookup", "blind"):
            raise ValueError(f"FakeProvider mode is 'dedupe', 'lookup' or 'blind', not {mode!r}")
        self.path = str(path)
        self.mode = mode
        self.name = name
        self.slow_seconds = slow_seconds
        self.hang_seconds = hang_seconds
        self.fencing = fencing
        with self._connect() as conn:
            conn.executescript(_SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        with closing(sqlite3.connect(self.path, timeout=30, isolation_level=None)) as conn:
            # Set first, so that switching a new file to WAL does not flush either.
            conn.execute("PRAGMA synchronous=OFF")
            conn.execute("PRAGMA journal_mode=WAL")
            yield conn

    # -- the provider's API --------------------------------------------------------------

    def apply(self, key: str, payload: dict[str, Any] | None = None,
              *, operation: str = "apply", fencing_token: int | None = None) -> dict[str, Any]:
        """Perform the effect for `key` and return its receipt.

        In `dedupe` mode a key already seen returns the first receipt and applies nothing.

        Raises:
            Retryable, NotApplied, ConnectionError: as scripted with `script_faults`.
            NotApplied: with `fencing`, a token lower than one already seen for `key`.
        """
        fault = self._next_fault(operation)
        if fault == "slow":
            time.sleep(self.slow_seconds)
        elif fault == "hang":
            time.sleep(self.hang_seconds)
            self._log(key, operation, "hung")
            raise TimeoutError(f"{self.name}: no answer for key {key}")
        elif fault == "transient":
            self._log(key, operation, "transient")
            raise Retryable(f"{self.name}: temporarily unavailable, nothing applied")
        elif fault == "permanent":
            self._log(key, operation, "permanent")
            raise NotApplied(f"{self.name}: request refused, nothing applied")
        receipt = self._apply_txn(key, payload or {}, operation, fencing_token)
        if fault == "lost":
            raise ConnectionError(f"{self.name}: connection lost after the request was sent")
        return receipt

    def _apply_txn(self, key: str, payload: dict[str, Any], operation: str,
                   fencing_token: int | None) -> dict[str, Any]:
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if self.fencing and fencing_token is not None:
                    row = conn.execute("SELECT token FROM fences WHERE key = ?", (key,)).fetchone()
                    if row is not None and fencing_token < row[0]:
                        conn.execute(
                            "INSERT INTO requests (key, operation, outcome, at) VALUES (?,?,?,?)",
                            (key, operation, "fenced", time.time()),
                        )
                        conn.execute("COMMIT")
                        raise NotApplied(
                            f"{self.name}: fencing token {fencing_token} is older than "
                            f"{row[0]} for key {key}; request refused")
                    conn.execute(
                        "INSERT INTO fences (key, token) VALUES (?, ?) ON CONFLICT (key) "
                        "DO UPDATE SET token = MAX(token, excluded.token)",
                        (key, fencing_token),
                    )
                if self.mode == "dedupe":
                    row = conn.execute(
                        "SELECT receipt FROM effects WHERE key = ? ORDER BY n LIMIT 1", (key,)
                    ).fetchone()
                    if row is not None:
                        conn.execute(
                            "INSERT INTO requests (key, operation, outcome, at) VALUES (?,?,?,?)",
                            (key, operation, "deduplicated", time.time()),
                        )
                        conn.execute("COMMIT")
                        return json.loads(row[0])
                n = conn.execute("SELECT COALESCE(MAX(n), 0) + 1 FROM effects").fetchone()[0]
                receipt = {"id": f"{self.name}-{n}", "key": key, **payload}
                conn.execute(
                    "INSERT INTO effects (key, operation, payload, receipt, at) VALUES (?,?,?,?,?)",
                    (key, operation, json.dumps(payload), json.dumps(receipt), time.time()),
                )
                conn.execute(
                    "INSERT INTO requests (key, operation, outcome, at) VALUES (?,?,?,?)",
                    (key, operation, "applied", time.time()),
                )
                conn.execute("COMMIT")
                return receipt
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def find(self, key: str) -> dict[str, Any] | None:
        """The receipt of the effect applied under `key`, or `None` if there is none.

        Raises:
            NotImplementedError: in `blind` mode, which offers no lookup.
        """
        if self.mode == "blind":
            raise NotImplementedError(f"{self.name} ({self.mode}) offers no lookup by key")
        with self._connect() as conn:
            row = conn.execute(
                "SELECT receipt FROM effects WHERE key = ? ORDER BY n LIMIT 1", (key,)
            ).fetchone()
        return None if row is None else json.loads(row[0])

    # -- scripted faults -----------------------------------------------------------------

    def script_faults(self, *faults: ProviderFault, operation: str = "apply") -> None:
        """Make the next calls of `operation` misbehave, one fault per call, in order."""
        with self._connect() as conn:
            conn.executemany(
                "INSERT INTO faults (operation, fault) VALUES (?, ?)",
                [(operation, fault) for fault in faults],
            )

    def take_fault(self, operation: str) -> str | None:
        """The next fault scripted for `operation` (consumed), or `None`: for callers
        that misbehave their own way, e.g. a lookup scripted under `find`."""
        return self._next_fault(operation)

    def _next_fault(self, operation: str) -> str | None:
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute(
                "SELECT n, fault FROM faults WHERE operation = ? ORDER BY n LIMIT 1",
                (operation,),
            ).fetchone()
            if row is not None:
                conn.execute("DELETE FROM faults WHERE n = ?", (row[0],))
            conn.execute("COMMIT")
        return None if row is None else row[1]

    def _log(self, key: str, operation: str, outcome: str) -> None:
        with self._connect() as conn:
            conn.execute(
                "INSERT INTO requests (key, operation, outcome, at) VALUES (?,?,?,?)",
                (key, operation, outcome, time.time()),
            )

    # -- what a test asserts on ----------------------------------------------------------

    def count(self, key: str | None = None, *, operation: str | None = None) -> int:
        """How many effects were applied (for `key` and `operation`, if given)."""
        return sum(
            n for (k, op), n in self._counts().items()
            if (key is None or k == key) and (operation is None or op == operation)
        )

    def counts(self) -> dict[str, int]:
        """Applied effects per key."""
        totals: dict[str, int] = {}
        for (key, _), n in self._counts().items():
            totals[key] = totals.get(key, 0) + n
        return totals

    def _counts(self) -> dict[tuple[str, str], int]:
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT key, operation, COUNT(*) FROM effects GROUP BY key, operation"
            ).fetchall()
        return {(key, op): n for key, op, n in rows}

    def effects(self) -> list[dict[str, Any]]:
        """Every applied effect, in order: key, operation, payload, receipt."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT key, operation, payload, receipt FROM effects ORDER BY n"
            ).fetchall()
        return [
            {"key": k, "operation": op, "payload": json.loads(p), "receipt": json.loads(r)}
            for k, op, p, r in rows
        ]

    def requests(self, key: str | None = None) -> list[dict[str, Any]]:
        """Every request received, in order, with its outcome (`applied`, ...)."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT key, operation, outcome FROM requests ORDER BY n"
            ).fetchall()
        return [
            {"key": k, "operation": op, "outcome": outcome}
            for k, op, outcome in rows if key is None or k == key
        ]
