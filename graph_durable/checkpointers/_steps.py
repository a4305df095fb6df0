"""Copy points and step anchors: what every durable saver runs, written once.

A guarded write is anchored to the root checkpoint its step runs from
(`graph_durable.nodes.write_keys`). A worker killed after a checkpoint's writes were
saved, but before the next step's checkpoint, leaves that step to be made again on
resume under a new id; a copy of the thread made then makes its own under another. So
`copy_thread` records where the source stood (its newest root checkpoint, with a digest
of the writes saved under it then: a *copy point*) for the source and the copy (a later
copy carries its source's points); a step a thread makes from one of its copy points,
whose writes there are still those, is anchored to the point and its writes, the same
in every such thread (`step_anchor`), and recorded for the family when first asked (or
before a prune deletes the writes), so that a later prune or write changes nothing.

Each piece is a generator of `Statement`s (SQL as written in `_sql`, `?` placeholders)
that receives each statement's rows; a saver performs them on its own connection
(`performed`, or its async loop).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any, NamedTuple

from graph_durable.checkpointers import _sql

__all__ = ["Statement", "anchors_before_prune", "aperformed", "copy_point", "performed",
           "step_anchor", "writes_digest"]


class Statement(NamedTuple):
    """One statement to run; `fetch`: its rows are sent back (else `None` is)."""

    sql: str
    params: tuple[Any, ...]
    fetch: bool = True


Statements = Generator[Statement, Any, Any]


def writes_digest(writes: Sequence[Sequence[Any]]) -> str:
    """A digest of a checkpoint's saved writes (rows of task id, index, channel, type and
    stored value), the same in every thread that holds them (a copy holds its source's
    bytes), whatever order the database returns them in."""
    digest = hashlib.blake2b(digest_size=16)
    for row in sorted(writes, key=lambda row: (str(row[0]), int(row[1]))):
        for field in row:
            data = (field if isinstance(field, bytes) else
                    bytes(field) if isinstance(field, bytearray | memoryview) else
                    str(field).encode())
            digest.update(len(data).to_bytes(8, "big"))
            digest.update(data)
    return digest.hexdigest()


def copy_point(source_thread_id: str, target_thread_id: str, writes_sql: str) -> Statements:
    """Record where `source_thread_id` stands as it is copied to `target_thread_id` (run
    in the copy's transaction, after the source's own points were carried over): its
    newest root checkpoint and the digest of its writes, for both threads."""
    newest = yield Statement(_sql.SELECT_NEWEST_ROOT, (source_thread_id,))
    if not newest:
        return
    checkpoint_id = newest[0][0]
    digest = writes_digest((yield Statement(writes_sql, (source_thread_id, checkpoint_id))))
    for thread_id in (source_thread_id, target_thread_id):
        yield Statement(_sql.RECORD_COPY_POINT,
                        (thread_id, checkpoint_id, digest, time.time()), fetch=False)


def step_anchor(thread_id: str, checkpoint_id: str, parent_id: str | None, writes_sql: str
                ) -> Statements:
    """The anchor of the step the root checkpoint `checkpoint_id` begins (made by a run
    from `parent_id` and its saved writes), or `None` when this thread was never
    copied, or copied from, at that parent. The first time it is asked it is worked out
    and recorded for the family: `<parent>~<digest>` when the thread's writes under the
    parent are still those of a copy point there (the step was decided before the
    copy), else the checkpoint's own id (the thread made its step from writes of its
    own). A recorded anchor is answered whatever is known of the parent now (`None`:
    pruned, or a fork's source gone)."""
    ask = (thread_id, thread_id, checkpoint_id, thread_id, parent_id)
    [(anchor, copied)] = yield Statement(_sql.SELECT_STEP_ANCHOR, ask)
    if anchor is not None or not copied:
        return anchor
    digest = writes_digest((yield Statement(writes_sql, (thread_id, parent_id))))
    point = yield Statement(_sql.SELECT_COPY_POINT, (thread_id, parent_id, digest))
    anchor = f"{parent_id}~{digest}" if point else checkpoint_id
    yield Statement(_sql.RECORD_STEP_ANCHOR,
                    (thread_id, thread_id, checkpoint_id, anchor, time.time()), fetch=False)
    [(anchor, _)] = yield Statement(_sql.SELECT_STEP_ANCHOR, ask)
    return anchor


def anchors_before_prune(thread_id: str, writes_sql: str,
                         steps_sql: str = _sql.SELECT_COPY_POINT_STEPS) -> Statements:
    """Anchor every step of `thread_id` made after one of its copy points (`step_anchor`;
    `loop` checkpoints, as `steps_sql` finds them) before a prune deletes the point's
    writes, which the anchor is worked out from (and, on PostgreSQL, the step's link to
    its parent)."""
    for checkpoint_id, parent_id in (yield Statement(steps_sql, (thread_id, thread_id))):
        yield from step_anchor(thread_id, checkpoint_id, parent_id, writes_sql)


def performed(statements: Statements, run: Callable[[Statement], Any]) -> Any:
    """Run `statements` to their end, each by `run` (its rows, or `None`); what they
    return."""
    try:
        statement = next(statements)
        while True:
            statement = statements.send(run(statement))
    except StopIteration as done:
        return done.value


async def aperformed(statements: Statements, run: Callable[[Statement], Awaitable[Any]]) -> Any:
    """`performed`, each statement awaited."""
    try:
        statement = next(statements)
        while True:
            statement = statements.send(await run(statement))
    except StopIteration as done:
        return done.value
