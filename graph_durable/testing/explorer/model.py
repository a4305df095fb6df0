"""Episodes of the explorer: what one generated run is, and how a seed generates it.

An `Episode` is plain data (JSON round-trip with `to_json`/`from_json`): the tools and
their policies, the model's turns of tool calls with the provider faults each call
meets, the crashes (a fault point, and the way the thread is resumed after it), an
optional fork of the finished thread, and how the human reviewer answers. `generate`
builds one from a seed and a set of path classes; the same seed and classes give the
same episode.

Path classes (`classes`) name what the generator may produce; `KNOWN_BUGS` are
the classes that fail today, with why.

Size: this module is a little longer than the ~400 lines modules aim for, on purpose:
the episode's data and the generator that fills it change together (a new field is
generated where it is defined), and the path classes already live apart (`classes`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from graph_durable.testing.explorer.classes import (
    ALL_PATHS,
    BACKEND_PATHS,
    ERROR_PATHS,
    FOLLOWUP_TOOL,
    KNOWN_BUGS,
    RESULT_PATHS,
    RESUME_PATHS,
    RUNTIME_PATHS,
    SHAPE_PATHS,
    STABLE_PATHS,
    SUBGRAPHS,
    draw_shapes,
    refork,
)
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
    `subgraph_send`, `create_agent` (`shapes`)."""
    stack: str = ""
    """A `create_agent` middleware list (`shapes.STACKS`)."""
    history: str = ""
    """How a flat graph keeps its messages: `""` (`add_messages`), `trimmed`, `idless`."""
    fresh_ids: bool = False
    """Above a subgraph: the model gives its calls new tool_call_ids each time it is
    asked, as a real model does (the script's ids otherwise)."""
    backend: str = "sqlite"
    """The saver's database: `sqlite` (a file of the episode's folder), `postgres` (a
    database of its own on the run's throwaway server, `classes.BACKEND_PATHS`, on one
    connection) or `postgres_pool` (the same, on psycopg's connection pool)."""

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
        if self.topology in SUBGRAPHS and refork(self):
            found.add("subgraph_refork")
            if self.topology == "subgraph_send":
                found.add("send_refork")
        if self.fresh_ids:
            found.add("fresh_call_ids")
        if self.backend != "sqlite":
            found.add("postgres")
        if self.history:
            found.add({"trimmed": "trimmed_history", "idless": "idless_messages"}[self.history])
        if self.stack and self.stack != "guard":
            found.add(self.stack)
        for spec in self.tools.values():
            if spec.get("lookup_faults"):
                found.add("lookup_cannot_tell")
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
                     else "",
                     f"lookup={'+'.join(spec['lookup_faults'])}" if spec.get("lookup_faults")
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
        reviewer = [k for k in ("malformed", "raw", "edit_unchanged", "reencoded")
                    if self.reviewer.get(k)]
        lines.append(f"{self.flavour}, {'sequential' if self.sequential else 'parallel'} calls"
                     + (f", {self.topology}" if self.topology != "flat" else "")
                     + (f" with middleware {self.stack}" if self.stack else "")
                     + (f", {self.history} history" if self.history else "")
                     + (", fresh tool_call_ids" if self.fresh_ids else "")
                     + (", leased runs" if self.leased else "")
                     + (", on PostgreSQL" if self.backend == "postgres" else "")
                     + (", on a PostgreSQL pool" if self.backend == "postgres_pool" else "")
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
        if self.fresh_ids:
            out.append(replace(self, fresh_ids=False))
        if self.backend == "postgres_pool":
            out.append(replace(self, backend="postgres"))
        if self.stack not in ("", "guard"):
            out.append(replace(self, stack="guard"))
        for name, spec in self.tools.items():
            for option, plain in (("approval", False), ("retries", 0), ("timeout", None),
                                  ("errors", "raise"), ("result", "receipt"),
                                  ("lookup_faults", None)):
                if spec.get(option, plain) != plain:
                    out.append(replace(self, tools={**self.tools, name: {**spec, option: plain}}))
        for option, plain in (("flavour", "sync"), ("sequential", True), ("leased", False),
                              ("backend", "sqlite")):
            if getattr(self, option) != plain:
                out.append(replace(self, **{option: plain}))
        for option in ("malformed", "raw", "reencoded"):
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
        unknown = set(group) - ALL_PATHS - set(BACKEND_PATHS)
        if unknown:
            raise ValueError(f"Unknown path class {sorted(unknown)}; known: "
                             f"{sorted(ALL_PATHS | set(BACKEND_PATHS))}")
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
    if episode.reviewer["edit_unchanged"]:  # drawn on its own: nothing else changes
        episode.reviewer["reencoded"] = random.Random(f"reencoded-{seed}").random() < 0.5
    draw_shapes(random.Random(f"shapes-{seed}"), episode, paths)
    roll = random.Random(f"backend-{seed}").random()  # its own: nothing else changes
    if "postgres" in paths and roll < 0.5:
        episode.backend = "postgres" if roll < 0.3 else "postgres_pool"
    return episode
