"""Three process-wide defaults of the runtime that a bridge changes once, at start-up.

**The GIL's switch interval.** The SQLite checkpoint store writes in a worker
thread (sqlite3 blocks). While the event loop's thread parses and decides
events, that worker needs the GIL to start a write and again to hand back its
result, and the loop's thread lets go of it only when the interval expires:
5 ms by default. A write-ahead of a few hundred rows, 1-2 ms of SQLite work,
then took 47 ms at the median during a 100k-pod first sync (88 ms at p90);
the writer was busy for 13 of the sync's 14 s, and decided events piled up
behind it to ``max_pending`` (~6 MB of encoded Pods) half of the time. At
0.5 ms the median was 6 ms and the events waiting stayed mostly under 512.

**glibc's mmap threshold.** A block of 128 KiB or more gets a mapping of its
own, returned to the OS when freed. But each time such a block is freed, glibc
raises the threshold to its size (up to 32 MiB), so later blocks of that size
come from the heap, between small long-lived ones, and the pages they leave
stay with the process. Setting the threshold once turns that off at its
initial 128 KiB; the blocks concerned (buffers of a list's body, of a commit's
rows, dict tables of many keys) come and go a few thousand times in a 100k-pod
sync, each an mmap and a munmap. A 100k-pod first sync ended with 8-10 MiB less
in the process (bench slowbus).

**asyncio's socket read size.** A socket transport reads with
``recv(max_size)``, 256 KiB, into a new ``bytes`` of that size, shrunk to what
arrived (TLS: each decrypted read, the same way). With the threshold fixed,
each of those buffers is a mapping of its own: every read of the watch stream
or of the bus's acks mapped fresh pages, faulted in as the kernel copied into
them, and unmapped them after. During a burst of updates through NATS that was
3.2-3.8 page faults per event on the event loop's thread, at 1-2 µs each on a
virtual machine; at 64 KiB the buffers come from the heap, already faulted in:
1.2-1.5 per event (0.8-0.9 once the NATS sink stopped joining each batch into
one buffer, bridge/sinks/nats.py). A read takes what has arrived; a burst's
reads averaged ~110 KB, so some now take two.
"""

from __future__ import annotations

import ctypes
import sys
from asyncio import selector_events, sslproto
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "MMAP_THRESHOLD",
    "SOCKET_READ_SIZE",
    "SWITCH_INTERVAL",
    "Tuning",
    "c_function",
    "configure",
]

SWITCH_INTERVAL = 0.0005
MMAP_THRESHOLD = 128 << 10
# Below MMAP_THRESHOLD, so a read's buffer comes from the heap.
SOCKET_READ_SIZE = 64 << 10

_M_MMAP_THRESHOLD = -3  # glibc's malloc.h


@dataclass(frozen=True, slots=True)
class Tuning:
    """What ``configure`` set: the switch interval, the mmap threshold or None
    where the C library has no such setting (musl, macOS), and asyncio's socket
    read size or None where the event loop is not asyncio's own (uvloop)."""

    switch_interval: float
    mmap_threshold: int | None
    socket_read_size: int | None = None


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
    """Set all three, for the whole process; returns what was set."""
    sys.setswitchinterval(SWITCH_INTERVAL)
    mallopt = c_function("mallopt")
    # mallopt returns 1 on success; musl has the symbol and ignores the call.
    fixed = mallopt is not None and mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    return Tuning(
        sys.getswitchinterval(), MMAP_THRESHOLD if fixed else None, _set_socket_read_size()
    )


def _set_socket_read_size() -> int | None:
    """asyncio's read size for every socket transport (a class attribute each reads
    per ``recv``) and for TLS (its decrypted reads), or None where it has neither."""
    classes = [
        getattr(selector_events, "_SelectorSocketTransport", None),
        getattr(sslproto, "SSLProtocol", None),
    ]
    found = [c for c in classes if isinstance(getattr(c, "max_size", None), int)]
    for cls in found:
        cls.max_size = SOCKET_READ_SIZE  # type: ignore[union-attr]
    return SOCKET_READ_SIZE if found else None
