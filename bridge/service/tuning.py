"""The process-wide settings ``k8s-bridge run`` makes, once, before the app starts.

They change the interpreter and the C library for the whole process, so nothing
else in the package makes them: an app built by a test or a benchmark runs on
the interpreter's defaults unless it applies a ``Tuning`` itself. Each setting
is here for the end-to-end gain it earns, measured with one setting off at a
time (BENCHMARKS.md, "Process tuning", with the commands); what earned less
than 5% is not set.

**The cyclic GC's young threshold** (``informer.gcThreshold``). At CPython's
700 a collection runs every 700 net allocations of containers, and most of
what it walks either lives on or dies by reference counting. The gain shows in
``bench e2e`` (the bus client and the API emulator share the process), not in
the bridge's own path alone (``bench inprocess``, ``bench slowbus``): it may be
the clients' or the emulator's.

**The GIL's switch interval.** The SQLite checkpoint store writes in a worker
thread; the event loop's thread, busy deciding events, lets go of the GIL only
when the interval expires (5 ms by default), and each write waits for it twice,
while decided events pile up behind it. At 0.5 ms a first sync runs faster.

**glibc's mmap threshold.** Left to glibc, it rises to the size of each large
block freed, and later blocks of that size (list chunks, socket reads, produce
requests) come from the heap, between long-lived small ones, where their pages
stay with the process: a first sync peaks higher. Fixed, such blocks are mapped
and unmapped. The trim threshold goes with it, at twice, as glibc would set it.

**Free pages handed back after the first sync** (``informer.gcFreeze``). What
the first sync's transient buffers left free in the C heap stays with the
process until glibc is asked (``malloc_trim``); asked once, the steady state
holds less.
"""

from __future__ import annotations

import ctypes
import gc
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from bridge.logging import get_logger

if TYPE_CHECKING:
    from bridge.service.settings import InformerSettings

log = get_logger(__name__)

__all__ = ["MMAP_THRESHOLD", "SWITCH_INTERVAL", "Tuning", "applied", "apply"]

SWITCH_INTERVAL = 0.0005
MMAP_THRESHOLD = 512 << 10

# glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


@dataclass(frozen=True, slots=True)
class Tuning:
    """What to set for the process; None or False leaves the interpreter's default."""

    gc_threshold: int | None = None
    switch_interval: float | None = None
    mmap_threshold: int | None = None
    trim_after_sync: bool = False

    @classmethod
    def for_run(cls, informer: InformerSettings) -> Tuning:
        """What ``k8s-bridge run`` sets, from the configuration's informer section."""
        return cls(
            gc_threshold=informer.gc_threshold,
            switch_interval=SWITCH_INTERVAL,
            mmap_threshold=MMAP_THRESHOLD,
            trim_after_sync=informer.gc_freeze,
        )

    def without(self, names: set[str]) -> Tuning:
        """This tuning with the settings ``names`` left at the interpreter's default."""
        known = {f.name for f in fields(self)}
        if unknown := names - known:
            raise ValueError(f"unknown setting(s) {sorted(unknown)}; known: {sorted(known)}")
        off = {n: False if n == "trim_after_sync" else None for n in names}
        return replace(self, **off)  # type: ignore[arg-type]

    def after_first_sync(self) -> None:
        """Once the first sync has landed: the C heap's free pages go back to the OS
        (after a collection, so what only the GC frees is free by then)."""
        if not self.trim_after_sync:
            return
        gc.collect()
        trim = _c_function("malloc_trim")
        if trim is not None:
            trim(0)
        log.info("free heap pages handed back after the first sync", trimmed=trim is not None)


_applied: Tuning | None = None


def applied() -> Tuning | None:
    """What ``apply`` set in this process, or None."""
    return _applied


def apply(tuning: Tuning) -> Tuning:
    """Set ``tuning`` for the whole process, once; returns what took effect (the mmap
    threshold is None where the C library has no ``mallopt``: musl, macOS)."""
    global _applied
    if _applied is not None:
        raise RuntimeError("the process is tuned once, at start-up")
    if tuning.gc_threshold is not None:
        _, t1, t2 = gc.get_threshold()
        gc.set_threshold(tuning.gc_threshold, t1, t2)
    if tuning.switch_interval is not None:
        sys.setswitchinterval(tuning.switch_interval)
    mmap_threshold = None
    mallopt = _c_function("mallopt")
    # mallopt returns 1 on success; musl has the symbol and ignores the call.
    if tuning.mmap_threshold is not None and mallopt is not None:
        if mallopt(_M_MMAP_THRESHOLD, tuning.mmap_threshold) == 1:
            mallopt(_M_TRIM_THRESHOLD, 2 * tuning.mmap_threshold)
            mmap_threshold = tuning.mmap_threshold
    _applied = replace(tuning, mmap_threshold=mmap_threshold)
    log.info("process tuned", **{f.name: getattr(_applied, f.name) for f in fields(_applied)})
    return _applied


def _c_function(name: str) -> Callable[..., int] | None:
    """The C library's function ``name`` among the symbols the interpreter has loaded,
    or None where it has none (glibc's ``mallopt`` and ``malloc_trim`` on musl or macOS)."""
    try:
        function: Callable[..., int] = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    return function
