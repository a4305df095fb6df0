"""Count the round trips a block makes on a psycopg connection, from libpq's own trace.

A round trip is a wait: the client sends, then reads what the server answers. In
pipeline mode several statements go out before the client reads, so counting statements
or `execute` calls would overstate what a pipelined write costs; libpq's trace says who
sent each protocol message, and every switch from the client's messages to the server's
is one wait.

    with round_trips(saver.conn) as trips:
        saver.claim_many(intents)
    assert trips.count == 1

Works for a `psycopg.Connection` and a `psycopg.AsyncConnection` (the trace is libpq's,
below either). The trace goes to a temporary file, read when the block ends.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RoundTrips", "round_trips"]


@dataclass
class RoundTrips:
    """What `round_trips` saw: `count` waits, and for each the protocol messages the
    client sent before it (`Parse`, `Bind`, `Query`, `Sync`, ...)."""

    count: int = 0
    """How many times the client waited for the server."""
    sent: list[list[str]] = field(default_factory=list)
    """The client's message types before each wait, in order."""


@contextmanager
def round_trips(conn: Any) -> Iterator[RoundTrips]:
    """Trace `conn` (a psycopg connection, sync or async) while the block runs; the
    yielded `RoundTrips` is filled in when it ends."""
    from psycopg import pq

    seen = RoundTrips()
    fd, path = tempfile.mkstemp(prefix="graph_durable_trace_")
    try:
        conn.pgconn.trace(fd)
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield seen
        finally:
            conn.pgconn.untrace()
        with open(path, encoding="utf-8", errors="replace") as trace:
            _count(trace, seen)
    finally:
        os.close(fd)
        os.unlink(path)


def _count(lines: Any, seen: RoundTrips) -> None:
    sending: list[str] = []
    for line in lines:
        side, _, rest = line.partition("\t")
        kind = rest.split("\t", 2)[1] if rest.count("\t") >= 1 else ""
        if side == "F":
            sending.append(kind)
        elif side == "B" and sending:
            seen.count += 1
            seen.sent.append(sending)
            sending = []
