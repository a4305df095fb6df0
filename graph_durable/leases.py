"""Leases with fencing tokens: one owner per thread, and late writes rejected.

`saver.lease(thread_id, owner, ttl)` takes a thread (or raises `LeaseHeld`), renews it
in the background every `ttl / 3`, and yields a `Lease` whose `config` is passed to
`graph.invoke`. Every checkpoint and ledger write made with that config presents the
lease's fencing token, checked in the same transaction as the write: a token that is
no longer the thread's newest, or whose lease has expired, raises `LeaseLost`.

What a fencing token does not do: it protects *our* database, not the provider. A
worker paused inside a tool call (GC pause, SIGSTOP, a hung socket) may still reach the
provider after another worker took over. The guard refuses to send once it knows its
lease is gone, and tools can pass `current_effect().fencing_token` to a provider that
supports fencing (rejects tokens lower than the highest it has seen) to close the gap;
a provider without fencing relies on the idempotency key alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from graph_durable.errors import LeaseHeld, LeaseLost, ThreadCancelled

__all__ = ["CANCEL_PREFIX", "Lease", "active_lease", "cancelled_by", "check_fence",
           "check_lease_available"]

logger = logging.getLogger("graph_durable")

CANCEL_PREFIX = "cancelled-by:"
"""Lease owners of `cancel()` start with this. The lease row of a cancelled thread keeps
such an owner once released: it is the durable mark that the thread is stopped for good,
read by the same fence check as every write (so it costs nothing more)."""


def cancelled_by(holder: str | None) -> str | None:
    """Who cancelled the thread whose lease row names `holder` (`None`: not cancelled)."""
    if holder is not None and holder.startswith(CANCEL_PREFIX):
        return holder[len(CANCEL_PREFIX):]
    return None


def _cancelled(thread_id: str, holder: str, token: int | None) -> ThreadCancelled:
    who = cancelled_by(holder)
    return ThreadCancelled(
        f"Thread {thread_id!r} was cancelled by {who!r}: it does not run again, and "
        "nothing was written. Start a new thread, or run cancel() again to finish a "
        "cancel that stopped half way.",
        thread_id=thread_id, token=token, cancelled_by=who or holder)

RENEWAL_WAIT = 10.0
"""Seconds a stopped lease waits for a renewal under way (see `Lease.join_renewal`)."""

OWNER_KEY = "graph_durable_owner"
TOKEN_KEY = "graph_durable_fencing_token"


@dataclass
class Lease:
    """A thread held by one owner until `expires_at`, renewed while in use.

    `expires_at` is on the database's clock (the worker's own for SQLite, which one
    machine shares; the server's for PostgreSQL). This process judges its own lease by
    `deadline`, on its monotonic clock, taken before the database granted the time: never
    later than the database's expiry, whatever the worker's wall clock says.
    """

    thread_id: str
    owner: str
    token: int
    ttl: float
    expires_at: float
    lost: bool = False
    deadline: float | None = None
    """`time.monotonic()` until which this process may act (default: from `expires_at`
    and the local wall clock)."""
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _renewer: threading.Thread | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.deadline is None:
            self.deadline = time.monotonic() + max(0.0, self.expires_at - time.time())

    def extended(self, expires_at: float, started: float) -> None:
        """Record a renewal: the database's new `expires_at`, granted for `ttl` from a
        request that began at `started` (`time.monotonic()`)."""
        self.expires_at = expires_at
        self.deadline = started + self.ttl

    @property
    def config(self) -> dict[str, Any]:
        """The config to run the graph with: thread_id plus owner and fencing token."""
        return {"configurable": {"thread_id": self.thread_id, OWNER_KEY: self.owner,
                                 TOKEN_KEY: self.token}}

    def is_valid(self, now: float | None = None) -> bool:
        """Whether this process may still act for the thread (renewed and not lost);
        `now` on the database's clock, else judged by `deadline`."""
        if self.lost:
            return False
        if now is not None:
            return now < self.expires_at
        return time.monotonic() < (self.deadline or 0.0)

    def check(self) -> None:
        """Raise `LeaseLost` if the lease is lost or has expired without renewal."""
        if not self.is_valid():
            raise LeaseLost(
                f"Lease on thread {self.thread_id!r} (owner {self.owner!r}, token "
                f"{self.token}) is lost or expired; another worker may own the thread. "
                "Stop this run; the new owner resumes it.",
                thread_id=self.thread_id, token=self.token,
            )

    def start_renewing(self, renew: Callable[[Lease], bool]) -> None:
        """Renew every `ttl / 3` in a daemon thread until stopped or lost."""

        def loop() -> None:
            while not self._stop.wait(self.ttl / 3):
                try:
                    renewed = renew(self)
                except Exception:
                    # A failed renewal is not a lost lease yet: it expires on its own.
                    continue
                if not renewed:
                    self.lost = True
                    return

        self._renewer = threading.Thread(target=loop, daemon=True,
                                         name=f"graph-durable-lease-{self.thread_id}")
        self._renewer.start()

    def stop_renewing(self, *, wait: bool = True) -> None:
        """Stop the background renewal and, with `wait`, wait for a renewal under way
        (see `join_renewal`)."""
        self._stop.set()
        if wait:
            self.join_renewal()

    def join_renewal(self) -> None:
        """Wait for the renewal thread to end once stopped: a renewal under way finishes
        its statement first, so the saver's connection may be closed after this returns
        (closing a SQLite connection while another thread runs a statement on it can
        crash the process). A renewal that hangs is waited for `RENEWAL_WAIT` seconds
        (or `ttl`, if longer)."""
        renewer = self._renewer
        if renewer is None or renewer is threading.current_thread():
            return
        renewer.join(timeout=max(self.ttl, RENEWAL_WAIT))
        if renewer.is_alive():
            logger.warning(
                "lease of thread %s (owner %s): a renewal still runs after %.0f s; its "
                "saver's connection must stay open until it ends", self.thread_id,
                self.owner, max(self.ttl, RENEWAL_WAIT),
                extra={"thread_id": self.thread_id, "owner": self.owner})


_ACTIVE: dict[tuple[str, int], Lease] = {}
_ACTIVE_LOCK = threading.Lock()


def register(lease: Lease) -> None:
    """Make a lease known to this process's guards (see `active_lease`)."""
    with _ACTIVE_LOCK:
        _ACTIVE[(lease.thread_id, lease.token)] = lease


def unregister(lease: Lease) -> None:
    """Forget a released lease."""
    with _ACTIVE_LOCK:
        _ACTIVE.pop((lease.thread_id, lease.token), None)


def active_lease(config: dict[str, Any] | None) -> Lease | None:
    """The lease of this process a run's config was made from, if any."""
    conf = (config or {}).get("configurable", {})
    token = conf.get(TOKEN_KEY)
    if token is None:
        return None
    return _ACTIVE.get((str(conf.get("thread_id")), token))


def check_lease_available(
    row: tuple[str, int, float] | None, thread_id: str, owner: str, now: float
) -> int:
    """The token of a new acquisition, or `LeaseHeld` if another owner holds the thread.

    `row` is `(owner, token, expires_at)` of the thread's lease row, if any.
    """
    if row is None:
        return 1
    holder, token, expires_at = row
    if cancelled_by(holder) is not None and cancelled_by(owner) is None:
        raise _cancelled(thread_id, holder, None)
    if expires_at > now and holder != owner:
        raise LeaseHeld(
            f"Thread {thread_id!r} is held by {holder!r} until "
            f"{time.strftime('%H:%M:%S', time.localtime(expires_at))} "
            f"({expires_at - now:.1f} s from now); wait for it to finish or expire.",
            thread_id=thread_id, holder=holder, expires_at=expires_at,
        )
    return token + 1


def check_fence(
    row: tuple[str, int, float] | None, thread_id: str, token: int | None, now: float
) -> None:
    """Reject a write whose fencing token is stale (checked inside the write's transaction).

    A write with a token must carry the thread's newest token, on a lease not yet
    expired. A write without a token is rejected while another owner's lease is live.
    """
    if row is None:
        if token is not None:
            raise LeaseLost(
                f"Write to thread {thread_id!r} carries fencing token {token}, but the "
                "thread has no lease (it was deleted?). Stop this run.",
                thread_id=thread_id, token=token,
            )
        return
    holder, current, expires_at = row
    if token is None and cancelled_by(holder) is not None:
        raise _cancelled(thread_id, holder, None)
    if token is None:
        if expires_at > now:
            raise LeaseLost(
                f"Write to thread {thread_id!r} without a lease while {holder!r} holds it "
                f"(token {current}); run it through saver.lease(...) or wait for the "
                "lease to end.",
                thread_id=thread_id, token=None,
            )
        return
    if token != current and cancelled_by(holder) is not None:
        raise _cancelled(thread_id, holder, token)
    if token != current or expires_at <= now:
        reason = (f"token {current} was issued to {holder!r} since" if token != current
                  else "the lease expired before it was renewed")
        raise LeaseLost(
            f"Write to thread {thread_id!r} with stale fencing token {token}: {reason}. "
            "This worker no longer owns the thread; its write was rejected.",
            thread_id=thread_id, token=token,
        )
