"""SHA-256 and HMAC-SHA256 of the short strings effect keys are derived from, by
CPython's own SHA-256 rather than OpenSSL's.

A key is derived once per guarded call, between the model's step and the tool's: code
that last ran a turn ago, its caches cold. Reaching OpenSSL's EVP layer (what
`hashlib.sha256` and `hmac.digest` call) is then slow: in a guarded turn, one HMAC of a
hundred bytes took 40-60 us of CPU, where CPython's SHA-256 (`_sha256`, `_sha2` from
3.12) took 12-14 us; warm, both take 1-2 us. The digests are the same (RFC 2104's
HMAC, the stdlib's `hmac` module's construction; `tests/test_ledger_model.py` checks
them against `hmac.digest` and `hashlib`). Without that module (another Python), the
stdlib's functions are used.
"""

from __future__ import annotations

import hashlib
import hmac
import platform
from typing import Any

__all__ = ["hmac_sha256_hex", "sha256_hex"]

_sha256: Any = None
if platform.python_implementation() == "CPython":  # another Python's module may differ
    try:
        from _sha2 import sha256 as _sha256  # type: ignore[import-not-found,no-redef]  # 3.12+
    except ImportError:
        try:
            from _sha256 import sha256 as _sha256  # type: ignore[import-not-found,no-redef]
        except ImportError:  # a build without it (hashlib's builtins left out)
            _sha256 = None

_BLOCK = 64
"""SHA-256's block size, in bytes."""
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))

_PADDED: dict[bytes, tuple[Any, Any]] = {}
"""`{key: (inner, outer)}`: SHA-256 states that have absorbed the key's padded blocks,
copied for each message (never updated: threads share them). A saver holds a few key
secrets; past `_KEPT` keys the cache starts over, so it never grows without bound."""
_KEPT = 64


def sha256_hex(data: bytes) -> str:
    """`hashlib.sha256(data).hexdigest()`."""
    if _sha256 is None:
        return hashlib.sha256(data).hexdigest()
    return _sha256(data).hexdigest()  # type: ignore[no-any-return]


def hmac_sha256_hex(key: bytes, data: bytes) -> str:
    """`hmac.digest(key, data, "sha256").hex()`."""
    if _sha256 is None:
        return hmac.digest(key, data, "sha256").hex()
    key = bytes(key)  # as `hmac` takes any bytes-like key
    padded = _PADDED.get(key)
    if padded is None:
        if len(_PADDED) >= _KEPT:
            _PADDED.clear()
        block = (_sha256(key).digest() if len(key) > _BLOCK else key).ljust(_BLOCK, b"\0")
        padded = _PADDED[key] = (_sha256(block.translate(_IPAD)),
                                 _sha256(block.translate(_OPAD)))
    inner = padded[0].copy()
    inner.update(data)
    outer = padded[1].copy()
    outer.update(inner.digest())
    return outer.hexdigest()  # type: ignore[no-any-return]
