"""Execute every notebook in notebooks/ with a real Jupyter kernel, as a user would run it.

The kernel is this interpreter (`sys.executable`), started from a kernelspec written to a
temporary folder, so a `python3` kernelspec elsewhere on the machine (user or system) cannot
substitute another Python. A cell prepended to each notebook reports the kernel's
interpreter and the test checks it. The notebooks assert what they show, so an error in any
cell fails the test; the test also checks that the review table was rendered as HTML.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

pytestmark = pytest.mark.crash  # the notebooks kill worker processes with SIGKILL

NOTEBOOKS_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
KERNEL_NAME = "graph-durable-test-venv"
CELL_TIMEOUT = 120  # seconds per cell
PROBE = "import json, sys; print(json.dumps({'executable': sys.executable, 'prefix': sys.prefix}))"


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kernelspec folder whose only kernel runs this interpreter."""
    root = tmp_path_factory.mktemp("kernels")
    spec = root / KERNEL_NAME
    spec.mkdir()
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python ({sys.prefix})",
        "language": "python",
    }))
    return root


def execute(path: Path, kernel_dir: Path) -> nbformat.NotebookNode:
    """Run a copy of the notebook at `path` (cwd: notebooks/), probe cell first."""
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(PROBE))
    km = AsyncKernelManager(kernel_name=KERNEL_NAME,
                            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernel_dir)]))
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT, allow_errors=False,
                            resources={"metadata": {"path": str(NOTEBOOKS_DIR)}})
    client.execute(cleanup_kc=True)  # a client given its km leaves the kernel running otherwise
    return nb


def outputs(cell: Any) -> list[Any]:
    return cell.get("outputs", []) if cell.cell_type == "code" else []


def test_notebooks_exist() -> None:
    assert NOTEBOOKS, f"no notebooks in {NOTEBOOKS_DIR}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, cell in enumerate(nb.cells)
             if outputs(cell) or cell.get("execution_count") is not None]
    assert not dirty, f"{path.name}: clear the outputs of cells {dirty} before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path, kernel_dir: Path, monkeypatch: pytest.MonkeyPatch,
                       tmp_path: Path) -> None:
    # Keep the kernel away from the user's IPython profile and Jupyter runtime folder.
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    nb = execute(path, kernel_dir)

    probe, *cells = nb.cells
    reported = json.loads("".join(o.get("text", "") for o in outputs(probe)
                                  if o.output_type == "stream"))
    assert reported == {"executable": sys.executable, "prefix": sys.prefix}

    errors = [(i, o.get("ename"), o.get("evalue"))
              for i, cell in enumerate(cells) for o in outputs(cell) if o.output_type == "error"]
    assert not errors, errors
    unrun = [i for i, cell in enumerate(cells)
             if cell.cell_type == "code" and cell.get("execution_count") is None]
    assert not unrun, f"cells {unrun} did not run"

    html = [o.data["text/html"] for cell in cells for o in outputs(cell)
            if o.output_type in ("display_data", "execute_result") and "text/html" in o.data]
    assert any("<table" in h for h in html), "no review table in the HTML outputs"
