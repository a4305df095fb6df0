"""The audit of a resume: what ran again after each crash, what was replayed, reconciled,
re-sent, decided or compensated, and what reached a provider more than once.

    graph = audited(builder.compile(checkpointer=saver))   # log node runs and model calls
    graph.invoke(inputs, config, durability="sync")
    ...                                                      # a crash, a resume
    print(saver.audit("t1").summary())                       # or: graph-durable audit

LangGraph re-runs a node that had not saved its writes when the worker died; a model call
in it is paid again. Nothing in a checkpoint says so, so `audited(graph)` adds a callback
that logs every node run and model call of the graph durably (one small write each, in the
saver's database) under the id of the run (one `invoke`/`stream`). A task that starts in
a second run had started before and not finished: it ran again. The rest of the audit is
read from the ledger's journal: each run's window is the time from its first log entry to
the next run's.

A thread run without `audited` still gets an audit of its effects (one window, and no
count of re-run nodes or model calls).

The report itself (`Audit`, `RunAudit`, `audit_of`) is a reading of the saver's run log
and journal, kept beside the savers (`graph_durable.checkpointers._audit`) so that
`saver.audit()` needs nothing above them; this module adds the run log's callbacks and
re-exports the report.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, TypeVar
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler

from graph_durable.checkpointers._audit import Audit, RunAudit, audit_of

__all__ = ["AsyncRunLog", "Audit", "RunAudit", "RunLog", "audit_of", "audited", "logs_runs",
           "run_log"]

G = TypeVar("G")


class RunLog(BaseCallbackHandler):
    """A callback that logs each node run and model call of a graph to its durable saver
    (`saver.record_task_run`). Failing to log never stops the run."""

    raise_error = False

    def __init__(self, saver: Any) -> None:
        self.saver = saver
        self._roots: dict[UUID, UUID] = {}

    def _root(self, run_id: UUID, parent_run_id: UUID | None) -> UUID:
        root = self._roots.get(parent_run_id, parent_run_id) if parent_run_id else run_id
        return root or run_id

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID,
                       parent_run_id: UUID | None = None, metadata: dict[str, Any] | None = None,
                       **kwargs: Any) -> None:
        """A node run (the chain named as its node) is logged as `node`."""
        root = self._root(run_id, parent_run_id)
        self._roots[run_id] = root
        meta = metadata or {}
        node = meta.get("langgraph_node")
        if node is not None and kwargs.get("name") == node:
            self._log(meta, root, "node")

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Forget a finished run."""
        self._roots.pop(run_id, None)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Forget a failed run."""
        self._roots.pop(run_id, None)

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: UUID,
                            parent_run_id: UUID | None = None,
                            metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """A chat model call is logged as `model`."""
        self._log(metadata or {}, self._root(run_id, parent_run_id), "model")

    def on_llm_start(self, serialized: Any, prompts: Any, *, run_id: UUID,
                     parent_run_id: UUID | None = None, metadata: dict[str, Any] | None = None,
                     **kwargs: Any) -> None:
        """A completion model call is logged as `model`."""
        self._log(metadata or {}, self._root(run_id, parent_run_id), "model")

    def _log(self, meta: Mapping[str, Any], root: UUID, kind: str) -> None:
        thread_id, node = meta.get("thread_id"), meta.get("langgraph_node")
        if thread_id is None or node is None:
            return
        self.saver.record_task_run(str(thread_id), str(root),
                                   str(meta.get("langgraph_checkpoint_ns", "")), node, kind)


class AsyncRunLog(AsyncCallbackHandler):
    """`RunLog` for a saver that lives on an event loop (`AsyncDurableSqliteSaver`): it
    awaits `saver.arecord_task_run`."""

    raise_error = False

    def __init__(self, saver: Any) -> None:
        self.saver = saver
        self._sync = RunLog(saver)  # its run-id bookkeeping; it writes nothing itself
        self._sync._log = self._collect  # type: ignore[method-assign]
        self._pending: list[tuple[str, str, str, str, str]] = []

    def _collect(self, meta: Mapping[str, Any], root: UUID, kind: str) -> None:
        thread_id, node = meta.get("thread_id"), meta.get("langgraph_node")
        if thread_id is not None and node is not None:
            self._pending.append((str(thread_id), str(root),
                                  str(meta.get("langgraph_checkpoint_ns", "")), node, kind))

    async def _flush(self) -> None:
        loop = getattr(self.saver, "loop", None)
        if loop is not None and asyncio.get_running_loop() is not loop:
            # A sync callback manager (a sync node's model call under `ainvoke`) runs this
            # coroutine on a loop of its own in another thread, where the saver's lock and
            # connection must not be used. The writes are handed to the saver's loop and
            # not waited for: the thread waiting on this one may be that loop's own.
            while self._pending:
                asyncio.run_coroutine_threadsafe(
                    self.saver.arecord_task_run(*self._pending.pop(0)), loop)
            return
        while self._pending:  # shielded: see `nodes.async_driver.aperform`
            await asyncio.shield(self.saver.arecord_task_run(*self._pending.pop(0)))

    async def on_chain_start(self, *args: Any, **kwargs: Any) -> None:
        """See `RunLog.on_chain_start`."""
        self._sync.on_chain_start(*args, **kwargs)
        await self._flush()

    async def on_chain_end(self, *args: Any, **kwargs: Any) -> None:
        """See `RunLog.on_chain_end`."""
        self._sync.on_chain_end(*args, **kwargs)

    async def on_chain_error(self, *args: Any, **kwargs: Any) -> None:
        """See `RunLog.on_chain_error`."""
        self._sync.on_chain_error(*args, **kwargs)

    async def on_chat_model_start(self, *args: Any, **kwargs: Any) -> None:
        """See `RunLog.on_chat_model_start`."""
        self._sync.on_chat_model_start(*args, **kwargs)
        await self._flush()

    async def on_llm_start(self, *args: Any, **kwargs: Any) -> None:
        """See `RunLog.on_llm_start`."""
        self._sync.on_llm_start(*args, **kwargs)
        await self._flush()


def run_log(saver: Any) -> BaseCallbackHandler | AsyncCallbackHandler:
    """The callback that logs runs to `saver`: `AsyncRunLog` for a saver on an event loop,
    else `RunLog`."""
    from graph_durable.checkpointers.sqlite import AsyncDurableSqliteSaver

    return AsyncRunLog(saver) if isinstance(saver, AsyncDurableSqliteSaver) else RunLog(saver)


def logs_runs(graph: Any) -> bool:
    """Whether `graph` is `audited` already (its config carries a run log)."""
    callbacks = (getattr(graph, "config", None) or {}).get("callbacks") or []
    handlers = getattr(callbacks, "handlers", callbacks)
    return any(isinstance(h, RunLog | AsyncRunLog) for h in handlers)


def audited(graph: G) -> G:
    """A copy of the compiled `graph` whose runs log their node runs and model calls to
    its durable saver, so `saver.audit(thread_id)` can count what ran again."""
    from graph_durable.checkpointers._base import durable_saver

    saver = durable_saver(getattr(graph, "checkpointer", None))
    if saver is None:
        raise TypeError("audited() takes a graph compiled with a durable saver")
    if logs_runs(graph):
        return graph
    return graph.with_config(callbacks=[run_log(saver)])  # type: ignore[attr-defined,no-any-return]
