"""The layers hold: production code never imports the test kit, no import runs up from a
lower layer to a higher one, and no modules import each other around a circle (the
layers and what counts as an import: `tests/layers.py`)."""

import subprocess
import sys

from tests import layers

PRODUCTION = [
    "graph_durable",
    "graph_durable.nodes.guard",
    "graph_durable.nodes.protocol",
    "graph_durable.checkpointers.sqlite",
    "graph_durable.checkpointers.sqlite.async_saver",
    "graph_durable.checkpointers.postgres",
    "graph_durable.operators.review",
    "graph_durable.operators.notebook",
    "graph_durable.operators.recovery",
    "graph_durable.cli",
]


def test_production_modules_do_not_import_the_test_kit() -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {PRODUCTION!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.startswith('graph_durable.testing')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]", f"production imported the test kit: {out}"


def test_every_module_is_in_a_layer_no_import_runs_up_and_no_circle() -> None:
    found = layers.problems()
    assert not found, "the import graph breaks the layers:\n" + "\n".join(found)


def test_the_check_sees_function_level_imports_circles_and_upward_arrows(tmp_path) -> None:
    """The check itself: a function-level import that runs up and closes a circle is
    found; one under `if TYPE_CHECKING:` is not."""
    package = tmp_path / "graph_durable"
    (package / "checkpointers").mkdir(parents=True)
    (package / "operators").mkdir()
    for init in (package, package / "checkpointers", package / "operators"):
        (init / "__init__.py").write_text("")
    (package / "checkpointers" / "_base.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from graph_durable.operators.review import Review\n"
        "def audit():\n"
        "    from graph_durable.operators import audit\n")
    (package / "operators" / "audit.py").write_text(
        "from graph_durable.checkpointers._base import audit\n")
    (package / "operators" / "review.py").write_text(
        "from ..checkpointers import _base\n")
    found = layers.problems(tmp_path)
    assert found == [
        "graph_durable.checkpointers._base (checkpointers) imports "
        "graph_durable.operators.audit (operators): an import that runs up",
        "circle of 2 modules: graph_durable.checkpointers._base -> "
        "graph_durable.operators.audit, graph_durable.operators.audit -> "
        "graph_durable.checkpointers._base",
    ], found
    assert layers.graph(tmp_path)["graph_durable.operators.review"] == {
        "graph_durable.checkpointers._base"}


def test_the_architecture_page_lists_the_current_import_graph() -> None:
    page = (layers.ROOT / "docs" / "architecture.md").read_text()
    assert f"{layers.BEGIN}\n\n{layers.listing()}\n{layers.END}" in page, (
        "docs/architecture.md lists another import graph: run python -m tests.layers --write")
