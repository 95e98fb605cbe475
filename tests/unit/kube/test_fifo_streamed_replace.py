"""Both FIFOs' streamed replace (``begin_replace``): client-go's Replace fed item by item."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from bridge.kube.fifo import REPLACE_YIELD_EVERY, Delta, DeltaType, RealFIFO
from bridge.kube.objects import DeletedFinalStateUnknown, RawObject, namespace_key
from bridge.kube.store import Indexer


def pod(name: str, rv: int = 1) -> RawObject:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ns1",
            "uid": f"uid-{name}",
            "resourceVersion": str(rv),
        },
    }


class Consumer:
    """Pops like an informer: records every delta and keeps ``known`` (the cache) up to date."""

    def __init__(self, fifo: RealFIFO, known: Indexer) -> None:
        self.fifo = fifo
        self.known = known
        self.seen: list[tuple[str, str, bool]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def process(self, deltas: list[Delta], initial: bool) -> None:
        await self.gate.wait()
        for d in deltas:
            self.seen.append((str(d.type), namespace_key(d.object), initial))
            if d.type is DeltaType.Deleted:
                self.known.delete(d.object)
            else:
                assert not isinstance(d.object, DeletedFinalStateUnknown)
                self.known.update(d.object)

    async def drain(self) -> None:
        while len(self.fifo):
            await asyncio.wait_for(self.fifo.pop(self.process), 1)

    async def run(self) -> None:
        while True:
            await self.fifo.pop(self.process)


@contextlib.asynccontextmanager
async def consuming(consumer: Consumer):  # type: ignore[no-untyped-def]
    task = asyncio.create_task(consumer.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def make(**kw: object) -> tuple[RealFIFO, Indexer, Consumer]:
    known = Indexer()
    fifo = RealFIFO(known_objects=known, **kw)  # type: ignore[arg-type]
    return fifo, known, Consumer(fifo, known)


async def test_checklist_20_tombstones_for_what_the_list_lacked() -> None:
    fifo, known, consumer = make()
    known.update(pod("gone-known", 1))
    known.update(pod("kept", 1))
    await fifo.update(pod("gone-queued", 2))
    r = fifo.begin_replace()
    for name in ("kept", "new"):
        await r.add(pod(name, 5))
    r.commit("9")
    await consumer.drain()
    types = [(t, k) for t, k, _ in consumer.seen]
    tombstones = [k for t, k in types if t == "Deleted"]
    assert sorted(tombstones) == ["ns1/gone-known", "ns1/gone-queued"]
    assert sorted(known.list_keys()) == ["ns1/kept", "ns1/new"]


async def test_checklist_24_real_fifo_streamed_tombstones_follow_the_items() -> None:
    """Unlike the all-at-once replace (tombstones first, as client-go): what vanished is
    known only after the last item. Per key the order is the same either way."""
    fifo, known, consumer = make()
    known.update(pod("gone-known", 1))
    await fifo.update(pod("gone-queued", 2))
    r = fifo.begin_replace()
    for name in ("kept", "new"):
        await r.add(pod(name, 5))
    r.commit("9")
    await consumer.drain()
    assert [(t, k) for t, k, _ in consumer.seen] == [
        ("Updated", "ns1/gone-queued"),
        ("Replaced", "ns1/kept"),
        ("Replaced", "ns1/new"),
        ("Deleted", "ns1/gone-queued"),
        ("Deleted", "ns1/gone-known"),
    ]


async def test_same_outcome_as_the_all_at_once_replace() -> None:
    outcomes = []
    for streamed in (False, True):
        fifo, known, consumer = make()
        for name in ("a", "b", "c"):
            known.update(pod(name, 1))
        await fifo.update(pod("d", 2))
        items = [pod("b", 3), pod("c", 1), pod("e", 4)]
        if streamed:
            r = fifo.begin_replace()
            for item in items:
                await r.add(item)
            r.commit("10")
        else:
            await fifo.replace(items, "10")
        await consumer.drain()
        outcomes.append((sorted((t, k) for t, k, _ in consumer.seen), known.list_keys()))
    assert outcomes[0][0] == outcomes[1][0]
    assert sorted(outcomes[0][1]) == sorted(outcomes[1][1]) == ["ns1/b", "ns1/c", "ns1/e"]


async def test_checklist_22_items_pop_while_the_list_arrives_and_sync_waits_for_the_commit() -> (
    None
):
    fifo, _, consumer = make()
    async with consuming(consumer):
        r = fifo.begin_replace()
        await r.add(pod("a"))
        await r.add(pod("b"))
        await asyncio.sleep(0.01)
        # The consumer already took them, but the list has not ended: not synced, not idle.
        assert [k for _, k, _ in consumer.seen] == ["ns1/a", "ns1/b"]
        assert all(initial for _, _, initial in consumer.seen)
        assert not fifo.has_synced() and not fifo.is_idle()
        consumer.gate.clear()
        await r.add(pod("c"))
        await asyncio.sleep(0.01)  # "c" is popped and held inside the handler
        r.commit("5")
        assert not fifo.has_synced()  # "c" is still being processed
        consumer.gate.set()
        await asyncio.wait_for(fifo.wait_for_sync(), 1)
        assert fifo.is_idle()
    assert [(k, initial) for _, k, initial in consumer.seen] == [
        ("ns1/a", True),
        ("ns1/b", True),
        ("ns1/c", True),
    ]


async def test_an_aborted_replace_keeps_its_items_and_decides_nothing() -> None:
    fifo, known, consumer = make()
    known.update(pod("old", 1))
    r = fifo.begin_replace()
    await r.add(pod("a", 2))
    r.abort()
    r.abort()  # idempotent: the reflector aborts on every way out
    assert not fifo.has_synced()
    await consumer.drain()
    assert [(t, k) for t, k, _ in consumer.seen] == [("Replaced", "ns1/a")]  # no tombstone
    assert fifo.is_idle()
    # The next replacement decides what vanished.
    r = fifo.begin_replace()
    await r.add(pod("a", 3))
    r.commit("7")
    await consumer.drain()
    assert ("Deleted", "ns1/old") in [(t, k) for t, k, _ in consumer.seen]
    assert fifo.has_synced()
    with pytest.raises(RuntimeError):
        r.commit("8")


async def test_a_discarded_item_gets_a_tombstone() -> None:
    fifo, known, consumer = make()
    r = fifo.begin_replace()
    await r.add(pod("a"))
    await r.add(pod("b"))
    r.discard(pod("a"))
    r.commit("3")
    await consumer.drain()
    assert known.list_keys() == ["ns1/b"]
    assert ("Deleted", "ns1/a") in [(t, k) for t, k, _ in consumer.seen]


async def test_one_replace_at_a_time_and_no_resync_meanwhile() -> None:
    fifo, known, consumer = make()
    known.update(pod("k"))
    r = fifo.begin_replace()
    with pytest.raises(RuntimeError):
        fifo.begin_replace()
    await fifo.resync()
    assert len(fifo) == 0
    r.commit("1")
    await consumer.drain()
    await fifo.resync()
    assert len(fifo) == 0  # "k" was tombstoned by the commit: nothing known to resync


async def test_the_queue_stays_short_when_the_consumer_keeps_up() -> None:
    fifo, _, consumer = make()
    longest = 0
    async with consuming(consumer):
        r = fifo.begin_replace()
        for i in range(5000):
            await r.add(pod(f"p{i}"))
            longest = max(longest, len(fifo))
        r.commit("1")
        await asyncio.wait_for(fifo.wait_for_sync(), 5)
    assert longest <= REPLACE_YIELD_EVERY


async def test_a_stuck_consumer_never_stops_a_replace() -> None:
    """A LIST must finish within the server's timeout: it is not paced by ``max_queued``."""
    fifo, _, consumer = make(max_queued=10)
    consumer.gate.clear()
    async with consuming(consumer):
        r = fifo.begin_replace()
        async with asyncio.timeout(2):
            for i in range(1000):
                await r.add(pod(f"p{i}"))
        r.commit("1")
        assert len(fifo) >= 999
        consumer.gate.set()
        await asyncio.wait_for(fifo.wait_for_sync(), 5)


async def test_a_paced_replace_waits_for_room_and_an_unpaced_one_never_does() -> None:
    def obj(i: int) -> RawObject:
        return {"metadata": {"name": f"p{i}", "namespace": "ns", "resourceVersion": str(i)}}

    unpaced = RealFIFO(max_queued=2)
    r = unpaced.begin_replace()
    for i in range(5):
        await asyncio.wait_for(r.add(obj(i)), 1)  # a LIST is never held up
    assert len(unpaced) == 5

    fifo = RealFIFO(max_queued=2)
    r = fifo.begin_replace(paced=True)
    await r.add(obj(0))
    await r.add(obj(1))
    third = asyncio.create_task(r.add(obj(2)))
    await asyncio.sleep(0.01)
    assert not third.done() and len(fifo) == 2  # the stream waits for the consumer

    async def drop(deltas: list[Delta], initial: bool) -> None:
        pass

    await fifo.pop(drop)
    await asyncio.wait_for(third, 1)
    assert len(fifo) == 2


async def test_a_first_replace_into_nothing_keeps_no_key_set() -> None:
    """Nothing queued or known when it begins: nothing can vanish, so the listed keys
    (100k strings held for the whole list) are not kept; one known object: they are."""
    fifo, _known, consumer = make()
    r = fifo.begin_replace()
    assert r._keys is None
    await r.add(pod("a"))
    r.commit("1")
    await consumer.drain()
    r = fifo.begin_replace()
    assert r._keys is not None
    r.commit("2")
    await consumer.drain()
    assert ("Deleted", "ns1/a") in [(t, k) for t, k, _ in consumer.seen]


async def test_an_item_discarded_then_handed_in_again_stays() -> None:
    fifo, known, consumer = make()
    r = fifo.begin_replace()
    await r.add(pod("a"))
    await r.add(pod("b"))
    r.discard(pod("a"))
    r.discard(pod("b"))
    await r.add(pod("b", 5))
    r.commit("6")
    await consumer.drain()
    assert known.list_keys() == ["ns1/b"]
    deleted = [k for t, k, _ in consumer.seen if t == "Deleted"]
    assert deleted == ["ns1/a"]
