"""Questions asked by a task another task called (LangGraph's functional API): saved by
the task and again by its caller, shown by `get_state()` only through the caller. The
views read them once, on every durable saver, and tell a question only the called task
saved (its worker stopped before the caller's write; `tests/test_crash_guarded_writes.py`
kills one there) from one a step is waiting on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langgraph.checkpoint.base import CheckpointTuple
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, StateGraph
from langgraph.types import Interrupt, Send, interrupt

from graph_durable import (
    Effect,
    current_effect,
    guarded,
    inbox,
    record_decisions,
    recover,
    thread_status,
)
from graph_durable.operators._checkpoints import asked_interrupts

CONFIG = {"configurable": {"thread_id": "t"}}


def checkpoint(*writes: tuple[str, str, Any]) -> CheckpointTuple:
    return CheckpointTuple(config={}, checkpoint={}, metadata={},  # type: ignore[typeddict-item]
                           pending_writes=list(writes))


def ask(name: str) -> Interrupt:
    return Interrupt(value={"type": "question", "name": name}, id=f"id-{name}")


def test_a_called_tasks_question_its_caller_saved_too_is_shown_once() -> None:
    saved = checkpoint(("called", "__interrupt__", [ask("a")]),
                       ("entry", "__interrupt__", [ask("a")]))
    assert asked_interrupts(saved, {"called"}) == ([ask("a")], [])


def test_a_question_only_the_called_task_saved_is_not_shown() -> None:
    saved = checkpoint(("called", "__interrupt__", [ask("a")]))
    assert asked_interrupts(saved, {"called"}) == ([], [ask("a")])
    # Without the path of its writes, it reads as a task of the checkpoint.
    assert asked_interrupts(saved, set()) == ([ask("a")], [])


def test_a_second_called_tasks_question_waits_behind_the_shown_one() -> None:
    """Two tasks called at once each save a question; the caller saves the first that
    reached it: the other is asked again once the first is answered."""
    saved = checkpoint(("one", "__interrupt__", [ask("a")]),
                       ("two", "__interrupt__", [ask("b")]),
                       ("entry", "__interrupt__", [ask("a")]))
    assert asked_interrupts(saved, {"one", "two"}) == ([ask("a")], [ask("b")])


def test_a_question_of_a_called_task_that_has_finished_was_answered() -> None:
    """The caller's write still holds the first task's question, which that task has
    since answered (it wrote its result); the next task's question is not shown."""
    saved = checkpoint(("one", "__interrupt__", [ask("a")]), ("one", "__return__", 1),
                       ("two", "__interrupt__", [ask("b")]),
                       ("entry", "__interrupt__", [ask("a")]))
    assert asked_interrupts(saved, {"one", "two"}) == ([], [ask("b")])


def test_a_functional_question_is_listed_once_and_answered_by_its_call(
        make_saver: Callable[..., Any]) -> None:
    """The inbox lists an approval a `@task` asked once (its `@entrypoint` saves it
    again), so a decision named by its tool_call_id is recorded."""
    saver = make_saver()
    graph = _functional(saver)
    graph.invoke({"customer": "ana", "cents": 1250}, CONFIG, durability="sync")
    [shown] = graph.get_state(CONFIG).interrupts
    assert [i.interrupt_id for i in inbox(saver)] == [shown.id]
    assert thread_status(saver, "t").status == "waiting"
    [record] = record_decisions(saver, "t", {"issue_invoice#0": {"type": "approve"}})
    assert record.decision["type"] == "approve"


def _functional(saver: Any) -> Any:
    @guarded(Effect(idempotent=True, approval=True))
    def issue_invoice(customer: str, cents: int) -> dict[str, Any]:
        return {"id": f"inv-{current_effect().key[-6:]}", "customer": customer, "cents": cents}

    @task(name="bill")
    def bill(customer: str, cents: int) -> dict[str, Any]:
        return issue_invoice(customer, cents)

    @entrypoint(checkpointer=saver, name="billing")
    def billing(order: dict[str, Any]) -> dict[str, Any]:
        return bill(order["customer"], order["cents"]).result()

    return billing


def test_tasks_asking_at_once_wait_for_the_shown_question_and_are_not_recovered(
        make_saver: Callable[..., Any]) -> None:
    """Two tasks called at once both ask: `get_state()` shows one question. The thread
    waits for its answer; `recover()` does not resume it (each run would ask the same)."""
    saver = make_saver()

    @task
    def ask_person(name: str) -> str:
        return str(interrupt(f"ok {name}?"))

    @entrypoint(checkpointer=saver)
    def both(names: list[str]) -> list[str]:
        futures = [ask_person(name) for name in names]
        return [f.result() for f in futures]

    both.invoke(["a", "b"], CONFIG, durability="sync")
    assert len(both.get_state(CONFIG).interrupts) == 1
    assert thread_status(saver, "t").status == "waiting"
    assert recover(both, saver, "worker-2") == []


def test_questions_of_send_branches_are_waited_on(make_saver: Callable[..., Any]) -> None:
    """`Send` branches are the checkpoint's own tasks (a `PUSH` path too): their
    questions are shown, and waited on."""
    saver = make_saver()
    builder = StateGraph(dict)
    builder.add_node("fan", lambda state: {})
    builder.add_node("branch", lambda state: {"x": interrupt(f"ok {state['n']}?")})
    builder.add_edge(START, "fan")
    builder.add_conditional_edges("fan", lambda state: [Send("branch", {"n": 1}),
                                                        Send("branch", {"n": 2})], ["branch"])
    builder.add_edge("branch", END)
    graph = builder.compile(checkpointer=saver)
    graph.invoke({}, CONFIG, durability="sync")
    assert len(graph.get_state(CONFIG).interrupts) == 2
    status = thread_status(saver, "t")
    assert status.status == "waiting", status
    assert recover(graph, saver, "worker-2") == []
