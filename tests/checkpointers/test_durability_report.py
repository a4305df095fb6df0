"""`saver.durability()` and `graph-durable durability`: the settings the guarantee rests
on, read from the database, each with what it risks; and what the savers enforce
themselves (SQLite's `synchronous=FULL` on a connection the application set to `OFF`)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import aiosqlite
import pytest

from graph_durable import AsyncDurableSqliteSaver, DurableSqliteSaver
from graph_durable.checkpointers._durability import filesystem_of
from graph_durable.checkpointers.postgres import AsyncDurablePostgresSaver, DurablePostgresSaver
from graph_durable.durability import postgres_durability, sqlite_durability
from graph_durable.testing.postgres import PostgresServer
from tests.test_cli import cli

FULL = 2


def test_a_connection_set_to_synchronous_off_runs_at_full_once_the_saver_has_it(
    tmp_path: Path,
) -> None:
    conn = sqlite3.connect(str(tmp_path / "agent.sqlite"), check_same_thread=False)
    conn.execute("PRAGMA synchronous=OFF")
    saver = DurableSqliteSaver(conn)
    assert saver.durability().settings[1].level == "enforced"
    saver.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}},
              {"v": 1, "id": "1", "ts": "2026-01-01T00:00:00+00:00", "channel_values": {},
               "channel_versions": {}, "versions_seen": {}}, {}, {})
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == FULL
    report = saver.durability()
    assert report.ok, report.summary()
    assert {s.name: s.value for s in report.settings}["synchronous"] == "FULL"


async def test_the_async_saver_runs_its_connection_at_full_too(tmp_path: Path) -> None:
    async with aiosqlite.connect(str(tmp_path / "agent.sqlite")) as conn:
        await conn.execute("PRAGMA synchronous=OFF")
        saver = AsyncDurableSqliteSaver(conn)
        await saver.setup()
        async with conn.execute("PRAGMA synchronous") as cur:
            assert (await cur.fetchone())[0] == FULL
        assert (await saver.adurability()).ok


def test_a_database_in_memory_or_on_a_network_file_system_is_named_a_risk(
    tmp_path: Path,
) -> None:
    memory = DurableSqliteSaver(sqlite3.connect(":memory:", check_same_thread=False))
    [risk] = memory.durability().risks
    assert risk.name == "file" and "ends with the process" in risk.meaning

    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/sda1 / ext4 rw 0 0\n"
                      "server:/export /mnt/shared nfs4 rw,relatime 0 0\n")
    assert filesystem_of("/mnt/shared/agents/agent.sqlite", str(mounts)) == "nfs4"
    assert filesystem_of("/mnt/sharedish/agent.sqlite", str(mounts)) == "ext4"
    [risk] = sqlite_durability("/mnt/shared/agent.sqlite", "wal", FULL, "nfs4").risks
    assert risk.name == "filesystem" and "network file system" in risk.meaning
    assert sqlite_durability("/data/agent.sqlite", "off", FULL, "ext4").risks[0].name == \
        "journal_mode"


def test_each_postgres_setting_the_guarantee_needs_is_judged() -> None:
    good = {"fsync": "on", "full_page_writes": "on", "synchronous_commit": "on",
            "synchronous_standby_names": ""}
    assert postgres_durability("db", good, False, []).ok
    lazy = postgres_durability("db", {**good, "synchronous_commit": "off"}, False, [])
    assert lazy.ok and lazy.settings[2].level == "enforced"
    for setting in ("fsync", "full_page_writes"):
        [risk] = postgres_durability("db", {**good, setting: "off"}, False, []).risks
        assert risk.name == setting
    [risk] = postgres_durability("db", good, False, [("replica_b", "async")]).risks
    assert risk.name == "standby replica_b" and "asynchronous standby" in risk.meaning
    waiting = postgres_durability("db", {**good, "synchronous_standby_names": "*"}, False,
                                  [("replica_b", "potential")])
    assert {r.name for r in waiting.risks} == {"synchronous_standby_names",
                                                "standby replica_b"}
    hidden = postgres_durability("db", good, False, [("replica_b", None)])
    assert hidden.ok and hidden.settings[-1].level == "unknown"
    assert [r.name for r in postgres_durability("db", good, True, []).risks] == ["role"]


@pytest.mark.parametrize("saver_class", [DurablePostgresSaver, AsyncDurablePostgresSaver])
async def test_a_server_with_fsync_off_is_reported_by_both_postgres_savers(
    saver_class: type, tmp_path: Path
) -> None:
    with PostgresServer(settings={"fsync": "off"}) as server:
        conninfo = server.create_database("agent")
        if saver_class is DurablePostgresSaver:
            with DurablePostgresSaver.from_conn_string(conninfo) as saver:
                saver.setup()
                report = saver.durability()
        else:
            async with AsyncDurablePostgresSaver.from_conn_string(conninfo) as saver:
                await saver.setup()
                report = await saver.adurability()
        assert [r.name for r in report.risks] == ["fsync"]
        done = cli("durability", "--db", f"postgresql://postgres@127.0.0.1:{server.port}/agent",
                   "--json")
        assert done.returncode == 1, done.stderr
        assert [s["name"] for s in json.loads(done.stdout)["settings"]
                if s["level"] == "risk"] == ["fsync"]


def test_the_cli_reads_a_sqlite_database_without_writing_it(tmp_path: Path) -> None:
    path = tmp_path / "agent.sqlite"
    with DurableSqliteSaver.from_conn_string(str(path)) as saver:
        saver.setup()
    before = path.stat().st_mtime_ns
    done = cli("durability", "--db", str(path))
    assert done.returncode == 0, done.stderr
    assert "journal_mode = wal" in done.stdout and "nothing found at risk" in done.stdout
    assert path.stat().st_mtime_ns == before
