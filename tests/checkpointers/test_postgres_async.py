"""AsyncDurablePostgresSaver on a real PostgreSQL server started by the tests.

The behaviour it shares with the other savers (guard, approvals, leases, crashes) is
tested through the parametrised `durable_saver` fixture; what is particular to an async
saver on a pool is tested here.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from graph_durable.checkpointers.postgres import AsyncDurablePostgresSaver
from tests.checkpointers.test_conformance import _assert_all_passed


def pool_of(conninfo: str, size: int) -> AsyncConnectionPool:
    return AsyncConnectionPool(conninfo, min_size=size, max_size=size, open=False,
                               kwargs={"autocommit": True, "prepare_threshold": 0,
                                       "row_factory": dict_row})


@pytest.mark.parametrize("conn", ["connection", "pool"])
async def test_passes_all_eight_conformance_capabilities(postgres_server, conn) -> None:
    counter = itertools.count()

    @checkpointer_test(name=f"AsyncDurablePostgresSaver ({conn})")
    async def factory():
        conninfo = postgres_server.create_database(f"gd_aconformance_{conn}_{next(counter)}")
        if conn == "connection":
            async with AsyncDurablePostgresSaver.from_conn_string(conninfo) as saver:
                yield saver
        else:
            async with pool_of(conninfo, 2) as pool:
                yield AsyncDurablePostgresSaver(pool)

    _assert_all_passed(await validate(factory))
