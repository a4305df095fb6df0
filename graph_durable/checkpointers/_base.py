"""What the sync and async durable savers share beyond SQL: turning ledger writes into plans.

This module is over 400 lines: it is the one mixin every saver inherits (its
`__init__`, ledger writes as plans, flow pins, leases, the audit), in sections that
share the saver's state.
"""

from __future__ import annotations

import json
import logging
import secrets as _random
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    Checkpoint,
    CheckpointMetadata,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from graph_durable._langgraph import WRAPPER_INNER
from graph_durable.checkpointers import _sql
from graph_durable.checkpointers._audit import audit_of
from graph_durable.checkpointers._decode import (
    effect_from_row,
    event_from_row,
    flow_version_from_row,
    lease_from_row,
    origin_from_row,
)
from graph_durable.errors import FlowVersionMismatch, IllegalTransition, LeaseLost
from graph_durable.leases import (
    OWNER_KEY,
    TOKEN_KEY,
    Lease,
    check_fence,
    check_lease_available,
    register,
    unregister,
)
from graph_durable.ledger import (
    _UNSET,
    FROM_RECEIPT,
    RESULT_FROM_RECEIPT,
    EffectEvent,
    EffectRecord,
    IntentWrite,
    Keying,
    TransitionWrite,
    canonical_json,
    receipt_message,
)
from graph_durable.telemetry.emit import log_lease_takeover
from graph_durable.secrets import KeySecrets, LedgerCodec, column_json, ordered_json

__all__ = ["DurableSaverMixin", "IntentExists", "actor_of", "claims_of", "durable_saver"]

_log = logging.getLogger("graph_durable")


def _keep(value: Any) -> Any:
    return value


def _redact_result(result: Any, redact: Any) -> Any:
    """A stored result (a ToolMessage, or a Command carrying some) as redacted."""
    from langchain_core.messages import ToolMessage
    from langgraph.types import Command

    if isinstance(result, ToolMessage):
        return result.model_copy(update={"content": redact(result.content),
                                         "artifact": redact(result.artifact)})
    if isinstance(result, Command) and isinstance(result.update, dict):
        update = {name: ([_redact_result(m, redact) for m in value]
                         if isinstance(value, list) else value)
                  for name, value in result.update.items()}
        return Command(graph=result.graph, update=update, resume=result.resume,
                       goto=result.goto)
    return result


def _args_json(write: IntentWrite) -> str:
    """An intent's args column before sealing: redacted as its policy says, else its
    canonical JSON."""
    if write.redact is not None:
        return column_json(write.redact(write.args))
    return write.args_json if write.args_json is not None else canonical_json(write.args)


def _receipt_json(write: TransitionWrite) -> str | None:
    """A transition's receipt column before sealing (`None`: it sets no receipt). A
    receipt a result is rebuilt from keeps the tool's key order."""
    if write.receipt is _UNSET:
        return None
    if write.result is FROM_RECEIPT:
        return ordered_json(write.receipt)
    return column_json((write.redact or _keep)(write.receipt))


class KeyingChanged(Exception):
    """A claim made with a predicted keying (`predicted_keying`) found its thread keyed
    otherwise (a copy, a legacy thread, another key secret). Raised inside the claim's
    transaction before anything of it is written; the caller reads the keying and
    claims again."""

    def __init__(self, thread_id: str) -> None:
        super().__init__(f"thread {thread_id!r} is not keyed as predicted; nothing was "
                         "claimed")
        self.thread_id = thread_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (KeyingChanged, (self.thread_id,))


class IntentExists(Exception):
    """An intent whose key is already recorded; carries the recorded effect.

    Raised inside a write transaction before anything of the intent is written, so
    `claim` can report the existing record instead of writing a second intent.
    """

    def __init__(self, record: EffectRecord) -> None:
        super().__init__(record.key)
        self.record = record


_METADATA_JSON = json.JSONEncoder(ensure_ascii=False)
"""How a checkpoint's metadata column is encoded (LangGraph's SQLite savers' options),
made once: `json.dumps` with options builds an encoder per call."""


def actor_of(config: RunnableConfig | None) -> tuple[str | None, int | None]:
    """The lease owner and fencing token a write was made with, if any."""
    if not config:
        return None, None
    conf = config.get("configurable", {})
    return conf.get(OWNER_KEY), conf.get(TOKEN_KEY)


def claims_of(items: Sequence[Any]) -> list[tuple[EffectRecord, bool]]:
    """`(record, created)` per claimed intent of a group commit's queued writes (each with
    its `result` and `error`); a refused intent raises, after the others were committed."""
    claimed: list[tuple[EffectRecord, bool]] = []
    for item in items:
        if isinstance(item.error, IntentExists):
            claimed.append((item.error.record, False))
        elif item.error is not None:
            raise item.error
        else:
            claimed.append((item.result[0], True))
    return claimed


def durable_saver(saver: Any) -> DurableSaverMixin | None:
    """The durable saver a graph runs with: `saver` itself, or the one a wrapper holds.

    The Agent Server wraps the saver `langgraph.json` names in an adapter that adds run
    metadata to checkpoints and passes every call on, configs included; the ledger is
    written to the wrapped saver with the same config, so the fence holds as without the
    wrapper. Only a wrapper's own attribute is followed (not one it forwards), three
    levels deep at most.
    """
    for _ in range(4):
        if isinstance(saver, DurableSaverMixin):
            return saver
        saver = vars(saver).get(WRAPPER_INNER) if hasattr(saver, "__dict__") else None
        if saver is None:
            return None
    return None


@contextmanager
def renewed(lease: Lease, renew: Any, *, wait: bool = True) -> Iterator[Lease]:
    """Keep `lease` renewed (by `renew`, every `ttl / 3`) and registered while the block
    runs; the caller releases it after. With `wait`, a renewal under way has ended when
    the block exits (an event loop that `renew` needs calls `lease.join_renewal` off
    the loop instead)."""
    register(lease)
    lease.start_renewing(renew)
    try:
        yield lease
    finally:
        try:
            lease.stop_renewing(wait=wait)
        finally:
            unregister(lease)


class DurableSaverMixin:
    """Marks a durable saver; builds SQL plans and checks that need no I/O of their own."""

    serde: SerializerProtocol
    flow_version: str | None
    compatible_flow_versions: frozenset[str]

    def __init__(
        self, conn: Any, *args: Any, serde: SerializerProtocol | None = None,
        flow_version: str | None = None, compatible_flow_versions: Collection[str] = (),
        key_secret: str | bytes | Sequence[str | bytes] | None = None, **kwargs: Any,
    ) -> None:
        """Open the LangGraph saver on `conn` (`args`, `serde` and `kwargs` are its
        own), then the ledger's state (the options are documented on the saver's class,
        see `DurableSqliteSaver`), then the engine's (`_init_engine`)."""
        if serde is not None:  # also given after `args` (PostgreSQL's `pipe`)
            kwargs["serde"] = serde
        super().__init__(conn, *args, **kwargs)  # type: ignore[call-arg]
        self._init_durable(flow_version, compatible_flow_versions, key_secret)
        self._init_engine()

    def _init_engine(self) -> None:
        """The saver's own state beside the ledger's (its queues, locks, caches)."""

    @classmethod
    def _reader(cls, conn: Any, serde: SerializerProtocol | None) -> Any:
        """A saver on `conn` for `open_read_only`: the schema is there (creating or
        migrating it is not its work), and a value `serde` cannot open reads as sealed."""
        saver = cls(conn, serde=serde)
        saver.is_setup = True  # type: ignore[attr-defined]
        saver._lenient = True
        return saver

    def _init_durable(
        self, flow_version: str | None, compatible_flow_versions: Collection[str],
        key_secret: Any = None,
    ) -> None:
        self.flow_version = flow_version
        self.compatible_flow_versions = frozenset(compatible_flow_versions)
        self._key_secrets = KeySecrets.configured(key_secret)
        self._db_secret_seen: str | None = None
        self._codec_cache: LedgerCodec | None = None
        # Operators' read-only views show a value they cannot open as `<encrypted>`.
        self._lenient = False
        # Threads whose pin this saver has already seen match: pins never change.
        self._flow_checked: set[str] = set()
        self._deferred: dict[str, list[tuple[TransitionWrite, RunnableConfig | None]]] = {}
        self._deferred_lock = threading.Lock()
        # Deferred writes taken by the transaction under way (the saver's lock is held).
        self._uncommitted: list[tuple[TransitionWrite, RunnableConfig | None]] = []
        # The columns of each deferred write, encoded (sealed) once however many writes
        # carry it: `id(write) -> (write, columns)`, while it is deferred. (Two writes
        # planned at the same instant in two threads may each encode it.)
        self._encoded: dict[int, tuple[TransitionWrite, dict[str, Any]]] = {}
        # Resume values a decision batch consumed before LangGraph's background save of
        # them landed: `(thread_id, checkpoint_ns, checkpoint_id) -> value`.
        self._late_resumes: dict[tuple[str, str, str], Any] = {}
        # Checkpoints this saver committed lately: the guard asks whether the checkpoint
        # a tool call comes from is stored, and it usually is one of these.
        self._stored: dict[tuple[str, str, str], None] = {}
        self._refused: dict[tuple[str, str, str], LeaseLost] = {}

    # -- where a thread's keys come from -------------------------------------------------

    @staticmethod
    def _origin_params(source_thread_id: str, target_thread_id: str) -> tuple[Any, ...]:
        """Parameters of `UPSERT_ORIGIN` for a copy of `source_thread_id`."""
        return (target_thread_id, source_thread_id, source_thread_id, time.time())

    @staticmethod
    def _keying_params(thread_id: str) -> tuple[str, str, str]:
        """Parameters of `SELECT_KEYING`. Asked of the database on every step, never
        cached: another process may delete a thread and copy another into its id."""
        return (thread_id, thread_id, thread_id)

    def _keying_of(self, rows: Sequence[Any], thread_id: str) -> Keying:
        key_thread, legacy, scheme, db_secret = rows[0]
        origin_from_row((thread_id, key_thread))
        if db_secret is not None and db_secret != self._db_secret_seen:
            self._key_secrets.add(self._codec.load_text(
                db_secret, where=f"'s key secret (keying thread {str(key_thread)!r})")
                                  or "")
            self._db_secret_seen = db_secret
        secret, used = self._key_secrets.secret_for(scheme, str(key_thread))
        if str(key_thread) == str(thread_id) and not legacy and scheme is None:
            self._plain_keying = (secret, used)
        return Keying(str(key_thread), bool(legacy), secret, None if scheme else used)

    _plain_keying: tuple[bytes | None, str] | None = None
    """`(secret, scheme)` of the last thread read keyed as most are: by its own id, not
    legacy, not pinned yet (`predicted_keying`)."""

    def predicted_keying(self, thread_id: str) -> Keying | None:
        """The keying most threads have (their own id, not legacy, this saver's current
        key secret), once the saver has read one such thread; `None` before. A step's
        claim made with it saves the keying read: the claim checks it in its own
        transaction and raises `KeyingChanged`, writing nothing, if the thread is keyed
        otherwise (see `_keying_refusal`)."""
        plain = self._plain_keying
        if plain is None:
            return None
        return Keying(str(thread_id), False, plain[0], plain[1])

    async def apredicted_keying(self, thread_id: str) -> Keying | None:
        """`predicted_keying` (no I/O)."""
        return self.predicted_keying(thread_id)

    def _keying_refusal(self, rows: Sequence[Any], thread_id: str, expected: Keying
                        ) -> BaseException | None:
        """Why a claim made with the predicted keying `expected` must not be written, from
        `SELECT_KEYING`'s rows read in its transaction: `KeyingChanged` when the thread's
        keys come out otherwise (another key thread, legacy keys, another secret), or
        the error reading its keying raises; `None` when they are the keys it has."""
        try:
            actual = self._keying_of(rows, thread_id)
        except Exception as exc:  # noqa: BLE001 - the claim's error (a secret unavailable)
            return exc
        if (actual.key_thread, actual.legacy, actual.secret) != (
                expected.key_thread, expected.legacy, expected.secret):
            return KeyingChanged(thread_id)
        return None

    def _db_secret_params(self) -> tuple[str]:
        """Parameters of `INSERT_DB_KEY_SECRET`: a new random secret (the first writer's
        stays), sealed like the rest of the ledger."""
        return (self._codec.dump_text(_random.token_hex(32)) or "",)

    # -- the ledger's columns: sealed when the serde encrypts ----------------------------

    @property
    def _codec(self) -> LedgerCodec:
        codec = self._codec_cache
        if codec is None or codec.serde is not self.serde:
            codec = self._codec_cache = LedgerCodec(self.serde, strict=not self._lenient)
        return codec

    def _record(self, row: Sequence[Any]) -> EffectRecord:
        return effect_from_row(row, self._codec)

    def _event(self, row: Sequence[Any]) -> EffectEvent:
        return event_from_row(row, self._codec)

    # -- checkpoints this saver stored ---------------------------------------------------

    def _remember_stored(self, stored: RunnableConfig) -> None:
        conf = stored["configurable"]
        if len(self._stored) >= 1024:
            self._stored.clear()
        self._stored[(str(conf["thread_id"]), conf["checkpoint_ns"], conf["checkpoint_id"])] = None

    def _known_stored(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> bool:
        """Whether this saver stored the checkpoint; raises the `LeaseLost` the fence
        refused its save with, if it did (the lease may have expired since, so the
        lease row no longer tells)."""
        where = (str(thread_id), checkpoint_ns, checkpoint_id)
        refused = self._refused.get(where)
        if refused is not None:
            again = type(refused).__new__(type(refused))
            BaseException.__init__(again, *refused.args)
            again.__dict__.update(refused.__dict__)
            raise again
        return where in self._stored

    def _remember_refused(self, config: RunnableConfig, checkpoint_id: str,
                          refused: LeaseLost) -> None:
        """Keep that the fence refused the save of this checkpoint (`_known_stored`)."""
        if len(self._refused) >= 256:
            self._refused.clear()
        conf = config["configurable"]
        self._refused[(str(conf["thread_id"]), conf.get("checkpoint_ns", ""),
                       checkpoint_id)] = refused

    def _prune_deletes(self, thread_ids: Sequence[str], strategy: str) -> bool:
        """Check `prune`'s arguments and forget which checkpoints were stored; whether
        the threads are deleted whole (`delete`) rather than pruned to their newest
        checkpoints (`keep_latest`, the ledger kept)."""
        if isinstance(thread_ids, str):
            raise TypeError("thread_ids must be a sequence of thread IDs, not a str")
        self._forget_stored()
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"Unknown prune strategy {strategy!r}; use 'keep_latest' or 'delete'")
        return strategy == "delete"

    def _forget_stored(self) -> None:
        """Forget what was stored: checkpoints are being deleted."""
        self._stored.clear()

    # -- deferred receipts: committed with the thread's next write -----------------------
    #
    # A deferred receipt stays deferred until a write that carries it commits: every
    # write of its thread that begins meanwhile carries it too. So whichever write of
    # the thread commits first after the receipt was deferred (on a pool, writes of one
    # thread may commit in another order than they began) has it: a step's own write
    # never commits without its calls' receipts. A second carrier changes nothing (the
    # lifecycle refuses the same receipt twice) and says nothing.

    def _defer(self, write: Any, config: RunnableConfig | None) -> bool:
        """Keep a deferrable write for the thread's next transaction; `False` if not one."""
        if not (isinstance(write, TransitionWrite) and write.defer):
            return False
        with self._deferred_lock:
            self._deferred.setdefault(write.thread_id, []).append((write, config))
        return True

    def _taken(self) -> list[tuple[TransitionWrite, RunnableConfig | None]]:
        """The deferred writes the transaction under way carries (the saver's lock is
        held: one transaction at a time)."""
        return self._uncommitted

    def _take_deferred(self, thread_id: str,
                       keep: Callable[[TransitionWrite], bool] | None = None,
                       ) -> list[tuple[TransitionWrite, RunnableConfig | None]]:
        """The thread's deferred writes (those `keep` keeps), for the transaction under
        way; they stay deferred until it commits (`_deferred_committed`). One it carries
        already (a second check of the thread in one transaction) is not taken again."""
        mine = self._taken()
        carried = {id(write) for write, _ in mine}
        with self._deferred_lock:
            taken = [item for item in self._deferred.get(thread_id, ())
                     if id(item[0]) not in carried and (keep is None or keep(item[0]))]
        mine.extend(taken)
        return taken

    @contextmanager
    def _carrying(self) -> Iterator[None]:
        """Around carrying deferred writes inside a transaction: if it fails, the
        transaction no longer carries what it took there (a savepoint around it may
        undo what it wrote)."""
        mark = len(self._taken())
        try:
            yield
        except BaseException:
            del self._taken()[mark:]
            raise

    def _refused_deferred(self, write: TransitionWrite, error: IllegalTransition) -> None:
        """A deferred write the lifecycle no longer allows: it wrote nothing, and is
        dropped rather than fail the write it rode on. If the effect is already in the
        state the write would set (another write carrying it committed first), that is
        all; otherwise someone settled the effect meanwhile, which is logged."""
        mine = self._taken()
        mine[:] = [item for item in mine if item[0] is not write]
        if not self._drop_deferred([write]) or error.status is write.to:
            _log.debug("Deferred %s of effect %r in thread %r already written: %s",
                       write.kind, write.key, write.thread_id, error)
            return
        _log.warning("Deferred %s of effect %r in thread %r dropped: %s", write.kind,
                     write.key, write.thread_id, error)

    def _drop_deferred(self, writes: Sequence[TransitionWrite]) -> bool:
        """Stop deferring `writes` (committed, or refused); whether any still was."""
        dropped = False
        ids = {id(write) for write in writes}
        with self._deferred_lock:
            for write_id in ids:
                self._encoded.pop(write_id, None)
            for thread_id in {write.thread_id for write in writes}:
                pending = self._deferred.get(thread_id)
                if pending is None:
                    continue
                kept = [item for item in pending if id(item[0]) not in ids]
                dropped = dropped or len(kept) < len(pending)
                if kept:
                    self._deferred[thread_id] = kept
                else:
                    del self._deferred[thread_id]
        return dropped

    def _deferred_committed(self) -> None:
        """The transaction under way committed: what it carried is written."""
        mine = self._taken()
        if mine:
            self._drop_deferred([write for write, _ in mine])
            mine.clear()

    def _deferred_rolled_back(self) -> None:
        """The transaction rolled back: what it carried is still deferred."""
        self._taken().clear()

    def _forget_deferred(self, thread_id: str) -> None:
        """Drop the deferred writes of a thread being deleted."""
        with self._deferred_lock:
            for write, _ in self._deferred.pop(thread_id, ()):
                self._encoded.pop(id(write), None)

    # -- a consumed resume value whose save lands late ----------------------------------

    def _resume_consumed(self, write: Any, deleted: int) -> None:
        """A decision batch consumed its run's resume value (`write.resume_at`). If
        LangGraph's background save of that value has not landed yet (`deleted` is 0),
        remember it, so the save that brings it deletes it again: a stored resume value
        would answer the next question with an old answer. Called inside the batch's
        transaction, so a save either landed before it or sees the mark."""
        if deleted or write.resume_at is None or write.resume_value is None:
            return
        with self._deferred_lock:
            if len(self._late_resumes) >= 256:
                self._late_resumes.clear()
            self._late_resumes[(write.thread_id, *write.resume_at)] = write.resume_value

    def _late_resume(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                     task_id: str) -> list[_sql.Statement]:
        """Statements that delete a consumed resume value these writes save again (run
        in their transaction, after them): the same value object the batch consumed."""
        if task_id != _sql.NULL_TASK_ID or not self._late_resumes:
            return []
        conf = config["configurable"]
        slot = (str(conf["thread_id"]), str(conf.get("checkpoint_ns", "")),
                str(conf.get("checkpoint_id")))
        with self._deferred_lock:
            value = self._late_resumes.get(slot)
            if value is None or not any(channel == _sql.RESUME_CHANNEL and saved is value
                                        for channel, saved in writes):
                return []
            del self._late_resumes[slot]
        return [(_sql.DELETE_NULL_RESUME, slot)]

    # -- write guards: fencing and flow-version pin (run inside the write's transaction) --

    def _check_fence(self, row: Any, thread_id: str, config: RunnableConfig | None) -> None:
        token = actor_of(config)[1]
        if row is None and token is None:
            return  # no lease, and none claimed: nothing to fence (`check_fence`'s first case)
        check_fence(lease_from_row(thread_id, None if row is None else tuple(row)), thread_id,
                    token, time.time())

    def _needs_flow_check(self, thread_id: str) -> bool:
        return self.flow_version is not None and thread_id not in self._flow_checked

    def _flow_statements(self, row: Any, thread_id: str) -> list[_sql.Statement]:
        """Pin a new thread to this saver's flow version, or refuse a mismatch."""
        current = self.flow_version
        assert current is not None
        if row is None:
            return [(_sql.INSERT_FLOW_VERSION, (thread_id, current, time.time()))]
        pinned = flow_version_from_row((thread_id, row[0]))[1]
        if pinned != current and pinned not in self.compatible_flow_versions:
            raise FlowVersionMismatch(
                f"Thread {thread_id!r} was started under flow version {pinned!r}; this "
                f"graph is {current!r}. Nothing was written. Resume it with a worker "
                f"running {pinned!r}, or declare the versions compatible with "
                f"compatible_flow_versions={{{pinned!r}}} if the change is safe for "
                "threads in flight.",
                thread_id=thread_id, pinned=pinned, current=current,
            )
        self._flow_checked.add(thread_id)
        return []

    # -- checkpoint writes, as LangGraph's SQLite savers make them ----------------------

    def _checkpoint_statement(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata
    ) -> tuple[_sql.Statement, RunnableConfig]:
        conf = config["configurable"]
        type_, blob = self.serde.dumps_typed(checkpoint)
        meta = _METADATA_JSON.encode(get_checkpoint_metadata(config, metadata))
        params = (str(conf["thread_id"]), conf["checkpoint_ns"], checkpoint["id"],
                  conf.get("checkpoint_id"), type_, blob, meta.encode("utf-8", "ignore"))
        stored = {"configurable": {"thread_id": conf["thread_id"],
                                   "checkpoint_ns": conf["checkpoint_ns"],
                                   "checkpoint_id": checkpoint["id"]}}
        return (_sql.UPSERT_CHECKPOINT, params), stored

    def _writes_statement(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
        task_path: str,
    ) -> tuple[str, list[tuple[Any, ...]]]:
        conf = config["configurable"]
        sql = (_sql.REPLACE_WRITES if all(w[0] in WRITES_IDX_MAP for w in writes)
               else _sql.IGNORE_WRITES)
        rows = [
            (str(conf["thread_id"]), str(conf["checkpoint_ns"]), str(conf["checkpoint_id"]),
             task_id, task_path, WRITES_IDX_MAP.get(channel, idx), channel,
             *self.serde.dumps_typed(value))
            for idx, (channel, value) in enumerate(writes)
        ]
        return sql, rows

    # -- subgraph runs ---------------------------------------------------------------------

    def subgraph_inputs(self, thread_id: str) -> list[Any]:
        """The first checkpoint (`source == "input"`) of every run of a subgraph in
        `thread_id`: where the guard finds the earlier runs of a subgraph that a fork
        restarted (`graph_durable.nodes.restarts`)."""
        found = self.list({"configurable": {"thread_id": thread_id}},  # type: ignore[attr-defined]
                          filter={"source": "input"})
        return [one for one in found if one.config["configurable"].get("checkpoint_ns")]

    async def asubgraph_inputs(self, thread_id: str) -> list[Any]:
        """Async `subgraph_inputs`."""
        found = self.alist({"configurable": {"thread_id": thread_id}},  # type: ignore[attr-defined]
                           filter={"source": "input"})
        return [one async for one in found if one.config["configurable"].get("checkpoint_ns")]

    def checkpoint_before(self, thread_id: str, checkpoint_ns: str, before: str) -> Any:
        """The latest checkpoint of `checkpoint_ns` in `thread_id` saved before the
        checkpoint `before` (the last step of an earlier run of a subgraph that a later
        run restarted in the same namespace), or `None`."""
        found = self.list({"configurable": {"thread_id": thread_id,  # type: ignore[attr-defined]
                                            "checkpoint_ns": checkpoint_ns}},
                          before={"configurable": {"checkpoint_id": before}}, limit=1)
        return next(iter(found), None)

    async def acheckpoint_before(self, thread_id: str, checkpoint_ns: str, before: str) -> Any:
        """Async `checkpoint_before`."""
        found = self.alist({"configurable": {"thread_id": thread_id,  # type: ignore[attr-defined]
                                             "checkpoint_ns": checkpoint_ns}},
                           before={"configurable": {"checkpoint_id": before}}, limit=1)
        async for one in found:
            return one
        return None

    # -- the audit -----------------------------------------------------------------------

    def audit(self, thread_id: str) -> Any:
        """What ran again in each run of `thread_id`, and what became of its effects (an
        `Audit`, see `graph_durable.checkpointers._audit`; count re-run nodes and model
        calls by running the graph `audited`)."""
        return audit_of(self, thread_id)

    # -- leases --------------------------------------------------------------------------

    @contextmanager
    def lease(self, thread_id: str, owner: str, ttl: float = 30.0, *,
              wait: bool = True) -> Iterator[Lease]:
        """Hold `thread_id` as `owner` while the block runs, renewing every `ttl / 3`.

        Pass `lease.config` to `graph.invoke`: every write it makes presents the lease's
        fencing token. (On an async saver, call this from another thread than its
        event loop, or use `alease`.) With `wait=False`, a thread another worker is
        writing at this moment is not waited for (`LeaseHeld` at once, on PostgreSQL):
        what a sweep over many threads wants.

        Raises:
            LeaseHeld: another owner's lease on the thread is live.
        """
        try_acquire = getattr(self, "try_acquire_lease", None)
        if not wait and try_acquire is not None:
            lease = try_acquire(thread_id, owner, ttl)
        else:
            lease = self.acquire_lease(thread_id, owner, ttl)  # type: ignore[attr-defined]
        try:
            with renewed(lease, self.renew_lease):  # type: ignore[attr-defined]
                yield lease
        finally:
            self.release_lease(lease)  # type: ignore[attr-defined]

    @staticmethod
    def _new_lease(row: Any, thread_id: str, owner: str, ttl: float, *,
                   now: float | None = None, started: float | None = None
                   ) -> tuple[Lease, _sql.Statement]:
        """The lease to grant and its statement; `now` is the database's clock (default:
        this machine's), `started` the `time.monotonic()` the request began at."""
        if ttl <= 0:
            raise ValueError(f"lease ttl must be > 0 seconds, got {ttl}")
        started = time.monotonic() if started is None else started
        now = time.time() if now is None else now
        previous = lease_from_row(thread_id, None if row is None else tuple(row), now)
        token = check_lease_available(previous, thread_id, owner, now)
        if previous is not None and previous[0] != owner and previous[2] > 0:
            # Not released (that sets it to 0): its holder stopped, or renewed too late.
            log_lease_takeover(thread_id, owner, previous[0], token)
        lease = Lease(thread_id=thread_id, owner=owner, token=token, ttl=ttl,
                      expires_at=now + ttl, deadline=started + ttl)
        return lease, (_sql.UPSERT_LEASE, (thread_id, owner, token, lease.expires_at, now))

    def clock(self) -> float:
        """Now, on the clock the leases are judged by (Unix time): this machine's for
        SQLite; the database server's for PostgreSQL."""
        return time.time()

    def _plan_intents(
        self, writes: Sequence[IntentWrite], actor: tuple[str | None, int | None]
    ) -> list[tuple[tuple[_sql.Statement, _sql.Statement], list[_sql.Statement],
                    EffectRecord]]:
        """`_plan_intent` of each write claimed together, their args sealed together
        (`LedgerCodec.seal_together`) when the serde encrypts."""
        texts = self._codec.seal_together([_args_json(write) for write in writes])
        return [self._plan_intent(write, actor, text)
                for write, text in zip(writes, texts, strict=True)]

    def _plan_intent(
        self, write: IntentWrite, actor: tuple[str | None, int | None],
        args_text: str | None = None,
    ) -> tuple[tuple[_sql.Statement, _sql.Statement], list[_sql.Statement], EffectRecord]:
        """`(inherit, plan, record)`: first take the effect over from the thread's family
        if one of them holds its key (`_sql.plan_inherit`), else run `plan` (the insert,
        then the statements that follow it). `args_text`: the args column, already
        encoded (`_plan_intents`)."""
        now = time.time()
        inherit = _sql.plan_inherit(key=write.key, thread_id=write.thread_id,
                                    checkpoint_ns=write.checkpoint_ns, now=now, actor=actor)
        codec = self._codec
        if args_text is None:
            args_text = codec.dump_json(_args_json(write))
        plan, record = _sql.plan_intent(
            key=write.key,
            thread_id=write.thread_id,
            checkpoint_ns=write.checkpoint_ns,
            tool_call_id=write.tool_call_id,
            tool=write.tool,
            args=write.args,
            args_text=args_text,
            status=write.status,
            now=now,
            actor=actor,
            codec=codec,
            data=write.data,
        )
        if write.key_scheme is not None:
            plan.append((_sql.PIN_KEY_SCHEME,
                         (write.thread_id, write.thread_id, write.key_scheme, now)))
        return inherit, plan, record

    def _receipt_texts(self, writes: Sequence[TransitionWrite]) -> list[str | None]:
        """The receipt column of each transition written together (`None`: it sets no
        receipt, or its columns are encoded already), sealed together
        (`LedgerCodec.seal_together`); for `_plan_update`."""
        encoded = self._encoded
        plain = [None if id(write) in encoded else _receipt_json(write) for write in writes]
        sealed = iter(self._codec.seal_together([text for text in plain if text is not None]))
        return [None if text is None else next(sealed) for text in plain]

    def _transition_columns(self, write: TransitionWrite,
                            receipt_text: str | None = None) -> dict[str, Any]:
        """The encoded column values a transition sets (besides status and time):
        redacted as the tool's policy says, sealed when the serde encrypts.
        `receipt_text`: the receipt column, already encoded (`_receipt_texts`). A
        deferred write's are encoded once while it is deferred (`_encoded`)."""
        if write.defer:
            known = self._encoded.get(id(write))
            if known is not None:
                return known[1]
        columns = self._encode_columns(write, receipt_text)
        if write.defer:
            with self._deferred_lock:
                if any(item[0] is write for item in self._deferred.get(write.thread_id, ())):
                    self._encoded[id(write)] = (write, columns)
        return columns

    def _encode_columns(self, write: TransitionWrite,
                        receipt_text: str | None) -> dict[str, Any]:
        columns: dict[str, Any] = {}
        codec, redact = self._codec, write.redact or _keep
        if write.error is not _UNSET:
            columns["error"] = codec.dump_text(
                None if write.error is None else str(redact(write.error)))
        if receipt_text is None:
            plain = _receipt_json(write)
            receipt_text = None if plain is None else codec.seal(plain)
        if receipt_text is not None:
            columns["receipt"] = receipt_text
        if write.result is FROM_RECEIPT:
            # The result is the receipt's own message: the receipt, in its own key order,
            # is all that is stored (`_load_result` rebuilds the message).
            columns["result_type"], columns["result"] = RESULT_FROM_RECEIPT, None
        if write.result is not _UNSET and write.result is not FROM_RECEIPT:
            result = write.result if write.redact is None else _redact_result(write.result,
                                                                              redact)
            columns["result_type"], columns["result"] = self.serde.dumps_typed(result)
        if write.decision is not _UNSET:
            decision = write.decision
            if decision is not None and write.redact is not None:
                decision = {**redact(decision), **({"edited_action": decision["edited_action"]}
                                                   if "edited_action" in decision else {})}
            columns["decision"] = None if decision is None else codec.dump(decision)
            if decision is not None and "edited_key" in decision:
                columns["edited_key"] = decision["edited_key"]
        if write.asked is not _UNSET:
            columns["asked"] = int(write.asked)
        if write.checkpoint_ns is not _UNSET:
            columns["checkpoint_ns"] = write.checkpoint_ns
        if write.tool_call_id is not _UNSET:
            columns["tool_call_id"] = write.tool_call_id
        return columns

    def _plan_update(self, write: TransitionWrite, now: float,
                     returning: str | None = _sql.EFFECT_COLUMNS,
                     receipt_text: str | None = None) -> _sql.Statement:
        """The conditional `UPDATE ... RETURNING` that carries out `write`
        (`receipt_text`: its receipt column, already encoded)."""
        return _sql.plan_update(
            thread_id=write.thread_id, key=write.key, to=write.to, now=now,
            columns=self._transition_columns(write, receipt_text),
            bump_attempts=write.bump_attempts, returning=returning,
        )

    def _transition_event(
        self, record: EffectRecord | _sql.Journaled, write: TransitionWrite, now: float,
        actor: tuple[str | None, int | None],
    ) -> _sql.Statement:
        data = write.data if write.redact is None else write.redact(write.data)
        return _sql.transition_event(record, kind=write.kind, data=data, now=now,
                                     actor=actor, bump_attempts=write.bump_attempts,
                                     codec=self._codec)

    def _load_result(self, row: Sequence[Any] | None) -> Any:
        """The stored result of `SELECT_RESULT`'s row: deserialised, or rebuilt from the
        receipt (`RESULT_FROM_RECEIPT`)."""
        if row is None or row[0] is None:
            return None
        if row[0] == RESULT_FROM_RECEIPT:
            return receipt_message(self._codec.load(row[2]), row[3], row[4])
        return self.serde.loads_typed((row[0], bytes(row[1])))
