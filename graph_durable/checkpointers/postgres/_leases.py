"""Leases of the PostgreSQL savers, on the server's clock: `PostgresLeases` for
`DurablePostgresSaver`, `AsyncPostgresLeases` for `AsyncDurablePostgresSaver`."""

from __future__ import annotations

import asyncio
import time

from graph_durable.checkpointers import _sql
from graph_durable.checkpointers.postgres import _sql as _pg
from graph_durable.checkpointers.postgres._sql import arun as _run
from graph_durable.errors import LeaseHeld
from graph_durable.leases import Lease

__all__ = ["AsyncPostgresLeases", "PostgresLeases"]


class PostgresLeases:
    """Mixin: take, renew and release leases, and read the server's clock; needs the
    saver's `_txn`, `_read` and `_new_lease`."""

    def acquire_lease(self, thread_id: str, owner: str, ttl: float = 30.0) -> Lease:
        """Take the thread with a new, higher fencing token (see `lease`). Expiry is
        on the server's clock: workers whose clocks disagree still agree on it."""
        return self._acquire(str(thread_id), owner, ttl, wait=True)

    def try_acquire_lease(self, thread_id: str, owner: str, ttl: float = 30.0) -> Lease:
        """`acquire_lease`, but without waiting while another worker writes the thread:
        its advisory lock is tried, as `FOR UPDATE SKIP LOCKED` skips a locked row, so
        sweepers over many threads never queue behind each other.

        Raises:
            LeaseHeld: the thread is being written right now, or its lease is live.
        """
        return self._acquire(str(thread_id), owner, ttl, wait=False)

    def _acquire(self, thread_id: str, owner: str, ttl: float, *, wait: bool) -> Lease:
        started = time.monotonic()
        with self._txn() as cur:
            if not wait and not cur.execute(_pg.TRY_LOCK_THREAD, (thread_id,)).fetchone()[0]:
                raise LeaseHeld(
                    f"Thread {thread_id!r} is being written by another worker right now; "
                    "passed by (try again later).",
                    thread_id=thread_id, holder="(another worker, writing)", expires_at=0.0)
            row, now = _pg.lease_and_clock(
                cur.execute(_pg.LOCK_THREAD_READ_LEASE, (thread_id,)).fetchone())
            lease, statement = self._new_lease(row, thread_id, owner, ttl, now=now,
                                               started=started)
            _pg.run(cur, *statement)
        return lease

    def renew_lease(self, lease: Lease) -> bool:
        """Extend a live lease by its ttl on the server's clock; `False` if it expired
        or was taken over."""
        started = time.monotonic()
        with self._txn() as cur:
            cur.execute(_pg.LOCK_THREAD, (lease.thread_id,))
            row = cur.execute(_pg.RENEW_LEASE_AT, (lease.ttl, lease.thread_id, lease.token)
                              ).fetchone()
        if row is not None:
            lease.extended(row[0], started)
        return row is not None

    def clock(self) -> float:
        """The server's clock (Unix time), which leases are judged by."""
        with self._read() as cur:
            return float(cur.execute(_pg.NOW).fetchone()[0])

    def live_leases(self) -> dict[str, tuple[str, int, float]]:
        """`{thread_id: (owner, token, expires_at)}` of every lease live by the server's
        clock."""
        with self._read() as cur:
            rows = cur.execute(_pg.SELECT_LIVE_LEASES_AT).fetchall()
        return {thread_id: (owner, token, expires) for thread_id, owner, token, expires in rows}

    def release_lease(self, lease: Lease) -> None:
        """End a lease now (a no-op if another owner has taken the thread since)."""
        with self._txn() as cur:
            cur.execute(_pg.LOCK_THREAD, (lease.thread_id,))
            _pg.run(cur, _sql.RELEASE_LEASE, (lease.thread_id, lease.token))


class AsyncPostgresLeases:
    """Mixin: take, renew and release leases, and read the server's clock; needs the
    saver's `_txn`, `_aquery`, `_sync`, `_new_lease` and `loop`."""

    _server_clock: tuple[float, float] | None = None
    """The server's clock as last read, against this process's monotonic clock."""

    def _saw_clock(self, now: float) -> float:
        self._server_clock = (now, time.monotonic())
        return now

    async def aacquire_lease(self, thread_id: str, owner: str, ttl: float = 30.0) -> Lease:
        """Take the thread with a new, higher fencing token; expiry on the server's clock."""
        return await self._acquire(str(thread_id), owner, ttl, wait=True)

    async def atry_acquire_lease(self, thread_id: str, owner: str, ttl: float = 30.0) -> Lease:
        """`aacquire_lease` without waiting while another worker writes the thread.

        Raises:
            LeaseHeld: the thread is being written right now, or its lease is live.
        """
        return await self._acquire(str(thread_id), owner, ttl, wait=False)

    def try_acquire_lease(self, thread_id: str, owner: str, ttl: float = 30.0) -> Lease:
        """Sync `atry_acquire_lease`."""
        return self._sync(self.atry_acquire_lease(thread_id, owner, ttl))

    async def _acquire(self, thread_id: str, owner: str, ttl: float, *, wait: bool) -> Lease:
        started = time.monotonic()
        async with self._txn() as cur:
            if not wait:
                await cur.execute(_pg.TRY_LOCK_THREAD, (thread_id,))
                if not (await cur.fetchone())[0]:
                    raise LeaseHeld(
                        f"Thread {thread_id!r} is being written by another worker right "
                        "now; passed by (try again later).",
                        thread_id=thread_id, holder="(another worker, writing)",
                        expires_at=0.0)
            await cur.execute(_pg.LOCK_THREAD_READ_LEASE, (thread_id,))
            row, now = _pg.lease_and_clock(await cur.fetchone())
            lease, statement = self._new_lease(row, thread_id, owner, ttl,
                                               now=self._saw_clock(now), started=started)
            await _run(cur, *statement)
        return lease

    async def arenew_lease(self, lease: Lease) -> bool:
        """Extend a live lease by its ttl on the server's clock; `False` if it expired or
        was taken over."""
        started = time.monotonic()
        async with self._txn() as cur:
            await cur.execute(_pg.LOCK_THREAD, (lease.thread_id,))
            await cur.execute(_pg.RENEW_LEASE_AT, (lease.ttl, lease.thread_id, lease.token))
            row = await cur.fetchone()
        if row is not None:
            lease.extended(row[0], started)
        return row is not None

    async def arelease_lease(self, lease: Lease) -> None:
        """End a lease now (a no-op if another owner has taken the thread since)."""
        async with self._txn() as cur:
            await cur.execute(_pg.LOCK_THREAD, (lease.thread_id,))
            await _run(cur, _sql.RELEASE_LEASE, (lease.thread_id, lease.token))

    async def aclock(self) -> float:
        """The server's clock (Unix time), which leases are judged by."""
        [(now,)] = await self._aquery(_pg.NOW)
        return self._saw_clock(float(now))

    def clock(self) -> float:
        """The server's clock: read from another thread; on the event loop (which must
        not wait), the clock as last read plus the time elapsed since on this process's
        monotonic clock (`alive_leases` reads it with the leases)."""
        try:
            on_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            on_loop = False
        if not on_loop:
            return self._sync(self.aclock())
        if self._server_clock is None:
            return time.time()
        now, at = self._server_clock
        return now + (time.monotonic() - at)

    async def alive_leases(self) -> dict[str, tuple[str, int, float]]:
        """`{thread_id: (owner, token, expires_at)}` of every lease live by the server's
        clock."""
        rows = await self._aquery(_pg.SELECT_LIVE_LEASES_WITH_CLOCK)
        self._saw_clock(float(rows[0][4]))
        return {thread_id: (owner, token, expires)
                for thread_id, owner, token, expires, _ in rows if thread_id is not None}
