"""Real child processes that start in milliseconds: fork them from a pre-imported server.

A fresh interpreter spends a second or two importing LangGraph before a crash test can
start its graph. A `ForkServer` pays that once: it starts one server process that
imports the given modules and then only waits, single-threaded, with no database open.
Each `run` makes the server `os.fork()` a child, which arms its fault plan, calls a
module-level function (`"module:function"`, JSON keyword arguments), writes the JSON it
returns to a file and leaves with `os._exit`. The child is a real process: a
`FaultPlan(action="kill")` SIGKILLs it, and everything it opens (databases, threads,
event loops) is its own, opened after the fork.

    with ForkServer(["graph_durable.testing.explorer.scenario"]) as server:
        outcome = server.run("pkg.mod:function", {"x": 1}, fault=FaultPlan("after_effect"))
        outcome.killed, outcome.result

`ForkServer(..., method="spawn")` runs each call in a new interpreter instead (slow, for
platforms or debugging sessions where forking is not wanted); results are the same.
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from dataclasses import asdict, dataclass
from typing import Any, Literal

from graph_durable.testing.faults import ENV_FAULTS, ENV_TRACE, FaultPlan, arm

__all__ = ["ChildOutcome", "ForkServer"]


@dataclass
class ChildOutcome:
    """How one child process ended, and what its function returned."""

    exitcode: int
    """`os.waitstatus_to_exitcode` of the child: 0, or minus the signal that ended it."""
    result: Any = None
    """What the function returned (JSON), if it returned."""
    error: str | None = None
    """The traceback of an exception the function let escape."""
    stderr: str = ""
    """What the child wrote to stdout and stderr (its last 4000 characters)."""

    @property
    def killed(self) -> bool:
        """Whether the child was SIGKILLed (an armed fault plan fired)."""
        return self.exitcode == -signal.SIGKILL

    @property
    def timed_out(self) -> bool:
        """Whether the child ran out of time (ended by its SIGALRM)."""
        return self.exitcode == -signal.SIGALRM


def _call(request: dict[str, Any]) -> None:
    """Body of a child: arm the plan, call the function, store its answer; never returns."""
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    # A child that dies below Python (SIGSEGV, SIGABRT) leaves its threads' stacks in
    # its output, which the parent reports.
    faulthandler.enable(all_threads=True)
    signal.alarm(max(1, int(request["timeout"] + 0.999)))
    if request["fault"] is not None:
        arm(FaultPlan(**request["fault"]))
    answer: dict[str, Any]
    try:
        module_name, _, attribute = request["target"].partition(":")
        function = getattr(importlib.import_module(module_name), attribute)
        answer = {"result": function(**request["kwargs"])}
    except BaseException:  # reported to the parent, whatever it is
        answer = {"error": traceback.format_exc()}
    path = request["result_path"]
    with open(path + ".tmp", "w", encoding="utf-8") as out:
        json.dump(answer, out, default=str)
    os.replace(path + ".tmp", path)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _redirect_output(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(devnull)


def _serve() -> None:
    """The server's loop: import, then fork one child per request line on stdin."""
    for name in json.loads(sys.argv[-1]):
        importlib.import_module(name)
    if threading.active_count() != 1:
        names = [t.name for t in threading.enumerate()]
        raise RuntimeError(f"fork server: importing started threads {names}; forking "
                           "a process with threads is unsafe")
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _redirect_output(request["output_path"])
            _call(request)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"exitcode": os.waitstatus_to_exitcode(status)}), flush=True)


def _run_once() -> None:
    """Body of a spawned child (`method="spawn"`)."""
    request = json.loads(sys.argv[-1])
    for name in request["preload"]:
        importlib.import_module(name)
    _call(request)


class ForkServer:
    """A server process that forks pre-imported children (see the module docstring).

    Args:
        preload: Modules the server imports before forking (the child's function's
            module and what it imports). They must not start threads when imported.
        method: `fork` (default) or `spawn` (a new interpreter per call).

    One call runs at a time per server; use one server per worker thread.
    """

    def __init__(self, preload: list[str], *, method: Literal["fork", "spawn"] = "fork"
                 ) -> None:
        if method not in ("fork", "spawn"):
            raise ValueError(f"ForkServer method is 'fork' or 'spawn', not {method!r}")
        self.preload = list(preload)
        self.method = method
        self._lock = threading.Lock()
        self._scratch = tempfile.mkdtemp(prefix="forkserver-")
        self._calls = 0
        self._env = {k: v for k, v in os.environ.items() if k not in (ENV_FAULTS, ENV_TRACE)}
        self._proc: subprocess.Popen[str] | None = None
        if method == "fork":
            self._proc = subprocess.Popen(
                [sys.executable, "-c", "from graph_durable.testing.crash.forkserver import _serve; "
                 "_serve()", json.dumps(self.preload)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=self._env)
            ready = self._proc.stdout.readline() if self._proc.stdout else ""
            if not ready.startswith("{"):
                self._proc.wait()
                raise RuntimeError(f"fork server did not start (exit code "
                                   f"{self._proc.returncode}); see its stderr above")

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the server (children have all ended: calls wait for theirs)."""
        if self._proc is not None and self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            self._proc.wait(timeout=10)
        for name in os.listdir(self._scratch):
            os.unlink(os.path.join(self._scratch, name))
        os.rmdir(self._scratch)

    def run(self, target: str, kwargs: dict[str, Any], *, fault: FaultPlan | None = None,
            timeout: float = 60.0, output_path: str | None = None) -> ChildOutcome:
        """Call `target(**kwargs)` in a new child process and wait for it to end.

        Args:
            target: `module:function`; the function returns JSON.
            kwargs: JSON keyword arguments.
            fault: A plan armed in the child (a `kill` plan SIGKILLs it at its point).
            timeout: Seconds before the child is ended with SIGALRM.
            output_path: File that receives the child's stdout and stderr (kept).
        """
        with self._lock:
            self._calls += 1
            result_path = os.path.join(self._scratch, f"result-{self._calls}.json")
            own_output = output_path is None
            if output_path is None:
                output_path = os.path.join(self._scratch, f"output-{self._calls}.txt")
            request = {"target": target, "kwargs": kwargs, "timeout": timeout,
                       "fault": asdict(fault) if fault is not None else None,
                       "result_path": result_path, "output_path": output_path,
                       "preload": self.preload}
            exitcode = self._fork(request) if self._proc is not None else self._spawn(request)
            outcome = ChildOutcome(exitcode)
            if os.path.exists(result_path):
                with open(result_path, encoding="utf-8") as stored:
                    answer = json.load(stored)
                os.unlink(result_path)
                outcome.result, outcome.error = answer.get("result"), answer.get("error")
            if os.path.exists(output_path):
                with open(output_path, encoding="utf-8", errors="replace") as output:
                    outcome.stderr = output.read()[-4000:]
                if own_output:
                    os.unlink(output_path)
            return outcome

    def _fork(self, request: dict[str, Any]) -> int:
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(request) + "\n")
        proc.stdin.flush()
        reply = proc.stdout.readline()
        if not reply:
            raise RuntimeError(f"fork server died (exit code {proc.wait()})")
        return int(json.loads(reply)["exitcode"])

    def _spawn(self, request: dict[str, Any]) -> int:
        with open(request["output_path"], "ab") as output:
            done = subprocess.run(
                [sys.executable, "-c", "from graph_durable.testing.crash.forkserver import "
                 "_run_once; _run_once()", json.dumps(request)],
                stdin=subprocess.DEVNULL, stdout=output, stderr=output, env=self._env,
                check=False)
        return done.returncode
