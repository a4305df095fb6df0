"""The upstream-suite runner's verdict (`graph_durable.testing.upstream`), without
running the suites: every test whose outcome differs between the stock savers and ours
is listed, and only those outside the documented list fail the run."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from graph_durable.testing.upstream import fetch, run
from graph_durable.testing.upstream.known import KNOWN, known_reason
from graph_durable.testing.upstream.run import SUITES, Result, summarize


def _outcome(outcome: str, message: str = "") -> dict:
    return {"outcome": outcome, "message": message, "seconds": 0.5}


def test_a_divergence_outside_the_documented_list_fails_the_run() -> None:
    stock = {"tests/test_sync.py::test_search[pipe]": _outcome("passed"),
             "tests/test_sync.py::test_search[base]": _outcome("passed"),
             "tests/test_sync.py::test_both[base]": _outcome("failed", "boom")}
    ours = {"tests/test_sync.py::test_search[pipe]": _outcome("failed", "TypeError: pipe"),
            "tests/test_sync.py::test_search[base]": _outcome("passed"),
            "tests/test_sync.py::test_both[base]": _outcome("failed", "boom")}
    text, unexpected = summarize([Result("postgres", "3.2.0", stock, ours, 1.0)])
    assert unexpected == 1
    assert "DIVERGES: tests/test_sync.py::test_search[pipe]: stock passed, ours failed" in text
    assert "ours: TypeError: pipe" in text
    assert "(1 fail on both sides: not a divergence)" in text
    assert "postgres_pipe" in text  # the table row of the pipeline saver


def test_a_documented_divergence_is_shown_with_its_reason_and_passes() -> None:
    test = "tests/test_sqlite.py::TestSqliteSaver::test_informative_async_errors"
    reason = known_reason("sqlite", test)
    assert reason is not None and "By design" in reason
    assert known_reason("postgres", test) is None  # matched by suite and test
    text, unexpected = summarize([Result("sqlite", "3.1.2", {test: _outcome("passed")},
                                         {test: _outcome("failed")}, 1.0)])
    assert unexpected == 0
    assert f"known: {test}: stock passed, ours failed" in text and reason in text
    assert all(k.reason for k in KNOWN)


def test_a_divergence_is_run_again_and_one_that_does_not_reproduce_is_a_flake(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    flake, real = "tests/test_a.py::test_race[postgres_aio]", "tests/test_a.py::test_x[sqlite]"
    runs = [
        {"stock": {flake: _outcome("passed"), real: _outcome("passed")},
         "ours": {flake: _outcome("failed", "order"), real: _outcome("failed", "bug")}},
        {"stock": {flake: _outcome("passed"), real: _outcome("passed")},
         "ours": {flake: _outcome("passed"), real: _outcome("failed", "bug")}},
    ]
    asked: list[tuple[str, ...]] = []

    def run_both(suite, src, paths, out, name, deadline):
        asked.append(paths)
        return runs[len(asked) - 1]

    monkeypatch.setattr(run, "_run_both", run_both)
    monkeypatch.setattr(run, "installed", lambda dist: "1.0")
    monkeypatch.setattr(run, "unpacked_tests", lambda dist, version, cache: tmp_path)
    result = run.run_suite(SUITES[0], "ci", tmp_path, 60.0)
    assert asked[1] == (flake, real)  # only the diverging tests run again
    assert list(result.flaky) == [flake]
    text, unexpected = summarize([result])
    assert unexpected == 1
    assert f"flaky: {flake}: stock passed, ours failed" in text
    assert f"DIVERGES: {real}: stock passed, ours failed" in text


def test_a_cached_sdist_is_unpacked_without_its_package(tmp_path: Path) -> None:
    """Only `tests/` and `pyproject.toml` come out of the sdist (the package itself is
    imported from the environment), and no download is made when it is cached."""
    sdists = tmp_path / "sdists"
    sdists.mkdir()
    with tarfile.open(sdists / "langgraph_checkpoint_sqlite-9.9.9.tar.gz", "w:gz") as tar:
        for name in ("pyproject.toml", "tests/test_x.py", "langgraph/checkpoint/x.py"):
            data = b"x = 1\n"
            info = tarfile.TarInfo(f"langgraph_checkpoint_sqlite-9.9.9/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    src = fetch.unpacked_tests("langgraph-checkpoint-sqlite", "9.9.9", tmp_path)
    assert (src / "tests" / "test_x.py").is_file() and (src / "pyproject.toml").is_file()
    assert not (src / "langgraph").exists()
