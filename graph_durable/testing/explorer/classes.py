"""The explorer's path classes: their names, the known bugs among them, and how the
classes of where tools sit and how they answer are drawn.

Path classes name what the generator may produce. Resume paths: `plain`, `async`,
`recover`, `copy_thread` (copy the crashed thread, go on with the copy),
`checkpoint_config`, `time_travel`, `update_state`, `copy_both` (go on with the copy
and the original). Call shapes: `slow_timeout_lookup` (a looked-up tool whose call
outlives its timeout), `edit_unchanged` (an approval edit that keeps the arguments; in
half of those episodes re-encoded as a JSON client sends them back, `0.0` for `0`),
`duplicate_call_id` (one id twice in an AIMessage), `reused_call_id` (a later turn
reuses an earlier turn's ids). Where the tools sit (`shapes`, drawn on a
generator of their own so an episode without them stays what it was): `subgraph`,
`subgraph_nested` (two levels down), `subgraph_send` (two `Send` branches into the
subgraph), each resumed every way above (a named checkpoint is the parent's), and
`fresh_call_ids` (there, the model's calls get new tool_call_ids each time it is asked);
`subgraph_refork` (a subgraph episode with two runs from named checkpoints, the second
on another branch of the history), `send_refork` (the same with two `Send` branches);
`create_agent` (`EffectGuardMiddleware`, one task per
call) with middleware lists `tool_retry_outside` (`ToolRetryMiddleware` first),
`model_retry` (`ModelRetryMiddleware`, a model that fails once per turn) and
`tool_retry_inside` (`ToolRetryMiddleware` after the guard: refused with
`MiddlewareOrderError`, then put in order). How write tools answer: `error_tool_exception`,
`error_message`, `error_validation` (the tool reports a lost answer after its write, or
a hang before it, as a `ToolException` with `handle_tool_error=True`, an error
ToolMessage, a `ValidationError` raised in its body); `artifact_result`,
`non_json_result`, `command_result` (a `Command` whose `goto` makes one more guarded
write). Histories of a flat graph: `trimmed_history` (a reducer keeping the last
messages, ids from the model), `idless_messages` (the same, messages without ids:
refused with `UnkeyableToolCall` before anything is sent). Lookups: `lookup_cannot_tell`
(a looked-up tool's first lookups raise, answer a bool or time out). Writes outside
ToolNode (`writes`): `guarded_node` (a custom StateGraph node calls a `guarded`
function per tool call) and `functional` (an `@entrypoint` calls the model and each tool
call in `@task`s, each tool task a `guarded` function), with every resume path above but
`update_state` on `functional` (an entrypoint has one node: an update writes its return
value and leaves nothing to run; such a resume is drawn as `plain`), and without the
tools' answer shapes (`error_*`, `*_result`: ToolNode's). `RUNTIME_PATHS` arise rather
than being generated. Savers: `postgres` (`BACKEND_PATHS`, asked for by name).
`KNOWN_BUGS` are the classes that fail today, with why.
"""

from __future__ import annotations

import random
from typing import Any

__all__ = [
    "ALL_PATHS",
    "BACKEND_PATHS",
    "KNOWN_BUGS",
    "RESUME_PATHS",
    "RUNTIME_PATHS",
    "SHAPE_PATHS",
    "STABLE_PATHS",
    "draw_shapes",
    "refork",
]

RESUME_PATHS = ("plain", "async", "recover", "copy_thread", "checkpoint_config",
                "time_travel", "update_state", "copy_both")
"""Ways a thread is resumed after a crash."""
SHAPE_PATHS = ("slow_timeout_lookup", "edit_unchanged", "duplicate_call_id", "reused_call_id",
               "subgraph", "subgraph_nested", "subgraph_send", "create_agent",
               "tool_retry_outside", "model_retry", "tool_retry_inside",
               "error_tool_exception", "error_message", "error_validation",
               "artifact_result", "non_json_result", "command_result", "subgraph_refork",
               "trimmed_history", "idless_messages", "hitl_before_guard", "hitl_after_guard",
               "fresh_call_ids", "lookup_cannot_tell", "guarded_node", "functional",
               "send_refork")
"""Call shapes the generator may produce besides the everyday ones."""
NAMED_RUNS = ("checkpoint_config", "time_travel", "update_state")
"""Resume paths that run from a named checkpoint id (of the parent, above a subgraph)."""
TOPOLOGY_PATHS = ("subgraph", "subgraph_nested", "subgraph_send", "create_agent",
                  "guarded_node", "functional")
"""Where the guarded tools sit (`shapes`); `flat` when none is enabled."""
STACK_PATHS = ("tool_retry_outside", "model_retry", "tool_retry_inside", "hitl_before_guard",
               "hitl_after_guard")
"""`create_agent` middleware lists other than the guard alone (`shapes.STACKS`)."""
ERROR_PATHS = {"error_tool_exception": "tool_exception", "error_message": "error_message",
               "error_validation": "validation"}
"""How a write tool reports an error it cannot tell about, by path class."""
RESULT_PATHS = {"artifact_result": "artifact", "non_json_result": "non_json",
                "command_result": "command"}
"""What a write tool returns, by path class."""
FOLLOWUP_TOOL = "audit"
RUNTIME_PATHS = ("recover_after_decision", "recover_misjudged", "retry_swallows_refusal",
                 "malformed_across_tasks", "hitl_review", "hitl_asked_again")
"""Situations that arise, rather than being generated: known bugs the driver reports
when enabled, or steps around."""
BACKEND_PATHS = ("postgres",)
"""Savers other than SQLite: `postgres` runs half of the episodes (drawn from the seed)
on `DurablePostgresSaver` (`AsyncDurablePostgresSaver` for `async` ones), on one
connection or (two in five of them) on psycopg's connection pool, each on a
database of its own on a throwaway server the explorer starts from the machine's
binaries (`graph_durable.testing.postgres`). Generated only when named
(`--paths stable,postgres`, `all,postgres`), in neither `stable` nor `all`: it needs the
binaries and the `postgres` extra, and a seed's episode stays what it was without it."""
ALL_PATHS = frozenset(RESUME_PATHS + SHAPE_PATHS + RUNTIME_PATHS)
"""Every path class of the agents (`--paths all`); the savers' are named on their own."""

KNOWN_BUGS: dict[str, str] = {
    "send_refork": "LangGraph's, not graph_durable's: a run from a named checkpoint of the "
    "parent whose step sends two `Send` branches into one subgraph, run again from the "
    "fork an earlier such run made (seed 4192: killed in both runs), restores the checkpoint "
    "from before the fork for one branch only (`ReplayState` counts a subgraph by node "
    "name, not by task); the other loads its latest checkpoint and gets its input again "
    "on top, so the tools step it was about to run is dropped and its calls end "
    "unanswered. The stock savers do the same. Generated only when asked for.",
}
"""Path classes that fail today (being fixed), and what the explorer sees; a class named
here is generated only when asked for, and the driver steps around a runtime one. Each
open one has a test in `tests/test_explorer_regressions.py` marked `xfail(strict=True)`,
which passes once it is fixed: take the class out of here then. (The seeds named are
those that found a bug; the classes drawn since have changed what a seed generates, so
the tests pin the episodes themselves.) Every other class the explorer found failing
has been fixed and is now stable, each with a named test in
`tests/test_explorer_regressions.py` or
`tests/nodes/test_exactly_once_paths.py`: `slow_timeout_lookup` (re-sent while the
first attempt ran), `edit_unchanged` (the thread stranded), `time_travel`,
`update_state` and `checkpoint_config` (keys changed, effects sent again; questions a
fork's answers never reached), `copy_both` (a call sent by both a copy and its source),
`duplicate_call_id` (two calls under one id could not be told apart),
`recover_misjudged` and `recover_after_decision` (`recover()` passed over orphaned
threads, `review()` asked again about decided calls). The last of
`recover_after_decision` (seeds 277, 40084) was the explorer's own: it took a thread
that `recover()` passed by, because the killed worker's lease still held it, for one
asked twice; it now waits for that lease and recovers again, and a run that resumes a
thread and still leaves decided calls pending fails the episode. `error_tool_exception`,
`error_message` and `error_validation` (seeds 216, 218: a write whose tool reported the
lost answer itself was recorded `failed` though applied) are stable since an error
reported after the tool body ran is an unknown outcome; `tool_retry_inside` (seeds 341,
363: a lost charge re-sent by the retry middleware) since that order is refused;
`fresh_call_ids` (seed 4157: a restarted subgraph whose model asked again under a new
tool_call_id was answered under the id of the run, or the copy, that settled the
charge, and left its own call without an answer) since a replayed answer, and a
question, name the call asked now. With a per-call `HumanInTheLoopMiddleware`
(`hitl_before_guard`, `hitl_after_guard`): `hitl_review` (`review()` could not read its
questions), `hitl_asked_again` (seeds 1013, 1028: asked again after a crash, an edit sent
a second charge; an edited call now keeps the requested call's key) and the guard taking its
answers for the guard's own (seeds 277, 3891: an answer addressed to a LangGraph
interrupt id now answers the guard only if the guard asked under that id);
`malformed_across_tasks` (seeds 301, 412, 430, 537: in a set of answers to calls that
run as tasks of their own, the tasks holding valid answers recorded and sent them) since
each task checks the whole set first; `retry_swallows_refusal` (seed 219:
`ToolRetryMiddleware` listed before the guard answered a malformed decision's call with
an error message) since the refusal is a `GraphBubbleUp`, which middleware lets through;
`functional_hidden_question` (seed 7056: a worker killed after a functional-API `@task`
saved its question and before its `@entrypoint` did left a thread `get_state()` showed
no question of, which `thread_status` called waiting, so `recover()` passed it by) since
`thread_status` tells such a question from one `get_state()` shows and calls the thread
orphaned."""
STABLE_PATHS = ALL_PATHS - frozenset(KNOWN_BUGS)
SUBGRAPHS = ("subgraph", "subgraph_nested", "subgraph_send")
GUARDED = ("guarded_node", "functional")
"""Topologies whose writes are `guarded` functions, not tool calls (`writes`)."""


def refork(episode: Any) -> bool:
    """Whether a run from a named checkpoint follows another (each is a fork), in an
    `model.Episode` (not imported: that module imports this one)."""
    vias = [c.then.via for c in episode.crashes] + (
        [episode.after.via] if episode.after is not None else [])
    return sum(1 for via in vias if via in NAMED_RUNS) > 1


def draw_shapes(rng: random.Random, episode: Any, paths: frozenset[str]) -> None:
    """Draw the topology, middleware and tool shapes (`shapes`) of the enabled
    classes, on a generator of their own: an episode without them is what it was."""
    topologies = [p for p in TOPOLOGY_PATHS if p in paths]
    if topologies and rng.random() < 0.5:
        episode.topology = rng.choice(topologies)
    if (episode.topology in SUBGRAPHS and refork(episode)
            and ("subgraph_refork" not in paths
                 or (episode.topology == "subgraph_send" and "send_refork" not in paths))):
        # Keep the episode, without the runs after the fork that make it that class.
        episode.after = None
        named = [c for c in episode.crashes if c.then.via in NAMED_RUNS]
        for crash in named[1:]:
            crash.then = type(crash.then)()  # a plain resume
    if episode.topology == "functional":
        # An update_state fork of an entrypoint's thread runs nothing (see above).
        for crash in episode.crashes:
            if crash.then.via == "update_state":
                crash.then = type(crash.then)()
        if episode.after is not None and episode.after.via == "update_state":
            episode.after = None
    if episode.topology in SUBGRAPHS and "fresh_call_ids" in paths and rng.random() < 0.5:
        episode.fresh_ids = True
    histories = [h for h, name in (("trimmed", "trimmed_history"),
                                   ("idless", "idless_messages")) if name in paths]
    if episode.topology == "flat" and histories and rng.random() < 0.3:
        episode.history = rng.choice(histories)
    if episode.topology == "create_agent":
        episode.stack = rng.choice(["guard", *(p for p in STACK_PATHS if p in paths)])
    tool_node = episode.topology not in GUARDED  # how tools answer is ToolNode's
    errors = [kind for name, kind in ERROR_PATHS.items() if name in paths and tool_node]
    results = [kind for name, kind in RESULT_PATHS.items() if name in paths and tool_node
               and not (kind == "command" and episode.topology == "create_agent")]
    command = None
    for name, spec in episode.tools.items():
        if spec["mode"] == "read":
            continue
        if (spec["policy"] == "lookup" and "lookup_cannot_tell" in paths
                and rng.random() < 0.3):
            spec["lookup_faults"] = rng.choice([["error"], ["bool"], ["hang"],
                                                ["error", "bool"]])
        if errors and rng.random() < 0.4:
            spec["errors"] = rng.choice(errors)
            for call in (c for turn in episode.turns for c in turn if c.tool == name):
                # Errors the tool cannot tell about: the answer lost after the write,
                # or no answer before it.
                if rng.random() < 0.4:
                    call.faults = [rng.choice(["lost", "hang"])]
        kinds = [k for k in results if not (k == "artifact"
                                            and spec.get("errors") == "error_message")]
        if kinds and rng.random() < 0.4:
            spec["result"] = rng.choice(kinds)
            command = command or (name if spec["result"] == "command" else None)
    if command is not None:
        spec = episode.tools[command]
        episode.tools[FOLLOWUP_TOOL] = {"mode": spec["mode"], "policy": spec["policy"],
                                        "approval": False, "retries": 0, "timeout": None}
