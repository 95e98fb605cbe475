"""``k8s-bridge demo`` on a terminal: events scroll by, Ctrl-C stops it with a summary.

The demo runs under a pseudo-terminal as a person would run it (line
buffering, console logging), and SIGINT is what Ctrl-C sends.
"""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

EVENT_LINE = re.compile(r"^(ADDED|MODIFIED|DELETED)\s+(Pod|Deployment|Node|Widget)\s+\S+\s+rv=\d+")
SUMMARY = re.compile(
    r"--- [\d.]+s: (\d+) changes made, (\d+) events published, "
    r"(\d+) updates suppressed as no real change ---"
)


class Terminal:
    """A child process on a pty; reads what it prints, with bounded waits."""

    def __init__(self, *args: str) -> None:
        env = dict(os.environ)
        env.pop("KUBECONFIG", None)
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bridge.cli", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            close_fds=True,
        )
        os.close(slave)
        self.buffer = b""

    def read_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.master], [], [], min(left, 0.2))
            if not ready:
                if self.proc.poll() is not None:
                    return
                continue
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: the child closed the terminal
                return
            if not chunk:
                return
            self.buffer += chunk

    def wait_for(self, pattern: re.Pattern[str], seconds: float) -> re.Match[str]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            match = pattern.search(self.text)
            if match:
                return match
            self.read_for(0.2)
            if self.proc.poll() is not None:
                self.read_for(0.5)
                match = pattern.search(self.text)
                if match:
                    return match
                raise AssertionError(f"demo exited with {self.proc.returncode}:\n{self.text}")
        raise AssertionError(f"{pattern.pattern!r} not printed in {seconds}s:\n{self.text[-3000:]}")

    @property
    def text(self) -> str:
        return self.buffer.decode(errors="replace").replace("\r\n", "\n")

    def lines(self) -> list[str]:
        return self.text.splitlines()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self.master)


def test_demo_prints_events_and_stops_on_ctrl_c_with_a_summary() -> None:
    term = Terminal("demo", "--rate", "20")
    try:
        term.wait_for(re.compile(r"k8s-bridge demo: emulated API at http://127\.0\.0\.1:\d+"), 15)
        # The initial list, then live changes from the churn.
        term.wait_for(re.compile(r"^ADDED\s+Pod\s+.*\(initial list\)", re.M), 15)
        term.wait_for(re.compile(r"^(MODIFIED|ADDED|DELETED)\s+\w+\s+\S+\s+rv=\d+$", re.M), 15)
        term.read_for(1.0)
        term.proc.send_signal(signal.SIGINT)
        code = term.proc.wait(15)
        term.read_for(0.5)
    finally:
        term.close()
    lines = term.lines()
    assert code == 0, term.text[-3000:]
    assert "Traceback" not in term.text, term.text[-3000:]
    events = [line for line in lines if EVENT_LINE.match(line)]
    live = [line for line in events if "(initial list)" not in line]
    assert any("(initial list)" in line for line in events)
    assert live, "no live change printed"
    summary = SUMMARY.search(term.text)
    assert summary is not None, term.text[-3000:]
    made, published, _suppressed = (int(g) for g in summary.groups())
    assert made > 0
    # Every printed event is counted in the summary, and nothing printed after it.
    assert published == len(events), (published, len(events))
    after = [line for line in term.text[summary.end() :].splitlines() if line.strip()]
    assert after and all(re.match(r"^\s+\w+ \w+\s+\d+$", line) for line in after), after
    assert sum(int(line.split()[-1]) for line in after) == published


def test_demo_with_duration_stops_by_itself() -> None:
    term = Terminal("demo", "--duration", "3", "--rate", "10")
    started = time.monotonic()
    try:
        term.wait_for(SUMMARY, 25)
        code = term.proc.wait(10)
        term.read_for(0.3)
    finally:
        term.close()
    elapsed = time.monotonic() - started
    assert code == 0, term.text[-3000:]
    assert 3 <= elapsed < 20, elapsed
    assert any(EVENT_LINE.match(line) for line in term.lines())
