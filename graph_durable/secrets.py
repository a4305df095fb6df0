"""What the ledger keeps about a call, and how: sealing, redaction and key secrets.

Three tools, each for a different reader:

- **Sealing** (for whoever reads the database). When a durable saver's `serde` encrypts
  (LangGraph's `EncryptedSerializer`, or any serializer that marks its types with a
  `+cipher` suffix, as that one does), the ledger stores args, receipts, decisions, error
  texts and journal data through it, as `gd-sealed:<type>:<base64>` text. Thread ids,
  keys, tool names, statuses, times, attempts, owners and tokens stay in the clear: the
  protocol and the operators' views query them. A ledger written before encryption was
  turned on stays readable; its new rows are sealed.
- **Redaction** (for users who do not encrypt, or keep the ledger longer than the
  checkpoints). `Effect(redact=...)` maps every value the ledger would store about a
  call to what is stored instead. The tool still gets the full args and the model the
  full result; keys are derived from the full args, and lookups ask by key.
- **Key secrets** (for the provider that sees the key). Keys are an HMAC of the call
  under a secret, so a provider cannot confirm a guess of the args. See `KeySecrets`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from graph_durable.errors import GraphDurableError

__all__ = [
    "KEY_SECRET_ENV",
    "KeySecrets",
    "LedgerCodec",
    "Redact",
    "SEALED",
    "SEALED_PREFIX",
    "Sealed",
    "SecretUnavailable",
    "column_json",
    "explained",
    "ordered_json",
    "redact_keys",
]

SEALED_PREFIX = "gd-sealed:"
"""How a sealed ledger value starts: `gd-sealed:<serde type>:<base64 of the bytes>`, or
for a member of a sealed set, `gd-sealed:set.<index>:<serde type>:<base64>`."""

_SET_PREFIX = "set."
"""How a sealed set member's type starts (no serde type starts so)."""

SET_MEMBERS = 8
"""At most this many values share one sealed set (`LedgerCodec.seal_together`)."""

SET_CHARS = 4096
"""A sealed set holds at most this many characters of JSON, as sealed (a larger value is
sealed alone)."""

_CLEAR_EVENT_FIELDS = frozenset({
    "status", "tool", "tool_call_id", "source", "attempt", "inherited", "decision",
    "decided_at", "approval_ttl", "edited_key",
})
"""Journal fields that say nothing about the call's content (`decision` only as a kind)."""

KEY_SECRET_ENV = "GRAPH_DURABLE_KEY_SECRET"
"""Environment variable a saver reads its key secret from when not given one."""

Redact = Callable[[Any], Any]
"""`redact(value) -> value`: what the ledger stores instead of `value` (args, a receipt,
a human's receipt, an edit's args, an error text, a stored result's content)."""


class SecretUnavailable(GraphDurableError):
    """The ledger holds a sealed value this saver cannot open (no key, or another key)."""


class Sealed(str):
    """A ledger value shown without its key: reads as `<encrypted>`, never as garbage."""

    __slots__ = ()

    def __new__(cls) -> Sealed:
        return super().__new__(cls, "<encrypted>")


SEALED = Sealed()
"""What an operator's read-only view shows for a sealed value it cannot open."""


def encrypts(serde: Any) -> bool:
    """Whether `serde` encrypts: LangGraph's `EncryptedSerializer` marks its types
    `<type>+<cipher>`, and so does any serializer following its convention."""
    try:
        type_, _ = serde.dumps_typed(b"")
    except Exception:  # noqa: BLE001 - a serializer that cannot say is not ours to judge
        return False
    return "+" in type_


_SORTED = json.JSONEncoder(ensure_ascii=False, default=str, sort_keys=True)
_ORDERED = json.JSONEncoder(ensure_ascii=False, default=str)
"""`json.dumps` with options builds an encoder per call; the columns' two, made once."""


def column_json(value: Any) -> str:
    """JSON for a ledger column, before any sealing: keys sorted, values JSON cannot
    hold stored as their `str()`."""
    return _SORTED.encode(value)


def ordered_json(value: Any) -> str:
    """`column_json`, keeping the order of `value`'s keys (a receipt a stored result is
    rebuilt from: its JSON must come back as the tool wrote it)."""
    return _ORDERED.encode(value)


class LedgerCodec:
    """Encodes the ledger's JSON columns: plain JSON, or sealed by the saver's `serde`.

    `strict` readers (the savers a graph runs with) raise `SecretUnavailable` on a value
    they cannot open; lenient ones (operators' read-only views) show `SEALED`.
    """

    def __init__(self, serde: Any, *, strict: bool = True) -> None:
        self.serde = serde
        self.seals = encrypts(serde)
        self.strict = strict
        # Sealed texts this process wrote or opened lately, and what they hold: a ledger
        # row is read back many times (every transition returns it), and a cipher such
        # as AES-EAX costs a tenth of a millisecond per value.
        self._opened: OrderedDict[str, str] = OrderedDict()

    def dump(self, value: Any) -> str:
        """The column text for `value` (JSON; values JSON cannot hold become `str()`)."""
        return self.seal(column_json(value))

    def dump_event(self, data: dict[str, Any]) -> str:
        """The column text of a journal entry's data: sealed only when it says more
        than the protocol's own words (statuses, sources, attempt numbers, kinds of
        decision), which the effects row keeps in the clear anyway."""
        if self.seals and all(
            k in _CLEAR_EVENT_FIELDS and (k != "decision" or isinstance(v, str))
            for k, v in data.items()
        ):
            return column_json(data)
        return self.dump(data)

    def dump_json(self, text: str) -> str:
        """The column text for `text`, already JSON."""
        return self.seal(text)

    def dump_text(self, text: str | None) -> str | None:
        """The column text for a plain string (an error), JSON-encoded when sealed."""
        if text is None or not self.seals:
            return text
        return self.seal(json.dumps(text, ensure_ascii=False))

    def seal(self, text: str) -> str:
        if not self.seals:
            return text
        type_, blob = self.serde.dumps_typed(text.encode("utf-8"))
        sealed = f"{SEALED_PREFIX}{type_}:{base64.b64encode(blob).decode('ascii')}"
        self._remember(sealed, text)
        return sealed

    def seal_together(self, texts: Sequence[str]) -> list[str]:
        """The column texts of `texts` (each already JSON), in order, sealed in sets.

        A cipher such as AES-EAX costs more per value than the bytes it seals (a tenth
        of a millisecond here), and a step writes a value per call together (its
        intents' args, its receipts). Values written together are sealed as one JSON
        list, up to `SET_MEMBERS` values and `SET_CHARS` characters a set, and each column
        holds its set and its index in it: a row still opens alone, and the set is
        opened once for all its members. A lone value is sealed as `seal` seals it.
        Each row stores its whole set, so its ciphertext also holds its siblings' values
        (the same step's, in the same thread): they leave the database with the thread.
        """
        if not self.seals:
            return list(texts)
        encoded = [json.dumps(text, ensure_ascii=False) for text in texts]  # in the set
        sealed: list[str] = []
        start = 0
        while start < len(texts):
            end, size = start, 0
            while (end < len(texts) and end - start < SET_MEMBERS
                   and (end == start or size + len(encoded[end]) + 1 <= SET_CHARS)):
                size += len(encoded[end]) + 1
                end += 1
            if end - start == 1:
                sealed.append(self.seal(texts[start]))
            else:
                sealed.extend(self._seal_set(texts[start:end], encoded[start:end]))
            start = end
        return sealed

    def _seal_set(self, texts: Sequence[str], encoded: Sequence[str]) -> list[str]:
        members = "[" + ",".join(encoded) + "]"
        type_, blob = self.serde.dumps_typed(members.encode("utf-8"))
        body = f"{type_}:{base64.b64encode(blob).decode('ascii')}"
        sealed = [f"{SEALED_PREFIX}{_SET_PREFIX}{index}:{body}" for index in range(len(texts))]
        for one, text in zip(sealed, texts, strict=True):
            self._remember(one, text)
        return sealed

    def _remember(self, sealed: str, text: str) -> None:
        opened = self._opened
        opened[sealed] = text
        if len(opened) > 4096:
            opened.popitem(last=False)

    def load(self, text: str | None, *, where: str = "") -> Any:
        """Decode a JSON column (`None` stays `None`)."""
        if text is None:
            return None
        if text.startswith(SEALED_PREFIX):
            opened = self._open(text, where)
            return opened if isinstance(opened, Sealed) else json.loads(opened)
        return json.loads(text)

    def load_text(self, text: str | None, *, where: str = "") -> str | None:
        """Decode a plain-string column (an error)."""
        if text is None or not text.startswith(SEALED_PREFIX):
            return text
        opened = self._open(text, where)
        return opened if isinstance(opened, Sealed) else json.loads(opened)

    def _open(self, text: str, where: str) -> str:
        known = self._opened.get(text)
        if known is not None:
            return known
        type_, _, body = text[len(SEALED_PREFIX):].partition(":")
        member: str | None = None
        if type_.startswith(_SET_PREFIX):
            member = type_[len(_SET_PREFIX):]
            type_, _, body = body.partition(":")
        try:
            raw = self.serde.loads_typed((type_, base64.b64decode(body)))
            opened = bytes(raw).decode("utf-8")
            if member is not None:
                members = json.loads(opened)
                if not (member.isdigit() and isinstance(members, list)
                        and int(member) < len(members)
                        and all(isinstance(one, str) for one in members)):
                    raise ValueError("not a member of a sealed set")
                prefix = text[:len(SEALED_PREFIX) + len(_SET_PREFIX)]
                for index, one in enumerate(members):  # the set's other rows open free
                    self._remember(f"{prefix}{index}:{type_}:{body}", one)
                opened = members[int(member)]
            self._remember(text, opened)
            return opened
        except Exception as exc:  # noqa: BLE001 - any failure to open is one answer
            if not self.strict:
                return SEALED
            cipher = type_.partition("+")[2] or type_
            raise SecretUnavailable(
                f"The ledger{where} is encrypted ({cipher}) and this saver cannot open it "
                f"({type(exc).__name__}). Give the saver the serde the ledger was written "
                "with, e.g. serde=EncryptedSerializer.from_pycryptodome_aes() with the same "
                "LANGGRAPH_AES_KEY; nothing was written."
            ) from None


class _Explained:
    """A serde whose failure to open an encrypted value is `SecretUnavailable`."""

    def __init__(self, serde: Any) -> None:
        self.serde = serde

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        return self.serde.dumps_typed(obj)  # type: ignore[no-any-return]

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        try:
            return self.serde.loads_typed(data)
        except Exception as exc:  # noqa: BLE001 - reworded only for encrypted values
            type_ = data[0]
            if "+" not in type_:
                raise
            raise SecretUnavailable(
                f"The checkpoints are encrypted ({type_.partition('+')[2]}) and cannot be "
                f"opened without the key ({type(exc).__name__}): set LANGGRAPH_AES_KEY to "
                "the key your agent's EncryptedSerializer uses.") from None


def explained(serde: Any) -> Any:
    """`serde`, raising `SecretUnavailable` (one clear line) instead of a cipher's or a
    decoder's error when a value it cannot open is read. For operators' tools."""
    return _Explained(serde)


def redact_keys(*names: str, mask: str = "[redacted]") -> Redact:
    """A redaction that replaces the values of dict keys in `names` with `mask`.

    It walks dicts and lists, and strings holding a JSON object or list (as a tool's
    dict result becomes in its ToolMessage). Other strings are kept as they are: pass
    your own callable to scrub free text such as error messages.
    """
    hidden = frozenset(names)
    if not hidden:
        raise ValueError("redact_keys needs at least one key name")

    def walk(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: (mask if k in hidden else walk(v)) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [walk(v) for v in value]
        if isinstance(value, str) and value[:1] in "{[":
            try:
                parsed = json.loads(value)
            except ValueError:
                return value
            return json.dumps(walk(parsed), ensure_ascii=False)
        return value

    walk.__qualname__ = f"redact_keys({', '.join(map(repr, sorted(hidden)))})"
    return walk


class KeySecrets:
    """The secrets keys are derived under, and which one a thread is pinned to.

    A thread's keys must never change while it lives (a changed key is a second
    effect), so each key thread is pinned to the scheme of its first intent:
    `sha256` (keys from before key secrets, or no secret), or `hmac:<id>` where `<id>`
    names the secret without revealing it. New threads use the first secret;
    the others stay accepted for threads pinned to them (rotation).
    """

    def __init__(self, secrets: Iterable[str | bytes]) -> None:
        self.by_id: dict[str, bytes] = {}
        self.current: str | None = None
        for secret in secrets:
            raw = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
            if len(raw) < 16:
                raise ValueError("a key secret must be at least 16 bytes long")
            scheme = "hmac:" + hmac.new(raw, b"graph_durable key id", hashlib.sha256
                                        ).hexdigest()[:16]
            self.by_id.setdefault(scheme, raw)
            self.current = self.current or scheme

    @classmethod
    def configured(cls, key_secret: str | bytes | Iterable[str | bytes] | None) -> KeySecrets:
        """From a saver's `key_secret` (one secret, or newest first), else from
        `GRAPH_DURABLE_KEY_SECRET`, else none."""
        if key_secret is None:
            env = os.environ.get(KEY_SECRET_ENV)
            return cls([env] if env else [])
        if isinstance(key_secret, str | bytes):
            return cls([key_secret])
        return cls(key_secret)

    def add(self, secret: str | bytes) -> None:
        """Accept `secret` too; it becomes the current one if none was configured."""
        extra = KeySecrets([secret])
        for scheme, raw in extra.by_id.items():
            self.by_id.setdefault(scheme, raw)
            self.current = self.current or scheme

    def secret_for(self, scheme: str | None, thread_id: str) -> tuple[bytes | None, str]:
        """`(secret, scheme)` to key `thread_id`'s calls with, given its pinned scheme
        (`None`: not pinned yet, so the current one).

        Raises:
            SecretUnavailable: the thread is pinned to a secret this saver lacks.
        """
        if scheme is None:
            scheme = self.current or "sha256"
        if scheme == "sha256":
            return None, scheme
        secret = self.by_id.get(scheme)
        if secret is None:
            raise SecretUnavailable(
                f"Thread {thread_id!r} keys its effects under key secret {scheme!r}, which "
                "this saver does not hold; nothing was sent. A changed key would send its "
                "effects again: give the saver that secret too (key_secret=[new, old], "
                f"or {KEY_SECRET_ENV}).",
                thread_id=thread_id,
            )
        return secret, scheme
