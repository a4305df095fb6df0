"""Production code never imports the test kit: the kit imports production."""

import subprocess
import sys

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
