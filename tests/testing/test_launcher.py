"""Children forked from the launcher behave as the `python -c` processes they replace:
their own pid, environment, directory and argument; exit codes and signals as a new
interpreter's; a fault plan armed from the environment each was given."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from graph_durable.testing.crash import launcher as launcher_module
from graph_durable.testing.crash.launcher import ENV_CHILDREN, Process, launched
from graph_durable.testing.faults import FaultPlan

HERE = "tests.testing.test_launcher"


def probe() -> None:
    """A child's entry point: report what it was given, then do what it was asked."""
    ask = json.loads(sys.argv[-1])
    print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(),
                      "marker": os.environ.get("LAUNCHER_MARKER"), "ask": ask}), flush=True)
    if ask.get("fault"):
        from graph_durable.faults import fault_point

        fault_point("after_effect", tool="probe")
    if ask.get("stop"):
        time.sleep(30)
    if "exit" in ask:
        sys.exit(ask["exit"])
    if ask.get("raise"):
        raise ValueError("the probe was asked to raise")


def run(ask: dict, env: dict[str, str] | None = None) -> tuple[Process, dict]:
    process = launched(f"{HERE}:probe", json.dumps(ask), {**os.environ, **(env or {})})
    process.wait(60)
    lines = [line for line in process.stdout().splitlines() if line.startswith("{")]
    return process, json.loads(lines[0]) if lines else {}


@pytest.fixture(params=["fork", "spawn"])
def how(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "spawn":
        monkeypatch.setenv(ENV_CHILDREN, "spawn")
    return request.param


def test_a_child_gets_its_own_pid_environment_directory_and_argument(
        how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the probe's module is found through PYTHONPATH
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    process, seen = run({"n": 1}, {"LAUNCHER_MARKER": "first"})
    assert process.returncode == 0, process.stderr()
    assert seen["pid"] == process.pid != os.getpid()
    assert seen["cwd"] == str(tmp_path) and seen["marker"] == "first"
    assert seen["ask"] == {"n": 1}
    forked = seen["ppid"] != os.getpid()
    assert forked == (how == "fork")
    _, again = run({"n": 2}, {"LAUNCHER_MARKER": "second"})
    assert again["marker"] == "second" and again["pid"] != seen["pid"]


def test_exit_codes_and_errors_are_a_new_interpreters(how: str) -> None:
    process, _ = run({"exit": 3})
    assert process.returncode == 3
    process, _ = run({"raise": True})
    assert process.returncode == 1
    assert "ValueError: the probe was asked to raise" in process.stderr()


def test_a_fault_plan_in_the_environment_kills_the_child(how: str) -> None:
    process, seen = run({"fault": True}, FaultPlan("after_effect", tool="probe").to_env())
    assert seen and process.returncode == -signal.SIGKILL
    process, _ = run({"fault": True})  # the next child, without the plan, is not armed
    assert process.returncode == 0, process.stderr()


def test_a_child_is_signalled_by_its_pid_and_children_run_at_once(how: str) -> None:
    first = launched(f"{HERE}:probe", json.dumps({"stop": True}), dict(os.environ))
    second = launched(f"{HERE}:probe", json.dumps({"stop": True}), dict(os.environ))
    assert json.loads(first.first_line())["pid"] == first.pid
    assert json.loads(second.first_line())["pid"] == second.pid
    assert first.poll() is None and second.poll() is None
    os.kill(first.pid, signal.SIGSTOP)
    os.kill(first.pid, signal.SIGCONT)
    second.kill()
    assert second.wait(30) == -signal.SIGKILL
    assert first.poll() is None
    first.send_signal(signal.SIGTERM)
    assert first.wait(30) == -signal.SIGTERM


def test_an_interpreter_option_set_apart_starts_a_new_interpreter() -> None:
    seed = "12345" if os.environ.get("PYTHONHASHSEED") != "12345" else "54321"
    probe_hash = json.dumps({"n": 3})
    process = launched(f"{HERE}:probe", probe_hash, {**os.environ, "PYTHONHASHSEED": seed})
    assert process.wait(60) == 0
    seen = json.loads(process.first_line())
    assert seen["ppid"] == os.getpid()  # a new interpreter, our child
    assert launcher_module._LAUNCHER is None or not launcher_module._LAUNCHER.forks_for(
        {**os.environ, "PYTHONHASHSEED": seed})


def test_a_preload_that_starts_a_thread_is_run_in_a_new_interpreter() -> None:
    threaded = "tests.testing.threaded_module"
    process = launched(f"{HERE}:probe", json.dumps({"n": 4}), dict(os.environ),
                       preload=[threaded])
    assert process.wait(60) == 0, process.stderr()
    assert json.loads(process.first_line())["ppid"] == os.getpid()  # not forked
    assert threaded in launcher_module._UNFORKABLE
    process, seen = run({"n": 5})  # a new launcher forks the next child
    assert process.returncode == 0 and seen["ppid"] != os.getpid()


def test_a_preload_that_prints_leaves_the_launcher_working() -> None:
    process = launched(f"{HERE}:probe", json.dumps({"n": 6}), dict(os.environ),
                       preload=["tests.testing.printing_module"])
    assert process.wait(60) == 0, process.stderr()
    assert json.loads(process.first_line())["ppid"] != os.getpid()  # forked
    process, seen = run({"n": 7})
    assert process.returncode == 0 and seen["ask"] == {"n": 7}


def test_a_child_dies_with_its_launcher_and_the_next_one_has_a_new_launcher() -> None:
    child = launched(f"{HERE}:probe", json.dumps({"stop": True}), dict(os.environ))
    seen = json.loads(child.first_line())
    launcher = launcher_module._LAUNCHER
    assert launcher is not None and seen["ppid"] == launcher._proc.pid
    launcher._proc.kill()
    assert child.wait(30) == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.kill(child.pid, 0)  # killed with its launcher, not left running
    process, again = run({"n": 8})
    assert process.returncode == 0 and again["ppid"] not in (os.getpid(), launcher._proc.pid)


def test_a_launcher_that_cannot_start_leaves_new_interpreters(monkeypatch) -> None:
    def refuse(preload: list[str]) -> None:
        raise RuntimeError("child launcher did not start")

    monkeypatch.setattr(launcher_module, "_LAUNCHER", None)
    monkeypatch.setattr(launcher_module, "_NO_LAUNCHER", [])
    monkeypatch.setattr(launcher_module, "Launcher", refuse)
    process, seen = run({"n": 9})
    assert process.returncode == 0 and seen["ppid"] == os.getpid()
    assert launcher_module._NO_LAUNCHER == ["child launcher did not start"]
