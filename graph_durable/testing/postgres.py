"""A throwaway PostgreSQL server for tests of the PostgreSQL path.

The PostgreSQL checkpointer and ledger must be tested against a real server, not a
mock: durability is about what a real server does with a commit. `PostgresServer`
starts one from the machine's own binaries (``initdb``, ``pg_ctl``, ``postgres``), in a
fresh temporary folder, on a free TCP port of 127.0.0.1, and removes everything when it
stops. No running server, Docker or network access is needed:

    from graph_durable.testing.postgres import PostgresServer

    with PostgresServer() as server:
        conninfo = server.create_database("my_test")   # a fresh, empty database
        with psycopg.connect(conninfo) as conn:
            conn.execute("SELECT 1")

- Binaries: the directory named by ``GRAPH_DURABLE_PG_BIN``, else ``pg_config
  --bindir``, else the newest ``/usr/lib/postgresql/*/bin`` (see `find_postgres_bin`).
- Settings are modest (50 connections, 64 MB shared buffers) and durability settings
  keep their defaults (``fsync`` and ``synchronous_commit`` on) while it runs; only
  ``initdb`` runs with ``--no-sync``, and `stop()` is an immediate shutdown, since the
  folder is removed right after.
- Authentication is ``trust`` for user ``postgres``; the server listens on 127.0.0.1
  only and on a unix socket inside its temporary folder.
- PostgreSQL refuses to run as root. When the tests run as root, the binaries run as the
  ``postgres`` system user (through ``runuser`` or ``setpriv``) and the temporary folder
  belongs to that user; its parent must be traversable by it (the default,
  `tempfile.gettempdir()`, is).
- A server still running when the interpreter exits is stopped by an `atexit` hook, so
  an aborted test run does not leave it behind. A server whose interpreter was killed by
  a signal (no `atexit` runs then) is swept by the next `start()` in the same base
  folder: each server's folder names the process that owns it (`owner.json`), and one
  whose owner is gone is stopped and removed.

psycopg is imported only when a server starts, so importing this module costs nothing
in projects without the ``postgres`` extra.

Size: this module is longer than the ~400 lines modules aim for, on purpose: it is one
class, `PostgresServer`, and the helpers only it uses (finding the binaries, running
them as the `postgres` user, sweeping servers whose owner died), each short; split, a
reader would have to follow one server's start across modules.
"""

from __future__ import annotations

import atexit
import glob
import json
import math
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["ENV_BIN", "PostgresServer", "find_postgres_bin"]

ENV_BIN = "GRAPH_DURABLE_PG_BIN"
"""Environment variable naming the directory that holds initdb, pg_ctl and postgres."""

_GLOB_FALLBACK = "/usr/lib/postgresql/*/bin"
_REQUIRED = ("initdb", "pg_ctl", "postgres")
_SYSTEM_USER = "postgres"
_SUPERUSER = "postgres"
_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes; the socket file is ".s.PGSQL.NNNNN"
_PORT_ATTEMPTS = 3
_POLL_INTERVAL = 0.05
_OWNER_FILE = "owner.json"
_SERVER_SETTINGS = {
    "max_connections": "50",
    "shared_buffers": "64MB",
    "listen_addresses": "127.0.0.1",
}


# --------------------------------------------------------------------------- binaries


def _has_initdb(bin_dir: str) -> bool:
    return os.path.isfile(os.path.join(bin_dir, "initdb"))


def _pg_config_bindir() -> str | None:
    pg_config = shutil.which("pg_config")
    if pg_config is None:
        return None
    try:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True,
                             timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _version_key(bin_dir: str) -> tuple[int, ...]:
    version = Path(bin_dir).parent.name  # /usr/lib/postgresql/<version>/bin
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def find_postgres_bin() -> str | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``, or None.

    In order: the ``GRAPH_DURABLE_PG_BIN`` environment variable if set (returned as
    is); ``pg_config --bindir`` if it has ``initdb``; the highest-numbered
    ``/usr/lib/postgresql/*/bin`` that has ``initdb``.
    """
    from_env = os.environ.get(ENV_BIN)
    if from_env:
        return from_env
    from_pg_config = _pg_config_bindir()
    if from_pg_config and _has_initdb(from_pg_config):
        return from_pg_config
    candidates = [d for d in glob.glob(_GLOB_FALLBACK) if _has_initdb(d)]
    return max(candidates, key=_version_key) if candidates else None


def _resolve_bin_dir(bin_dir: str | None) -> str:
    if bin_dir is None:
        bin_dir = find_postgres_bin()
    if bin_dir is None:
        raise RuntimeError(
            "no PostgreSQL server binaries (initdb, pg_ctl, postgres) found: set "
            f"{ENV_BIN} to the directory holding them. Looked at ${ENV_BIN} (unset), "
            f"`pg_config --bindir` and {_GLOB_FALLBACK}.")
    missing = [name for name in _REQUIRED
               if not os.access(os.path.join(bin_dir, name), os.X_OK)]
    if missing:
        raise RuntimeError(
            f"PostgreSQL bin directory {bin_dir!r} lacks {', '.join(missing)}; set "
            f"{ENV_BIN} to the directory holding initdb, pg_ctl and postgres.")
    return bin_dir


# ------------------------------------------------------------------------ running as


def _as_postgres_prefixes() -> list[list[str]]:
    user = _SYSTEM_USER
    return [["runuser", "-u", user, "--"],
            ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"]]


def _user_prefix() -> list[str]:
    """Command prefix running a binary as a user PostgreSQL accepts: [] unless root."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(_SYSTEM_USER)
    except KeyError:
        raise RuntimeError(
            f"running as root, but there is no {_SYSTEM_USER!r} system user to run "
            "PostgreSQL as (it refuses to run as root)") from None
    for prefix in _as_postgres_prefixes():
        if shutil.which(prefix[0]) is None:
            continue
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return prefix
    raise RuntimeError(
        f"running as root, and neither runuser nor setpriv can run commands as "
        f"{_SYSTEM_USER!r}; PostgreSQL refuses to run as root")


def _give_to_postgres_user(path: Path) -> None:
    """When root: hand `path` (and what it holds) to the postgres system user."""
    if os.geteuid() != 0:
        return
    entry = pwd.getpwnam(_SYSTEM_USER)
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.chown(name, entry.pw_uid, entry.pw_gid)


# ------------------------------------------------------------------------- utilities


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _quote_conninfo_value(value: str) -> str:
    if value and not any(c in value for c in " '\\\t\n"):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _conninfo(port: int, dbname: str) -> str:
    return (f"host=127.0.0.1 port={port} user={_SUPERUSER} "
            f"dbname={_quote_conninfo_value(dbname)}")


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no server log)"
    return "\n".join(text.splitlines()[-lines:]) or "(server log is empty)"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _process_identity(pid: int) -> dict[str, Any]:
    """`{pid, started}`: a pid, and when that process started (so a reused pid is not
    taken for the owner)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        started: str | None = fields[19]  # starttime, in clock ticks since boot
    except (OSError, IndexError):
        started = None
    return {"pid": pid, "started": started}


def _sweep_orphans(base_dir: str, prefix: list[str], bin_dir: str) -> None:
    """Stop and remove every server in `base_dir` whose owning process is gone (killed
    by a signal, so its `atexit` hook never ran); never raises."""
    for folder in Path(base_dir).glob("gd-pg-*"):
        try:
            owner = json.loads((folder / _OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not a server of this kit, or one still being created
        if _pid_alive(owner["pid"]) and _process_identity(owner["pid"]) == owner:
            continue
        data = folder / "data"
        try:
            pid = int((data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pid = None
        if pid is not None and _pid_alive(pid):
            try:
                subprocess.run([*prefix, os.path.join(bin_dir, "pg_ctl"), "stop", "-D",
                                str(data), "-m", "immediate", "-w", "-t", "30"],
                               capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
            except (OSError, subprocess.SubprocessError):
                pass
            if _pid_alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        shutil.rmtree(folder, ignore_errors=True)


# ------------------------------------------------------------------- atexit registry

_live_servers: set[PostgresServer] = set()
_live_lock = threading.Lock()


def _stop_all_at_exit() -> None:
    with _live_lock:
        servers = list(_live_servers)
    for server in servers:
        if server._owner_pid == os.getpid():  # not in a forked child that exits
            server.stop()


atexit.register(_stop_all_at_exit)


# -------------------------------------------------------------------------- server


class _StartFailed(RuntimeError):
    """The postmaster exited during startup; `port_in_use` says whether to retry."""

    def __init__(self, message: str, *, port_in_use: bool) -> None:
        super().__init__(message)
        self.port_in_use = port_in_use


class PostgresServer:
    """A PostgreSQL server in a temporary folder, for tests; see the module docstring.

    `base_dir` is where the temporary folder is created (default:
    `tempfile.gettempdir()`); `bin_dir` holds the binaries (default:
    `find_postgres_bin()`); `timeout` bounds the wait for the server to accept
    connections, in seconds; `settings` are server settings passed on its command line
    (``{"synchronous_commit": "off"}``), over the defaults. Start with `start()` or
    ``with``; `stop()` removes everything and may be called any number of times.
    `crash()` and `start_again()` stop the server as a power cut would its processes
    and start it on the same data, for tests of what a commit survives.
    """

    def __init__(self, base_dir: str | None = None, *, bin_dir: str | None = None,
                 timeout: float = 60.0, settings: dict[str, str] | None = None) -> None:
        self._settings = dict(settings or {})
        self._bin_dir = _resolve_bin_dir(bin_dir)
        self._base_dir = base_dir if base_dir is not None else tempfile.gettempdir()
        self._timeout = timeout
        self._prefix: list[str] = []
        self._tmp: Path | None = None
        self._port: int | None = None
        self._running = False
        self._owner_pid = os.getpid()

    # ---------------------------------------------------------------- public surface

    @property
    def port(self) -> int:
        """The TCP port the server listens on (127.0.0.1)."""
        if self._port is None:
            raise RuntimeError("PostgresServer is not started")
        return self._port

    @property
    def conninfo(self) -> str:
        """libpq connection string for the ``postgres`` database as superuser."""
        return _conninfo(self.port, "postgres")

    @property
    def data_dir(self) -> str:
        """The cluster's data directory (it no longer exists once stopped)."""
        if self._tmp is None:
            raise RuntimeError("PostgresServer is not started")
        return str(self._tmp / "data")

    @property
    def running(self) -> bool:
        """Whether the server is started: from `start()` until `stop()`."""
        return self._running

    def start(self) -> PostgresServer:
        """initdb a new cluster, start it, and wait until it accepts connections."""
        if self._running:
            raise RuntimeError("PostgresServer is already started")
        self._prefix = _user_prefix()
        self._owner_pid = os.getpid()
        _sweep_orphans(self._base_dir, self._prefix, self._bin_dir)
        self._tmp = self._make_tmp_dir()
        (self._tmp / _OWNER_FILE).write_text(json.dumps(_process_identity(os.getpid())))
        with _live_lock:
            _live_servers.add(self)  # from here on, stop() must run at exit
        self._running = True
        try:
            self._initdb()
            self._start_on_a_free_port()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the server (immediate shutdown) and remove its folder; never raises."""
        with _live_lock:
            _live_servers.discard(self)
        if not self._running:
            return
        self._running = False
        try:
            self._shutdown()
        finally:
            if self._tmp is not None:
                shutil.rmtree(self._tmp, ignore_errors=True)

    def crash(self) -> None:
        """Stop the server's processes at once (`pg_ctl stop -m immediate`), keeping its
        folder: what was committed survives, as after a power cut, only if it reached
        the write-ahead log on disk. `start_again()` starts it on the same data."""
        if not self._running:
            raise RuntimeError("PostgresServer is not started")
        self._shutdown()

    def start_again(self) -> PostgresServer:
        """Start a server stopped by `crash()` on its data and port (crash recovery runs
        first), and wait until it accepts connections."""
        if not self._running or self._postmaster_pid() is not None:
            raise RuntimeError("start_again() starts a server stopped by crash()")
        deadline = time.monotonic() + self._timeout
        try:
            self._launch(deadline)
        except _StartFailed as failure:
            raise RuntimeError(str(failure)) from None
        self._wait_until_ready(deadline)
        return self

    def database_conninfo(self, name: str) -> str:
        """libpq connection string for database `name` (created or not) as superuser."""
        return _conninfo(self.port, name)

    def create_database(self, name: str) -> str:
        """Create database `name` and return its libpq connection string."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return _conninfo(self.port, name)

    def drop_database(self, name: str) -> None:
        """Drop database `name`, closing any session still on it (its files are freed at
        once, rather than all at `stop()`); a missing database is not an error."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                         .format(sql.Identifier(name)))

    def dump_database(self, name: str, path: str) -> None:
        """Write database `name` to `path` as SQL (`pg_dump`), to read or restore after
        the server is gone (`psql -f path`)."""
        subprocess.run([os.path.join(self._bin_dir, "pg_dump"), "--no-owner",
                        "--dbname", _conninfo(self.port, name), "--file", path],
                       check=True, capture_output=True, timeout=120)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None,
                 exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"port={self._port}" if self._running else "stopped"
        return f"<PostgresServer {state} bin_dir={self._bin_dir!r}>"

    # ------------------------------------------------------------------ folder layout

    @property
    def _log(self) -> Path:
        assert self._tmp is not None
        return self._tmp / "server.log"

    @property
    def _socket_dir(self) -> Path:
        assert self._tmp is not None
        return self._tmp / "socket"

    def _make_tmp_dir(self) -> Path:
        os.makedirs(self._base_dir, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="gd-pg-", dir=self._base_dir))
        socket_dir = tmp / "socket"
        if len(str(socket_dir)) > _SOCKET_PATH_MAX - 15:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(
                f"base_dir {self._base_dir!r} is too long for a unix socket path; "
                "use a shorter one (the default is tempfile.gettempdir())")
        socket_dir.mkdir()
        os.chmod(tmp, 0o755)
        _give_to_postgres_user(tmp)
        return tmp

    # ------------------------------------------------------------------------ commands

    def _command(self, binary: str, *args: str) -> list[str]:
        return [*self._prefix, os.path.join(self._bin_dir, binary), *args]

    def _run(self, binary: str, *args: str, timeout: float = 120.0
             ) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        return subprocess.run(self._command(binary, *args), capture_output=True,
                              text=True, timeout=timeout, cwd=self._tmp, env=env,
                              stdin=subprocess.DEVNULL)

    def _initdb(self) -> None:
        done = self._run("initdb", "-D", self.data_dir, "--auth=trust",
                         f"-U{_SUPERUSER}", "--encoding=UTF8", "--locale=C",
                         "--no-sync")
        if done.returncode != 0:
            hint = ""
            if self._prefix and "Permission denied" in done.stderr:
                hint = (f"\n(initdb runs as {_SYSTEM_USER!r}: every parent of "
                        f"{self._tmp} must be traversable by that user)")
            raise RuntimeError(
                f"initdb failed (exit {done.returncode}):\n{done.stdout}{done.stderr}"
                f"{hint}")

    def _server_options(self, port: int) -> str:
        settings = {**_SERVER_SETTINGS, **self._settings, "port": str(port),
                    "unix_socket_directories": str(self._socket_dir)}
        return " ".join(f"-c {shlex.quote(f'{key}={value}')}"
                        for key, value in settings.items())

    # ------------------------------------------------------------------------ startup

    def _start_on_a_free_port(self) -> None:
        deadline = time.monotonic() + self._timeout
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            self._port = _free_port()
            try:
                self._launch(deadline)
                self._wait_until_ready(deadline)
                return
            except _StartFailed as failure:
                if not failure.port_in_use or attempt == _PORT_ATTEMPTS:
                    raise RuntimeError(str(failure)) from None
                self._log.unlink(missing_ok=True)  # another process took the port

    def _launch(self, deadline: float) -> None:
        """`pg_ctl start -w`: returns once the postmaster is ready, or has exited."""
        seconds = max(1, math.ceil(deadline - time.monotonic()))
        done = self._run("pg_ctl", "start", "-w", "-t", str(seconds), "-D",
                         self.data_dir, "-l", str(self._log),
                         "-o", self._server_options(self.port), timeout=seconds + 30)
        if done.returncode == 0:
            return
        if self._postmaster_pid() is not None:  # alive but not ready: pg_ctl gave up
            raise self._timed_out()
        log = _tail(self._log)
        raise _StartFailed(
            f"PostgreSQL failed to start (pg_ctl exit {done.returncode}):\n"
            f"{done.stdout}{done.stderr}\nserver log:\n{log}",
            port_in_use="Address already in use" in log)

    def _wait_until_ready(self, deadline: float) -> None:
        """Poll with psycopg until a TCP connection runs ``SELECT 1``."""
        import psycopg

        while True:
            try:
                with psycopg.connect(self.conninfo, connect_timeout=5) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                pass
            if self._postmaster_pid() is None:
                log = _tail(self._log)
                raise _StartFailed(
                    f"PostgreSQL exited during startup; server log:\n{log}",
                    port_in_use="Address already in use" in log)
            if time.monotonic() > deadline:
                raise self._timed_out()
            time.sleep(_POLL_INTERVAL)

    def _timed_out(self) -> RuntimeError:
        return RuntimeError(
            f"PostgreSQL did not accept connections on 127.0.0.1:{self._port} within "
            f"{self._timeout:g} s; server log:\n{_tail(self._log)}")

    def _read_pid(self) -> int | None:
        """The pid in postmaster.pid, if the file exists."""
        try:
            return int((Path(self.data_dir) / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _postmaster_pid(self) -> int | None:
        """The postmaster's pid if it is alive."""
        pid = self._read_pid()
        return pid if pid is not None and _pid_alive(pid) else None

    # ----------------------------------------------------------------------- shutdown

    def _shutdown(self) -> None:
        """pg_ctl stop -m immediate, else SIGKILL; never raises.

        Immediate: the folder is removed next, so the shutdown checkpoint a fast stop
        writes (every database of the session flushed and fsynced, about 20 s after a
        full test run) would be thrown away."""
        if self._tmp is None or self._postmaster_pid() is None:
            return
        try:
            self._run("pg_ctl", "stop", "-D", self.data_dir, "-m", "immediate", "-w",
                      "-t", "30", timeout=60)
        except (OSError, subprocess.SubprocessError):
            pass
        if self._postmaster_pid() is None:
            return
        pid = self._postmaster_pid()
        if pid is not None:  # backends exit on their own once the postmaster is gone
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
