"""GC tuning: the threshold is set once, a pause restores the GC, a freeze hides the heap."""

from __future__ import annotations

import gc

from bridge import gctune
from bridge.settings import InformerSettings


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
