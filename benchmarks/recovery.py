"""Recovery does not grow with history: resume a crashed thread after 10 vs 10,000 turns.

The agent is model -> `EffectGuardNode` -> model on a `DurableSqliteSaver`; its one tool,
`record_note`, writes to a `FakeProvider` that dedupes by key (so the policy is
`Effect(idempotent=True)`). Its model answers from the *last human message* ("turn N"
-> one tool call `call_N`; after the tool's answer, "Turn N done."), so it works on a
thread of any length; `ScriptedChatModel`, which counts AI messages, would not.

History: one thread `t` is run for `SMALL` and for `LARGE` turns, in this process, each
turn a real graph invocation with `durability="sync"` and one guarded effect, so the
database holds ~5 checkpoints, ~7 writes, 1 effect and 2 journal events per turn. Only
the tool is a trivial local function while the history is built, and the connection
commits with `synchronous=OFF` to build it faster; the thread, its checkpoints and its
ledger are what the agent makes. The thread's *state* keeps the messages of the current
turn only (its reducer starts over at each human message), as an agent that trims its
context does: with a plain `MessagesState` the state itself would hold 40,000 messages
after 10,000 turns, and loading it would grow with history whatever the saver does.

Then, `REPETITIONS` times for each history (interleaved):

1. crash: a child process starts turn N and is SIGKILLed at the fault point
   `after_effect` (the provider applied the write, the receipt is not recorded);
2. resume: a fresh child process rebuilds the agent on the same files, reads the state
   (`next == ("tools",)`) and invokes `None`; the guard finds the effect in flight,
   re-sends it under the same key, the provider dedupes, the turn ends.

Timed: from the start of the resume child (`Popen`) to the line it prints once the
thread has finished (imports, building the graph, opening the database, resuming), and,
within the child, the resume alone (`get_state` + `invoke(None)`). After that line the
child checks, untimed, that the turn ended with the final answer, the effect is applied
after 2 attempts and the provider applied it exactly once. Medians over the
repetitions; target ratio (10,000 / 10 turns) at most 1.5.

Run: `python -m benchmarks recovery` (or `python -m benchmarks.recovery`); set
`BENCH_RECOVERY_TURNS` for another large history.
"""

from __future__ import annotations

import time

_MODULE_START = time.time()
"""When this module began to run (in a child: after interpreter start-up, before imports)."""

import json
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage
from langchain_core.tools import BaseTool, tool
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import tools_condition

from benchmarks._runner import Comparison, report, run_main, spawn_child
from graph_durable import DurableSqliteSaver, Effect, EffectGuardNode, current_effect
from graph_durable.testing.faults import ENV_FAULTS, ENV_TRACE, FaultPlan
from graph_durable.testing.models import DeterministicChatModel
from graph_durable.testing.providers import FakeProvider

__all__ = [
    "LARGE",
    "REPETITIONS",
    "SMALL",
    "TARGET",
    "LastHumanModel",
    "build_agent",
    "build_history",
    "main",
]

SMALL = 10
LARGE = int(os.environ.get("BENCH_RECOVERY_TURNS", "10000"))
"""Earlier turns in the thread: the small and the large history."""

REPETITIONS = 7
"""Crash-and-resume cycles per history; the median resume is reported."""

TARGET = 1.5
"""Resume time with the large history over resume time with the small one."""

TOOL = "record_note"
THREAD = "t"
FINISHED = "RESUMED-AND-FINISHED"


# -- the agent ---------------------------------------------------------------------------


def current_turn(left: list[AnyMessage], right: Any) -> list[AnyMessage]:
    """`add_messages`, except that a human message starts the list over (one turn kept)."""
    update = right if isinstance(right, list) else [right]
    if update and isinstance(update[0], HumanMessage):
        return add_messages([], update)
    return add_messages(left, update)


class TurnState(TypedDict):
    messages: Annotated[list[AnyMessage], current_turn]


class LastHumanModel(DeterministicChatModel):
    """Answers from the last human message `turn N`: a tool call, then the final answer."""

    @property
    def _llm_type(self) -> str:
        return "last-human"

    def answer(self, messages: list[BaseMessage]) -> AIMessage:
        human = next(m for m in reversed(messages) if isinstance(m, HumanMessage))
        match = re.fullmatch(r"turn (\d+)", str(human.content))
        if match is None:
            raise ValueError(f"expected 'turn N', got {human.content!r}")
        n = int(match.group(1))
        if isinstance(messages[-1], HumanMessage):
            return AIMessage(content="", tool_calls=[
                {"name": TOOL, "args": {"note": f"note {n}"}, "id": f"call_{n}",
                 "type": "tool_call"},
            ])
        return AIMessage(content=f"Turn {n} done.")


def _tool(provider: FakeProvider | None) -> BaseTool:
    @tool(TOOL)
    def record_note(note: str) -> Any:
        """Record a note with the provider, under the effect's key."""
        key = current_effect().key
        if provider is None:
            return f"recorded {note!r}"
        return provider.apply(key, {"note": note})

    return record_note


@dataclass
class Agent:
    graph: Any
    saver: DurableSqliteSaver
    conn: sqlite3.Connection
    provider: FakeProvider | None

    def close(self) -> None:
        self.conn.close()


def build_agent(db_path: str, provider_path: str | None = None) -> Agent:
    """The agent on `db_path`; its tool writes to a dedupe provider at `provider_path`."""
    conn = sqlite3.connect(db_path, check_same_thread=False)
    saver = DurableSqliteSaver(conn)
    saver.setup()
    provider = None if provider_path is None else FakeProvider(provider_path, "dedupe",
                                                                name=TOOL)
    model = LastHumanModel()

    def agent(state: TurnState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(TurnState)
    builder.add_node("agent", agent)
    builder.add_node("tools", EffectGuardNode([_tool(provider)],
                                              effects={TOOL: Effect(idempotent=True)}))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return Agent(builder.compile(checkpointer=saver), saver, conn, provider)


def _config() -> dict[str, Any]:
    return {"configurable": {"thread_id": THREAD}}


def build_history(db_path: str, turns: int, *, first: int = 0) -> None:
    """Run `turns` real turns on thread `t` (trivial tool, commits without fsync)."""
    agent = build_agent(db_path)
    agent.conn.execute("PRAGMA synchronous=OFF")
    started = time.perf_counter()
    try:
        for n in range(first, first + turns):
            out = agent.graph.invoke({"messages": [HumanMessage(f"turn {n}")]}, _config(),
                                     durability="sync")
            if n % 2000 == 1999:
                print(f"  {n + 1 - first}/{turns} turns, {time.perf_counter() - started:.0f} s",
                      flush=True)
        if out["messages"][-1].content != f"Turn {first + turns - 1} done.":
            raise RuntimeError(f"history turn ended with {out['messages'][-1]!r}")
    finally:
        agent.close()


def _history_counts(db_path: str) -> dict[str, int]:
    with sqlite3.connect(db_path) as conn:
        counts = {
            table: conn.execute(f"SELECT COUNT(*) FROM {table} WHERE thread_id = ?",
                                (THREAD,)).fetchone()[0]
            for table in ("checkpoints", "writes", "effects", "effect_events")
        }
    counts["bytes"] = os.path.getsize(db_path)
    return counts


# -- the child processes -----------------------------------------------------------------


def _child(spec: dict[str, Any]) -> None:
    """`crash`: start turn N (armed to die); `resume`: finish the thread, then verify."""
    started = time.time()
    agent = build_agent(spec["db"], spec["provider"])
    built = time.time()
    n = spec["turn"]
    if spec["action"] == "crash":
        agent.graph.invoke({"messages": [HumanMessage(f"turn {n}")]}, _config(),
                           durability="sync")
        print(json.dumps({"error": "the crash child was not killed"}), flush=True)
        sys.exit(3)
    state = agent.graph.get_state(_config())
    if tuple(state.next) != ("tools",):
        print(json.dumps({"error": f"nothing to resume: next={state.next!r}"}), flush=True)
        sys.exit(4)
    out = agent.graph.invoke(None, _config(), durability="sync")
    done = time.time()
    print(FINISHED, flush=True)
    # Untimed from here: did the resumed turn do what the benchmark claims?
    (key,) = agent.conn.execute(
        "SELECT key FROM effects WHERE thread_id = ? AND tool_call_id = ?",
        (THREAD, f"call_{n}"),
    ).fetchone()
    record = agent.saver.effect(key, THREAD)
    assert agent.provider is not None
    print(json.dumps({
        "final": out["messages"][-1].content,
        "messages": len(out["messages"]),
        "status": record.status.value if record else None,
        "attempts": record.attempts if record else None,
        "provider_applied": agent.provider.count(key),
        "provider_requests": [r["outcome"] for r in agent.provider.requests(key)],
        "module_start": _MODULE_START,
        "imports_s": started - _MODULE_START,
        "build_s": built - started,
        "resume_s": done - built,
        "done": done,
    }), flush=True)
    agent.close()


def _spawn(
    spec: dict[str, Any], fault: FaultPlan | None, stderr: Any
) -> tuple[subprocess.Popen[str], float]:
    env = {k: v for k, v in os.environ.items() if k not in (ENV_FAULTS, ENV_TRACE)}
    if fault is not None:
        env.update(fault.to_env())
    start = time.time()
    return spawn_child("benchmarks.recovery", spec, env=env, stderr=stderr), start


def crash(db: str, provider: str, turn: int) -> None:
    """Start `turn` in a child and have it SIGKILLed after the effect, before the receipt."""
    proc, _ = _spawn({"action": "crash", "db": db, "provider": provider, "turn": turn},
                     FaultPlan("after_effect", tool=TOOL), subprocess.PIPE)
    out, err = proc.communicate(timeout=120)
    if proc.returncode != -9:
        raise RuntimeError(f"crash child exited with {proc.returncode}, not SIGKILL:\n"
                           f"{out}\n{err[-3000:]}")


def resume(db: str, provider: str, turn: int) -> dict[str, Any]:
    """Resume the crashed thread in a fresh child; time process start -> finished."""
    with tempfile.TemporaryFile("w+") as stderr:  # a file: a full pipe would block the child
        proc, start = _spawn(
            {"action": "resume", "db": db, "provider": provider, "turn": turn}, None, stderr)
        assert proc.stdout is not None
        finished_at = None
        lines = []
        for line in proc.stdout:
            if line.strip() == FINISHED and finished_at is None:
                finished_at = time.time()
            else:
                lines.append(line)
        proc.wait(timeout=120)
        stderr.seek(0)
        err = stderr.read()
    if proc.returncode != 0 or finished_at is None:
        raise RuntimeError(f"resume child exited with {proc.returncode}:\n"
                           f"{''.join(lines)}\n{err[-3000:]}")
    result = json.loads(lines[-1])
    expected = {"final": f"Turn {turn} done.", "status": "applied", "attempts": 2,
                "provider_applied": 1, "provider_requests": ["applied", "deduplicated"]}
    wrong = {k: result.get(k) for k, v in expected.items() if result.get(k) != v}
    if wrong:
        raise RuntimeError(f"resumed turn {turn} is not as expected: {wrong} "
                           f"(expected {expected})")
    result["total_s"] = finished_at - start
    result["startup_s"] = result["module_start"] - start
    return result


# -- the benchmark -----------------------------------------------------------------------


def main() -> list[Comparison]:
    """Build both histories, crash and resume each `REPETITIONS` times, report."""
    sizes = (SMALL, LARGE)
    with tempfile.TemporaryDirectory(prefix="graph-durable-recovery-") as workdir:
        paths = {size: (os.path.join(workdir, f"agent-{size}.sqlite"),
                        os.path.join(workdir, f"provider-{size}.sqlite")) for size in sizes}
        built = {}
        for size in sizes:
            print(f"building a thread of {size} turns ...", flush=True)
            started = time.perf_counter()
            build_history(paths[size][0], size)
            built[size] = time.perf_counter() - started
            counts = _history_counts(paths[size][0])
            print(f"  {size} turns in {built[size]:.1f} s: {counts['checkpoints']} "
                  f"checkpoints, {counts['writes']} writes, {counts['effects']} effects, "
                  f"{counts['effect_events']} events, {counts['bytes'] / 1e6:.1f} MB",
                  flush=True)
        history = {size: _history_counts(paths[size][0]) for size in sizes}
        runs: dict[int, list[dict[str, Any]]] = {size: [] for size in sizes}
        next_turn = {size: size for size in sizes}  # turns 0..size-1 are the history
        print(f"{REPETITIONS} x (crash at after_effect, resume in a new process) per "
              "history, interleaved", flush=True)
        for rep in range(REPETITIONS):
            for size in sizes if rep % 2 == 0 else reversed(sizes):
                db, provider = paths[size]
                turn = next_turn[size]
                next_turn[size] += 1
                crash(db, provider, turn)
                runs[size].append(resume(db, provider, turn))
            print(f"  rep {rep + 1}/{REPETITIONS}: " + ", ".join(
                f"{size} turns {runs[size][-1]['total_s'] * 1000:.0f} ms "
                f"(resume {runs[size][-1]['resume_s'] * 1000:.1f} ms)" for size in sizes),
                flush=True)
    total = {size: [r["total_s"] * 1000 for r in runs[size]] for size in sizes}
    inner = {size: [r["resume_s"] * 1000 for r in runs[size]] for size in sizes}
    build = {size: [r["build_s"] * 1000 for r in runs[size]] for size in sizes}
    details = {"history": {str(k): v for k, v in history.items()},
               "history_build_s": {str(k): v for k, v in built.items()},
               "build_ms": {str(k): v for k, v in build.items()},
               "small": SMALL, "large": LARGE}
    labels = (f"{SMALL} turns", f"{LARGE:,} turns")
    comparisons = [
        Comparison.of_samples(
            "recovery: process start to finished", total[SMALL], total[LARGE],
            target=TARGET, labels=labels,
            note=(f"a new Python process: start, imports, graph and saver built "
                  f"(median {statistics.median(build[SMALL]):.0f} / "
                  f"{statistics.median(build[LARGE]):.0f} ms), resume to the end"),
            details=details,
        ),
        Comparison.of_samples(
            "recovery: get_state + invoke(None)", inner[SMALL], inner[LARGE],
            target=TARGET, labels=labels,
            note=(f"the resume alone, inside the child; history: {history[LARGE]['checkpoints']:,} "
                  f"checkpoints, {history[LARGE]['effects']:,} effects, "
                  f"{history[LARGE]['bytes'] / 1e6:.0f} MB vs {history[SMALL]['checkpoints']} "
                  f"checkpoints, {history[SMALL]['bytes'] / 1e6:.1f} MB"),
            details=details,
        ),
    ]
    report(f"recovery after a crash at after_effect: {SMALL} vs {LARGE:,} earlier turns in "
           "the thread (EffectGuardNode + DurableSqliteSaver, dedupe provider)",
           comparisons, benchmark="recovery")
    return comparisons


if __name__ == "__main__":
    raise SystemExit(run_main(main, child=_child))
