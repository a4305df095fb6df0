"""Execute every notebook in notebooks/ with a real Jupyter kernel, as a user would run it.

The kernel is this interpreter (`sys.executable`), started from a kernelspec written to a
temporary folder, so a `python3` kernelspec elsewhere on the machine (user or system) cannot
substitute another Python. A cell prepended to each notebook reports the kernel's
interpreter and the test checks it. The notebooks assert what they show, so an error in any
cell fails the test; the test also checks that tables were rendered as HTML.

Notebooks are committed with their outputs, so a reader sees them without running
anything: every code cell of a committed notebook has run, in order, without an error, and
nothing in the file names a folder of the machine that ran it, nor carries the state of
its widgets (a widget's output keeps its static HTML beside it, which is what GitHub and
nbviewer show). `make notebooks` (this module run as a script) executes them the same way
and writes the outputs back, without widget state.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
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
MACHINE_PATH = re.compile(r"(/tmp/|/var/folders/|/private/|/work/|/home/|/Users/|/root/|"
                          r"[A-Za-z]:\\\\Users)")
"""Folders of the machine that ran a notebook; a committed file must name none."""
SHOWS = {"01_quickstart.ipynb": "text/html",
         "02_review_inbox.ipynb": "application/vnd.jupyter.widget-view+json",
         "03_fault_injection.ipynb": "image/png"}
"""What each notebook must show besides text: tables, the inbox widget, the plot."""
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_STATE_LIMIT = 2_000
"""Bytes of widget state a committed notebook may carry (the inbox's is about 200 kB)."""


def write_kernelspec(root: Path) -> Path:
    """A kernelspec folder under `root` whose only kernel runs this interpreter."""
    spec = root / KERNEL_NAME
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python ({sys.prefix})",
        "language": "python",
    }))
    return root


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kernelspec folder whose only kernel runs this interpreter."""
    return write_kernelspec(tmp_path_factory.mktemp("kernels"))


def execute(path: Path, kernel_dir: Path) -> nbformat.NotebookNode:
    """Run a copy of the notebook at `path` (cwd: notebooks/), probe cell first."""
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(PROBE))
    km = AsyncKernelManager(kernel_name=KERNEL_NAME,
                            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernel_dir)]))
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT, allow_errors=False,
                            store_widget_state=False,
                            resources={"metadata": {"path": str(NOTEBOOKS_DIR)}})
    client.execute(cleanup_kc=True)  # a client given its km leaves the kernel running otherwise
    return nb


def outputs(cell: Any) -> list[Any]:
    return cell.get("outputs", []) if cell.cell_type == "code" else []


def test_notebooks_exist() -> None:
    assert NOTEBOOKS, f"no notebooks in {NOTEBOOKS_DIR}"


def machine_paths(text: str) -> list[str]:
    """Lines of `text` that name a folder of the machine."""
    return [line.strip()[:160] for line in text.splitlines() if MACHINE_PATH.search(line)]


def code_cells(nb: nbformat.NotebookNode) -> list[Any]:
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def shown(cells: list[Any]) -> set[str]:
    """Mime types of the cells' rich outputs."""
    return {mime for cell in cells for o in outputs(cell)
            if o.output_type in ("display_data", "execute_result") for mime in o.data}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_committed_with_its_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    cells = code_cells(nb)
    counts = [cell.get("execution_count") for cell in cells]
    assert counts == list(range(1, len(cells) + 1)), (
        f"{path.name}: run every cell once, top to bottom, in one kernel (make notebooks); "
        f"execution counts are {counts}")
    empty = [i for i, cell in enumerate(cells) if not outputs(cell)]
    assert not empty, f"{path.name}: code cells {empty} have no output to show a reader"
    errors = [(i, o.get("ename")) for i, cell in enumerate(cells) for o in outputs(cell)
              if o.output_type == "error" or o.get("name") == "stderr"]
    assert not errors, f"{path.name}: committed with errors or stderr output: {errors}"
    assert SHOWS.get(path.name, "text/html") in shown(cells)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_notebook_names_no_machine_path(path: Path) -> None:
    found = machine_paths(path.read_text(encoding="utf-8"))
    assert not found, f"{path.name} names folders of the machine that ran it: {found}"


def widget_state_bytes(nb: nbformat.NotebookNode) -> int:
    """Size of the widget state `nb` carries: in its metadata (where Jupyter and nbclient
    save it) and in any output."""
    kept = [nb.metadata.get("widgets")]
    kept += [o.data[WIDGET_STATE] for cell in nb.cells for o in outputs(cell)
             if WIDGET_STATE in o.get("data", {})]
    return sum(len(json.dumps(state)) for state in kept if state)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_notebook_carries_no_widget_state(path: Path) -> None:
    size = widget_state_bytes(nbformat.read(path, as_version=4))
    assert size <= WIDGET_STATE_LIMIT, (
        f"{path.name} carries {size} bytes of widget state (limit {WIDGET_STATE_LIMIT}): "
        "write it with make notebooks, or clear the widget state before saving")


@pytest.mark.long
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
    assert any("<table" in h for h in html), "no table in the HTML outputs"
    assert SHOWS.get(path.name, "text/html") in shown(cells)
    assert widget_state_bytes(nb) == 0, "the run stored its widgets' state"
    nb.cells = cells
    found = machine_paths(nbformat.writes(nb))
    assert not found, f"{path.name} shows folders of this machine: {found}"


def write_outputs(paths: list[Path]) -> None:
    """Execute each notebook as the test does and store it with its outputs."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        os.environ.update(IPYTHONDIR=str(root / "ipython"),
                          JUPYTER_RUNTIME_DIR=str(root / "runtime"), JUPYTER_PLATFORM_DIRS="1")
        kernels = write_kernelspec(root / "kernels")
        for path in paths:
            metadata = nbformat.read(path, as_version=4).metadata
            nb = execute(path, kernels)
            nb.cells = nb.cells[1:]  # the probe
            for n, cell in enumerate(code_cells(nb), 1):
                cell.execution_count = n
                for output in outputs(cell):
                    if "execution_count" in output:
                        output.execution_count = n
            nb.metadata = {**nb.metadata, "kernelspec": metadata.get("kernelspec", {})}
            nb.metadata.pop("widgets", None)  # a saved state is large, and stale once read
            nbformat.write(nb, path)
            print(f"{path.name}: {len(code_cells(nb))} code cells run, outputs written")


if __name__ == "__main__":
    write_outputs([Path(arg) for arg in sys.argv[1:]] or NOTEBOOKS)
