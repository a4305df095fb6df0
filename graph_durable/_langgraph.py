"""Every LangGraph (and langgraph-api) internal graph_durable touches, in one place.

Each is pinned by `tests/nodes/test_langgraph_internals.py`, so a release that moves one
fails there first, by name, instead of silently breaking the guard. Why each is needed,
where no public API carries the load:

- `CONFIG_KEY_CHECKPOINTER`: the task's saver, to write the ledger beside the checkpoints
  in the same database (a node gets no public handle on it).
- `CONFIG_KEY_DURABILITY`: the run's durability, for the durability barrier; also the
  graph-level default `sync_by_default` sets (LangGraph reads it when a run passes none).
- `CONFIG_KEY_CHECKPOINT_MAP`: the checkpoint the task runs from, to check it is stored.
- `CONFIG_KEY_RESUME_MAP`: the whole `{interrupt_id: answer}` map of a run. The public
  `interrupt()` asks one question per task at a time, under ids LangGraph numbers per
  task; a `ToolNode` task asking about several calls needs one interrupt per call, so
  the guard raises its own and reads the answers addressed to them here.
- `CONFIG_KEY_SCRATCHPAD` (`resume`, `get_null_resume`): a bare resume value, and
  answers of earlier releases' interrupts, read without consuming them, so a malformed
  answer is refused before LangGraph stores it.
- `CONFIG_KEY_TASK_ID`: the task's id, whose pending writes (its last interrupt) say
  whose question a LangGraph interrupt id names: a guard's of an earlier release, or
  that of an `interrupt()` before the guard (a per-call `HumanInTheLoopMiddleware`).
- `interrupt_id`: LangGraph's id of a task's n-th interrupt (earlier releases' ids).
- Checkpoint channel names (`INTERRUPT`, `ERROR`, `RESUME`, `TASKS`): what
  `thread_status` reads in a checkpoint's pending writes.
- `CALLED_TASK_PATH`: how the task path a saver stores with a task's writes begins when
  another task called it (a functional-API `@task`): `get_state()` shows such a task's
  question only through its caller's own interrupt write, so `thread_status` tells the
  two apart by the path (`CheckpointTuple.pending_writes` carries no path).
- `ToolNode` private methods (`_func`, `_afunc`, `_parse_input`, `_extract_state`) and
  ToolNode's error handling helpers (`_default_handle_tool_errors`, `_handle_tool_error`,
  `_infer_handled_types`): `EffectGuardNode` claims a step's calls together before
  ToolNode runs them, and keeps ToolNode's own error handling for read-only tools.
- `WRAPPER_INNER`: where the Agent Server's checkpointer adapter keeps the saver.
"""

from __future__ import annotations

from langgraph.prebuilt.tool_node import (
    _default_handle_tool_errors,
    _handle_tool_error,
    _infer_handled_types,
)
from langgraph.types import _interrupt_id as interrupt_id

__all__ = [
    "CALLED_TASK_PATH",
    "CONFIG_KEY_CHECKPOINTER",
    "CONFIG_KEY_CHECKPOINT_MAP",
    "CONFIG_KEY_DURABILITY",
    "CONFIG_KEY_RESUME_MAP",
    "CONFIG_KEY_SCRATCHPAD",
    "CONFIG_KEY_TASK_ID",
    "ERROR",
    "INTERRUPT",
    "RESUME",
    "TASKS",
    "TOOL_NODE_METHODS",
    "WRAPPER_INNER",
    "_default_handle_tool_errors",
    "_handle_tool_error",
    "_infer_handled_types",
    "interrupt_id",
]

CONFIG_KEY_CHECKPOINTER = "__pregel_checkpointer"
CONFIG_KEY_DURABILITY = "__pregel_durability"
CONFIG_KEY_SCRATCHPAD = "__pregel_scratchpad"
CONFIG_KEY_RESUME_MAP = "__pregel_resume_map"
CONFIG_KEY_CHECKPOINT_MAP = "checkpoint_map"
CONFIG_KEY_TASK_ID = "__pregel_task_id"

INTERRUPT = "__interrupt__"
ERROR = "__error__"
RESUME = "__resume__"
TASKS = "__pregel_tasks"

CALLED_TASK_PATH = "~__pregel_push, ~"
"""The start of `task_path_str(task.path)` for a task another task called: a `PUSH`
whose parent is a task path (a `Send`'s `PUSH` is followed by a number)."""

TOOL_NODE_METHODS = ("_func", "_afunc", "_parse_input", "_extract_state")

WRAPPER_INNER = "_inner"
