"""Start a child's `python -c` entry point by forking a pre-imported process.

`start_child` and `run_fork_child` run one scenario per child process: a fresh
interpreter spends a second or more of CPU importing LangGraph before it reaches the
graph, most of a crash test's time. A `Launcher` pays that once per process: it starts
one launcher process that imports the children's modules and then only waits,
single-threaded, with no database open. Each `start` makes it `os.fork()` a child that
takes the environment, working directory and argument it is given, sends its stdout and
stderr to files, and calls a module-level entry point as `python -c` would have. The
child is a real process, the launcher's: it can be signalled (SIGKILL, SIGSTOP) by its
pid, and its exit status comes back through the launcher.

`launched(target, argument, env)` is the entry: it forks when it can (POSIX, a launcher
whose interpreter options the environment does not change) and otherwise starts a new
interpreter (`subprocess.Popen`). `GRAPH_DURABLE_CHILDREN=spawn` always starts a new
interpreter. Both give a `Process` with the same methods.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Sequence
from typing import Any

from graph_durable.faults import ENV_FAULTS, ENV_TRACE

__all__ = ["ENV_CHILDREN", "Launcher", "Process", "Unforkable", "launched"]

ENV_CHILDREN = "GRAPH_DURABLE_CHILDREN"
"""`spawn`: start every child as a new interpreter, not forked from a launcher."""

RUN_MODULES = (
    "graph_durable.operators.audit", "graph_durable.checkpointers._base", "graph_durable.errors",
    "graph_durable.faults", "graph_durable.operators.recovery", "graph_durable.operators.review",
    "langgraph.types",
    # What langchain_core imports on a graph's first invoke (callback managers,
    # tracers, the translation of v0 message content).
    "langchain_core.messages.block_translators.langchain_v0",
    "langchain_core.tracers.context", "langchain_core.tracers.run_collector",
    "langchain_core.tracers.stdout")
"""What a child run imports only once it runs (`graph_durable.testing.crash.child.PRELOAD`)."""

PRELOAD = ["graph_durable.testing.crash.child", "graph_durable.testing.scenarios.forks",
           "graph_durable.testing", "langgraph.prebuilt", *RUN_MODULES]
"""What the launcher imports before it forks."""

def _read_at_start(name: str) -> bool:
    """Whether a variable is read when an interpreter starts (Python's options) or when
    LangGraph is imported (`LANGGRAPH_*`): a child whose environment sets one apart from
    the launcher's is started as a new interpreter. `PYTHONPATH` is applied to a forked
    child's `sys.path`, `TZ` with `time.tzset()`."""
    return (name.startswith("PYTHON") and name != "PYTHONPATH") or name.startswith("LANGGRAPH_")


class Unforkable(RuntimeError):
    """A module a child asked the launcher to import started a thread: the launcher no
    longer forks (a forked copy of a thread's locks can deadlock)."""


class LauncherGone(RuntimeError):
    """The launcher could not fork a child (it ended, or the fork failed)."""


class Process:
    """A started child (forked, or a new interpreter): a subset of `subprocess.Popen`."""

    def __init__(self, pid: int, stdout_path: str, stderr_path: str,
                 popen: subprocess.Popen[bytes] | None = None) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._stdout_path, self._stderr_path = stdout_path, stderr_path
        self._popen = popen
        self._exited = threading.Event()
        self.owns_output = True
        """Whether `close` removes the output files (not a caller's `output`)."""

    def _ended(self, returncode: int) -> None:
        self.returncode = returncode
        self._exited.set()

    def poll(self) -> int | None:
        """The exit code (minus the signal that ended it) if the child has ended."""
        if self._popen is not None and self._popen.poll() is not None:
            self._ended(self._popen.returncode)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child to end; its exit code."""
        if self._popen is not None:
            self._ended(self._popen.wait(timeout))
        elif not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"child {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Signal the child (nothing once it has ended and been reaped)."""
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def first_line(self, prefix: str = "{") -> str:
        """Wait for the first whole line of stdout that starts with `prefix` (or for
        the child to end); that line, or ''."""
        while True:
            ended = self.poll() is not None
            for line in self.stdout().splitlines(keepends=True):
                if line.startswith(prefix) and line.endswith("\n"):
                    return line
            if ended:
                return ""
            time.sleep(0.01)

    def stdout(self) -> str:
        with open(self._stdout_path, encoding="utf-8", errors="replace") as out:
            return out.read()

    def stderr(self) -> str:
        with open(self._stderr_path, encoding="utf-8", errors="replace") as err:
            return err.read()

    def close(self) -> None:
        """Remove the output files (after the child ended), unless they are a caller's."""
        for path in {self._stdout_path, self._stderr_path} if self.owns_output else ():
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


class Launcher:
    """A process that forks pre-imported children on request (see the module docstring).

    Several children may run at once; `start` is safe from any thread.
    """

    def __init__(self, preload: list[str]) -> None:
        self.preload = list(preload)
        self._env = {k: v for k, v in os.environ.items() if k not in (ENV_FAULTS, ENV_TRACE)}
        self.refused = False
        """Whether it refused to fork (`Unforkable`): it only reports its children now."""
        self._lock = threading.Lock()
        self._next = 0
        self._started: dict[int, tuple[threading.Event, list[Any], Process | None]] = {}
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "from graph_durable.testing.crash.launcher import _serve; "
             "_serve()", json.dumps(self.preload)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self._env)
        assert self._proc.stdout is not None
        if not self._proc.stdout.readline().startswith(b"{"):
            self._proc.wait()
            raise RuntimeError(f"child launcher did not start (exit code "
                               f"{self._proc.returncode}); see its stderr above")
        self._reader = threading.Thread(target=self._read, name="child-launcher",
                                        daemon=True)
        self._reader.start()

    def forks_for(self, env: dict[str, str]) -> bool:
        """Whether a child with `env` can be forked from this launcher."""
        return (self._proc.poll() is None and not self.refused and
                all(env.get(name) == self._env.get(name)
                    for name in {*env, *self._env} if _read_at_start(name)))

    def start(self, target: str, argument: str, env: dict[str, str], stdout_path: str,
              stderr_path: str, preload: Sequence[str] = ()) -> Process:
        """Fork a child that calls `target` (`module:function`) with `sys.argv[-1]` set to
        `argument`, in `env` and this process's working directory. The launcher imports
        `preload` first, once, for this child and every later one."""
        ready = threading.Event()
        answer: list[Any] = []
        with self._lock:
            self._next += 1
            ident = self._next
            self._started[ident] = (ready, answer, None)
            request = {"id": ident, "target": target, "argument": argument, "env": env,
                       "cwd": os.getcwd(), "stdout": stdout_path, "stderr": stderr_path,
                       "preload": list(preload)}
            assert self._proc.stdin is not None
            self._proc.stdin.write(json.dumps(request).encode() + b"\n")
            self._proc.stdin.flush()
        ready.wait()
        if not answer or "pid" not in answer[0]:
            with self._lock:
                self._started.pop(ident, None)
            if answer and answer[0].get("unforkable"):
                self.refused = True
                raise Unforkable(f"child launcher could not start {target}: {answer[0]}")
            raise LauncherGone(f"child launcher could not start {target}: {answer}")
        process = Process(answer[0]["pid"], stdout_path, stderr_path)
        with self._lock:
            entry = self._started.get(ident)
            if entry is None:  # the launcher ended meanwhile: its children died with it
                _gone(process.pid)
                process._ended(-signal.SIGKILL)
                return process
            ended = entry[1]
            self._started[ident] = (ready, ended, process)
            if len(ended) > 1:  # it ended before we got here
                process._ended(ended[1].get("exit", -signal.SIGKILL))
                del self._started[ident]
        return process

    def _read(self) -> None:
        assert self._proc.stdout is not None
        try:
            for raw in self._proc.stdout:
                try:
                    message = json.loads(raw)
                except ValueError:
                    continue  # not a message (the stream is the launcher's own)
                with self._lock:
                    entry = self._started.get(message.get("id"))
                    if entry is None:
                        continue
                    ready, answers, process = entry
                    answers.append(message)
                    if "exit" in message and process is not None:
                        process._ended(message["exit"])
                        del self._started[message["id"]]
                ready.set()
        finally:
            self._proc.wait()
            with self._lock:  # the launcher ended: its children were killed with it
                left = list(self._started.values())
                self._started.clear()
            for ready, answers, process in left:
                answers.append({"error": "launcher ended"})
                if process is not None:
                    _gone(process.pid)
                    process._ended(-signal.SIGKILL)
                ready.set()

    def close(self) -> None:
        """Stop the launcher once its children have ended (after 10 s it is killed, and
        the children still running die with it)."""
        if self._proc.poll() is None and self._proc.stdin is not None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


def _gone(pid: int, wait: float = 5.0) -> None:
    """Wait (up to `wait` s) until `pid`, a child of a launcher that ended, is gone: it
    was killed with its launcher (`PR_SET_PDEATHSIG`) and reaped by its new parent."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)


_LAUNCHER: Launcher | None = None
_LAUNCHER_LOCK = threading.Lock()
_NO_LAUNCHER: list[str] = []
"""Why this process's launcher could not start, if it could not (children then start
as new interpreters)."""
_UNFORKABLE: set[str] = set()
"""Modules whose import started a thread in a launcher: a child that needs them is
started as a new interpreter."""


def _launcher() -> Launcher | None:
    global _LAUNCHER
    if os.environ.get(ENV_CHILDREN) == "spawn" or not hasattr(os, "fork"):
        return None
    with _LAUNCHER_LOCK:
        if _NO_LAUNCHER:
            return None
        if _LAUNCHER is None or _LAUNCHER._proc.poll() is not None or _LAUNCHER.refused:
            try:
                _LAUNCHER = Launcher(PRELOAD)
            except (RuntimeError, OSError) as exc:  # e.g. a sitecustomize starting threads
                _NO_LAUNCHER.append(str(exc))
                return None
            atexit.register(_LAUNCHER.close)
        return _LAUNCHER


def launched(target: str, argument: str, env: dict[str, str], *,
             preload: Sequence[str] = (), output: str | None = None) -> Process:
    """Start `target` (`module:function`, called with `sys.argv[-1] == argument`) in a
    child process with `env`: forked from this process's launcher when it can be (which
    imports `preload` first), a new interpreter otherwise. Its stdout and stderr go to
    files (`Process.stdout()`), or both are appended to `output`."""
    if output is None:
        fd, stdout_path = tempfile.mkstemp(prefix="child-", suffix=".out")
        os.close(fd)
        fd, stderr_path = tempfile.mkstemp(prefix="child-", suffix=".err")
        os.close(fd)
    else:
        stdout_path = stderr_path = output
    launcher = _launcher()
    process: Process | None = None
    if launcher is not None and launcher.forks_for(env) and not _UNFORKABLE.intersection(preload):
        try:
            process = launcher.start(target, argument, env, stdout_path, stderr_path, preload)
        except Unforkable:  # one of `preload` starts a thread: never import it there again
            _UNFORKABLE.update(name for name in preload if name not in PRELOAD)
        except LauncherGone:
            pass  # a new interpreter for this one; the next call starts a new launcher
    if process is None:
        module, _, function = target.partition(":")
        with open(stdout_path, "ab") as out, open(stderr_path, "ab") as err:
            # Not `-m`: the package imports these modules, and runpy warns about that.
            popen = subprocess.Popen(
                [sys.executable, "-c", f"from {module} import {function}; {function}()",
                 argument], stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env)
        process = Process(popen.pid, stdout_path, stderr_path, popen)
    process.owns_output = output is None
    return process


# -- the launcher process ----------------------------------------------------------------

def _preload(modules: list[str]) -> str | None:
    """Import `modules` in the launcher (one that fails is left to the child to report);
    why forking is now unsafe, if it is."""
    for name in modules:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except BaseException:  # noqa: BLE001 - the child imports it again and reports it
                pass
    if threading.active_count() != 1:
        names = [t.name for t in threading.enumerate()]
        return (f"child launcher: importing {modules} started threads {names}; forking "
                "a process with threads is unsafe")
    return None


def _serve() -> None:
    """The launcher's loop: import, then fork one child per request line on stdin and
    report its pid, then its exit status."""
    # The messages go on a descriptor of their own: what a preloaded module prints goes
    # to stderr, not into them.
    proto = os.dup(1)
    os.dup2(2, 1)
    refused = _preload(json.loads(sys.argv[-1]))
    if refused:
        raise RuntimeError(refused)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    children: dict[int, int] = {}
    launcher = os.getpid()

    def say(message: dict[str, Any]) -> None:
        data = json.dumps(message).encode() + b"\n"
        while data:
            data = data[os.write(proto, data):]

    say({"ready": os.getpid()})
    pending = b""
    reading = True
    while reading or children:
        ready, _, _ = select.select([0, wake_r] if reading else [wake_r], [], [], 0.5)
        if wake_r in ready:
            try:
                while os.read(wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
        if 0 in ready:
            chunk = os.read(0, 1 << 20)
            if not chunk:
                reading = False  # the parent is done: wait for the children it left
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                refused = _preload(request["preload"])
                if refused:
                    say({"id": request["id"], "error": refused, "unforkable": True})
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                try:
                    pid = os.fork()
                except OSError as exc:
                    say({"id": request["id"], "error": f"fork failed: {exc}"})
                    continue
                if pid == 0:
                    _child(request, (wake_r, wake_w, proto), launcher)
                children[pid] = request["id"]
                say({"id": request["id"], "pid": pid})
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid in children:
                say({"id": children.pop(pid), "exit": os.waitstatus_to_exitcode(status)})


def _die_with_parent(parent: int) -> None:
    """Be killed (SIGKILL) when the launcher ends, so that a child it can no longer
    report on is not reported killed while it runs on (Linux; elsewhere a no-op)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it ended before the request was made
        os.kill(os.getpid(), signal.SIGKILL)


def _child(request: dict[str, Any], launcher_fds: tuple[int, ...], launcher: int) -> None:
    """Body of a forked child: become what `python -c` with `request` would have been."""
    code = 1
    try:
        _die_with_parent(launcher)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in launcher_fds:
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for fd, target in ((devnull, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        env = request["env"]
        os.environ.clear()
        os.environ.update(env)
        time.tzset()
        for entry in reversed(env.get("PYTHONPATH", "").split(os.pathsep)):
            if entry and os.path.abspath(entry) not in sys.path:
                sys.path.insert(1, os.path.abspath(entry))
        sys.argv = ["-c", request["argument"]]
        from graph_durable import faults

        faults._rearm_from_env()  # its plans and trace come with the environment
        module, _, function = request["target"].partition(":")
        try:
            getattr(importlib.import_module(module), function)()
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        # As an interpreter ends: wait for its non-daemon threads, run its atexit hooks.
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
