"""The review inbox in a real browser: JupyterLab serving the first cells of
`notebooks/02_review_inbox.ipynb` (three invoice threads, two of them SIGKILLed
mid-effect), headless Chromium driven by Playwright. The widget renders; Approve, Mark
applied, Send edited (a field changed), Retry, Reject and Resume thread, clicked as a
person would, do what the notebook's own Python-level cells check: each payment and
email once. Screenshots of the run are kept in the test's folder
(`GRAPH_DURABLE_SCREENSHOTS` names another).

Needs the `browser` extra (JupyterLab, Playwright) and a Chromium (Debian's
`chromium`, or `GRAPH_DURABLE_CHROMIUM`); marker `browser`, run by `make test-sweeps`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("jupyterlab", reason="needs the browser extra")
playwright = pytest.importorskip("playwright.sync_api", reason="needs the browser extra")

import nbformat  # noqa: E402

from graph_durable.testing import FakeProvider  # noqa: E402

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "02_review_inbox.ipynb"
TOKEN = "graph-durable-browser-test"
CHROMIUM = os.environ.get("GRAPH_DURABLE_CHROMIUM") or shutil.which("chromium") \
    or shutil.which("chromium-browser")
WAIT_MS = 120_000


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _inbox_notebook(folder: Path, workdir: Path) -> Path:
    """The notebook's cells up to the one that shows the inbox, its agent kept in
    `workdir` (the test reads the providers there)."""
    source = nbformat.read(NOTEBOOK, as_version=4)
    cells = []
    for cell in source.cells:
        if cell.cell_type != "code":
            continue
        code = cell.source.replace('Path(tempfile.mkdtemp(prefix="graph-durable-inbox-"))',
                                   f"Path({str(workdir)!r})")
        cells.append(nbformat.v4.new_code_cell(code))
        if code.strip().endswith("\nbox"):
            break
    assert "inbox(agent.graph" in cells[-1].source, "the notebook no longer shows its inbox"
    page = folder / "inbox.ipynb"
    notebook = nbformat.v4.new_notebook(cells=cells)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    nbformat.write(notebook, page)
    return page


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A JupyterLab server on 127.0.0.1 serving `tmp_path/lab`; its base URL."""
    if CHROMIUM is None:
        missing = "no Chromium: apt-get install chromium, or set GRAPH_DURABLE_CHROMIUM"
        if os.environ.get("CI"):  # CI installs it (.ci/run): never pass by without it
            pytest.fail(missing)
        pytest.skip(missing)
    root = tmp_path / "lab"
    root.mkdir()
    port = _free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
         f"--ServerApp.port={port}", "--ServerApp.ip=127.0.0.1",
         f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class="
         "jupyterlab.NeverCheckForUpdate"],
        cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "lab.log", "w"))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={TOKEN}", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("JupyterLab did not start:\n"
                                       + (tmp_path / "lab.log").read_text()[-3000:]) from None
                time.sleep(0.2)
        yield base, root
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


def _shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("GRAPH_DURABLE_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _thread_box(page: Any, thread_id: str) -> Any:
    """The box of one thread: the innermost widget box holding its header and button."""
    return (page.locator(".widget-vbox")
            .filter(has_text=f"Thread {thread_id}")
            .filter(has=page.get_by_role("button", name="Resume thread")).last)


def _card(thread: Any, call: str) -> Any:
    """The card of one pending call of a thread: the innermost box naming it."""
    return thread.locator(".widget-vbox").filter(has_text=call).filter(
        has=thread.page.get_by_role("button")).last


def test_a_person_answers_three_threads_in_the_browser(
    lab: tuple[str, Path], tmp_path: Path
) -> None:
    base, root = lab
    if os.environ.get("GRAPH_DURABLE_EXPECT_FLOOR"):  # make test-sweeps' floor run
        import ipywidgets

        assert ipywidgets.__version__ == "8.1.0", ipywidgets.__version__
    workdir = tmp_path / "agent"
    workdir.mkdir()
    _inbox_notebook(root, workdir)
    shots = _shots(tmp_path)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM,
                                    args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(WAIT_MS)
        try:
            page.goto(f"{base}/lab/tree/inbox.ipynb?token={TOKEN}")
            page.locator(".jp-Notebook").first.wait_for()
            page.get_by_text("Python 3 (ipykernel) | Idle").first.wait_for()
            page.get_by_role("menuitem", name="Run").click()
            page.get_by_text("Run All Cells", exact=True).click()
            page.get_by_text("3 thread(s) wait for a person").wait_for()
            page.screenshot(path=str(shots / "1-inbox.png"), full_page=True)

            acme = _thread_box(page, "invoice-1042")
            _card(acme, "call_pay").get_by_role("button", name="Approve").click()
            mail = FakeProvider(str(workdir / "mail.sqlite"), "blind")
            [sent] = [e for e in mail.effects() if e["payload"]["to"] == "billing@acme.example"]
            card = _card(acme, "call_mail")
            card.locator("textarea").fill(json.dumps(sent["receipt"]))
            card.get_by_role("button", name="Mark applied").click()

            globex = _thread_box(page, "invoice-1043")
            pay = _card(globex, "call_pay")
            cents = pay.locator("input[type=number]").first
            cents.fill("94000")
            cents.press("Enter")
            pay.get_by_role("button", name="Send edited").click()
            pay.get_by_text("cents: 98000 -> 94000").first.wait_for()

            initech = _thread_box(page, "invoice-1044")
            _card(initech, "call_mail").get_by_role("button", name="Retry").click()
            pay = _card(initech, "call_pay")
            pay.get_by_placeholder("message (reject, respond, skip)").fill(
                "Initech's invoice was paid by wire on Monday.")
            pay.get_by_role("button", name="Reject").click()
            page.screenshot(path=str(shots / "2-decided.png"), full_page=True)

            for thread in (acme, globex, initech):
                thread.get_by_role("button", name="Resume thread").click()
                thread.get_by_text("resumed").first.wait_for()
            page.screenshot(path=str(shots / "3-resumed.png"), full_page=True)
        except Exception:
            page.screenshot(path=str(shots / "failed.png"), full_page=True)
            raise
        finally:
            browser.close()

    payments = FakeProvider(str(workdir / "payments.sqlite"), "dedupe")
    paid = sorted((e["payload"]["invoice"], e["payload"]["cents"]) for e in payments.effects())
    assert paid == [("INV-1042", 125000), ("INV-1043", 94000)]
    emails = sorted(e["payload"]["to"] for e in FakeProvider(str(workdir / "mail.sqlite"),
                                                               "blind").effects())
    assert emails == ["ap@globex.example", "billing@acme.example", "finance@initech.example"]
