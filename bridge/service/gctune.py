"""Cyclic GC tuning for a process that holds many long-lived small objects.

CPython's cyclic GC runs a young collection every 700 net allocations of
container objects and a full one whenever the survivors grew by a quarter.
Building a large cache (an initial list, a restart from a checkpoint) makes
millions of containers that all survive, so collections run over and over
and find nothing. ``gc_paused`` holds the GC off for such a build;
``freeze`` (run by the app once every resource synced) moves what survived the initial sync out of the GC's
sight for good (``gc.freeze``), so later collections walk only the objects
made since; ``configure`` sets the thresholds once at start-up.

``release_free_memory`` hands the C heap's free pages back to the OS. Objects
over 512 B (event bytes, list chunks, SQLite's pages) come from malloc, not
from Python's own arenas; once freed, glibc keeps their pages unless asked,
so after a first sync a 100k-pod bridge held 40-48 MiB where 31-35 MiB were
in use (bench slowbus).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from bridge.service.runtime import c_function

__all__ = ["configure", "freeze", "gc_paused", "release_free_memory"]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic collection inside the block (reference counting frees as usual)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def configure(threshold0: int | None) -> None:
    """Set the young-generation threshold (None: the interpreter's default, 700)."""
    if threshold0 is not None:
        _, t1, t2 = gc.get_threshold()
        gc.set_threshold(threshold0, t1, t2)


def freeze() -> None:
    """Move every object alive now into the permanent generation (``gc.freeze``).

    A collection first, so garbage made so far is freed rather than kept forever.
    """
    gc.collect()
    gc.freeze()


def release_free_memory() -> bool:
    """Give the C heap's free pages back to the OS (glibc); False where it cannot."""
    trim = c_function("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True
