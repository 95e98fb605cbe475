"""A cancellation is never lost: a loop that runs until cancelled ends when cancelled,
even in the tick its await completes, and closing something is no place to drop one.

On Python 3.11, ``asyncio.wait_for`` returns the awaited result instead of
raising when the task is cancelled in the same tick as that result arrives: the
cancellation is lost, the loop goes round again, and a SIGTERM waits forever
for it. Heartbeats every 0.3 s hit that window in about one stop in 50 to 80. The
bridge waits with ``asyncio.timeout`` instead, which delivers the cancellation.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import pytest

from bridge.delivery.heartbeat import Heartbeat, HeartbeatBuilder, HeartbeatTarget
from bridge.ground.envelope import Event
from bridge.kube.liststream import _ReadAhead
from tests.doubles.memory_sink import MemorySink
from tests.unit.test_signals import Source

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


async def test_heartbeats_stop_when_cancelled_in_the_tick_their_publish_returns() -> None:
    sink = HeldSink()
    target = HeartbeatTarget("test", "", "v1", "Pod", "pods")
    beat = Heartbeat(Source(), HeartbeatBuilder(target, 0.01), sink, timeout=5.0)
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


async def test_closing_a_list_body_keeps_a_cancellation_of_the_closer() -> None:
    """``task.cancel(); with suppress(CancelledError): await task`` drops the awaiting
    task's own cancellation when it arrives while the other task winds down."""
    wound_down = asyncio.Event()
    reading, winding = asyncio.Event(), asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        try:
            reading.set()
            await asyncio.Event().wait()  # the server has not sent the next chunk yet
            yield b""
        except asyncio.CancelledError:
            winding.set()
            await wound_down.wait()  # a connection that takes a while to let go
            raise

    ahead = _ReadAhead(body(), asyncio.get_running_loop().time() + 60)
    await reading.wait()
    closer = asyncio.create_task(ahead.aclose())
    await winding.wait()  # the closer cancelled the read task and waits for it
    closer.cancel()
    wound_down.set()
    await asyncio.gather(closer, return_exceptions=True)
    assert closer.cancelled()


def _lines_matching(pattern: str) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "bridge").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(pattern, line)
    ]


def test_the_bridge_never_waits_with_asyncio_wait_for() -> None:
    calls = _lines_matching(r"\basyncio\.wait_for\(")
    assert calls == [], "use asyncio.timeout: wait_for loses a cancellation on 3.11"


def test_the_bridge_never_suppresses_a_cancellation() -> None:
    found = _lines_matching(r"suppress\([^)]*CancelledError")
    assert found == [], "use bridge.aiotasks.cancel_and_wait to stop a task and await it"
