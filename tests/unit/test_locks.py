"""The locks in requirements/ pin what pyproject.toml asks for, and agree with each other.

``make demo``, ``make test`` and the image install from the locks, never from
the ranges: a range changed without ``make lock`` would go on installing the old
pins unnoticed. These fail first.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# What CI and the image run, and what `make lock` resolves for.
TARGET = {"python_version": "3.11", "sys_platform": "linux", "platform_machine": "x86_64"}
PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)(?P<hashes>.*)$")


def entries(lock: str) -> list[str]:
    """The requirement lines of a lock, continuation lines joined, comments dropped."""
    text = (ROOT / "requirements" / lock).read_text().replace("\\\n", " ")
    return [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]


def pins(lock: str) -> dict[NormalizedName, Version]:
    out = {}
    for entry in entries(lock):
        found = PIN.match(entry)
        assert found, f"{lock}: not an exact pin: {entry}"
        out[canonicalize_name(found["name"])] = Version(found["version"])
    return out


def wanted(requirements: list[str]) -> list[Requirement]:
    reqs = [Requirement(r) for r in requirements]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(TARGET)]


@pytest.mark.parametrize("lock", ["runtime.txt", "dev.txt"])
def test_every_package_is_pinned_with_its_hashes(lock: str) -> None:
    for entry in entries(lock):
        found = PIN.match(entry)
        assert found and "--hash=sha256:" in found["hashes"], f"{lock}: {entry}"


def test_the_runtime_lock_pins_the_dependencies_within_their_ranges() -> None:
    runtime = pins("runtime.txt")
    for req in wanted(PROJECT["dependencies"]):
        name = canonicalize_name(req.name)
        assert name in runtime, f"{req} is not in requirements/runtime.txt: make lock"
        assert req.specifier.contains(runtime[name], prereleases=True), (
            f"{req}: locked at {runtime[name]}: make lock"
        )


def test_the_dev_lock_pins_the_dev_extras_within_their_ranges() -> None:
    dev = pins("dev.txt")
    for req in wanted(PROJECT["dependencies"] + PROJECT["optional-dependencies"]["dev"]):
        name = canonicalize_name(req.name)
        assert name in dev, f"{req} is not in requirements/dev.txt: make lock"
        assert req.specifier.contains(dev[name], prereleases=True), (
            f"{req}: locked at {dev[name]}: make lock"
        )


def test_the_dev_lock_installs_on_top_of_the_runtime_lock_without_changing_it() -> None:
    runtime, dev = pins("runtime.txt"), pins("dev.txt")
    assert {name: dev.get(name) for name in runtime} == runtime


def test_the_runtime_lock_leaves_the_test_tooling_out() -> None:
    """`make demo` and the image install the runtime lock: no pytest, ruff or mypy in them."""
    runtime = pins("runtime.txt")
    dev_only = {canonicalize_name(r.name) for r in wanted(PROJECT["optional-dependencies"]["dev"])}
    dev_only -= {canonicalize_name(r.name) for r in wanted(PROJECT["dependencies"])}
    assert dev_only and not dev_only & runtime.keys()
