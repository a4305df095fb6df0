"""Packaging: the version is one, the metadata says what the project is, and a missing
optional dependency is an ImportError naming the extra that installs it."""

from __future__ import annotations

import subprocess
import sys

from importlib.metadata import metadata
from pathlib import Path

import pytest

import graph_durable

ROOT = Path(__file__).resolve().parent.parent


def test_the_version_and_the_metadata_agree() -> None:
    meta = metadata("graph-durable")
    assert graph_durable.__version__ == meta["Version"]
    assert meta["License-Expression"] == "MIT" and (ROOT / "LICENSE").read_text().startswith("MIT")
    assert any(c.startswith("Programming Language :: Python :: 3.1") for c in
               meta.get_all("Classifier"))
    # No project URL until the project has a public home: none that leads nowhere.
    assert not meta.get_all("Project-URL")


@pytest.mark.parametrize(("blocked", "statement", "extra"), [
    ("psycopg", "from graph_durable.checkpointers.postgres import DurablePostgresSaver",
     "postgres"),
    ("langchain", "from graph_durable import EffectGuardMiddleware", "agents"),
])
def test_a_missing_extra_is_named(blocked: str, statement: str, extra: str) -> None:
    code = f"import sys\nsys.modules[{blocked!r}] = None\n{statement}\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError") and f"pip install 'graph-durable[{extra}]'" in last, last
