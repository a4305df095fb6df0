"""The documentation site: every page its table of contents names exists, every page under
docs/ is in it once, and the examples a newcomer copies first run as written. No build
here; `make docs` builds the site strictly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_readme import run_first_block

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


class _Loader(yaml.SafeLoader):
    """Reads mkdocs.yml, whose `!!python/name:` tags (a fence's formatter) stay unresolved."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def _config() -> dict[str, Any]:
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)


def _pages(nav: Any) -> list[str]:
    """The files a nav names, in order (a title maps to a file or to a section's list)."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for entry in nav for page in _pages(entry)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _pages(value)]
    raise AssertionError(f"mkdocs.yml: unexpected nav entry {nav!r}")


def test_the_nav_names_pages_that_exist() -> None:
    config = _config()
    assert config["docs_dir"] == "docs"
    pages = _pages(config["nav"])
    missing = [page for page in pages if not (DOCS / page).is_file()]
    assert pages and not missing, f"mkdocs.yml's nav names files not under docs/: {missing}"


def test_every_page_is_in_the_nav_once() -> None:
    pages = _pages(_config()["nav"])
    on_disk = sorted(str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md"))
    left_out = sorted(set(on_disk) - set(pages))
    twice = sorted({page for page in pages if pages.count(page) > 1})
    assert not left_out, f"pages under docs/ missing from mkdocs.yml's nav: {left_out}"
    assert not twice, f"pages listed twice in mkdocs.yml's nav: {twice}"


def test_the_build_is_strict() -> None:
    """Warnings (a broken link or anchor, a docstring mkdocstrings cannot read) fail it."""
    config = _config()
    assert config["strict"] is True
    assert "mkdocs build --strict" in (ROOT / "Makefile").read_text()


@pytest.mark.parametrize("page", [
    "getting-started.md", "how-to/create-agent.md", "how-to/guarded-writes.md",
    "how-to/tools-you-do-not-own.md"])
def test_the_first_example_of_a_page_runs_as_written(page: str, tmp_path: Path) -> None:
    run_first_block((DOCS / page).read_text(), tmp_path, page)
