"""The writer's linger follows the rate: changes that come steadily share batches,
a trickle's leave one by one, and each batch is still written ahead before it is sent.

The real Publisher over a real Outbox and the memory sink; decisions are made
on the event loop at a fixed pace, as the informer makes them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from bridge.aiotasks import cancel_and_wait
from bridge.delivery.outbox import Batch, Outbox
from bridge.delivery.publisher import Publisher
from bridge.delivery.settings import PipelineSettings
from bridge.delivery.stats import PipelineStats
from bridge.ground.digest import UNCERTAIN, Digest
from bridge.ground.envelope import Event
from bridge.kube.backoff import Backoff
from tests.doubles.memory_sink import MemorySink
from tests.unit.test_outbox import event


async def batch_sizes(gap: float, n: int, settings: PipelineSettings) -> tuple[list[int], bool]:
    """Sizes of the batches ``n`` changes ``gap`` seconds apart were published in, and
    whether every event's row was written ahead before its batch was published."""
    sink = MemorySink()
    outbox = Outbox(lambda key: None)
    ahead: set[str] = set()
    in_order = True

    async def write_ahead(batch: Batch) -> None:
        await asyncio.sleep(0.001)  # a store's commit takes a while: the sender must wait
        ahead.update(row.uid for row in batch.ahead)

    async def publish(events: Sequence[Event]) -> dict[int, str]:
        nonlocal in_order
        in_order = in_order and all(e.id.split(":")[0] in ahead for e in events)
        return dict(await MemorySink.publish(sink, events))

    sink.publish = publish  # type: ignore[method-assign]
    publisher = Publisher(
        sink=sink, outbox=outbox, settings=settings, stats=PipelineStats(),
        write_ahead=write_ahead, on_acknowledged=lambda: None, backoff=Backoff, label="t",
    )  # fmt: skip
    task = asyncio.create_task(publisher.run(prefix="t"))
    try:
        for i in range(n):
            key = f"ns/p{i}"
            digest = Digest(key, f"u{i}", str(i), "f", UNCERTAIN)
            outbox.decide(key, f"u{i}", event(f"u{i}", str(i)), digest)
            publisher.decided()
            await asyncio.sleep(gap)
        async with asyncio.timeout(5):
            await publisher.drained()
    finally:
        with contextlib.suppress(Exception):
            await cancel_and_wait([task])
    return [len(b) for b in sink.batches], in_order


async def test_steady_changes_share_batches_and_a_trickle_does_not() -> None:
    settings = PipelineSettings()
    steady, steady_in_order = await batch_sizes(0.004, 60, settings)  # 250/s
    trickle, trickle_in_order = await batch_sizes(0.03, 8, settings)  # 33/s
    assert steady_in_order and trickle_in_order
    assert sum(steady) == 60 and len(steady) <= 30, steady
    assert trickle == [1] * 8, trickle


async def test_no_linger_means_no_steady_linger_either() -> None:
    settings = PipelineSettings(linger=0.0)
    sizes, in_order = await batch_sizes(0.004, 30, settings)
    assert in_order
    assert len(sizes) >= 25, sizes
