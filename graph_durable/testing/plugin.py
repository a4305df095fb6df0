"""pytest plugin: the `crash_matrix` fixture and the `--crash-matrix` option.

Installed with graph-durable (entry point `pytest11`), so a project's tests can write:

    @pytest.mark.crash_matrix
    def test_my_agent_survives_every_crash(crash_matrix):
        report = crash_matrix("myapp.scenarios:build_agent", {"mode": "lookup"}, pairs=True)
        assert report.duplicates == 0      # already checked: the fixture fails on not-ok

- The fixture is a callable taking `graph_durable.testing.crash.crash_matrix`'s
  arguments. Each sweep runs in its own folder under the test's `tmp_path`. Unless
  `check=False`, a report that is not ok fails the test with the table and the
  differences of every failing crash point; the report is returned either way.
- Tests marked `crash_matrix` are skipped unless pytest runs with `--crash-matrix`: a
  sweep starts two or more processes per fault point, too slow for every test run.
  The fixture itself works in any test, marked or not.
- `--crash-matrix-workers N` runs N crash points at once (each is its own process and
  folder); a `workers=` argument wins.
- `-p no:graph_durable` disables the plugin.

The sweep machinery is imported when the fixture is first used; loading the plugin
imports only pytest and the `graph_durable` package it lives in.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from graph_durable.testing.crash.matrix import CrashReport

__all__ = ["crash_matrix", "pytest_addoption", "pytest_collection_modifyitems",
           "pytest_configure"]

MARKER = "crash_matrix"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add `--crash-matrix` and `--crash-matrix-workers`."""
    group = parser.getgroup("graph_durable", "graph_durable crash sweeps")
    group.addoption("--crash-matrix", action="store_true", default=False,
                    help="run tests marked crash_matrix (skipped otherwise)")
    group.addoption("--crash-matrix-workers", type=int, default=1, metavar="N",
                    help="crash points run at once by the crash_matrix fixture (default 1)")


def pytest_configure(config: pytest.Config) -> None:
    """Register the `crash_matrix` marker."""
    config.addinivalue_line(
        "markers",
        f"{MARKER}: sweeps crash points in real processes; runs only with --crash-matrix",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked `crash_matrix` unless `--crash-matrix` is given."""
    if config.getoption("--crash-matrix"):
        return
    skip = pytest.mark.skip(reason="crash matrix sweep: run pytest with --crash-matrix")
    for item in items:
        if item.get_closest_marker(MARKER) is not None:
            item.add_marker(skip)


@pytest.fixture
def crash_matrix(request: pytest.FixtureRequest,
                 tmp_path: Path) -> Callable[..., CrashReport]:
    """Run `graph_durable.testing.crash.crash_matrix` in `tmp_path`; fail if not ok.

    Call it as `crash_matrix(scenario, kwargs=None, *, check=True, **options)`.
    """
    from graph_durable.testing.crash.matrix import crash_matrix as sweep

    workers = request.config.getoption("--crash-matrix-workers")
    count = 0

    def run(scenario: str, kwargs: dict[str, Any] | None = None, *, check: bool = True,
            **options: Any) -> CrashReport:
        nonlocal count
        count += 1
        options.setdefault("workers", workers)
        options.setdefault("directory", tmp_path / f"crash-matrix-{count}")
        report = sweep(scenario, kwargs, **options)
        if check and not report.ok:
            pytest.fail(report.render(), pytrace=False)
        return report

    return run
