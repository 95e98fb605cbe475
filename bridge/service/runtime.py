"""Two process-wide defaults of the runtime that a bridge changes once, at start-up.

**The GIL's switch interval.** The SQLite checkpoint store writes in a worker
thread (sqlite3 blocks). While the event loop's thread parses and decides
events, that worker needs the GIL to start a write and again to hand back its
result, and the loop's thread lets go of it only when the interval expires:
5 ms by default. A write-ahead of a few hundred rows, 1-2 ms of SQLite work,
then took 47 ms at the median during a 100k-pod first sync (88 ms at p90);
the writer was busy for 13 of the sync's 14 s, and decided events piled up
behind it to ``max_pending`` (~6 MB of encoded Pods) half of the time. At
0.5 ms the median was 6 ms and the events waiting stayed mostly under 512.

**glibc's mmap threshold.** A block at or above the threshold gets a mapping
of its own, returned to the OS when freed. But each time such a block is
freed, glibc raises the threshold to its size (up to 32 MiB), so later blocks
of that size come from the heap, between small long-lived ones, and the pages
they leave stay with the process. Setting the threshold once turns that off;
the large blocks (buffers of a list's body, dict tables of many keys) come and
go a few thousand times in a 100k-pod sync. Fixed at glibc's initial 128 KiB, a
100k-pod first sync ended with 8-10 MiB less in the process (bench slowbus).

Fixed at 512 KiB instead: a mapping of its own is fresh pages, faulted in one
by one as they are first written (1-2 µs each on a virtual machine), and some
blocks between 128 and 512 KiB are made for every few events: asyncio reads a
socket into a new 256 KiB buffer (then shrunk to what arrived), and aiokafka
encodes a produce request (a few 64 KiB batches) through nested joins, each a
new buffer of the request's size. During a burst of updates the event loop's
thread took 2.4-3.3 page faults per event through Kafka and 2.2-2.7 through
NATS at 128 KiB; 0.8-0.9 through either at 512 KiB, most of them the API
server emulator's own (bench e2e runs it in the same process), and the loop's
CPU per Kafka event went from 66-73 µs to 57-63. A 100k-pod first sync peaks
where it did (bench slowbus, with the trim threshold below: 293 / 268 / 275 /
245 B per object, steady 188-210 B; 294 / 268 / 269 / 246 B and 191-208 B at
128 KiB the day before; runs differ by up to ±12 B).

Fixing one threshold also fixes the other: the heap's free top is handed back
to the OS once it exceeds 128 KiB, and a 256 KiB buffer freed at the top of the
heap was handed back and faulted in again by the next read (1,700 faults for 20
MB read through a socket, against 5,100 with the threshold at 128 KiB). glibc
keeps twice the mmap threshold when it moves it itself; so does this, and the
same 20 MB took 70 faults. It holds at most 1 MiB more at the top of the heap.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "MMAP_THRESHOLD",
    "SWITCH_INTERVAL",
    "TRIM_THRESHOLD",
    "Tuning",
    "c_function",
    "configure",
]

SWITCH_INTERVAL = 0.0005
MMAP_THRESHOLD = 512 << 10
# Twice the mmap threshold, as glibc sets it whenever it moves that threshold itself.
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD

# glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


@dataclass(frozen=True, slots=True)
class Tuning:
    """What ``configure`` set: the switch interval, and the mmap threshold or None
    where the C library has no such setting (musl, macOS)."""

    switch_interval: float
    mmap_threshold: int | None


def c_function(name: str) -> Callable[..., int] | None:
    """The C library's function ``name``, or None where it has none (glibc's
    ``mallopt`` and ``malloc_trim`` on musl or macOS).

    Looked up among the symbols the interpreter already has loaded (its C
    library's among them), so nothing is searched for on disk.
    """
    try:
        function: Callable[..., int] = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    return function


def configure() -> Tuning:
    """Set both, for the whole process; returns what was set."""
    sys.setswitchinterval(SWITCH_INTERVAL)
    mallopt = c_function("mallopt")
    # mallopt returns 1 on success; musl has the symbol and ignores the call.
    fixed = mallopt is not None and mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    if fixed and mallopt is not None:
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    return Tuning(sys.getswitchinterval(), MMAP_THRESHOLD if fixed else None)
