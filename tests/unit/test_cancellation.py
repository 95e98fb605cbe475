"""A loop that runs until cancelled ends when cancelled, even in the tick its await completes.

On Python 3.11, ``asyncio.wait_for`` returns the awaited result instead of
raising when the task is cancelled in the same tick as that result arrives: the
cancellation is lost, the loop goes round again, and a SIGTERM waits forever
for it. Heartbeats every 0.3 s hit that window in about one stop in fifty. The
bridge waits with ``asyncio.timeout`` instead, which delivers the cancellation.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from bridge.events import Event
from bridge.heartbeat import Heartbeat, HeartbeatBuilder, HeartbeatTarget
from bridge.sinks.memory import MemorySink

ROOT = Path(__file__).resolve().parents[2]


class HeldSink(MemorySink):
    """Holds each publish until ``release`` opens; ``entered`` says one is held."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def publish(self, events: Sequence[Event]) -> Mapping[int, str]:
        self.entered.set()
        await self.release.wait()
        return await super().publish(events)


class QuietResource:
    """A resource that is synced, watched and idle: what a heartbeat reports on."""

    label = "v1/pods"
    resource_id = "test/v1/pods"
    committed_resource_version = "7"
    sink_healthy = True

    def has_synced(self) -> bool:
        return True

    def watch_up(self) -> bool:
        return True

    def object_count(self) -> int:
        return 1

    def unacknowledged(self) -> int:
        return 0

    def seconds_since_last_change(self) -> float | None:
        return None

    def checkpoint_lag(self) -> float:
        return 0.0


async def test_heartbeats_stop_when_cancelled_in_the_tick_their_publish_returns() -> None:
    sink = HeldSink()
    target = HeartbeatTarget("test", "", "v1", "Pod", "pods")
    beat = Heartbeat(QuietResource(), HeartbeatBuilder(target, 0.01), sink, timeout=5.0)
    task = asyncio.create_task(beat.run())
    await sink.entered.wait()
    # One tick: the publish can finish and the task is told to stop.
    sink.release.set()
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=2.0)
    if not done:
        sink.release.clear()  # the next publish is held: a cancel lands then
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        pytest.fail("the heartbeat loop went on after it was cancelled")
    assert task.cancelled()


def test_the_bridge_never_waits_with_asyncio_wait_for() -> None:
    calls = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "bridge").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\basyncio\.wait_for\(", line)
    ]
    assert calls == [], "use asyncio.timeout: wait_for loses a cancellation on 3.11"
