"""README is a short page: its quick start is exactly `make demo` and `make test`, its
example runs as written, in an empty folder, and prints what its comment says, and its
links lead to pages of the docs. The examples it used to carry moved to the docs: the
StateGraph one to docs/getting-started.md (run here, with its provider's count), the
guarded-writes one to docs/how-to/guarded-writes.md (run by tests/test_docs.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
README_LINES = 100
"""The README stays a short page; the rest belongs in docs/."""


def run_first_block(text: str, folder: Path, page: str = "the page") -> None:
    """Run the first Python block of `text` (from `page`) in `folder`; its last line
    printed must be what the comment after its last `print(...)` says."""
    block = re.search(r"```python\n(.*?)```", text, re.S)
    assert block, f"{page} has no Python example"
    code = block.group(1)
    (folder / "example.py").write_text(code)
    result = subprocess.run([sys.executable, "example.py"], cwd=folder, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    promised = re.findall(r"print\(.*\)\s+# (.+)", code)
    assert promised and result.stdout.strip().splitlines()[-1] == promised[-1].strip()


def payments_count(folder: Path) -> str:
    """How many charges the example's payment provider holds."""
    again = subprocess.run([sys.executable, "-c", (
        "from graph_durable.testing import FakeProvider\n"
        "print(FakeProvider('payments.sqlite', 'dedupe').count())")],
        cwd=folder, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    return again.stdout.strip()


def test_the_quick_start_is_exactly_make_demo_and_make_test() -> None:
    section = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README's quick start has no shell block"
    commands = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]
    assert [c for c in commands if c] == ["make demo", "make test"]
    targets = re.findall(r"^(\w[\w-]*):", (ROOT / "Makefile").read_text(), re.M)
    assert {"demo", "test", "docs"} <= set(targets)


def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    text = README.read_text()
    run_first_block(text, tmp_path)
    assert payments_count(tmp_path) == "1"  # the payment provider holds one charge
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert "EffectGuardMiddleware" in code and "DurableSqliteSaver" in code
    assert "A real model plugs in here" in code


def test_the_getting_started_example_runs_as_written(tmp_path: Path) -> None:
    """The README's first example before it was cut, now on the getting-started page."""
    run_first_block(GETTING_STARTED.read_text(), tmp_path)
    assert payments_count(tmp_path) == "1"


def test_the_readme_is_short_and_its_links_lead_to_the_docs() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= README_LINES, (
        f"README.md has {len(text.splitlines())} lines (at most {README_LINES}): "
        "put guides, concepts and reference in docs/ and link to them")
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    missing = [link for link in local if not (ROOT / link).is_file()]
    assert not missing, f"README links to files that do not exist: {missing}"
    assert {"docs/getting-started.md", "docs/concepts/guarantees.md",
            "docs/how-to/notebooks.md"} <= set(local)
    assert "make docs" in text
