"""The canonical form of a call's arguments: how a `guarded` write whose arguments are
not plain JSON is keyed and recorded.

A key is derived from the canonical JSON of the arguments (`ledger.canonical_json`). What
LangGraph's own serializer handles is keyed by a canonical form, the same in every
process and release:

| value | canonical form |
|---|---|
| `None`, `bool`, `int`, finite `float`, `str` | itself |
| a mapping with `str` keys, a `list`, a `tuple` | the same shape, each item in canonical form |
| a `set`, a `frozenset` | a list of its items' canonical forms, ordered by their canonical JSON |
| a pydantic model | every field (`model_dump()`), in canonical form |
| a dataclass | every field, in canonical form |
| an `Enum` | its value, in canonical form |
| a `datetime`, `date`, `time` | `isoformat()` |
| a `UUID`, a `Decimal` | `str()` |

A pydantic model is keyed by the values of all its fields, as the function gets them.
Which fields were set explicitly does not survive a checkpoint (LangGraph's serializer
rebuilds a model with every field set), so a model that reached the write through the
graph's state was keyed apart on every resume and sent again; releases before keyed the
fields set explicitly only (`legacy_forms`, looked up so that a write they recorded is
found). A default a release changes changes the call, as any other argument. No type
name enters the form (a model and the dict of its fields key alike, as the same
parameter takes either), so renaming a class keeps its keys. Anything else (bytes, an arbitrary object) is
refused, with the argument's path and type named, before anything is sent.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import json
import math
import uuid
from collections.abc import Mapping
from typing import Any, Literal

__all__ = ["ModelFields", "NotCanonical", "canonical_form", "legacy_forms"]


ModelFields = Literal["all", "set", "not_default"]
"""Which fields of a pydantic model a form holds: all of them (the canonical form), those
set explicitly, or those that differ from their defaults (`legacy_forms`)."""


class NotCanonical(TypeError):
    """A value with no canonical form; `path` names where it is (`args.invoice.lines[2]`)."""

    def __init__(self, path: str, value: Any) -> None:
        super().__init__(f"{path} is a {type(value).__module__}.{type(value).__qualname__}, "
                         "which has no canonical form to key the call by")
        self.path = path


def _sort_key(item: Any) -> str:
    return json.dumps(item, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_form(value: Any, path: str = "args", *, fields: ModelFields = "all") -> Any:
    """`value` as plain JSON values, by the rules of the module docstring (`fields`:
    which of a pydantic model's fields, see `legacy_forms`).

    Raises:
        NotCanonical: a value (at `path`) that has no canonical form.
    """
    if value is None or isinstance(value, (bool, int, str)) and not isinstance(value, enum.Enum):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NotCanonical(path, value)
        return value
    if isinstance(value, enum.Enum):
        return canonical_form(value.value, path, fields=fields)
    if isinstance(value, Mapping):
        form = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise NotCanonical(f"{path} key {key!r}", key)
            form[key] = canonical_form(item, f"{path}.{key}", fields=fields)
        return form
    if isinstance(value, (list, tuple)):
        return [canonical_form(item, f"{path}[{i}]", fields=fields)
                for i, item in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        return sorted((canonical_form(item, f"{path}{{}}", fields=fields) for item in value),
                      key=_sort_key)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (uuid.UUID, decimal.Decimal)):
        return str(value)
    dump = getattr(value, "model_dump", None)
    if callable(dump) and hasattr(type(value), "model_fields"):
        return canonical_form(dump(exclude_unset=fields == "set",
                                   exclude_defaults=fields == "not_default"),
                              path, fields=fields)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: canonical_form(getattr(value, field.name), f"{path}.{field.name}",
                                           fields=fields)
                for field in dataclasses.fields(value)}
    raise NotCanonical(path, value)


def legacy_forms(value: Any, form: Any, path: str = "args") -> list[Any]:
    """The canonical forms releases before this one may have keyed `value` by, where
    they differ from its own (`form`): a pydantic model by its fields set explicitly
    (`model_dump(exclude_unset=True)`), as those releases keyed a model made in the node;
    and by its fields that differ from their defaults, which is what those were for a model
    a checkpoint has since given back with every field set. Nothing for a plain JSON
    value (no model in it)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return []
    forms: list[Any] = []
    for fields in ("set", "not_default"):
        legacy = canonical_form(value, path, fields=fields)  # type: ignore[arg-type]
        if legacy != form and legacy not in forms:
            forms.append(legacy)
    return forms
