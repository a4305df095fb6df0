"""Real child processes that start in milliseconds: fork them from a pre-imported server.

A fresh interpreter spends a second or two importing LangGraph before a crash test can
start its graph. A `ForkServer` pays that once per process: its children are forked by
this process's launcher (`launcher`), a process that imports the given modules and then
only waits, single-threaded, with no database open. Each `run` forks a child, which arms
its fault plan, calls a module-level function (`"module:function"`, JSON keyword
arguments), writes the JSON it returns to a file and leaves with `os._exit`. The child
is a real process: a `FaultPlan(action="kill")` SIGKILLs it, and everything it opens
(databases, threads, event loops) is its own, opened after the fork.

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

from graph_durable.testing.crash.launcher import launched
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


def _run_forked() -> None:
    """Body of a child forked by the launcher (the request is the last argument)."""
    _call(json.loads(sys.argv[-1]))


def _run_once() -> None:
    """Body of a spawned child (`method="spawn"`)."""
    request = json.loads(sys.argv[-1])
    for name in request["preload"]:
        importlib.import_module(name)
    _call(request)


class ForkServer:
    """Runs calls in pre-imported children, one at a time (see the module docstring).

    Args:
        preload: Modules imported before forking (the child's function's module and
            what it imports), by this process's launcher, once. They must not start
            threads when imported.
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

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove the server's files (children have all ended: calls wait for theirs)."""
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
            exitcode = self._fork(request) if self.method == "fork" else self._spawn(request)
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
        return launched("graph_durable.testing.crash.forkserver:_run_forked",
                        json.dumps(request), self._env, preload=self.preload,
                        output=request["output_path"]).wait()

    def _spawn(self, request: dict[str, Any]) -> int:
        with open(request["output_path"], "ab") as output:
            done = subprocess.run(
                [sys.executable, "-c", "from graph_durable.testing.crash.forkserver import "
                 "_run_once; _run_once()", json.dumps(request)],
                stdin=subprocess.DEVNULL, stdout=output, stderr=output, env=self._env,
                check=False)
        return done.returncode
