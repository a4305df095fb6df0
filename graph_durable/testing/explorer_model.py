"""Episodes of the explorer: what one generated run is, and how a seed generates it.

An `Episode` is plain data (JSON round-trip with `to_json`/`from_json`): the tools and
their policies, the model's turns of tool calls with the provider faults each call
meets, the crashes (a fault point, and the way the thread is resumed after it), an
optional fork of the finished thread, and how the human reviewer answers. `generate`
builds one from a seed and a set of path classes; the same seed and classes give the
same episode.

Path classes name what the generator may produce. Resume paths: `plain`, `async`,
`recover`, `copy_thread` (copy the crashed thread, go on with the copy),
`checkpoint_config`, `time_travel`, `update_state`, `copy_both` (go on with the copy
and the original). Call shapes: `slow_timeout_lookup` (a looked-up tool whose call
outlives its timeout), `edit_unchanged` (an approval edit that keeps the arguments),
`duplicate_call_id` (one id twice in an AIMessage), `reused_call_id` (a later turn
reuses an earlier turn's ids). Where the tools sit (`explorer_shapes`, drawn on a
generator of their own so an episode without them stays what it was): `subgraph`,
`subgraph_nested` (two levels down), `subgraph_send` (two `Send` branches into the
subgraph), each resumed every way above (a named checkpoint is the parent's);
`subgraph_refork` (a subgraph episode with two runs from named checkpoints, the second
on another branch of the history); `create_agent` (`EffectGuardMiddleware`, one task per
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
refused with `UnkeyableToolCall` before anything is sent). `RUNTIME_PATHS` arise rather
than being generated. `KNOWN_BUGS` are the classes that fail today, with why.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from graph_durable.testing.faults import FaultPlan

__all__ = [
    "ALL_PATHS",
    "HANG_SECONDS",
    "KNOWN_BUGS",
    "RESUME_PATHS",
    "RUNTIME_PATHS",
    "SHAPE_PATHS",
    "SLOW_SECONDS",
    "STABLE_PATHS",
    "Call",
    "Crash",
    "Episode",
    "Resume",
    "generate",
    "resolve_paths",
]

SLOW_SECONDS = 0.25
"""How long a `slow` provider fault delays its answer (then the effect is applied)."""
HANG_SECONDS = 0.05
"""How long a `hang` fault waits before raising `TimeoutError` (nothing applied)."""

RESUME_PATHS = ("plain", "async", "recover", "copy_thread", "checkpoint_config",
                "time_travel", "update_state", "copy_both")
"""Ways a thread is resumed after a crash."""
SHAPE_PATHS = ("slow_timeout_lookup", "edit_unchanged", "duplicate_call_id", "reused_call_id",
               "subgraph", "subgraph_nested", "subgraph_send", "create_agent",
               "tool_retry_outside", "model_retry", "tool_retry_inside",
               "error_tool_exception", "error_message", "error_validation",
               "artifact_result", "non_json_result", "command_result", "subgraph_refork",
               "trimmed_history", "idless_messages", "hitl_before_guard", "hitl_after_guard")
"""Call shapes the generator may produce besides the everyday ones."""
NAMED_RUNS = ("checkpoint_config", "time_travel", "update_state")
"""Resume paths that run from a named checkpoint id (of the parent, above a subgraph)."""
TOPOLOGY_PATHS = ("subgraph", "subgraph_nested", "subgraph_send", "create_agent")
"""Where the guarded tools sit (`explorer_shapes`); `flat` when none is enabled."""
STACK_PATHS = ("tool_retry_outside", "model_retry", "tool_retry_inside", "hitl_before_guard",
               "hitl_after_guard")
"""`create_agent` middleware lists other than the guard alone (`explorer_shapes.STACKS`)."""
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
ALL_PATHS = frozenset(RESUME_PATHS + SHAPE_PATHS + RUNTIME_PATHS)

KNOWN_BUGS: dict[str, str] = {
    "subgraph_refork": "a call a restarted subgraph first sent in a run from a named "
    "parent checkpoint (a fork: `get_state().config`, an `update_state` fork) is sent "
    "again, under a new key, by a second run from a parent checkpoint (seed 335: an "
    "update_state fork sends the call, time travel to the checkpoint before it sends it "
    "again; seed 439: a run from get_state().config sends it, an update_state fork of "
    "the first checkpoint sends it again; smallest: killed before the charge, run twice "
    "from the same `get_state().config`).",
    "malformed_across_tasks": "a set of answers to calls that run as tasks of their own "
    "(create_agent's calls, the branches of a Send) with one malformed answer raises "
    "InvalidDecision, but the other tasks record and send their valid answers (seeds "
    "301, 412, 430, 537), where README says one invalid answer runs none of the set. "
    "The driver sends the malformed answer alone in such a set unless this class is "
    "enabled.",
    "hitl_review": "`review(graph, config)` raises KeyError('key') on a thread paused by a "
    "per-call HumanInTheLoopMiddleware listed before the guard (the order README "
    "recommends): its questions carry no effect key. The driver answers those pauses "
    "by interrupt id unless this class is enabled.",
    "hitl_asked_again": "a per-call HumanInTheLoopMiddleware listed before the guard asks "
    "again about a call it was answered for when the thread is resumed after a crash "
    "(or run from a checkpoint): its answer is kept nowhere the resumed run reads. A "
    "person who answers differently the second time (approve, then edit) has the call "
    "sent twice, once as first asked and once edited (seeds 1013, 1028, on create_agent "
    "with hitl_before_guard). The driver's reviewer answers such a question as the first "
    "time unless this class is enabled.",
    "retry_swallows_refusal": "ToolRetryMiddleware listed before EffectGuardMiddleware "
    "(`tool_retry_outside`, the safe order) catches the guard's InvalidDecision and "
    "answers the call with an error ToolMessage (seed 219): a malformed decision is not "
    "refused, the call is answered as failed without being sent, and the thread goes "
    "on. The driver tries no malformed decision under that stack unless this class is "
    "enabled.",
}
"""Path classes that fail today (being fixed), and what the explorer sees; a class named
here is generated only when asked for, and the driver steps around a runtime one. None
is open. Every class the explorer found failing has been fixed and is now stable, each
with a named test in `tests/test_explorer_regressions.py` or
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
363: a lost charge re-sent by the retry middleware) since that order is refused."""
STABLE_PATHS = ALL_PATHS - frozenset(KNOWN_BUGS)

WRITE_TOOLS = ("charge", "email", "ticket", "crm")
READ_TOOL = "search"
POLICIES = {"dedupe": ("idempotent", "lookup", "blind"), "lookup": ("lookup", "blind"),
            "blind": ("blind",)}
"""Policies each provider contract honours."""
OUTCOMES = {  # outcome -> (weight, provider faults the call meets)
    "return": (52, []), "not_applied": (8, ["permanent"]), "retryable": (12, ["transient"]),
    "retryable_twice": (4, ["transient", "transient"]), "lost": (8, ["lost"]),
    "error": (6, ["hang"]), "slow": (10, ["slow"]),
}
GUARD_POINTS = ("before_intent", "after_intent", "after_effect", "after_receipt")
SAVER_POINTS = ("before_put", "after_put", "before_put_writes", "after_put_writes")


@dataclass
class Call:
    """One tool call of a turn, and the provider faults it meets (in order)."""

    tool: str
    id: str
    item: str
    n: int = 0
    faults: list[str] = field(default_factory=list)


@dataclass
class Resume:
    """How a thread is run again: `via` (a resume path) and which step a fork picks."""

    via: str = "plain"
    pick: int = 0


@dataclass
class Crash:
    """A SIGKILL at the `occurrence`-th `point` (of `tool`), armed from pause `phase` on,
    then a resume `then`."""

    point: str
    tool: str | None = None
    occurrence: int = 1
    phase: int = 0
    then: Resume = field(default_factory=Resume)

    def plan(self) -> FaultPlan:
        """The fault plan that kills the child here."""
        return FaultPlan(self.point, self.tool, self.occurrence, "kill")


@dataclass
class Episode:
    """One generated run (see the module docstring)."""

    seed: int
    tools: dict[str, dict[str, Any]]
    turns: list[list[Call]]
    crashes: list[Crash] = field(default_factory=list)
    after: Resume | None = None
    """A fork of the finished thread (time travel or update_state), run to its end."""
    flavour: str = "sync"
    sequential: bool = True
    leased: bool = False
    sealed: bool = False
    """The saver encrypts (LangGraph's `EncryptedSerializer`), sealing the ledger."""
    reviewer: dict[str, Any] = field(default_factory=dict)
    """`seed`, `malformed` (try a malformed decision first, among valid ones), `raw`
    (resume by hand instead of through `review`: keyed by interrupt id, or, while one
    interrupt is pending, a bare decision or keyed by tool_call_id), `edit_unchanged`.
    Every third round with several calls pending answers only half of them."""
    topology: str = "flat"
    """Where the guarded tools sit: `flat`, `subgraph`, `subgraph_nested`,
    `subgraph_send`, `create_agent` (`explorer_shapes`)."""
    stack: str = ""
    """A `create_agent` middleware list (`explorer_shapes.STACKS`)."""
    history: str = ""
    """How a flat graph keeps its messages: `""` (`add_messages`), `trimmed`, `idless`."""

    def scenario_turns(self) -> list[list[dict[str, Any]]]:
        """The turns as the scenario factory takes them."""
        return [[{"tool": c.tool, "id": c.id, "item": c.item, "n": c.n} for c in turn]
                for turn in self.turns]

    def faults(self) -> dict[str, tuple[str, list[str]]]:
        """`{item: (tool, faults)}` of the calls that meet faults (each `Send` branch's
        item of a call meets them)."""
        prefixes = ("b0", "b1") if self.topology == "subgraph_send" else ("",)
        return {p + c.item: (c.tool, c.faults) for turn in self.turns for c in turn
                if c.faults for p in prefixes}

    def paths(self) -> set[str]:
        """The path classes this episode exercises."""
        found = {crash.then.via for crash in self.crashes}
        if self.after is not None:
            found.add(self.after.via)
        for turn_number, turn in enumerate(self.turns):
            ids = [c.id for c in turn]
            if len(set(ids)) != len(ids):
                found.add("duplicate_call_id")
            if turn_number and {c.id for c in turn} & {c.id for c in self.turns[0]}:
                found.add("reused_call_id")
            for call in turn:
                spec = self.tools[call.tool]
                if ("slow" in call.faults and spec["policy"] == "lookup"
                        and (spec["timeout"] or 1e9) < SLOW_SECONDS):
                    found.add("slow_timeout_lookup")
        if self.reviewer.get("edit_unchanged"):
            found.add("edit_unchanged")
        if self.topology != "flat":
            found.add(self.topology)
        if self.topology in SUBGRAPHS and _refork(self):
            found.add("subgraph_refork")
        if self.history:
            found.add({"trimmed": "trimmed_history", "idless": "idless_messages"}[self.history])
        if self.stack and self.stack != "guard":
            found.add(self.stack)
        for spec in self.tools.values():
            found |= {name for name, kind in ERROR_PATHS.items() if spec.get("errors") == kind}
            found |= {name for name, kind in RESULT_PATHS.items() if spec.get("result") == kind}
        return found

    def to_json(self) -> str:
        """Compact JSON (for a replay command)."""
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Episode:
        """The episode `to_json` wrote."""
        data = json.loads(text)
        data["turns"] = [[Call(**c) for c in turn] for turn in data["turns"]]
        data["crashes"] = [Crash(**{**c, "then": Resume(**c["then"])}) for c in data["crashes"]]
        data["after"] = Resume(**data["after"]) if data["after"] else None
        return cls(**data)

    def describe(self) -> str:
        """Several lines a person reads to see what the episode does."""
        lines = []
        for name, spec in self.tools.items():
            approval = spec.get("approval")
            extra = ["approval" + (" of odd items" if approval == "odd" else "") if approval
                     else "",
                     f"retries={spec['retries']}" if spec.get("retries") else "",
                     f"timeout={spec['timeout']}" if spec.get("timeout") else "",
                     f"errors={spec['errors']}" if spec.get("errors", "raise") != "raise"
                     else "",
                     f"result={spec['result']}" if spec.get("result", "receipt") != "receipt"
                     else ""]
            lines.append(f"tool {name}: provider {spec['mode']}, policy {spec['policy']} "
                         + " ".join(e for e in extra if e))
        for number, turn in enumerate(self.turns):
            calls = ", ".join(f"{c.tool}({c.item}, id={c.id})"
                              + (f" faults={'+'.join(c.faults)}" if c.faults else "")
                              for c in turn)
            lines.append(f"turn {number}: {calls}")
        for number, crash in enumerate(self.crashes, 1):
            lines.append(f"crash {number}: SIGKILL at {crash.point}"
                         + (f" of {crash.tool}" if crash.tool else "")
                         + f" #{crash.occurrence} (from pause {crash.phase} on), then "
                         f"resume via {crash.then.via}"
                         + (f" (pick {crash.then.pick})" if crash.then.via in _PICKING else ""))
        if self.after is not None:
            lines.append(f"once done: {self.after.via} (pick {self.after.pick}), run to the end")
        reviewer = [k for k in ("malformed", "raw", "edit_unchanged") if self.reviewer.get(k)]
        lines.append(f"{self.flavour}, {'sequential' if self.sequential else 'parallel'} calls"
                     + (f", {self.topology}" if self.topology != "flat" else "")
                     + (f" with middleware {self.stack}" if self.stack else "")
                     + (f", {self.history} history" if self.history else "")
                     + (", leased runs" if self.leased else "")
                     + (f", reviewer: {', '.join(reviewer)}" if reviewer else ""))
        return "\n".join(lines)

    def simpler(self) -> list[Episode]:
        """Episodes one step simpler than this one, for shrinking a failure."""
        out: list[Episode] = []
        if self.after is not None:
            out.append(replace(self, after=None))
        for i, crash in enumerate(self.crashes):
            out.append(replace(self, crashes=self.crashes[:i] + self.crashes[i + 1:]))
            if crash.then.via != "plain":
                plain = replace(crash, then=Resume())
                out.append(replace(self, crashes=[*self.crashes[:i], plain,
                                                  *self.crashes[i + 1:]]))
        if len(self.turns) > 1:
            out += [replace(self, turns=self.turns[:i] + self.turns[i + 1:])
                    for i in range(len(self.turns))]
        for t, turn in enumerate(self.turns):
            for i, call in enumerate(turn):
                if len(turn) > 1:
                    out.append(self._with_turn(t, turn[:i] + turn[i + 1:]))
                if call.faults:
                    out.append(self._with_turn(t, [*turn[:i], replace(call, faults=[]),
                                                   *turn[i + 1:]]))
        if self.topology != "flat":
            out.append(replace(self, topology="flat", stack=""))
        if self.history:
            out.append(replace(self, history=""))
        if self.stack not in ("", "guard"):
            out.append(replace(self, stack="guard"))
        for name, spec in self.tools.items():
            for option, plain in (("approval", False), ("retries", 0), ("timeout", None),
                                  ("errors", "raise"), ("result", "receipt")):
                if spec.get(option, plain) != plain:
                    out.append(replace(self, tools={**self.tools, name: {**spec, option: plain}}))
        for option, plain in (("flavour", "sync"), ("sequential", True), ("leased", False)):
            if getattr(self, option) != plain:
                out.append(replace(self, **{option: plain}))
        for option in ("malformed", "raw"):
            if self.reviewer.get(option):
                out.append(replace(self, reviewer={**self.reviewer, option: False}))
        used = {c.tool for turn in self.turns for c in turn}
        if any(self.tools[t].get("result") == "command" for t in used):
            used.add(FOLLOWUP_TOOL)
        if set(self.tools) - used:
            out.append(replace(self, tools={k: v for k, v in self.tools.items() if k in used}))
        return out

    def _with_turn(self, number: int, calls: list[Call]) -> Episode:
        return replace(self, turns=[*self.turns[:number], calls, *self.turns[number + 1:]])


_PICKING = ("time_travel", "update_state")


def resolve_paths(paths: str | Iterable[str] | None) -> frozenset[str]:
    """`"stable"` (default), `"all"`, or class names (comma-separated or iterable);
    a leading `-` removes a class (`"all,-copy_both"`)."""
    if paths is None:
        return STABLE_PATHS
    names = [p.strip() for p in paths.split(",")] if isinstance(paths, str) else list(paths)
    chosen: set[str] = set()
    for name in names:
        if not name:
            continue
        target = chosen.difference_update if name.startswith("-") else chosen.update
        name = name.lstrip("-")
        group = {"stable": STABLE_PATHS, "all": ALL_PATHS}.get(name, {name})
        unknown = set(group) - ALL_PATHS
        if unknown:
            raise ValueError(f"Unknown path class {sorted(unknown)}; known: {sorted(ALL_PATHS)}")
        target(group)
    if not chosen & set(RESUME_PATHS):
        chosen.add("plain")
    return frozenset(chosen)


def _weighted(rng: random.Random, table: dict[str, tuple[int, Any]]) -> str:
    names = list(table)
    return rng.choices(names, weights=[table[n][0] for n in names])[0]


def _tools(rng: random.Random, planted_bug: bool) -> dict[str, dict[str, Any]]:
    tools: dict[str, dict[str, Any]] = {}
    for name in WRITE_TOOLS[:rng.randint(1, len(WRITE_TOOLS))]:
        mode = rng.choice(sorted(POLICIES))
        roll = rng.random()
        tools[name] = {"mode": mode, "policy": rng.choice(POLICIES[mode]),
                       "approval": True if roll < 0.18 else "odd" if roll < 0.28 else False,
                       "retries": rng.choice([0, 0, 1, 2]),
                       "timeout": rng.choice([None, None, None, 0.1, 1.0])}
    if planted_bug:
        # The misconfiguration to catch: a provider that does not dedupe, declared
        # idempotent, so a same-key re-send after a crash applies the effect again.
        first = next(iter(tools))
        tools[first].update(mode="blind", policy="idempotent")
    if rng.random() < 0.3:
        tools[READ_TOOL] = {"mode": "read", "policy": "read_only"}
    return tools


def _turns(rng: random.Random, tools: dict[str, dict[str, Any]], paths: frozenset[str]
           ) -> list[list[Call]]:
    turns: list[list[Call]] = []
    names = sorted(tools)
    for t in range(rng.randint(1, 3)):
        calls = []
        for i in range(rng.randint(1, 5)):
            tool = rng.choice(names)
            call_id = f"call_{t}_{i}"
            # Drawn whatever the paths, so that other classes do not reshuffle an episode.
            duplicate, reuse = rng.random() < 0.08, rng.random() < 0.15
            if i and duplicate and "duplicate_call_id" in paths:
                call_id = calls[-1].id
            elif t and i < len(turns[0]) and reuse and "reused_call_id" in paths:
                call_id = f"call_0_{i}"
            faults: list[str] = []
            outcome, outlives = _weighted(rng, OUTCOMES), rng.random() < 0.3
            if tools[tool]["mode"] != "read":
                spec = tools[tool]
                if outlives and (spec["timeout"] or 1e9) < SLOW_SECONDS:
                    outcome = "slow"  # a short timeout is there to be outlived
                faults = list(OUTCOMES[outcome][1])
                if ("slow" in faults and spec["policy"] == "lookup"
                        and (spec["timeout"] or 1e9) < SLOW_SECONDS
                        and "slow_timeout_lookup" not in paths):
                    faults = []
            calls.append(Call(tool, call_id, f"x{t}{i}", 0, faults))
        turns.append(calls)
    return turns


def _crash(rng: random.Random, episode: Episode, paths: frozenset[str],
           copied: bool) -> Crash:
    writes = sorted({c.tool for turn in episode.turns for c in turn
                     if episode.tools[c.tool]["mode"] != "read"})
    approvals = any(episode.tools[t].get("approval") for t in writes)
    roll = rng.random()
    if writes and roll < 0.6:
        tool = rng.choice(writes)
        per_turn = max(sum(1 for c in turn if c.tool == tool) for turn in episode.turns)
        crash = Crash(rng.choice(GUARD_POINTS), tool, rng.randint(1, max(1, per_turn)))
    elif approvals and roll < 0.7:
        crash = Crash("after_decision", None, 1)
    else:
        crash = Crash(rng.choice(SAVER_POINTS), None, rng.randint(1, 2 * len(episode.turns) + 2))
    if approvals and rng.random() < 0.3:
        crash.phase = rng.randint(1, 2)
    vias = sorted(p for p in RESUME_PATHS if p in paths
                  and not (copied and p in ("recover", "copy_thread", "copy_both")))
    crash.then = Resume(rng.choice(vias or ["plain"]), rng.randrange(8))
    return crash


def generate(seed: int, paths: Iterable[str] = STABLE_PATHS, *,
             planted_bug: bool = False) -> Episode:
    """The episode of `seed` under the path classes `paths` (deterministic).

    `planted_bug` declares the first tool idempotent on a provider that does not
    dedupe: a misconfiguration the explorer's invariants must catch.
    """
    paths = frozenset(paths)
    rng = random.Random(seed)
    tools = _tools(rng, planted_bug)
    # A third of the episodes run on an encrypted saver; drawn from the seed, not the
    # generator, so every other choice of a seed stays what it was.
    episode = Episode(seed, tools, _turns(rng, tools, paths), sealed=seed % 3 == 2)
    crashes = 0 if rng.random() < 0.2 else (2 if rng.random() < 0.3 else 1)
    copied = False
    for _ in range(crashes):
        crash = _crash(rng, episode, paths, copied)
        copied = copied or crash.then.via in ("copy_thread", "copy_both")
        episode.crashes.append(crash)
    forks = sorted(p for p in _PICKING if p in paths)
    if rng.random() < 0.15 and forks:
        episode.after = Resume(rng.choice(forks), rng.randrange(8))
    if rng.random() < 0.15 and "async" in paths:
        episode.flavour = "async"
    episode.sequential = rng.random() < 0.8
    episode.leased = rng.random() < 0.12
    episode.reviewer = {"seed": rng.randrange(2**31), "malformed": rng.random() < 0.4,
                        "raw": rng.random() < 0.3,
                        "edit_unchanged": rng.random() < 0.3 and "edit_unchanged" in paths}
    _shapes(random.Random(f"shapes-{seed}"), episode, paths)
    return episode


SUBGRAPHS = ("subgraph", "subgraph_nested", "subgraph_send")


def _refork(episode: Episode) -> bool:
    """Whether a run from a named checkpoint follows another (each is a fork)."""
    vias = [c.then.via for c in episode.crashes] + (
        [episode.after.via] if episode.after is not None else [])
    return sum(1 for via in vias if via in NAMED_RUNS) > 1


def _shapes(rng: random.Random, episode: Episode, paths: frozenset[str]) -> None:
    """Draw the topology, middleware and tool shapes (`explorer_shapes`) of the enabled
    classes, on a generator of their own: an episode without them is what it was."""
    topologies = [p for p in TOPOLOGY_PATHS if p in paths]
    if topologies and rng.random() < 0.5:
        episode.topology = rng.choice(topologies)
    if (episode.topology in SUBGRAPHS and "subgraph_refork" not in paths
            and _refork(episode)):
        # Keep the episode, without the runs after the fork that make it that class.
        episode.after = None
        named = [c for c in episode.crashes if c.then.via in NAMED_RUNS]
        for crash in named[1:]:
            crash.then = Resume()
    histories = [h for h, name in (("trimmed", "trimmed_history"),
                                   ("idless", "idless_messages")) if name in paths]
    if episode.topology == "flat" and histories and rng.random() < 0.3:
        episode.history = rng.choice(histories)
    if episode.topology == "create_agent":
        episode.stack = rng.choice(["guard", *(p for p in STACK_PATHS if p in paths)])
    errors = [kind for name, kind in ERROR_PATHS.items() if name in paths]
    results = [kind for name, kind in RESULT_PATHS.items() if name in paths
               and not (kind == "command" and episode.topology == "create_agent")]
    command = None
    for name, spec in episode.tools.items():
        if spec["mode"] == "read":
            continue
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
