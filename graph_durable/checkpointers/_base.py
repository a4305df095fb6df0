"""What the sync and async durable savers share beyond SQL: turning ledger writes into plans."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.serde.base import SerializerProtocol

from graph_durable.checkpointers import _sql
from graph_durable.ledger import (
    _UNSET,
    IntentWrite,
    TransitionWrite,
    canonical_json,
)

__all__ = ["DurableSaverMixin", "actor_of"]

LEASE_OWNER_KEY = "graph_durable_owner"
LEASE_TOKEN_KEY = "graph_durable_fencing_token"


def actor_of(config: RunnableConfig | None) -> tuple[str | None, int | None]:
    """The lease owner and fencing token a write was made with, if any."""
    if not config:
        return None, None
    conf = config.get("configurable", {})
    return conf.get(LEASE_OWNER_KEY), conf.get(LEASE_TOKEN_KEY)


class DurableSaverMixin:
    """Marks a durable saver, and builds the SQL plan of a ledger write (no I/O)."""

    serde: SerializerProtocol

    def _plan_intent(
        self, write: IntentWrite, actor: tuple[str | None, int | None]
    ) -> list[_sql.Statement]:
        return _sql.plan_intent(
            key=write.key,
            thread_id=write.thread_id,
            checkpoint_ns=write.checkpoint_ns,
            tool_call_id=write.tool_call_id,
            tool=write.tool,
            args_json=canonical_json(write.args),
            status=write.status,
            now=time.time(),
            actor=actor,
        )

    def _plan_transition(
        self,
        row: Sequence[Any] | None,
        write: TransitionWrite,
        actor: tuple[str | None, int | None],
    ) -> list[_sql.Statement]:
        columns: dict[str, Any] = {}
        if write.error is not _UNSET:
            columns["error"] = write.error
        if write.receipt is not _UNSET:
            columns["receipt"] = _sql.to_json(write.receipt)
        if write.result is not _UNSET:
            columns["result_type"], columns["result"] = self.serde.dumps_typed(write.result)
        if write.decision is not _UNSET:
            columns["decision"] = (
                None if write.decision is None else _sql.to_json(write.decision)
            )
        if write.asked is not _UNSET:
            columns["asked"] = int(write.asked)
        return _sql.plan_transition(
            row,
            thread_id=write.thread_id,
            key=write.key,
            to=write.to,
            kind=write.kind,
            data=write.data,
            now=time.time(),
            actor=actor,
            columns=columns,
            bump_attempts=write.bump_attempts,
        )

    def _load_result(self, row: Sequence[Any] | None) -> Any:
        if row is None or row[0] is None:
            return None
        return self.serde.loads_typed((row[0], row[1]))
