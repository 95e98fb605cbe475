"""The Makefile's first-run paths, read with ``make -n`` against a virtualenv that does not exist.

``make demo`` on a fresh machine must install the runtime only (issue 9: a
15-second first demo spent its time installing the test tooling); ``make
test`` must still install everything it needs from a fresh clone, as CI does.
Both install from the locks (issue 24): every package that comes from PyPI is
named, with its hashes, in ``requirements/``; the project goes on top without
dependencies.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")


def dry_run(target: str, venv: Path, *flags: str) -> list[str]:
    """The commands ``make TARGET`` would run with VENV (one that does not exist: a fresh checkout)."""
    # Run from `make test` itself, make's flags and level would leak in: start clean.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", *flags, target, f"VENV={venv}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return done.stdout.splitlines()


def installs(commands: list[str]) -> list[str]:
    return [c for c in commands if " pip install " in c]


def from_a_lock_or_the_project(command: str) -> bool:
    _, _, args = command.partition(" pip install ")
    return args.startswith("-q --require-hashes -r requirements/") or args == "-q --no-deps -e ."


def test_make_demo_from_scratch_installs_the_runtime_only(tmp_path: Path) -> None:
    commands = dry_run("demo", tmp_path / "venv")
    pip = f"{tmp_path}/venv/bin/python -m pip install -q"
    assert installs(commands) == [
        f"{pip} --require-hashes -r requirements/runtime.txt",
        f"{pip} --no-deps -e .",
    ]
    assert commands[-1] == f"{tmp_path}/venv/bin/k8s-bridge demo"


def test_make_test_from_scratch_installs_the_dev_lock_before_running_anything(
    tmp_path: Path,
) -> None:
    commands = dry_run("test", tmp_path / "venv")
    steps = installs(commands)
    assert any("-r requirements/dev.txt" in c for c in steps)
    assert all(from_a_lock_or_the_project(c) for c in steps), steps
    first_check = next(i for i, c in enumerate(commands) if "/bin/ruff check" in c)
    last_install = max(i for i, c in enumerate(commands) if " pip install " in c)
    assert last_install < first_check


def test_a_changed_lock_reinstalls_what_it_pins(tmp_path: Path) -> None:
    """A virtualenv installed before a lock changed takes the lock's versions on the next run."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    for stamp in (".runtime", ".installed"):
        (venv / "bin" / stamp).touch()
    assert installs(dry_run("lint", venv)) == []
    pip = f"{venv}/bin/python -m pip install -q"
    assert installs(dry_run("lint", venv, "-W", "requirements/dev.txt")) == [
        f"{pip} --require-hashes -r requirements/dev.txt"
    ]
    assert installs(dry_run("lint", venv, "-W", "requirements/runtime.txt")) == [
        f"{pip} --require-hashes -r requirements/runtime.txt",
        f"{pip} --no-deps -e .",
        f"{pip} --require-hashes -r requirements/dev.txt",
    ]
