"""The explorer's invariants, checked on the provider's side, the ledger and the threads.

`check_episode` reads an episode's database and provider files once every thread has
run (or given up) and returns one line per broken invariant, each starting with its
kind:

- `DUPLICATE`: a key applied more than once at a provider, or a logical call (`item`)
  applied more often than distinct model messages requested it. A model message asked
  again (time travel before a model step) is a new request by design; a crash, a
  resume, a fork or a copy of the same message is not.
- `LEDGER`: the ledger disagrees with a provider: `applied` without the effect (or
  with another receipt), `failed`/`rejected` (or skipped for an edit) with it, or an
  effect no ledger knows; once every thread finished (and no fork left a branch
  behind, whose in-flight calls nobody resumes), an effect whose ledger status is not
  `applied` or `skipped`. (So a tool that reports an error itself after its write
  must end applied once, or paused as unknown and settled: never `failed`, nor
  re-sent, which `DUPLICATE` counts.)
- `EXACTLY-ONCE`: a finished thread answered a call as applied, but the provider does
  not hold exactly one effect under the key of that answer.
- `STRANDED`: a finished thread holds a call without an answer, or the placeholder of a
  pending decision.
- `ANSWER`: a finished thread answered a call applied, but not the way its tool answers
  (`shapes`): an `artifact` tool's ToolMessage without the receipt as its
  artifact, a `non_json` tool's without its non-JSON value, a `command` tool's not the
  ToolMessage of its Command; a replay that lost them
  (when the receipt came from the tool: a lookup or a person answers their own way);
  a `Command` answer whose `goto` never led to its follow-up write.

Above a subgraph (`one_request_per_item`) the model asks again when the subgraph
restarts (a run from a named parent checkpoint): the same logical call, under a new
message id, which keeps its key; there each item may be applied once per set of
threads its requests are held by (a copy and its source asking on their own are two).

`ledger_snapshot` is what must not change when a malformed decision is refused.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Sequence, Set
from typing import Any

from graph_durable.checkpointers.sqlite import DurableSqliteSaver
from graph_durable.ledger import EffectStatus
from graph_durable.operators.orphans import ANSWERED_WITHOUT_GUARD, find_orphans
from graph_durable.testing.explorer.scenario import explorer_saver, is_postgres
from graph_durable.testing.explorer.shapes import parse_answer
from graph_durable.testing.providers import FakeProvider

__all__ = ["check_episode", "ledger_snapshot", "provider_effects"]

S = EffectStatus


def provider_effects(provider_dir: str, tools: dict[str, dict[str, Any]]
                     ) -> list[dict[str, Any]]:
    """Every effect applied at the episode's providers, with `tool` added."""
    found = []
    for name, spec in tools.items():
        path = os.path.join(provider_dir, f"{name}.sqlite")
        if spec["mode"] == "read" or not os.path.exists(path):
            continue
        found += [{**e, "tool": name} for e in FakeProvider(path, "lookup", name=name).effects()]
    return found


def ledger_snapshot(db_path: str, sealed: bool = False) -> tuple[list[Any], list[Any]]:
    """Every effect record and journal event of the database, as plain data."""
    with explorer_saver(db_path, sealed) as saver:
        return ([r.model_dump(mode="json") for r in saver.effects()],
                [e.model_dump(mode="json") for e in saver.events()])


RESPONDED = "answered by a person"
"""What the explorer's reviewer answers in place of a tool (a `respond` decision)."""


def _receipt_of(content: Any) -> Any:
    """The provider receipt a write tool's ToolMessage carries (edit note stripped)."""
    if not isinstance(content, str):
        return None
    if content.startswith("[arguments edited by reviewer:"):
        content = content.split("] ", 1)[-1]
    return parse_answer(content)


def _answer_shape(spec: dict[str, Any], answer: Any, receipt: dict[str, Any]) -> str | None:
    """What is wrong with an applied answer of a tool shaped as `spec` says, if anything."""
    result = spec.get("result", "receipt")
    if result == "artifact":
        artifact = answer.artifact
        held = artifact.get("receipt") if isinstance(artifact, dict) else None
        if not isinstance(held, dict) or held.get("id") != receipt.get("id"):
            return f"artifact {artifact!r}, not the receipt {receipt.get('id')}"
    if result == "non_json" and not isinstance(receipt.get("raw"), bytes):
        return f"content {answer.content!r} lost the non-JSON value"
    if result == "command" and not answer.additional_kwargs.get("command"):
        return "a ToolMessage that is not the one its Command carried"
    return None


def _requests(saver: DurableSqliteSaver, threads: list[str]) -> dict[str, dict[str, set[str]]]:
    """`{item: {id of a checkpointed AIMessage requesting it: threads holding it}}`, over
    every branch."""
    requested: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for thread_id in threads:
        for saved in saver.list({"configurable": {"thread_id": thread_id}}):
            # A functional-API agent's model answers are its model task's results, saved
            # as the task's writes before its tool tasks run.
            answers = [value for _, channel, value in saved.pending_writes or []
                       if channel == RETURN]
            for message in _messages(saved.checkpoint["channel_values"]) + answers:
                for call in getattr(message, "tool_calls", None) or []:
                    requested[str(call["args"].get("item"))][str(message.id)].add(thread_id)
    return requested


RETURN = "__return__"
"""The channel of a functional-API task's result (LangGraph's `RETURN`)."""


def _messages(values: dict[str, Any]) -> list[Any]:
    """The messages of a checkpoint's channels: a graph's `messages`, or those of the
    `{"messages": ...}` a functional-API entrypoint returned (its `__end__` channel)."""
    if "messages" in values:
        return list(values["messages"])
    returned = values.get("__end__")
    return list(returned.get("messages", [])) if isinstance(returned, dict) else []


def _receipt_sources(saver: DurableSqliteSaver, thread_id: str) -> dict[str, Any]:
    """`{key: where its last receipt came from}` (`tool`, `lookup`, `human`, `family`)."""
    return {event.key: event.data.get("source") for event in saver.events(thread_id)
            if event.kind == "receipt"}


def _sent(record: Any) -> bool:
    """Whether a thread sent its call, so the provider may hold its key: `applied`, or
    attempted and not certainly absent (in flight, `unknown`, skipped after a send)."""
    return record.status is S.APPLIED or (
        record.attempts > 0 and record.status not in (S.FAILED, S.REJECTED))


def _final_messages(saver: DurableSqliteSaver, thread_id: str) -> list[Any]:
    latest = saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
    return [] if latest is None else _messages(latest.checkpoint["channel_values"])


def _check_finished(thread_id: str, messages: list[Any], tools: dict[str, dict[str, Any]],
                    by_key: dict[str, list[dict[str, Any]]], records: dict[str, Any],
                    family: dict[str, dict[str, Any]] | None = None,
                    sources: dict[str, Any] | None = None) -> list[str]:
    problems = []
    for position, message in enumerate(messages):
        calls = getattr(message, "tool_calls", None) or []
        answers = []
        for later in messages[position + 1:]:
            if later.type != "tool":
                break
            answers.append(later)
        for call in calls:
            if tools.get(call["name"], {}).get("mode") == "read":
                continue
            what = f"{thread_id}: call {call['id']} ({call['name']} {call['args'].get('item')})"
            answer = next((a for a in answers if a.tool_call_id == call["id"]
                           and a.name in (None, call["name"])), None)
            if answer is None:
                problems.append(f"STRANDED {what} finished without an answer")
                continue
            answers.remove(answer)
            if answer.content == "awaiting a human decision":
                problems.append(f"STRANDED {what} finished on a pending-decision placeholder")
            if answer.status == "error":
                continue
            if answer.content == RESPONDED:
                # A person answered in place of the tool: nothing may have been sent from
                # this thread. A copy (or the thread it was copied from) shares the key and
                # asks anew about a call answered this way here; its own approval may send
                # it, once (DUPLICATE counts the provider's side), whatever that send's
                # outcome (seeds 10442, 10469: lost, then skipped by the reviewer).
                # (By arguments: a restarted subgraph asks under a new tool_call_id, and
                # keeps the record of the call its earlier run asked for.)
                mine = [r for r in records.values() if r.tool == call["name"]
                        and r.args == call["args"] and r.status == "rejected"]
                sent_by_kin = {key for other, held in (family or {}).items()
                               if other != thread_id
                               for key, r in held.items() if _sent(r)}
                sent = [k for r in mine for k in [r.key] if by_key.get(k) and k not in sent_by_kin]
                if not mine or sent:
                    problems.append(f"EXACTLY-ONCE {what} answered by a person, but the "
                                    f"ledger holds {[r.status for r in mine]} and the "
                                    f"provider holds keys {sent}")
                continue
            receipt = _receipt_of(answer.content)
            key = receipt.get("key") if isinstance(receipt, dict) else None
            if key is None:
                problems.append(f"EXACTLY-ONCE {what} answered {answer.content!r}: no receipt")
                continue
            held = by_key.get(key, [])
            if len(held) != 1 or held[0]["receipt"].get("id") != receipt.get("id"):
                problems.append(f"EXACTLY-ONCE {what} answered applied under {key} "
                                f"({receipt.get('id')}); the provider holds "
                                f"{[e['receipt'].get('id') for e in held]} under it")
            wrong = _answer_shape(tools.get(call["name"], {}), answer, receipt) if (
                sources or {}).get(key) == "tool" else None
            if wrong is not None:
                problems.append(f"ANSWER {what} answered with {wrong}")
            record = records.get(key)
            if record is not None and record.status is not S.APPLIED:
                problems.append(f"LEDGER {what} answered applied; its ledger status is "
                                f"{record.status.value}")
    return problems


def _check_ledger(records_by_thread: dict[str, dict[str, Any]],
                  by_key: dict[str, list[dict[str, Any]]], all_finished: bool,
                  refused: Sequence[str] = (), answered_elsewhere: Set[str] = frozenset()
                  ) -> list[str]:
    problems = []
    for thread_id, records in records_by_thread.items():
        for key, record in records.items():
            what = (f"{thread_id}: {record.tool_call_id} ({record.tool} "
                    f"{record.args.get('item')}) is {record.status.value} under {key}")
            held = by_key.get(key, [])
            edited = (record.decision or {}).get("edited_key")
            if record.status is S.APPLIED:
                receipt_id = (record.receipt.get("id") if isinstance(record.receipt, dict)
                              else None)
                if not held:
                    # Taken over from a copy that sent the call as a reviewer edited it
                    # there: the provider holds it under the edited key.
                    held = next((by_key.get(other[key].decision["edited_key"], [])
                                 for other in records_by_thread.values()
                                 if other.get(key) is not None
                                 and (other[key].decision or {}).get("edited_key")), [])
                if not held:
                    problems.append(f"LEDGER {what}; the provider holds no effect under it")
                elif receipt_id is not None and receipt_id != held[0]["receipt"].get("id"):
                    problems.append(f"LEDGER {what} with receipt {receipt_id}; the provider "
                                    f"holds {held[0]['receipt'].get('id')}")
            elif held and (record.status in (S.FAILED, S.REJECTED) or edited) and not any(
                    other.get(key) is not None and _sent(other[key])
                    for other in records_by_thread.values()):
                # (Another thread sharing the key, a copy's origin, may have sent it since,
                # whatever came of that send.)
                problems.append(f"LEDGER {what}; the provider applied it "
                                f"({held[0]['receipt'].get('id')})")
    for key, held in by_key.items():
        statuses = {r.status for records in records_by_thread.values()
                    for k, r in records.items() if k == key}
        what = f"{held[0]['tool']} applied {held[0]['operation']} under {key}"
        if not statuses:
            problems.append(f"LEDGER {what}; no thread's ledger knows the key")
        elif (all_finished and not statuses & {S.APPLIED, S.SKIPPED}
              # A thread refused as documented stopped before anyone could settle what it
              # had sent (an unknown outcome waits for a person, once the thread is fixed);
              # a thread that was not refused and holds the key must have settled it.
              and not (refused and all(thread_id in refused
                                       for thread_id, records in records_by_thread.items()
                                       if key in records))
              # An orphan a middleware before the guard answered in its place (a reject
              # after the call was sent, asked again after a crash): listed to be settled.
              and key not in answered_elsewhere):
            problems.append(f"LEDGER {what}; every thread has finished and the ledger says "
                            f"{sorted(s.value for s in statuses)}")
    return problems


def check_episode(db_path: str, provider_dir: str, tools: dict[str, dict[str, Any]],
                  threads: list[str], finished: list[str], abandoned: list[str] = (),
                  forked: bool = False, sealed: bool = False,
                  one_request_per_item: bool = False, refused: Sequence[str] = ()
                  ) -> list[str]:
    """The broken invariants of an episode (see the module docstring); `[]` if none.

    Args:
        db_path, provider_dir: The episode's database and provider folder.
        tools: The episode's tools (`scenario`).
        threads: Every thread the episode ran (copies included).
        finished: The threads that ran to their end.
        abandoned: Threads left behind on purpose (the original of a copy, or one
            refused as documented).
        forked: Whether a time travel or fork left a branch of a thread behind.
        sealed: Whether the episode's saver encrypts (`scenario.explorer_serde`).
        one_request_per_item: Each item is one logical request however many messages
            asked for it (the guarded tools sit in a subgraph).
        refused: The threads among `abandoned` that a documented refusal stopped: what
            they sent may still wait for a person to settle it.
    """
    effects = provider_effects(provider_dir, tools)
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for effect in effects:
        by_key[effect["key"]].append(effect)
    if not (is_postgres(db_path) or os.path.exists(db_path)):
        return [f"LEDGER {e['tool']} applied {e['operation']}: there is no database"
                for e in effects]
    with explorer_saver(db_path, sealed) as saver:
        requested = _requests(saver, threads)
        records_by_thread = {t: {r.key: r for r in saver.effects(t)} for t in threads}
        problems = [f"DUPLICATE {held[0]['tool']} applied key {key} ({held[0]['operation']}) "
                    f"{len(held)} times" for key, held in by_key.items() if len(held) > 1]
        per_item = Counter(e["operation"] for e in effects)
        for item, count in sorted(per_item.items()):
            asked = requested.get(item, {})
            # Above a subgraph, messages asked in one thread (or inherited alike by a copy
            # and its source) are one request: the subgraph's restarts ask again.
            allowed = (len({frozenset(held) for held in asked.values()})
                       if one_request_per_item else len(asked))
            if count > allowed and not any(p.startswith("DUPLICATE") and f"({item})" in p
                                           for p in problems):
                problems.append(f"DUPLICATE call {item} applied {count} times, requested by "
                                f"{allowed} model message(s)")
        settled = not forked and set(finished) | set(abandoned) >= set(threads)
        answered_elsewhere = {orphan.key for orphan in find_orphans(saver)
                              if orphan.reason == ANSWERED_WITHOUT_GUARD}
        problems += _check_ledger(records_by_thread, by_key, settled, refused,
                                  answered_elsewhere)
        for thread_id in finished:
            final = _final_messages(saver, thread_id)
            problems += _check_finished(thread_id, final, tools,
                                        by_key, records_by_thread[thread_id], records_by_thread,
                                        _receipt_sources(saver, thread_id))
            problems += [f"ANSWER {thread_id}: the Command answering {m.tool_call_id} "
                         f"({m.name}) led to no follow-up write of {item}"
                         for m in final if m.type == "tool" and m.additional_kwargs.get("command")
                         for item in [f"{(_receipt_of(m.content) or {}).get('item')}a"]
                         if item not in requested]
    return problems
