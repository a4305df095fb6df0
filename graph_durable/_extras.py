"""Optional dependencies: a missing one is an ImportError that names the extra to install."""

from __future__ import annotations

import importlib

__all__ = ["require"]


def require(extra: str, owner: str, *modules: str) -> None:
    """Import `modules`, or raise an ImportError saying `owner` needs `extra`.

    Args:
        extra: The extra of graph-durable that installs them (`postgres`, `agents`, ...).
        owner: What needs them, as the user names it.
        modules: The modules to import.
    """
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ImportError(
                f"{owner} needs the {extra!r} extra ({name} is not installed): "
                f"pip install 'graph-durable[{extra}]'") from exc
