"""What a command names, opened safely: the database (read-only for reads) and the graph."""

from __future__ import annotations

import importlib
import json
import os
import sqlite3
import sys
from datetime import datetime, timedelta, timezone
from typing import Any

from graph_durable.errors import GraphDurableError

__all__ = ["POSTGRES_SCHEMES", "Refused", "known_thread", "load_graph", "open_saver",
           "parse_json", "parse_since", "where"]

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


class Refused(Exception):
    """A bad input: one line on stderr, exit code `code`, nothing written."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def where(db: str) -> str:
    """`db` as it may be shown: a PostgreSQL URL without its user and password."""
    if db.startswith(POSTGRES_SCHEMES):
        scheme, _, rest = db.partition("://")
        return f"{scheme}://{rest.rpartition('@')[2]}"
    return db


def _serde() -> Any:
    """LangGraph's `EncryptedSerializer` under `LANGGRAPH_AES_KEY` if it is set, else the
    default serializer; either way, a value it cannot open is one clear error."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from graph_durable.secrets import explained

    if not os.environ.get("LANGGRAPH_AES_KEY"):
        return explained(JsonPlusSerializer())
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    try:
        return explained(EncryptedSerializer.from_pycryptodome_aes())
    except ImportError:
        raise Refused("LANGGRAPH_AES_KEY is set, but opening it needs pycryptodome: "
                      "pip install 'graph-durable[encryption]'") from None
    except ValueError as exc:
        raise Refused(f"LANGGRAPH_AES_KEY is set, but {exc}") from None


def open_saver(db: str, *, read_only: bool = False) -> Any:
    """`DurablePostgresSaver` for a PostgreSQL URL, `DurableSqliteSaver` for a file.

    Every command first opens the database read-only, which never creates, migrates or
    writes it: a typo, a file that is not a database, or a LangGraph database without
    graph_durable's ledger is refused before anything is written. Commands that write
    then open it again for writing. (LangGraph is imported here, not before: a usage
    error is answered at once.)
    """
    if not db:
        raise Refused("--db is required: a SQLite file, or a postgresql:// URL "
                      "(or set GRAPH_DURABLE_DB)")
    serde = _serde()
    if not db.startswith(POSTGRES_SCHEMES):
        from graph_durable.checkpointers.sqlite import DurableSqliteSaver

        reader = DurableSqliteSaver.open_read_only(db, serde=serde)
        if read_only:
            return reader
        reader.conn.close()
        return DurableSqliteSaver(sqlite3.connect(db, check_same_thread=False), serde=serde)
    try:
        from psycopg import Connection, OperationalError
        from psycopg.rows import dict_row

        from graph_durable.checkpointers.postgres import DurablePostgresSaver
    except ImportError as exc:
        raise Refused(f"--db {where(db)!r} is a PostgreSQL URL, which needs the postgres "
                      f"extra ({exc}): pip install 'graph-durable[postgres]'") from None
    try:
        reader = DurablePostgresSaver.open_read_only(db, serde=serde)
        if read_only:
            return reader
        reader.conn.close()
        conn = Connection.connect(db, autocommit=True, prepare_threshold=0,
                                  row_factory=dict_row, connect_timeout=10)
    except OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise Refused(f"cannot reach PostgreSQL at {where(db)!r}: {first}") from None
    return DurablePostgresSaver(conn, serde=serde)


def load_graph(spec: str | None, saver: Any, *, why: str = "") -> Any:
    """The graph `--graph module:attribute` names, on the command's saver.

    The attribute is a compiled graph, a `StateGraph` builder (compiled here), or a
    callable that takes the saver and returns a compiled graph. A graph compiled with
    another checkpointer is given this one: `--db` is what the command reads and writes.
    The working directory is importable, as it is for `python -m`.
    """
    if not spec:
        raise Refused(f"--graph module:attribute is needed{why} (or set GRAPH_DURABLE_GRAPH)")
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise Refused(f"--graph must be module:attribute, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except Exception as exc:  # an import error of any kind is the user's module's
        raise Refused(f"--graph {spec!r} could not be loaded: {type(exc).__name__}: "
                      f"{exc}") from None
    if hasattr(target, "compile") and not hasattr(target, "invoke"):
        return target.compile(checkpointer=saver)
    if not hasattr(target, "invoke") and callable(target):
        try:
            target = target(saver)
        except GraphDurableError:
            raise
        except Exception as exc:
            raise Refused(f"--graph {spec!r}: calling it with the saver raised "
                          f"{type(exc).__name__}: {exc}") from None
    if not hasattr(target, "invoke"):
        raise Refused(f"--graph {spec!r} is neither a compiled graph, a StateGraph, nor a "
                      "callable that takes the saver and returns a compiled graph")
    if getattr(target, "checkpointer", None) is not saver and hasattr(target, "copy"):
        target = target.copy(update={"checkpointer": saver})
    return target


def known_thread(saver: Any, thread_id: str | None) -> None:
    """Refuse (exit 1) a thread the database has no checkpoint of."""
    if thread_id is not None and thread_id not in saver.thread_ids():
        raise Refused(f"thread {thread_id!r} has no checkpoint in this database; "
                      "`graph-durable threads --db ...` lists the threads", code=1)


def parse_json(text: str, option: str, example: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise Refused(f"{option} is not JSON ({exc}); e.g. {option} '{example}'") from None


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str | None) -> float | None:
    """`--since`: a duration back from now (`30m`, `2h`, `7d`) or an ISO 8601 time."""
    if text is None:
        return None
    number, unit = text[:-1], text[-1:].lower()
    if unit in _UNITS and number.replace(".", "", 1).isdigit():
        return (datetime.now(timezone.utc)
                - timedelta(seconds=float(number) * _UNITS[unit])).timestamp()
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise Refused(f"--since {text!r} is neither a duration (30m, 2h, 7d) nor an ISO 8601 "
                      "time (2026-12-01T09:00)") from None
    return (at if at.tzinfo else at.replace(tzinfo=timezone.utc)).timestamp()
