"""`saver.step_anchor`: a step a thread makes again after it was copied (or copied from)
at the checkpoint before it, from the writes saved there before the copy, is anchored to
that checkpoint and those writes, recorded for the family when first asked (see
`graph_durable.nodes.write_keys`), on every saver."""

from __future__ import annotations

from typing import Any

import aiosqlite
from langgraph.checkpoint.base import empty_checkpoint

from graph_durable import AsyncDurableSqliteSaver


def _put(saver: Any, thread_id: str, checkpoint_id: str, parent: str | None = None,
         source: str = "loop") -> dict[str, Any]:
    """Store a root checkpoint `checkpoint_id` of `thread_id` (made from `parent`)."""
    conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
    if parent is not None:
        conf["checkpoint_id"] = parent
    checkpoint = {**empty_checkpoint(), "id": checkpoint_id}
    return saver.put({"configurable": conf}, checkpoint,
                     {"source": source, "step": 1, "parents": {}}, {})


def _at(thread_id: str, checkpoint_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": "",
                             "checkpoint_id": checkpoint_id}}


def test_a_step_after_a_copy_point_is_anchored_once_for_the_family(make_saver) -> None:
    saver: Any = make_saver()
    parent = _put(saver, "t", "0001")
    saver.put_writes(parent, [("amounts", [5, 7])], "plan-task")
    # Never copied there: the step keeps its checkpoint's own id.
    assert saver.step_anchor("t", "0009", "0001") is None
    assert saver.step_anchor("t", "0009", None) is None

    saver.copy_thread("t", "c")  # the source stood at 0001, with its writes saved
    anchor = saver.step_anchor("t", "0002", "0001")
    assert anchor is not None and anchor.startswith("0001~")
    # The copy makes the step again under its own id, from the same saved writes.
    assert saver.step_anchor("c", "0003", "0001") == anchor
    # Not a copy point: a step after another checkpoint keeps its own id.
    assert saver.step_anchor("t", "0005", "0004") is None

    # A thread whose writes there changed since the copy made its step from writes of
    # its own: the step keeps its checkpoint's id, recorded as its anchor.
    saver.put_writes(_at("c", "0001"), [("answer", "only here")], "human-task")
    assert saver.step_anchor("c", "0006", "0001") == "0006"

    # Recorded when first asked: another saver (process) reads the same anchors, even
    # once the writes they came from have changed.
    saver.put_writes(parent, [("late", 1)], "late-task")
    other: Any = make_saver()
    assert other.step_anchor("t", "0002", "0001") == anchor
    assert other.step_anchor("c", "0003", "0001") == anchor
    assert other.step_anchor("c", "0006", "0001") == "0006"
    saver.delete_thread("c")
    assert other.step_anchor("t", "0002", "0001") == anchor


def test_the_digest_holds_the_values_written(make_saver) -> None:
    saver: Any = make_saver()
    anchors = []
    for thread_id, amount in (("a", 5), ("b", 6)):
        _put(saver, thread_id, "0001")
        saver.put_writes(_at(thread_id, "0001"), [("amounts", [amount])], "plan-task")
        saver.copy_thread(thread_id, f"{thread_id}-copy")
        anchors.append(saver.step_anchor(thread_id, "0002", "0001"))
    assert None not in anchors and anchors[0] != anchors[1]


def test_only_the_threads_of_a_copy_share_what_was_decided_before_it(make_saver) -> None:
    """A thread copied before a step was planned, that plans it alike later, still made
    its own request: it shares no anchor with a later copy that was made after the
    plan was saved."""
    saver: Any = make_saver()
    _put(saver, "t", "0001")
    saver.copy_thread("t", "c")  # nothing planned yet
    saver.put_writes(_at("t", "0001"), [("amounts", [5])], "plan-task")
    saver.copy_thread("t", "d")  # planned
    saver.put_writes(_at("c", "0001"), [("amounts", [5])], "plan-task")  # alike, later
    shared = saver.step_anchor("t", "0002", "0001")
    assert shared is not None and shared.startswith("0001~")
    assert saver.step_anchor("d", "0003", "0001") == shared
    assert saver.step_anchor("c", "0004", "0001") == "0004"


def test_a_copy_of_a_copy_carries_the_points_it_was_made_from(make_saver) -> None:
    saver: Any = make_saver()
    parent = _put(saver, "t", "0001")
    saver.put_writes(parent, [("amounts", [5])], "plan-task")
    saver.copy_thread("t", "c1")
    _put(saver, "c1", "0002", parent="0001")  # the copy moved on, the source did not
    saver.copy_thread("c1", "c2")  # at 0002, and carrying c1's point at 0001
    assert saver.step_anchor("c2", "0003", "0002") is not None
    first = saver.step_anchor("t", "0004", "0001")
    assert first is not None and saver.step_anchor("c2", "0005", "0001") == first


def test_a_prune_anchors_the_steps_after_a_copy_point_first(make_saver) -> None:
    """`prune` deletes the copy point's writes the anchor is worked out from: the steps
    made after it are anchored before, so asked later they match the copy's."""
    saver: Any = make_saver()
    parent = _put(saver, "t", "0001")
    saver.put_writes(parent, [("amounts", [5])], "plan-task")
    saver.copy_thread("t", "c")
    _put(saver, "t", "0002", parent="0001")  # made, not asked yet (paused before pay)
    saver.prune(["t"])
    assert saver.get_tuple(_at("t", "0001")) is None  # the point and its writes are gone
    anchor = saver.step_anchor("t", "0002", "0001")
    assert anchor is not None and anchor.startswith("0001~")
    assert saver.step_anchor("c", "0003", "0001") == anchor
    # Answered without its parent too: PostgreSQL's prune unlinks the kept checkpoint.
    assert saver.step_anchor("t", "0002", None) == anchor


def test_a_prune_anchors_only_the_steps_a_run_made(make_saver) -> None:
    """An input (or an update) made from a copy point is new in each thread: a prune
    records nothing for it."""
    saver: Any = make_saver()
    parent = _put(saver, "t", "0001")
    saver.put_writes(parent, [("amounts", [5])], "plan-task")
    saver.copy_thread("t", "c")
    _put(saver, "t", "0002", parent="0001", source="input")
    saver.prune(["t"])
    assert saver.step_anchor("t", "0002", None) is None


def test_a_write_of_the_source_waits_for_its_copy(make_saver, monkeypatch) -> None:
    """The source's newest checkpoint is where the copy stands: a step the source
    saves while the copy runs is saved after it (and so is no copy's), not between the
    copy of the checkpoints and the copy point."""
    import threading

    from graph_durable.checkpointers import _steps

    saver: Any = make_saver()
    worker: Any = make_saver()  # another process, running the source
    parent = _put(saver, "t", "0001")
    saver.put_writes(parent, [("amounts", [5])], "plan-task")
    saved_during_copy: list[bool] = []
    original = _steps.copy_point

    def copy_point(*args: Any) -> Any:
        put = threading.Thread(target=_put, args=(worker, "t", "0002", "0001"))
        put.start()
        put.join(0.5)
        saved_during_copy.append(not put.is_alive())
        result = yield from original(*args)
        threads.append(put)
        return result

    threads: list[threading.Thread] = []
    monkeypatch.setattr(_steps, "copy_point", copy_point)
    saver.copy_thread("t", "c")
    monkeypatch.undo()
    for put in threads:
        put.join(10)
    assert saved_during_copy == [False]
    assert saver.get_tuple(_at("t", "0002")) is not None
    anchor = saver.step_anchor("t", "0002", "0001")
    assert anchor is not None and anchor == saver.step_anchor("c", "0003", "0001")


async def test_the_async_sqlite_saver_anchors_steps_as_the_sync_one(tmp_path) -> None:
    async with aiosqlite.connect(tmp_path / "a.sqlite") as conn:
        saver = AsyncDurableSqliteSaver(conn)
        conf = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        parent = await saver.aput(conf, {**empty_checkpoint(), "id": "0001"},
                                  {"source": "loop", "step": 1, "parents": {}}, {})
        await saver.aput_writes(parent, [("amounts", [5])], "plan-task")
        assert await saver.astep_anchor("t", "0009", "0001") is None
        await saver.acopy_thread("t", "c")
        anchor = await saver.astep_anchor("t", "0002", "0001")
        assert anchor is not None and anchor.startswith("0001~")
        assert await saver.astep_anchor("c", "0003", "0001") == anchor
