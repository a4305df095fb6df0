"""The supported release range: pyproject's lower bounds are the floor `make test` runs
(`requirements/floor.txt`, in a second virtualenv), and that run really is on them."""

from __future__ import annotations

import os
import re
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _floor() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements" / "floor.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name] = version
    return pins


def _lower_bounds() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"]) + list(project["optional-dependencies"]["agents"])
    bounds = {}
    for spec in specs:
        found = re.match(r"([A-Za-z0-9_.\-\[\]]+)>=([0-9.]+)", spec)
        if found:
            bounds[found.group(1)] = found.group(2)
    return bounds


def test_the_floor_is_pyprojects_lower_bounds() -> None:
    floor, bounds = _floor(), _lower_bounds()
    for name in ("langgraph", "langchain-core", "langchain"):
        assert floor[name] == bounds[name], name


def test_the_installed_releases_are_in_the_supported_range() -> None:
    bounds = _lower_bounds()
    for name in ("langgraph", "langchain-core", "langchain"):
        installed = tuple(int(p) for p in metadata.version(name).split(".")[:3])
        assert installed >= tuple(int(p) for p in bounds[name].split(".")), name
    if os.environ.get("GRAPH_DURABLE_EXPECT_FLOOR"):  # set by `make test`'s floor run
        for name, version in _floor().items():
            assert metadata.version(name) == version, name
