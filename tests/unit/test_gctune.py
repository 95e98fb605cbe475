"""GC tuning: the threshold is set once, a pause restores the GC, a freeze hides the heap."""

from __future__ import annotations

import gc
import sys

import pytest

from bridge.service import gctune, runtime
from bridge.service.settings import InformerSettings


def test_configure_sets_the_young_threshold_only_when_given() -> None:
    before = gc.get_threshold()
    try:
        gctune.configure(None)
        assert gc.get_threshold() == before
        gctune.configure(12_345)
        assert gc.get_threshold() == (12_345, before[1], before[2])
    finally:
        gc.set_threshold(*before)
    assert InformerSettings().gc_threshold == 50_000 and InformerSettings().gc_freeze


def test_gc_paused_restores_the_previous_state() -> None:
    assert gc.isenabled()
    with gctune.gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gctune.gc_paused():
            pass
        assert not gc.isenabled()  # it was off before: it stays off
    finally:
        gc.enable()


def test_freeze_moves_live_objects_out_of_the_collectors_sight() -> None:
    try:
        kept = [[i] for i in range(100)]
        gctune.freeze()
        assert gc.get_freeze_count() >= len(kept)
    finally:
        gc.unfreeze()


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_free_heap_pages_go_back_to_the_os() -> None:
    """Event-sized bytes come from malloc: freed in the middle of the heap, their
    pages stay with the process until the heap is trimmed."""
    if runtime.c_function("malloc_trim") is None:
        pytest.skip("no malloc_trim in this C library")
    blocks = [bytes(3_000) + bytes([i % 256]) for i in range(30_000)]  # ~90 MB
    kept = blocks[::100]  # pins the heap's top, as long-lived objects do
    del blocks
    before = _rss_kb()
    assert gctune.release_free_memory()
    after = _rss_kb()
    assert before - after > 40_000, f"{before} kB before, {after} kB after"
    assert len(kept) == 300
