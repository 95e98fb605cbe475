"""What every benchmark needs: free ports, bus processes, the machine line, BENCHMARKS.md."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bridge.service.tuning import Tuning


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"port {port} did not open")


@contextlib.contextmanager
def process(cmd: list[str], port: int) -> Iterator[None]:
    """Run ``cmd`` (a bus) until the block ends; ready once ``port`` accepts connections."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def tune_as_run() -> Tuning:
    """Tune this process as ``k8s-bridge run`` does with the default configuration
    (bridge/service/tuning.py), less the settings named in ``$BENCH_TUNING_OFF``
    (comma-separated field names of ``Tuning``, or ``all``): how each setting's gain
    is measured. Returns what took effect."""
    from bridge.service import tuning
    from bridge.service.settings import InformerSettings

    wanted = tuning.Tuning.for_run(InformerSettings())
    off = {n.strip() for n in os.environ.get("BENCH_TUNING_OFF", "").split(",") if n.strip()}
    if off == {"all"}:
        wanted = tuning.Tuning()
    elif off:
        wanted = wanted.without(off)
    applied = tuning.apply(wanted)
    print(f"  process tuning: {applied}", file=sys.stderr)
    return applied


def compile_bridge(tree: str | Path) -> None:
    """Byte-compile ``tree``'s bridge package into its (git-ignored) ``__pycache__``, as
    pip compiles the wheel the image installs: a bridge measured from bare sources
    would compile its modules at start and keep ~3 MiB of the compiler's leftovers."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(Path(tree) / "bridge")],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


# Where every benchmark writes its section.
BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"


# Below this line (or a section's first ``###`` heading), a section of BENCHMARKS.md is
# written by hand: re-running its benchmark keeps it.
NOTES_MARK = "<!-- notes: kept when the benchmark rewrites this section -->"


def update_benchmarks_md(path: Path, section: str, body: str) -> None:
    """Replace (or append) the measured part of one ``## section`` of BENCHMARKS.md,
    leaving the other sections alone.

    What was written by hand under a section (earlier runs, what moved a
    figure, experiments) is kept: it follows a ``NOTES_MARK`` line or starts
    at the section's first ``###`` heading, and a new run replaces only what
    comes before it.
    """
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"## {section}\n\n{body.rstrip()}\n"
    pattern = re.compile(
        rf"^## {re.escape(section)}\n.*?(?=^{re.escape(NOTES_MARK)}$|^### |^## |\Z)", re.S | re.M
    )
    if pattern.search(text):
        text = pattern.sub(lambda _: block + "\n", text, count=1).rstrip() + "\n"
    else:
        text = text.rstrip() + "\n\n" + block
    path.write_text(text)
