"""`saver.step_anchor`: a step a thread makes again after its family was copied at the
checkpoint before it is anchored to that checkpoint and its saved writes, recorded for
the family when first asked (see `graph_durable.nodes.write_keys`), on every saver."""

from __future__ import annotations

from typing import Any

import aiosqlite
from langgraph.checkpoint.base import empty_checkpoint

from graph_durable import AsyncDurableSqliteSaver


def _put(saver: Any, thread_id: str, checkpoint_id: str, parent: str | None = None
         ) -> dict[str, Any]:
    """Store a root checkpoint `checkpoint_id` of `thread_id` (made from `parent`)."""
    conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
    if parent is not None:
        conf["checkpoint_id"] = parent
    checkpoint = {**empty_checkpoint(), "id": checkpoint_id}
    return saver.put({"configurable": conf}, checkpoint,
                     {"source": "loop", "step": 1, "parents": {}}, {})


def test_a_step_after_a_copy_point_is_anchored_once_for_the_family(make_saver) -> None:
    saver: Any = make_saver()
    parent = _put(saver, "t", "0001")
    saver.put_writes(parent, [("amounts", [5, 7])], "plan-task")
    # Never copied there: the step keeps its checkpoint's own id.
    assert saver.step_anchor("t", "0002", "0001") is None
    assert saver.step_anchor("t", "0002", None) is None

    saver.copy_thread("t", "c")  # the source stood at 0001
    anchor = saver.step_anchor("t", "0002", "0001")
    assert anchor is not None and anchor.startswith("0001~")
    # The copy makes the step again under its own id, from the same saved writes.
    assert saver.step_anchor("c", "0003", "0001") == anchor
    # Not a copy point: a step after another checkpoint keeps its own id.
    assert saver.step_anchor("t", "0005", "0004") is None

    # A thread whose writes under the point changed since the copy made its step from
    # writes of its own: the step keeps its checkpoint's id, recorded as its anchor.
    copied_parent = {"configurable": {"thread_id": "c", "checkpoint_ns": "",
                                      "checkpoint_id": "0001"}}
    saver.put_writes(copied_parent, [("answer", "only here")], "human-task")
    other_anchor = saver.step_anchor("c", "0006", "0001")
    assert other_anchor == "0006"

    # Recorded when first asked: another saver (process) reads the same anchors, even
    # once the writes they came from have changed or are gone.
    saver.put_writes(parent, [("late", 1)], "late-task")
    other: Any = make_saver()
    assert other.step_anchor("t", "0002", "0001") == anchor
    assert other.step_anchor("c", "0003", "0001") == anchor
    assert other.step_anchor("c", "0006", "0001") == other_anchor
    saver.delete_thread("c")
    assert other.step_anchor("t", "0002", "0001") == anchor


def test_a_copy_of_a_copy_records_its_point_for_the_whole_family(make_saver) -> None:
    saver: Any = make_saver()
    parent = _put(saver, "t", "0001")
    saver.put_writes(parent, [("amounts", [5])], "plan-task")
    saver.copy_thread("t", "c1")
    _put(saver, "c1", "0002", parent="0001")  # the copy moved on, the source did not
    saver.copy_thread("c1", "c2")  # at 0002, recorded for the family's key thread, t
    assert saver.step_anchor("c2", "0003", "0002") is not None
    first = saver.step_anchor("t", "0004", "0001")
    assert first is not None and saver.step_anchor("c1", "0005", "0001") == first


async def test_the_async_sqlite_saver_anchors_steps_as_the_sync_one(tmp_path) -> None:
    async with aiosqlite.connect(tmp_path / "a.sqlite") as conn:
        saver = AsyncDurableSqliteSaver(conn)
        conf = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        parent = await saver.aput(conf, {**empty_checkpoint(), "id": "0001"},
                                  {"source": "loop", "step": 1, "parents": {}}, {})
        await saver.aput_writes(parent, [("amounts", [5])], "plan-task")
        assert await saver.astep_anchor("t", "0002", "0001") is None
        await saver.acopy_thread("t", "c")
        anchor = await saver.astep_anchor("t", "0002", "0001")
        assert anchor is not None and anchor.startswith("0001~")
        assert await saver.astep_anchor("c", "0003", "0001") == anchor


def test_no_copy_point_where_a_thread_of_the_family_already_made_the_step(
        make_saver) -> None:
    """A copy at a checkpoint some thread of the family already made its next step from
    records no new point there: that thread may have keyed writes from its step's own id
    (before copy points were recorded), which a point recorded now would change."""
    saver: Any = make_saver()
    parent = _put(saver, "t", "0001")
    saver.put_writes(parent, [("amounts", [5])], "plan-task")
    saver.copy_thread("t", "c")
    _put(saver, "c", "0002", parent="0001")  # the copy made its step from the point
    saver.put_writes(parent, [("late", 1)], "late-task")  # the source's writes changed
    saver.copy_thread("t", "d")  # the source still stands at 0001: nothing recorded
    assert saver.step_anchor("d", "0003", "0001") == "0003"
    assert saver.step_anchor("t", "0004", "0001") == "0004"
    # Where no thread of the family made the step yet, a copy records its point.
    saver.copy_thread("c", "e")  # c stands at 0002
    assert saver.step_anchor("e", "0005", "0002") == saver.step_anchor("c", "0006", "0002")
    assert saver.step_anchor("e", "0005", "0002").startswith("0002~")
