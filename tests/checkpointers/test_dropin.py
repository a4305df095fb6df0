"""The PostgreSQL savers take what the stock ones take: `pipe=` (positional too) and
`from_conn_string(pipeline=True)`, and refuse a pipeline on a pool as they do."""

from __future__ import annotations

import psycopg
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from graph_durable.checkpointers.postgres import AsyncDurablePostgresSaver, DurablePostgresSaver
from graph_durable.ledger import EffectStatus, IntentWrite

ROOT = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}


def intent(key: str) -> IntentWrite:
    return IntentWrite(key=key, thread_id="t", checkpoint_ns="tools:x", tool_call_id=f"c-{key}",
                       tool="pay", args={"cents": 5}, status=EffectStatus.IN_FLIGHT)


def _connect(conninfo: str) -> psycopg.Connection:
    return psycopg.Connection.connect(conninfo, autocommit=True, prepare_threshold=0,
                                      row_factory=dict_row)


def test_the_sync_saver_takes_a_pipeline_as_the_stock_saver_does(postgres_conninfo) -> None:
    with _connect(postgres_conninfo) as conn:
        DurablePostgresSaver(conn).setup()  # setup cannot run inside a pipeline
        with conn.pipeline() as pipe:
            for saver in (DurablePostgresSaver(conn, pipe=pipe), DurablePostgresSaver(conn, pipe)):
                assert saver.pipe is pipe
                stored = saver.put(ROOT, empty_checkpoint(), {"step": 0}, {})
                assert saver.get_tuple(stored).config == stored
            saver.claim(intent("k1"))
            assert [r.key for r in saver.effects("t")] == ["k1"]
    with ConnectionPool(postgres_conninfo, open=False) as pool, \
            _connect(postgres_conninfo) as conn, conn.pipeline() as pipe:
        with pytest.raises(ValueError, match="Pipeline should be used only with a single"):
            DurablePostgresSaver(pool, pipe=pipe)


def test_the_sync_saver_opens_in_pipeline_mode_from_a_conn_string(postgres_conninfo) -> None:
    with DurablePostgresSaver.from_conn_string(postgres_conninfo) as saver:
        saver.setup()
    with DurablePostgresSaver.from_conn_string(postgres_conninfo, pipeline=True) as saver:
        assert saver.pipe is not None
        stored = saver.put(ROOT, empty_checkpoint(), {"step": 0}, {})
        assert saver.get_tuple(stored).config == stored


async def test_the_async_saver_takes_a_pipeline_as_the_stock_saver_does(
        postgres_conninfo) -> None:
    async with await psycopg.AsyncConnection.connect(
            postgres_conninfo, autocommit=True, prepare_threshold=0,
            row_factory=dict_row) as conn:
        await AsyncDurablePostgresSaver(conn).setup()
        async with conn.pipeline() as pipe:
            for saver in (AsyncDurablePostgresSaver(conn, pipe=pipe),
                          AsyncDurablePostgresSaver(conn, pipe)):
                assert saver.pipe is pipe
                stored = await saver.aput(ROOT, empty_checkpoint(), {"step": 0}, {})
                assert (await saver.aget_tuple(stored)).config == stored
            await saver.aclaim(intent("k1"))
            assert [r.key for r in await saver.aeffects("t")] == ["k1"]
        async with AsyncConnectionPool(postgres_conninfo, open=False) as pool:
            async with conn.pipeline() as pipe:
                with pytest.raises(ValueError, match="Pipeline should be used only with"):
                    AsyncDurablePostgresSaver(pool, pipe=pipe)
    async with AsyncDurablePostgresSaver.from_conn_string(postgres_conninfo,
                                                          pipeline=True) as saver:
        assert saver.pipe is not None
        stored = await saver.aput(ROOT, empty_checkpoint(), {"step": 1}, {})
        assert (await saver.aget_tuple(stored)).config == stored
