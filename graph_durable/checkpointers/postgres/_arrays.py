"""Lists of text a ledger statement sends as arrays, dumped in binary in one pass.

psycopg dumps a plain `list` by looking for a dumper of its elements on every execution
(`ListBinaryDumper.upgrade`) and then dumping each element through it: about 7 µs for a
list of five strings. A step's claim sends eight such lists, and the receipts its
checkpoint carries as many. `Texts` marks a list of `str` (or `None`), and its dumper
writes PostgreSQL's binary `text[]` (`array_send`'s layout: dimensions, flags, element
type, then each element's length and bytes) in the connection's encoding (UTF-8 on a
`SQL_ASCII` one, as psycopg's own text dumpers).

The dumper is registered on psycopg's global adapters when this module is imported, so
every connection made afterwards has it (and one made before that had run nothing yet:
psycopg copies a connection's adapters on first use). Any other dumps a `Texts` as any
list (psycopg looks a type's dumper up along its MRO): the same array, the slower way.
"""

from __future__ import annotations

import struct
from typing import Any

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

__all__ = ["Texts"]

_TEXT_OID = 25
_TEXT_ARRAY_OID = 1009
_HEADER = struct.Struct("!iiiii")  # ndim, has nulls, element oid, length, lower bound
_EMPTY = struct.pack("!iii", 0, 0, _TEXT_OID)
_LENGTH = struct.Struct("!i")
_NULL = _LENGTH.pack(-1)


class Texts(list):  # type: ignore[type-arg]
    """A list of `str` or `None` sent as a `text[]` parameter (in binary)."""

    __slots__ = ()


class TextsDumper(Dumper):
    """Dumps a `Texts` as a one-dimensional `text[]` in binary."""

    format = Format.BINARY
    oid = _TEXT_ARRAY_OID

    def __init__(self, cls: type, context: Any = None) -> None:
        super().__init__(cls, context)
        info = getattr(self.connection, "info", None)
        encoding = getattr(info, "encoding", None) or "utf-8"
        # As psycopg's own text dumpers: SQL_ASCII stores whatever bytes it gets.
        self._encoding = encoding if encoding != "ascii" else "utf-8"

    def dump(self, obj: Any) -> bytes:
        if not obj:
            return _EMPTY
        encoding, pack = self._encoding, _LENGTH.pack
        parts: list[bytes] = [b""]
        nulls = 0
        for item in obj:
            if item is None:
                parts.append(_NULL)
                nulls = 1
            else:
                data = item.encode(encoding)
                parts.append(pack(len(data)))
                parts.append(data)
        parts[0] = _HEADER.pack(1, nulls, _TEXT_OID, len(obj), 1)
        return b"".join(parts)


psycopg.adapters.register_dumper(Texts, TextsDumper)
