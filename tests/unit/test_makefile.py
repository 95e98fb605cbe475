"""The Makefile's first-run paths, read with ``make -n`` against a virtualenv that does not exist.

``make demo`` on a fresh machine must install the runtime only (issue 9: a
15-second first demo spent its time installing the test tooling); ``make
test`` must still install everything it needs from a fresh clone, as CI does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")


def dry_run(target: str, venv: Path) -> list[str]:
    """The commands ``make TARGET`` would run for a checkout without a virtualenv."""
    # Run from `make test` itself, make's flags and level would leak in: start clean.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", target, f"VENV={venv}"],
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


def test_make_demo_from_scratch_installs_the_runtime_only(tmp_path: Path) -> None:
    commands = dry_run("demo", tmp_path / "venv")
    assert installs(commands) == [f"{tmp_path}/venv/bin/python -m pip install -q -e ."]
    assert commands[-1] == f"{tmp_path}/venv/bin/k8s-bridge demo"


def test_make_test_from_scratch_installs_the_dev_extras_before_running_anything(
    tmp_path: Path,
) -> None:
    commands = dry_run("test", tmp_path / "venv")
    steps = installs(commands)
    assert any("-e '.[dev]'" in c for c in steps)
    first_check = next(i for i, c in enumerate(commands) if "/bin/ruff check" in c)
    last_install = max(i for i, c in enumerate(commands) if " pip install " in c)
    assert last_install < first_check
