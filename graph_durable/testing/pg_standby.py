"""A streaming standby of a test `PostgresServer`, for failover tests.

    with PostgresServer() as primary:
        conninfo = primary.create_database("agent")
        with StandbyServer(primary) as standby:    # pg_basebackup -R, then streaming
            make_synchronous(primary)              # synchronous_standby_names = '*'
            ...                                    # the worker runs on the primary
            primary.crash()                        # as by a power cut
            standby.promote()                      # the failover
            ...                                    # resume on standby.database_conninfo("agent")

The standby is a copy of the primary taken with `pg_basebackup -R` (it writes
`standby.signal` and `primary_conninfo`), in a temporary folder of its own, started from
the same binaries as the primary; it stops and is removed as a `PostgresServer` is.
Asynchronous unless `make_synchronous(primary)` names it: then every commit on the
primary waits until the standby has flushed it.
"""

from __future__ import annotations

import time

from graph_durable.testing.postgres import PostgresServer

__all__ = ["StandbyServer", "make_synchronous"]

_POLL = 0.05


class StandbyServer(PostgresServer):
    """A standby of `primary` (which must be running); see the module docstring."""

    def __init__(self, primary: PostgresServer, *, timeout: float = 60.0) -> None:
        super().__init__(primary._base_dir, bin_dir=primary._bin_dir, timeout=timeout)
        self._primary = primary

    def _initdb(self) -> None:
        done = self._run("pg_basebackup", "-D", self.data_dir, "-R", "-X", "stream",
                         "-c", "fast", "-h", "127.0.0.1", "-p", str(self._primary.port),
                         "-U", "postgres", "--no-sync")
        if done.returncode != 0:
            raise RuntimeError(f"pg_basebackup failed (exit {done.returncode}):\n"
                               f"{done.stdout}{done.stderr}")

    def wait_caught_up(self) -> None:
        """Wait until this standby has replayed everything the primary has written."""
        import psycopg

        with psycopg.connect(self._primary.conninfo, autocommit=True) as primary:
            row = primary.execute("SELECT pg_current_wal_lsn()::text").fetchone()
            assert row is not None
            target = row[0]
        deadline = time.monotonic() + self._timeout
        with psycopg.connect(self.conninfo, autocommit=True) as standby:
            while True:
                row = standby.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",
                                      (target,)).fetchone()
                if row is not None and row[0]:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the standby did not replay up to {target} in time")
                time.sleep(_POLL)

    def promote(self) -> None:
        """Make this standby a primary (`pg_ctl promote`) and wait until it takes writes."""
        import psycopg

        done = self._run("pg_ctl", "promote", "-D", self.data_dir, "-w",
                         "-t", str(int(self._timeout)))
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl promote failed (exit {done.returncode}):\n"
                               f"{done.stdout}{done.stderr}")
        deadline = time.monotonic() + self._timeout
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            while conn.execute("SELECT pg_is_in_recovery()").fetchone() != (False,):
                if time.monotonic() > deadline:
                    raise RuntimeError("the promoted standby is still in recovery")
                time.sleep(_POLL)


def make_synchronous(primary: PostgresServer, timeout: float = 60.0) -> None:
    """Make every standby of `primary` synchronous (`synchronous_standby_names = '*'`)
    and wait until one reports `sync_state = 'sync'`."""
    import psycopg

    with psycopg.connect(primary.conninfo, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
        conn.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + timeout
        while conn.execute("SELECT count(*) FROM pg_stat_replication "
                           "WHERE sync_state = 'sync'").fetchone() == (0,):
            if time.monotonic() > deadline:
                raise RuntimeError("no standby became synchronous in time")
            time.sleep(_POLL)
