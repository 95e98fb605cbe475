"""What every benchmark needs: free ports, bus processes, the machine line, BENCHMARKS.md."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


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


def tune_as_the_app(gc_threshold: int | None) -> None:
    """The process-wide settings ``k8s-bridge run`` makes at start-up (bridge/service/app.py):
    the GC's young threshold (``informer.gcThreshold``, whose default is
    ``InformerSettings().gc_threshold``), the GIL's switch interval and glibc's mmap
    threshold (bridge/service/runtime.py)."""
    from bridge.service import gctune, runtime

    gctune.configure(gc_threshold)
    runtime.configure()


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
