"""The LangGraph internals graph_durable touches, pinned: a release that moves one fails
here first, by name, instead of silently breaking the guard (they are all named, with why,
in `graph_durable/_langgraph.py`)."""

import pytest
from langgraph._internal import _constants
from langgraph._internal._scratchpad import PregelScratchpad

from graph_durable import _langgraph as internals


def test_config_keys_match_langgraphs() -> None:
    assert internals.CONFIG_KEY_CHECKPOINTER == _constants.CONFIG_KEY_CHECKPOINTER
    assert internals.CONFIG_KEY_DURABILITY == _constants.CONFIG_KEY_DURABILITY
    assert internals.CONFIG_KEY_SCRATCHPAD == _constants.CONFIG_KEY_SCRATCHPAD
    assert internals.CONFIG_KEY_RESUME_MAP == _constants.CONFIG_KEY_RESUME_MAP
    assert internals.CONFIG_KEY_TASK_ID == _constants.CONFIG_KEY_TASK_ID
    assert internals.CONFIG_KEY_CHECKPOINT_MAP == _constants.CONFIG_KEY_CHECKPOINT_MAP


def test_checkpoint_channels_match_langgraphs() -> None:
    assert internals.INTERRUPT == _constants.INTERRUPT
    assert internals.ERROR == _constants.ERROR
    assert internals.RESUME == _constants.RESUME
    assert internals.TASKS == _constants.TASKS


def test_the_tool_node_methods_the_guard_extends_are_there() -> None:
    from langgraph.prebuilt import ToolNode

    for name in internals.TOOL_NODE_METHODS:
        assert callable(getattr(ToolNode, name, None)), name


def test_scratchpad_and_interrupt_ids_have_the_shape_the_guard_reads() -> None:
    fields = PregelScratchpad.__dataclass_fields__
    assert {"resume", "get_null_resume"} <= set(fields)
    # The first interrupt of a task is keyed by its namespace alone.
    assert internals.interrupt_id("tools:1", 0) != internals.interrupt_id("tools:1", 1)
    assert len(internals.interrupt_id("tools:1", 0)) == 32


def test_the_agent_servers_saver_adapter_keeps_the_saver_where_the_guard_looks() -> None:
    """The adapter cannot be imported without a server's configuration, so its source is
    read; `tests/server` runs it for real."""
    import importlib.util
    from pathlib import Path

    from graph_durable._langgraph import WRAPPER_INNER
    from graph_durable.checkpointers._base import durable_saver

    spec = importlib.util.find_spec("langgraph_api")  # finds, does not import
    if spec is None or spec.origin is None:
        pytest.skip("needs the 'server' extra (langgraph-cli[inmem])")
    source = (Path(spec.origin).parent / "_checkpointer" / "_adapter.py").read_text()
    assert "class _CustomCheckpointerAdapter(BaseCheckpointSaver)" in source
    assert f"self.{WRAPPER_INNER} = inner" in source

    class Adapter:
        def __init__(self, inner: object) -> None:
            setattr(self, WRAPPER_INNER, inner)

        def __getattr__(self, name: str) -> object:
            return getattr(getattr(self, WRAPPER_INNER), name)

    from graph_durable import DurableSqliteSaver

    with DurableSqliteSaver.from_conn_string(":memory:") as saver:
        assert durable_saver(Adapter(saver)) is saver
        assert durable_saver(Adapter(Adapter(saver))) is saver
    assert durable_saver(Adapter(object())) is None and durable_saver(None) is None


def test_the_path_saved_with_a_called_tasks_writes_begins_as_thread_status_reads_it() -> None:
    """A functional-API `@task`'s writes are saved with a path that begins with
    `CALLED_TASK_PATH`; its `@entrypoint`'s (a task of the checkpoint) and a `Send`
    branch's do not."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.func import entrypoint, task
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Send, interrupt

    paths: dict[str, str] = {}

    class Recording(InMemorySaver):
        def put_writes(self, config, writes, task_id, task_path=""):  # type: ignore[no-untyped-def]
            for channel, _ in writes:
                paths.setdefault(f"{task_path}|{channel}", task_path)
            super().put_writes(config, writes, task_id, task_path)

    @task
    def ask(question: str) -> str:
        return str(interrupt(question))

    @entrypoint(checkpointer=Recording())
    def agent(question: str) -> str:
        return ask(question).result()

    agent.invoke("ok?", {"configurable": {"thread_id": "f"}})
    called = {p for p in paths.values() if p.startswith(internals.CALLED_TASK_PATH)}
    assert called and len(called) < len(set(paths.values())), paths

    builder = StateGraph(dict)
    builder.add_node("fan", lambda state: {})
    builder.add_node("branch", lambda state: {})
    builder.add_edge(START, "fan")
    builder.add_conditional_edges("fan", lambda state: [Send("branch", {})], ["branch"])
    builder.add_edge("branch", END)
    paths.clear()
    builder.compile(checkpointer=Recording()).invoke({}, {"configurable": {"thread_id": "s"}})
    assert any(p.startswith("~__pregel_push") for p in paths.values()), paths  # the branch
    assert not any(p.startswith(internals.CALLED_TASK_PATH) for p in paths.values()), paths
