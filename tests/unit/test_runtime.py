"""Process-wide runtime settings: made once at start-up, each with the effect it is for."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bridge.service import runtime

ROOT = Path(__file__).resolve().parents[2]


def test_configure_sets_the_switch_interval() -> None:
    before = sys.getswitchinterval()
    try:
        tuning = runtime.configure()
        assert sys.getswitchinterval() == pytest.approx(runtime.SWITCH_INTERVAL)
        assert tuning.switch_interval == pytest.approx(runtime.SWITCH_INTERVAL)
    finally:
        sys.setswitchinterval(before)


# Large blocks, freed while small long-lived ones sit between them, as a list's body
# buffers and a commit's rows sit between cache records. Prints the MiB the process
# gave back when the large ones were freed.
_FREED_LARGE_BLOCKS = textwrap.dedent(
    """
    import sys

    if sys.argv[1] == "configured":
        from bridge.service import runtime

        assert runtime.configure().mmap_threshold == runtime.MMAP_THRESHOLD


    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096


    once = bytearray(4 << 20)  # mapped on its own; its free raises glibc's threshold
    del once
    large, small = [], []
    for _ in range(60):
        large.append(bytearray(700 << 10))  # above the threshold the bridge sets
        small.append(bytearray(600))
    before = rss()
    del large
    print((before - rss()) >> 20)
    """
)


def _printed_by(script: str, mode: str) -> int:
    # A process of its own: the thresholds are process-wide and move with its history.
    out = subprocess.run(
        [sys.executable, "-c", script, mode],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return int(out.stdout)


def _given_back(mode: str) -> int:
    return _printed_by(_FREED_LARGE_BLOCKS, mode)


needs_mallopt = pytest.mark.skipif(
    runtime.c_function("mallopt") is None or not sys.platform.startswith("linux"),
    reason="glibc's mallopt",
)


@needs_mallopt
def test_large_blocks_go_back_to_the_os_when_freed() -> None:
    """42 MB of 700 KiB blocks: with glibc's moving threshold they came from the heap
    and stayed with the process once freed; with the threshold fixed, they go back."""
    assert runtime.MMAP_THRESHOLD < 700 << 10
    assert _given_back("default") < 10
    assert _given_back("configured") >= 37


# 20 MB through a socket read by an asyncio transport, which reads into a new
# 256 KiB buffer each time; prints the page faults the process took meanwhile.
_SOCKET_READS = textwrap.dedent(
    """
    import asyncio, resource, socket, sys, threading

    from bridge.service import runtime

    if sys.argv[1] == "configured":
        runtime.configure()
    else:
        runtime.c_function("mallopt")(-3, 128 << 10)  # M_MMAP_THRESHOLD at glibc's initial
    TOTAL = 200 * (100 << 10)


    async def main():
        ours, theirs = socket.socketpair()
        done = asyncio.Event()
        received = 0

        class Reader(asyncio.Protocol):
            def data_received(self, data):
                nonlocal received
                received += len(data)
                if received >= TOTAL:
                    done.set()

        await asyncio.get_running_loop().connect_accepted_socket(Reader, ours)
        chunk = b"x" * (100 << 10)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        writer = threading.Thread(target=lambda: [theirs.sendall(chunk) for _ in range(200)])
        writer.start()
        await done.wait()
        print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        writer.join()


    asyncio.run(main())
    """
)


def _faults_reading(mode: str) -> int:
    return _printed_by(_SOCKET_READS, mode)


@needs_mallopt
def test_blocks_made_for_every_socket_read_come_from_the_heap_not_fresh_pages() -> None:
    """Below the threshold, each read's 256 KiB buffer was a mapping of its own, its
    pages faulted in as the kernel filled them (~5,000 faults for 20 MB); at the
    bridge's threshold they come from the heap, already faulted in."""
    assert runtime.MMAP_THRESHOLD > 256 << 10
    at_128k, configured = _faults_reading("128k"), _faults_reading("configured")
    assert at_128k > 2_000
    assert configured < at_128k / 5
