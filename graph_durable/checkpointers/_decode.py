"""The one place a stored row is read: ledger rows and checkpoints, or a named `Damage`.

Every read a saver makes of a ledger row (effects, journal entries, leases, flow-version
pins, origins, run-log entries) and of a LangGraph checkpoint decodes here. A row whose
column holds what no release writes (a status this release does not know, text that is
not JSON, a value of the wrong type, a lease that would outlive any real one, a blob
that does not decode) becomes a `Damage`: which table, thread and row, which column,
and what is wrong. A read that needs the row raises it as `LedgerDamaged` (before
anything is sent); a listing across threads passes it by and carries it in its
`damaged` (`Listing`, `ListingDict`), so one bad row never hides the healthy threads.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from graph_durable.errors import GraphDurableError, LedgerDamaged
from graph_durable.ledger import EffectEvent, EffectRecord, EffectStatus, trusted_record
from graph_durable.secrets import LedgerCodec, Sealed

__all__ = [
    "LEASE_HORIZON",
    "PLAIN",
    "CheckedCheckpoints",
    "Damage",
    "Listing",
    "ListingDict",
    "checked_checkpoint",
    "damage_of",
    "damaged_checkpoint",
    "effect_from_row",
    "event_from_row",
    "flow_version_from_row",
    "lease_from_row",
    "listing",
    "loads_error",
    "origin_from_row",
    "task_run_from_row",
]

T = TypeVar("T")

PLAIN = LedgerCodec(None, strict=False)
"""Reads plain columns, and shows sealed ones as `SEALED`: for messages about a row."""

LEASE_HORIZON = 366 * 86400.0
"""A lease that expires further ahead than this (seconds) was not written by a worker:
leases live for seconds or minutes and are renewed."""

NEXT_STEP = ("Nothing was sent. Run `graph-durable check --db ...` to list every damaged "
             "row; restore it from a backup (or run the release that wrote it) before "
             "resuming the thread.")


@dataclass(frozen=True)
class Damage:
    """One row the database holds that cannot be read, or a rule it breaks, named."""

    table: str
    """The table (`effects`, `effect_events`, `thread_leases`, `checkpoints`, ...)."""
    thread_id: str | None
    """The thread the row belongs to, when the row says."""
    key: str | None
    """The row: an effect's key, a journal entry's seq, a checkpoint's id, a thread id."""
    column: str
    """The column that cannot be read (or the one the broken rule is about)."""
    problem: str
    """What is wrong, in words."""
    kind: str = "row"
    """`row` (a row that cannot be read), `rule` (rows that read but break an invariant
    the design relies on), `schema` (the schema version) or `engine` (the database's own
    integrity check)."""

    def __str__(self) -> str:
        where = f"thread {self.thread_id!r}: " if self.thread_id is not None else ""
        row = f" row {self.key!r}" if self.key is not None else ""
        column = f", column {self.column}" if self.column else ""
        return f"{where}{self.table}{row}{column}: {self.problem}"

    def error(self) -> LedgerDamaged:
        """This damage as the error a run that needs the row raises."""
        return LedgerDamaged(f"Unreadable row: {self}. {NEXT_STEP}", thread_id=self.thread_id,
                             key=self.key, column=self.column, table=self.table,
                             problem=self.problem)

    def to_dict(self) -> dict[str, Any]:
        """The damage as JSON-ready values."""
        return asdict(self)


def damage_of(error: LedgerDamaged) -> Damage:
    """The `Damage` a `LedgerDamaged` was raised for."""
    return Damage(error.table, error.thread_id, error.key, error.column, error.problem)


class Listing(list[T]):
    """A list of the rows that read, with `damaged`: the `Damage` of each row passed by."""

    damaged: tuple[Damage, ...] = ()


class ListingDict(dict[str, T]):
    """A mapping of the rows that read, with `damaged`: the `Damage` of each row passed by."""

    damaged: tuple[Damage, ...] = ()


def listing(rows: Iterable[Sequence[Any]], decode: Callable[[Sequence[Any]], T]) -> Listing[T]:
    """Every row `decode` reads; a row it cannot read is passed by and named in `damaged`."""
    found: Listing[T] = Listing()
    damaged: list[Damage] = []
    for row in rows:
        try:
            found.append(decode(row))
        except LedgerDamaged as exc:
            damaged.append(damage_of(exc))
    found.damaged = tuple(damaged)
    return found


class _Row:
    """Reads one row's columns, raising `LedgerDamaged` naming the first that fails."""

    def __init__(self, table: str, thread_id: Any, key: Any) -> None:
        self.table = table
        self.thread_id = thread_id if isinstance(thread_id, str) else (
            None if thread_id is None else repr(thread_id))
        self.key = None if key is None else str(key)

    def bad(self, column: str, problem: str) -> LedgerDamaged:
        return Damage(self.table, self.thread_id, self.key, column, problem).error()

    def text(self, column: str, value: Any, *, optional: bool = False) -> Any:
        if isinstance(value, str) or (optional and value is None):
            return value
        raise self.bad(column, f"holds {_shown(value)}, not text")

    def number(self, column: str, value: Any, *, whole: bool = False,
               optional: bool = False) -> Any:
        if optional and value is None:
            return value
        kinds = (int,) if whole else (int, float)
        if isinstance(value, kinds) and not isinstance(value, bool):
            return value
        raise self.bad(column, f"holds {_shown(value)}, not {'an integer' if whole else 'a number'}")

    def json(self, column: str, load: Callable[[], Any], *, kinds: tuple[type, ...] = (),
             optional: bool = True) -> Any:
        try:
            value = load()
        except GraphDurableError:
            raise  # a sealed value this saver has no key for: not damage
        except (ValueError, TypeError) as exc:
            raise self.bad(column, f"is not JSON ({_reason(exc)})") from None
        if kinds and not isinstance(value, (*kinds, Sealed)) and not (optional and value is None):
            raise self.bad(column, f"holds {_shown(value)}, not a JSON "
                                   f"{'object' if dict in kinds else kinds[0].__name__}")
        return value

    def status(self, value: Any) -> EffectStatus:
        try:
            return EffectStatus(value)
        except ValueError:
            raise self.bad("status", f"holds {value!r}, a status this release does not know "
                                     "(a newer graph_durable wrote it, or the row was "
                                     "edited)") from None


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def _reason(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:120] or type(exc).__name__


def effect_from_row(row: Sequence[Any], codec: LedgerCodec = PLAIN) -> EffectRecord:
    """An `EffectRecord` from a row selected with `_sql.EFFECT_COLUMNS`.

    Raises:
        LedgerDamaged: a column holds what no release writes.
    """
    (key, thread_id, ns, tcid, tool, args, status, receipt, error, attempts, decision,
     asked, created_at, updated_at) = row
    read = _Row("effects", thread_id, key)
    where = f" of thread {thread_id!r}"
    # The columns are checked, then the record built without pydantic's validation.
    return trusted_record(
        key=read.text("key", key),
        thread_id=read.text("thread_id", thread_id),
        checkpoint_ns=read.text("checkpoint_ns", ns),
        tool_call_id=read.text("tool_call_id", tcid),
        tool=read.text("tool", tool),
        args=read.json("args", lambda: codec.load(args, where=where), kinds=(dict,),
                       optional=False),
        status=read.status(status),
        receipt=read.json("receipt", lambda: codec.load(receipt, where=where)),
        error=read.json("error", lambda: codec.load_text(error, where=where), kinds=(str,)),
        attempts=read.number("attempts", attempts, whole=True),
        decision=read.json("decision", lambda: codec.load(decision, where=where),
                           kinds=(dict,)),
        asked=bool(read.number("asked", asked, whole=True)),
        created_at=read.number("created_at", created_at),
        updated_at=read.number("updated_at", updated_at),
    )


def event_from_row(row: Sequence[Any], codec: LedgerCodec = PLAIN) -> EffectEvent:
    """An `EffectEvent` from a row selected with `_sql.EVENT_COLUMNS`.

    Raises:
        LedgerDamaged: a column holds what no release writes.
    """
    seq, key, thread_id, kind, data, at, owner, token = row
    read = _Row("effect_events", thread_id, seq)
    return EffectEvent.model_construct(
        seq=read.number("seq", seq, whole=True), key=read.text("key", key),
        thread_id=read.text("thread_id", thread_id), kind=read.text("kind", kind),
        data=read.json("data", lambda: codec.load(data, where=f" of thread {thread_id!r}"),
                       kinds=(dict,), optional=False),
        at=read.number("at", at), owner=read.text("owner", owner, optional=True),
        fencing_token=read.number("fencing_token", token, whole=True, optional=True),
    )


def lease_from_row(thread_id: str, row: Sequence[Any] | None,
                   now: float | None = None) -> tuple[str, int, float] | None:
    """`(owner, token, expires_at)` of a thread's lease row (or `None` for no row).

    Raises:
        LedgerDamaged: a column holds what no release writes, or the lease expires
            further ahead than `LEASE_HORIZON` (no worker takes a lease for a year).
    """
    if row is None:
        return None
    owner, token, expires_at = row
    read = _Row("thread_leases", thread_id, thread_id)
    lease = (read.text("owner", owner), read.number("token", token, whole=True),
             read.number("expires_at", expires_at))
    if lease[2] - (time.time() if now is None else now) > LEASE_HORIZON:
        raise read.bad("expires_at", f"expires at {lease[2]!r}, over a year ahead: no "
                                     "worker takes a lease that long")
    return lease


def flow_version_from_row(row: Sequence[Any]) -> tuple[str, str]:
    """`(thread_id, flow_version)` of a flow-version pin."""
    thread_id, version = row
    read = _Row("thread_flow_versions", thread_id, thread_id)
    return read.text("thread_id", thread_id), read.text("flow_version", version)


def origin_from_row(row: Sequence[Any]) -> tuple[str, str]:
    """`(thread_id, origin_thread_id)` of a copied thread's origin row."""
    thread_id, origin = row[0], row[1]
    read = _Row("thread_origins", thread_id, thread_id)
    return read.text("thread_id", thread_id), read.text("origin_thread_id", origin)


def task_run_from_row(thread_id: str, row: Sequence[Any]
                      ) -> tuple[int, str, str, str, str, float]:
    """`(seq, run_id, checkpoint_ns, node, kind, at)` of a run-log entry."""
    seq, run_id, ns, node, kind, at = row
    read = _Row("task_runs", thread_id, seq)
    return (read.number("seq", seq, whole=True), read.text("run_id", run_id),
            read.text("checkpoint_ns", ns), read.text("node", node), read.text("kind", kind),
            read.number("at", at))


def damaged_checkpoint(config: Any, problem: str) -> LedgerDamaged:
    """The error for a checkpoint of `config`'s thread that cannot be read."""
    conf = (config or {}).get("configurable", {})
    thread_id = conf.get("thread_id")
    return Damage("checkpoints", None if thread_id is None else str(thread_id),
                  conf.get("checkpoint_id") or "latest", "checkpoint", problem).error()


def checked_checkpoint(found: Any, config: Any) -> Any:
    """`found` (a `CheckpointTuple` or `None`) if it has the shape every reader relies
    on; else `LedgerDamaged` naming the checkpoint."""
    if found is None:
        return None
    checkpoint = found.checkpoint
    problem = None
    if not isinstance(checkpoint, dict):
        problem = f"decodes to {_shown(checkpoint)}, not a checkpoint"
    elif not isinstance(checkpoint.get("channel_values", {}), dict):
        problem = "its channel_values are not a mapping"
    elif not isinstance(checkpoint.get("id"), str):
        problem = "it has no id"
    elif found.metadata is not None and not isinstance(found.metadata, dict):
        problem = f"its metadata decodes to {_shown(found.metadata)}"
    elif any(not isinstance(w, tuple) or len(w) != 3 for w in found.pending_writes or ()):
        problem = "a pending write of it is not (task, channel, value)"
    if problem is not None:
        conf = found.config.get("configurable", {}) if isinstance(found.config, dict) else {}
        raise damaged_checkpoint({"configurable": {**(config or {}).get("configurable", {}),
                                                   **conf}}, problem)
    return found


def loads_error(exc: BaseException) -> str:
    """What a decoding error says, in one line (for `damaged_checkpoint`)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"does not decode ({_reason(exc)})"
    return f"does not decode ({type(exc).__name__}: {_reason(exc)})"


_UNREADABLE = (ValueError, TypeError, AttributeError, IndexError, UnicodeDecodeError)
"""What reading a checkpoint whose blob or JSON is damaged raises inside LangGraph."""


class CheckedCheckpoints:
    """Mixin: `get_tuple`/`aget_tuple` read through `checked_checkpoint`, so a checkpoint
    that does not decode is `LedgerDamaged` naming its thread, for a run before anything
    runs, and for the operators' views. Put it before the LangGraph saver in the bases."""

    def get_tuple(self, config: Any) -> Any:
        """Fetch a checkpoint tuple, as LangGraph's saver does, or `LedgerDamaged`."""
        try:
            found = super().get_tuple(config)  # type: ignore[misc]
        except GraphDurableError:
            raise
        except _UNREADABLE as exc:
            raise damaged_checkpoint(config, loads_error(exc)) from exc
        return checked_checkpoint(found, config)

    async def aget_tuple(self, config: Any) -> Any:
        """Async `get_tuple`."""
        try:
            found = await super().aget_tuple(config)  # type: ignore[misc]
        except GraphDurableError:
            raise
        except _UNREADABLE as exc:
            raise damaged_checkpoint(config, loads_error(exc)) from exc
        return checked_checkpoint(found, config)
