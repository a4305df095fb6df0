"""Fetch the sdists of the installed LangGraph packages and unpack their tests.

`pip download --no-deps --no-binary :all: NAME==VERSION` fetches the source
distribution of exactly the installed version from the package index; it is kept in
`CACHE/sdists/` and only its `tests/` folder and `pyproject.toml` (the suite's pytest
settings) are unpacked, into `CACHE/src/NAME-VERSION/`: the package itself is imported
from the environment, not from the sdist.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
from importlib.metadata import version as installed_version
from pathlib import Path

__all__ = ["installed", "unpacked_tests"]


def installed(dist: str) -> str:
    """The installed version of `dist` (raises if it is not installed)."""
    return installed_version(dist)


def _norm(dist: str) -> str:
    return re.sub(r"[-_.]+", "_", dist).lower()


def _find(dist: str, version: str, sdists: Path) -> Path | None:
    for path in sorted(sdists.glob("*.tar.gz")):
        name, _, ver = path.name[: -len(".tar.gz")].rpartition("-")
        if ver == version and _norm(name) == _norm(dist):
            return path
    return None


def _sdist(dist: str, version: str, sdists: Path) -> Path:
    found = _find(dist, version, sdists) if sdists.is_dir() else None
    if found is not None:
        return found
    sdists.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
           "--no-binary", ":all:", "--dest", str(sdists), f"{dist}=={version}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"could not download the sdist of {dist}=={version} from the package index "
            f"(pip download exited {done.returncode}):\n{done.stderr[-2000:]}")
    found = _find(dist, version, sdists)
    if found is None:
        raise RuntimeError(f"pip download of {dist}=={version} left no sdist in {sdists}")
    return found


def unpacked_tests(dist: str, version: str, cache: Path) -> Path:
    """The folder holding `tests/` and `pyproject.toml` of `dist`'s sdist at `version`."""
    dest = cache / "src" / f"{_norm(dist)}-{version}"
    if (dest / ".complete").exists():
        return dest
    archive = _sdist(dist, version, cache / "sdists")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            parts = member.name.split("/", 1)
            if len(parts) < 2 or not (parts[1] == "pyproject.toml"
                                      or parts[1].startswith("tests/")):
                continue
            member.name = parts[1]
            members.append(member)
        tar.extractall(dest, members=members, filter="data")
    (dest / ".complete").write_text(archive.name + "\n")
    return dest
