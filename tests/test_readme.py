"""README's first Python example runs as written, in an empty folder, and prints what
its comment says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def run_first_block(text: str, folder: Path) -> None:
    """Run the first Python block of `text` in `folder`; its last line printed must be
    what the comment after its `print(...)` says."""
    block = re.search(r"```python\n(.*?)```", text, re.S)
    assert block, "no Python example"
    code = block.group(1)
    (folder / "example.py").write_text(code)
    result = subprocess.run([sys.executable, "example.py"], cwd=folder, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    promised = re.search(r"print\(.*\)\s+# (.+)", code)
    assert promised and result.stdout.strip().splitlines()[-1] == promised.group(1).strip()


def test_the_first_python_block_of_the_readme_runs_as_written(tmp_path: Path) -> None:
    run_first_block(README.read_text(), tmp_path)
    # The payment provider holds one charge.
    again = subprocess.run([sys.executable, "-c", (
        "from graph_durable.testing import FakeProvider\n"
        "print(FakeProvider('payments.sqlite', 'dedupe').count())")],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert again.stdout.strip() == "1", again.stderr


def test_the_guarded_writes_example_runs_as_written(tmp_path: Path) -> None:
    run_first_block(README.read_text().split("## Writes outside ToolNode", 1)[1], tmp_path)
