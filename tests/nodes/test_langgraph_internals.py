"""The LangGraph internals the guard touches, pinned: a release that moves one fails here
first, by name, instead of silently breaking the guard (see `graph_durable/nodes/guard.py`)."""

from langgraph._internal import _constants
from langgraph._internal._scratchpad import PregelScratchpad
from langgraph.types import _interrupt_id

from graph_durable.nodes import guard


def test_config_keys_match_langgraphs() -> None:
    assert guard.CONFIG_KEY_CHECKPOINTER == _constants.CONFIG_KEY_CHECKPOINTER
    assert guard.CONFIG_KEY_DURABILITY == _constants.CONFIG_KEY_DURABILITY
    assert guard.CONFIG_KEY_SCRATCHPAD == _constants.CONFIG_KEY_SCRATCHPAD
    assert guard.CONFIG_KEY_RESUME_MAP == _constants.CONFIG_KEY_RESUME_MAP
    assert guard.CONFIG_KEY_CHECKPOINT_MAP == _constants.CONFIG_KEY_CHECKPOINT_MAP


def test_scratchpad_and_interrupt_ids_have_the_shape_the_guard_reads() -> None:
    fields = PregelScratchpad.__dataclass_fields__
    assert {"resume", "get_null_resume"} <= set(fields)
    # The first interrupt of a task is keyed by its namespace alone.
    assert _interrupt_id("tools:1", 0) != _interrupt_id("tools:1", 1)
    assert len(_interrupt_id("tools:1", 0)) == 32
