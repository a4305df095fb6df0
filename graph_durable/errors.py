"""Exceptions raised by graph_durable.

The hierarchy::

    GraphDurableError (Exception)
    ├── DurabilityError          effects refused: the requesting step is not durably saved
    ├── DatabaseUnavailable      the database broke under a write (a connection lost,
    │   │                        an I/O error, a lock held past the busy timeout)
    │   └── StorageFull          the database's disk is full
    ├── ReadOnlyDatabase         a write tried on a read-only connection or replica
    ├── InvalidDecision          a resume value that does not answer the pending interrupt
    ├── FlowVersionMismatch      a thread pinned to another flow version
    ├── LeaseHeld                another live owner holds the thread
    ├── MiddlewareOrderError     a middleware inside the guard re-calls or answers for a tool
    ├── NotDurableCheckpointer   the graph was compiled without a durable saver
    ├── UnkeyableToolCall        a call with no stable key: args not canonical JSON, no id,
    │                            or a requesting AIMessage without an id
    ├── UndeliveredKey           a tool promised to dedupe (or be looked up) by a key
    │                            that would never reach its provider
    ├── IllegalTransition        a ledger status change the lifecycle forbids
    └── LedgerDamaged            a stored row (ledger or checkpoint) that cannot be read

    LeaseLost (BaseException)    a write made with a stale fencing token
    └── ThreadCancelled          a write to (or a lease on) a thread cancel() stopped

    Tool outcomes (raised by tools, read by the guard):
    ├── NotApplied (Exception)   the provider certainly did not apply the effect
    └── Retryable (Exception)    not applied, and worth trying again with the same key

`LeaseLost` derives from `BaseException` so that a tool's `except Exception` cannot
swallow it: once a worker has lost its thread it must stop, not carry on.
"""

from __future__ import annotations

from contextvars import ContextVar

__all__ = [
    "DatabaseUnavailable",
    "DurabilityError",
    "FlowVersionMismatch",
    "GraphDurableError",
    "IllegalTransition",
    "InvalidDecision",
    "LeaseHeld",
    "LeaseLost",
    "LedgerDamaged",
    "MiddlewareOrderError",
    "NotApplied",
    "NotDurableCheckpointer",
    "ReadOnlyDatabase",
    "Retryable",
    "StorageFull",
    "ThreadCancelled",
    "UndeliveredKey",
    "UnkeyableToolCall",
]


class GraphDurableError(Exception):
    """Base class of graph_durable's errors.

    Attributes:
        thread_id: The thread concerned, when known.
        tool_call_id: The tool call concerned, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        thread_id: str | None = None,
        tool_call_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.tool_call_id = tool_call_id


class DurabilityError(GraphDurableError):
    """The step that requested an effect is not durably checkpointed.

    Raised before anything is sent. Under `durability="async"` or `"exit"` a crash can
    lose the AIMessage that asked for the effect; the model then chooses again with new
    tool_call_ids, which means new keys and duplicate effects.
    """


class DatabaseUnavailable(GraphDurableError):
    """The database broke under a write: the connection was lost (the server restarted,
    or the connection was terminated), the storage failed (SQLite's disk I/O error), or
    another connection held the write lock past the busy timeout. The write was not
    committed, unless the break hit its `COMMIT`; either way nothing is lost: running the
    thread again reconciles it from its ledger. A read is retried once on a fresh pooled
    connection instead.

    Raised from a guarded call, it names the call and says whether it was sent (`sent`):
    not sent, nothing happened; sent, its receipt is not recorded yet, and resuming the
    thread reconciles it (a lookup, a same-key re-send, or a question for a person).

    Attributes:
        sent: Whether the guarded call it was raised from had been sent; `None` when not
            raised from a guarded call.
    """

    sent: bool | None = None


class StorageFull(DatabaseUnavailable):
    """The database's disk (or its quota) is full: nothing of the write was stored. Free
    space, then resume the thread."""


class ReadOnlyDatabase(GraphDurableError):
    """A write was tried through a saver whose connection may only read (SQLite opened
    `mode=ro` or on a file this process may not write, a PostgreSQL read replica or
    read-only transaction). Nothing was written. Reads work on such a connection; the
    message says what needed write access and how to get it."""

    @classmethod
    def refused(cls, what: str, cause: BaseException, *, thread_id: str | None = None,
                tool_call_id: str | None = None) -> ReadOnlyDatabase:
        """The error for `what` (e.g. "this write") refused with `cause`."""
        where = f"thread {thread_id!r}: " if thread_id is not None else ""
        if tool_call_id is not None:
            where = f"{where[:-2]}, tool call {tool_call_id!r}: "
        detail = " ".join(str(cause).split())[:200]
        return cls(
            f"{where}{what} needs write access, but the saver's connection is read-only "
            f"({detail}). Nothing was written. Reading (get_state, history, the ledger, "
            "the CLI's read commands) works on it; to run the graph, record effects, "
            "take leases or delete, open the database read-write: SQLite without "
            "mode=ro and as a user who may write the file, PostgreSQL on the primary "
            "and without default_transaction_read_only.", thread_id=thread_id,
            tool_call_id=tool_call_id)


class InvalidDecision(GraphDurableError):
    """A resume value that does not answer the pending interrupt.

    The interrupt stays pending and the ledger is unchanged; resume again with a
    corrected decision.
    """


class FlowVersionMismatch(GraphDurableError):
    """A thread first checkpointed under one flow version resumed under another.

    Attributes:
        pinned: The version the thread is pinned to.
        current: The version of the running graph.
    """

    def __init__(self, message: str, *, thread_id: str, pinned: str, current: str) -> None:
        super().__init__(message, thread_id=thread_id)
        self.pinned = pinned
        self.current = current


class LeaseHeld(GraphDurableError):
    """Another owner holds a live lease on the thread.

    Attributes:
        holder: The owner holding the lease.
        expires_at: When the lease expires unless renewed (Unix time).
    """

    def __init__(
        self, message: str, *, thread_id: str, holder: str, expires_at: float
    ) -> None:
        super().__init__(message, thread_id=thread_id)
        self.holder = holder
        self.expires_at = expires_at


class MiddlewareOrderError(GraphDurableError):
    """A `create_agent` middleware that may call the tool handler again, or answer in
    the tool's place, is listed after `EffectGuardMiddleware`, so it runs inside the guard.

    Raised before anything is sent a second time. List such middleware
    (`ToolRetryMiddleware`, a per-call `HumanInTheLoopMiddleware`, ...) before the guard
    and run the thread again; what the refused call had done is reconciled then.
    """


class NotDurableCheckpointer(GraphDurableError):
    """The graph running an effect guard was compiled without a durable saver."""


class UnkeyableToolCall(GraphDurableError, TypeError):
    """A tool call that cannot be keyed: arguments that are not canonical JSON, no id, or
    a requesting AIMessage without an id (a state without `add_messages`, or a message
    built by hand; see `graph_durable.nodes.anchor`), or args a middleware before the guard
    changed under a tool_call_id that several calls of the message to the tool share.

    Without them there is no stable idempotency key, so nothing is claimed or sent.
    """


class UndeliveredKey(GraphDurableError, ValueError):
    """A tool whose policy relies on the provider knowing the call's key (`idempotent`,
    or a `lookup`) but whose key would never reach the provider: its schema has a
    key-like argument (`idempotency_key`, ...) that `Effect(key_arg=...)` does not name,
    or `key_arg` names an argument the tool does not have.

    Raised before anything is claimed or sent. Name the argument in the policy
    (`Effect(idempotent=True, key_arg="idempotency_key")`) so the guard fills it.

    Attributes:
        tool: The tool's name.
    """

    def __init__(self, message: str, *, tool: str) -> None:
        super().__init__(message)
        self.tool = tool


class IllegalTransition(GraphDurableError):
    """A ledger status change that the effect lifecycle does not allow.

    Attributes:
        status: The effect's status (an `EffectStatus`) when the change was refused;
            `None` when there is no such effect or it was not said.
    """

    status: Any = None


class LedgerDamaged(GraphDurableError):
    """A row the database holds cannot be read: a ledger row (an effect, a journal entry,
    a lease, a flow-version pin, a thread's origin, a run-log entry) or a LangGraph
    checkpoint whose column holds what no release writes (a status this release does not
    know, text that is not JSON, a value of the wrong type, a blob that does not decode).
    A bad restore, a manual edit or a row a newer release wrote leaves one.

    Raised by a run (and by `review`, `compensate`, `cancel`) that needs the row, before
    anything is sent; list views pass the row by and show its thread as `damaged`. Run
    `graph-durable check` to list every damaged row, then restore the row from a backup
    (or run the release that wrote it) before resuming the thread.

    Attributes:
        thread_id: The thread the row belongs to, when it says.
        key: The row: an effect's key, a journal entry's `seq`, a checkpoint's id, or the
            thread id for a row kept per thread.
        column: The column that cannot be read.
        table: The table the row is in.
        problem: What is wrong with it, in words.
    """

    def __init__(self, message: str, *, thread_id: str | None, key: str | None,
                 column: str, table: str, problem: str) -> None:
        super().__init__(message, thread_id=thread_id)
        self.key = key
        self.column = column
        self.table = table
        self.problem = problem

    @property
    def fact(self) -> str:
        """The damaged row in one line: its table, row and column, and what is wrong."""
        row = f" row {self.key!r}" if self.key is not None else ""
        return f"{self.table}{row}, column {self.column}: {self.problem}"


class LeaseLost(BaseException):
    """A checkpoint or ledger write carried a stale fencing token.

    Another worker has taken the thread over. This derives from `BaseException` so a
    tool's `except Exception` cannot swallow it.

    Attributes:
        thread_id: The thread whose lease was lost.
        token: The stale fencing token that was presented.
    """

    def __init__(self, message: str, *, thread_id: str, token: int | None) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.token = token


class ThreadCancelled(LeaseLost):
    """The thread was stopped for good by `graph_durable.cancel()`.

    Raised by any checkpoint or ledger write to it, and by `saver.lease()` for anyone but
    another cancel (which may finish a cancel that stopped half way). A `LeaseLost`, so a
    tool's `except Exception` cannot swallow it.

    Attributes:
        thread_id: The cancelled thread.
        token: The fencing token presented, if any.
        cancelled_by: The owner that cancelled it.
    """

    def __init__(self, message: str, *, thread_id: str, token: int | None,
                 cancelled_by: str) -> None:
        super().__init__(message, thread_id=thread_id, token=token)
        self.cancelled_by = cancelled_by


_REPORTED: ContextVar[list[Exception] | None] = ContextVar("graph_durable_reported",
                                                          default=None)
"""Set by the guard while it runs a tool: the `NotApplied` and `Retryable` errors made
meanwhile, so that one an error handler turns into an error ToolMessage is still told
apart from an error after which the effect may exist."""


class _ToolOutcome(Exception):
    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        reported = _REPORTED.get()
        if reported is not None:
            reported.append(self)


class NotApplied(_ToolOutcome):
    """Raised by a tool: the provider certainly did not apply the effect.

    The effect becomes `failed` and the model sees an error ToolMessage. Once a tool has
    started, this is the only way to say "not applied": any other error (an exception,
    a `ToolException` that `handle_tool_error` turns into a message, an error
    ToolMessage the tool returns) leaves the outcome `unknown`.
    """


class Retryable(_ToolOutcome):
    """Raised by a tool: not applied, and worth another attempt with the same key.

    The guard retries up to `Effect.retries` times with backoff, then records `failed`.
    """
