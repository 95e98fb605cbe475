"""A plain LIST against a slow consumer: memory must not grow with the list's size.

The body is read only as fast as the FIFO has room (its bound holds, the rest
of the body stays unread), until the pacing deadline; past it the rest is read
at once and held as bytes, so a server's request timeout cannot cut the read.
Either way the replace keeps its meaning: one Replaced delta per listed key,
tombstones for the vanished ones once the whole list is known.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import orjson

from bridge.kube.fifo import Delta, DeltaType, RealFIFO
from bridge.kube.liststream import ListBody
from bridge.kube.objects import DeletedFinalStateUnknown, RawObject, namespace_key
from bridge.kube.protocols import ListOptions, ListStream
from bridge.kube.reflector import Reflector, ReflectorSettings
from bridge.kube.store import Indexer
from tests.doubles.scripted import ScriptedListerWatcher

N = 3000  # items in the list: far more than the FIFO's bound
BOUND = 20
PER_CHUNK = 5  # items per body chunk


def pod(i: int) -> RawObject:
    return {
        "metadata": {
            "name": f"p{i}",
            "namespace": "ns1",
            "uid": f"uid-{i}",
            "resourceVersion": str(10 + i),
        },
        "spec": {"nodeName": "n1"},
    }


def body_chunks(n: int) -> list[bytes]:
    """A compact LIST body, as the API server writes it, cut into chunks of a few items."""
    items = [orjson.dumps(pod(i)) for i in range(n)]
    chunks = [
        b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9999"},"items":['
    ]
    for start in range(0, n, PER_CHUNK):
        part = b",".join(items[start : start + PER_CHUNK])
        chunks.append(part if start + PER_CHUNK >= n else part + b",")
    chunks.append(b"]}")
    return chunks


@dataclass(repr=False)
class BodyLister(ScriptedListerWatcher):
    """A lister whose LIST is a real ``ListBody`` over a body counted as it is read."""

    chunks: list[bytes] = field(default_factory=list)
    read: int = 0  # chunks pulled from the "socket"
    read_all_at: float | None = None

    async def _body(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            self.read += 1
            yield chunk
        self.read_all_at = asyncio.get_running_loop().time()

    @contextlib.asynccontextmanager
    async def list_stream(self, options: ListOptions) -> AsyncIterator[ListStream]:
        body = ListBody(self._body(), kind="Pod", api_version="v1", what="GET pods")
        try:
            yield body
        finally:
            await body.aclose()


class SlowConsumer:
    """An informer whose sink is slower than the list: a turn of the loop (or a sleep) per item."""

    def __init__(self, fifo: RealFIFO, known: Indexer, lister: BodyLister, delay: float) -> None:
        self.fifo, self.known, self.lister, self.delay = fifo, known, lister, delay
        self.seen: list[tuple[DeltaType, str]] = []
        self.most_queued = 0
        # Chunks read but not yet consumed, in items: what waits decoded or as bytes.
        self.most_read_ahead = 0
        self.done_at: float | None = None

    async def process(self, deltas: list[Delta], initial: bool) -> None:
        self.most_queued = max(self.most_queued, len(self.fifo))
        ahead = self.lister.read * PER_CHUNK - len(self.seen)
        self.most_read_ahead = max(self.most_read_ahead, ahead)
        if self.delay:
            await asyncio.sleep(self.delay)
        else:
            for _ in range(3):
                await asyncio.sleep(0)
        for d in deltas:
            self.seen.append((d.type, namespace_key(d.object)))
            if d.type is DeltaType.Deleted:
                self.known.delete(d.object)
            else:
                assert not isinstance(d.object, DeletedFinalStateUnknown)
                self.known.update(d.object)

    async def run(self) -> None:
        while True:
            await self.fifo.pop(self.process)
            if self.fifo.has_synced() and self.done_at is None:
                self.done_at = asyncio.get_running_loop().time()


async def run_list(
    pace: float | None, delay: float = 0.0
) -> tuple[SlowConsumer, BodyLister, Reflector]:
    known = Indexer()
    # Known before the list and absent from it: must come out as a tombstone, after the items.
    known.update({"kind": "Pod", "metadata": {"name": "gone", "namespace": "ns1", "uid": "g"}})
    fifo = RealFIFO(known_objects=known, max_queued=BOUND)
    lister = BodyLister(chunks=body_chunks(N))
    consumer = SlowConsumer(fifo, known, lister, delay)
    settings = ReflectorSettings(watch_list="off", page_size=None, list_pace_seconds=pace)
    reflector = Reflector(lister, fifo, settings=settings)
    tasks = [asyncio.create_task(consumer.run()), asyncio.create_task(reflector.run())]
    try:
        await asyncio.wait_for(fifo.wait_for_sync(), 30)
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
    return consumer, lister, reflector


def assert_one_replace(consumer: SlowConsumer) -> None:
    keys = [f"ns1/p{i}" for i in range(N)]
    assert consumer.seen[:N] == [(DeltaType.Replaced, k) for k in keys]
    assert consumer.seen[N:] == [(DeltaType.Deleted, "ns1/gone")]


async def test_a_list_waits_for_a_slow_consumer_instead_of_queueing_decoded_items() -> None:
    consumer, _, reflector = await run_list(pace=60.0)
    assert_one_replace(consumer)
    assert reflector.list_read_aheads == 0
    # The FIFO's bound holds for a LIST as for a watch: not N items, and the body
    # is read only a few chunks ahead of the consumer (the rest stays unread): the
    # FIFO, the item being processed, the piece being split, the chunk read ahead.
    assert consumer.most_queued <= BOUND
    assert consumer.most_read_ahead <= BOUND + 1 + 3 * PER_CHUNK


async def test_past_the_deadline_the_body_is_read_at_once_and_the_fifo_stays_bounded() -> None:
    # ~3 s of consuming; the server would cut a read paced that long, so after
    # 0.2 s the rest of the body is read (held as bytes), the FIFO still bounded.
    consumer, lister, reflector = await run_list(pace=0.2, delay=0.001)
    assert_one_replace(consumer)
    assert reflector.list_read_aheads == 1  # counted, so k8s_bridge_list_read_aheads_total shows it
    assert consumer.most_queued <= BOUND
    assert lister.read_all_at is not None and consumer.done_at is not None
    assert consumer.done_at - lister.read_all_at > 1.0


async def test_list_body_reads_one_chunk_ahead_until_the_deadline_then_all() -> None:
    read = 0
    chunks = body_chunks(200)

    async def source() -> AsyncIterator[bytes]:
        nonlocal read
        for c in chunks:
            read += 1
            yield c

    loop = asyncio.get_running_loop()
    body = ListBody(source(), kind="Pod", api_version="v1", what="GET pods")
    body.pace_until(loop.time() + 0.1)
    try:
        batches = aiter(body)
        first = await anext(batches)
        assert first
        for _ in range(20):
            await asyncio.sleep(0)
        assert read <= 3  # the envelope, the first items' chunk and one ahead
        assert not body.draining
        await asyncio.sleep(0.15)
        assert body.draining and read == len(chunks)
        items = list(first)
        async for batch in batches:
            items.extend(batch)
        assert [o["metadata"]["name"] for o in items] == [f"p{i}" for i in range(200)]
        assert body.metadata == {"resourceVersion": "9999"}
    finally:
        await body.aclose()
