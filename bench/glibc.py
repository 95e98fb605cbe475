"""``python -m bench glibc``: what the C-heap settings of ``k8s-bridge run`` do, in isolation.

Each row runs a small script in a fresh process (the settings are process-wide
and move with the process's history), once on glibc's defaults and once tuned
as ``k8s-bridge run`` tunes (bridge/service/tuning.py):

- *large blocks freed* (the figure moves with the process's history): one 4 MiB block freed (which raises glibc's moving mmap
  threshold), then 60 blocks of 700 KiB with small long-lived ones between
  them; MiB handed back to the OS when the large ones are freed;
- *socket reads*: 20 MB through a socket read by an asyncio transport, which
  reads into a new 256 KiB buffer each time; minor page faults meanwhile
  (glibc's default against its initial 128 KiB threshold, which the moving
  threshold starts from);
- *free pages after a sync*: 90 MB of event-sized bytes freed with every
  hundredth kept (it pins the heap as long-lived objects do); MiB of RSS the
  after-sync step (``malloc_trim``) hands back.

These show the mechanism; whether it is worth a setting is the end-to-end
benchmarks' answer (BENCHMARKS.md, "Process tuning").
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_PRELUDE = textwrap.dedent(
    """
    import ctypes, sys

    # Nothing imported on glibc's defaults: the first row's figure moves with the
    # process's history, and importing a logging library alone took it from 0 to 40 MiB.
    if sys.argv[1] == "tuned":
        from bridge.service import tuning
        from bridge.service.settings import InformerSettings

        tuning.apply(tuning.Tuning.for_run(InformerSettings()))


    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096
    """
)

_LARGE_BLOCKS = textwrap.dedent(
    """
    once = bytearray(4 << 20)  # mapped on its own; its free raises glibc's threshold
    del once
    large, small = [], []
    for _ in range(60):
        large.append(bytearray(700 << 10))
        small.append(bytearray(600))
    before = rss()
    del large
    print((before - rss()) / 2**20)
    """
)

_SOCKET_READS = textwrap.dedent(
    """
    import asyncio, resource, socket, threading

    if sys.argv[1] != "tuned":
        ctypes.CDLL(None).mallopt(-3, 128 << 10)  # M_MMAP_THRESHOLD at glibc's initial
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

_FREE_PAGES = textwrap.dedent(
    """
    blocks = [bytes(3_000) + bytes([i % 256]) for i in range(30_000)]
    kept = blocks[::100]
    del blocks
    before = rss()
    if sys.argv[1] == "tuned":
        tuning.applied().after_first_sync()
    print((before - rss()) / 2**20)
    """
)

ROWS = {
    "large blocks freed: MiB handed back": _LARGE_BLOCKS,
    "socket reads of 20 MB: page faults": _SOCKET_READS,
    "free pages after a sync: MiB handed back": _FREE_PAGES,
}


def _run(script: str, mode: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _PRELUDE + script, mode],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return float(out.stdout.split()[-1])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench glibc", description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if not sys.platform.startswith("linux"):
        print("  glibc's settings: Linux only")
        return 0
    print("| what | glibc's defaults | tuned as `k8s-bridge run` |")
    print("| --- | ---: | ---: |")
    for label, script in ROWS.items():
        default = [_run(script, "default") for _ in range(args.rounds)]
        tuned = [_run(script, "tuned") for _ in range(args.rounds)]
        print(
            f"| {label} | {', '.join(f'{v:,.0f}' for v in default)}"
            f" | {', '.join(f'{v:,.0f}' for v in tuned)} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
