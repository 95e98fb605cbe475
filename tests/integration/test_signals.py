"""Heartbeats and snapshot signals on a running pipeline, against the emulator over HTTP.

Snapshots: every cached object is announced once, in order with live changes
per object, and the checkpoint never changes (not even in a crash during the
snapshot). Heartbeats: they carry the committed watermark, not the reflector's
position, and they reach a real JetStream on their own subject.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import itertools
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping, Sequence

import nats
import orjson
import pytest

from bridge.checkpoints.memory import MemoryCheckpointStore
from bridge.delivery.heartbeat import Heartbeat, HeartbeatBuilder, HeartbeatTarget
from bridge.delivery.pipeline import ResourcePipeline
from bridge.delivery.snapshot import take_snapshot
from bridge.emulator import Emulator
from bridge.ground.envelope import HEARTBEAT_TYPE, Event
from bridge.ground.records import is_record, make_record
from bridge.sinks.nats import NatsSink
from tests.doubles.memory_sink import MemorySink
from tests.fixtures.pipeline import FAST, Harness, commit_cycles, pod
from tests.fixtures.waiting import until

pytestmark = pytest.mark.integration

RID = "core/v1/pods"


@contextlib.asynccontextmanager
async def running(p: ResourcePipeline) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(p.run())
    try:
        await until(p.has_synced)
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def change_of(e: Event) -> str:
    return e.type.rsplit(".", 1)[1]


async def settled(harness: Harness, p: ResourcePipeline) -> None:
    await harness.settled(p)
    await until(lambda: p.outbox.unacknowledged == 0)


# -- snapshots -----------------------------------------------------------------------


async def test_a_snapshot_announces_every_object_once_and_leaves_the_checkpoint_as_it_was(
    harness: Harness, emulator: Emulator
) -> None:
    for i in range(7):
        emulator.create(pod(f"p{i}"))
    p = await harness.pipeline()
    async with running(p):
        await settled(harness, p)
        before = await harness.checkpoints.load(RID)
        first = len(harness.sink.events)
        result = await take_snapshot(p, "sig1", page_size=3)  # every announcement acknowledged
        await commit_cycles(p)  # commits that would store what the announcements changed
        after = await harness.checkpoints.load(RID)
    assert (result.listed, result.announced, sum(result.skipped.values())) == (7, 7, 0)
    announced = harness.sink.events[first:]
    assert sorted(e.subject for e in announced) == [f"default/p{i}" for i in range(7)]
    for e in announced:
        uid = e.data["object"]["metadata"]["uid"]
        assert e.type == "io.k8s.core.v1.Pod.snapshot"
        assert e.id == f"{uid}:{e.resource_version}:snapshot:sig1"
        assert not e.initial
    assert after == before


@pytest.mark.parametrize("cached_rv", ["1", "999999"], ids=["cache-behind", "cache-ahead"])
async def test_a_snapshot_skips_objects_the_cache_does_not_hold_as_listed(
    harness: Harness, emulator: Emulator, cached_rv: str
) -> None:
    """Same uid and fingerprint is not enough: the cache ahead (A → B → A, the last A
    published) would have the old A announced after it, out of order."""
    emulator.create(pod("kept"))
    emulator.create(pod("moved"))
    p = await harness.pipeline()
    async with running(p):
        await settled(harness, p)
        # The cache is told a different version than the list will show: as if the
        # watch had not yet brought (or had already passed) the listed state.
        assert p.informer is not None
        cached = p.informer.store.get_by_key("default/moved")
        assert is_record(cached)
        record = make_record(cached.key, cached.uid, cached_rv, cached.fingerprint)
        p.informer.store.update(record)
        kept = p.informer.store.get_by_key("default/kept")
        assert kept is not None
        p.informer.store.delete(kept)  # and one not cached at all
        result = await take_snapshot(p, "sig2")
    assert result.announced == 0
    assert result.skipped == {"changed": 1, "not-cached": 1}


async def test_a_snapshot_during_churn_keeps_resource_version_order_per_object(
    harness: Harness, emulator: Emulator
) -> None:
    names = [f"c{i}" for i in range(40)]
    for name in names:
        emulator.create(pod(name))
    harness.sink.delay = 0.002  # a bus that takes its time: events queue, batches interleave
    p = await harness.pipeline()
    p.settings = dataclasses.replace(FAST, max_pending=8, max_batch=4)
    async with running(p):
        await settled(harness, p)
        stop = asyncio.Event()

        async def churn() -> None:
            i = 0
            while not stop.is_set():
                i += 1
                # Alternating values: states repeat (A → B → A), the hard case for order.
                emulator.patch(
                    "v1",
                    "Pod",
                    names[i % len(names)],
                    {"spec": {"nodeName": f"n{(i // len(names)) % 2}"}},
                    namespace="default",
                )
                await asyncio.sleep(0.001)

        churner = asyncio.create_task(churn())
        try:
            results = [await take_snapshot(p, f"s{n}", page_size=7) for n in range(3)]
        finally:
            stop.set()
            await churner
        await settled(harness, p)
    assert sum(r.announced for r in results) > 0
    by_subject: dict[str, list[Event]] = defaultdict(list)
    for e in harness.sink.events:
        by_subject[e.subject].append(e)
    interleaved = 0
    for subject, events in by_subject.items():
        rvs = [int(e.resource_version) for e in events]
        assert rvs == sorted(rvs), (subject, [(change_of(e), e.resource_version) for e in events])
        for before, e in itertools.pairwise(events):
            if change_of(e) == "snapshot":
                # It announces exactly what the object's last change event published.
                last = next(
                    x for x in reversed(events[: events.index(e)]) if change_of(x) != "snapshot"
                )
                assert e.resource_version == last.resource_version, subject
                interleaved += change_of(before) != "snapshot"
    assert interleaved > 0


async def test_a_crash_during_a_snapshot_makes_the_restart_publish_nothing(
    harness: Harness, emulator: Emulator
) -> None:
    for i in range(60):
        emulator.create(pod(f"k{i}"))
    p = await harness.pipeline()
    async with running(p):
        await settled(harness, p)
        harness.sink.delay = 0.02  # announcements are in flight when the process dies
        snap = asyncio.create_task(take_snapshot(p, "crash", page_size=10))
        await until(lambda: p.outbox.unacknowledged > 10)
        # kill -9 now: only what the checkpoint store holds survives.
        crashed = MemoryCheckpointStore()
        crashed._data = copy.deepcopy(harness.checkpoints._data)
        snap.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await snap
    harness.checkpoints = crashed
    harness.sink = MemorySink()
    restarted = await harness.pipeline()
    async with running(restarted):
        await settled(harness, restarted)
        await harness.probe()
    assert [e.subject for e in harness.sink.events] == ["default/probe"]


# -- heartbeats ------------------------------------------------------------------------


class GatedSink(MemorySink):
    """Holds change events until ``gate`` opens; heartbeats pass at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()

    async def publish(self, events: Sequence[Event]) -> Mapping[int, str]:
        if any(e.type != HEARTBEAT_TYPE for e in events):
            await self.gate.wait()
        return await super().publish(events)


def heartbeat_for(p: ResourcePipeline, sink: MemorySink | NatsSink, cluster: str) -> Heartbeat:
    target = HeartbeatTarget(cluster, "", "v1", "Pod", "pods")
    return Heartbeat(p, HeartbeatBuilder(target, 30.0), sink)


async def test_a_heartbeat_carries_the_committed_watermark_not_the_watch_position(
    harness: Harness, emulator: Emulator
) -> None:
    for i in range(3):
        emulator.create(pod(f"h{i}"))
    sink = harness.sink = GatedSink()
    p = await harness.pipeline()
    beat = heartbeat_for(p, sink, "test")
    async with running(p):
        await settled(harness, p)
        committed = p.committed_resource_version
        assert await beat.beat()
        quiet = sink.events[-1].data
        assert quiet["watermark"] == committed == str(emulator.resource_version)
        assert (quiet["objects"], quiet["synced"], quiet["watchUp"]) == (3, True, True)
        assert quiet["secondsSinceLastChange"] is not None
        assert quiet["unacknowledged"] == 0
        # A change the bus has not acknowledged: the watch moved on, the watermark did not.
        sink.gate.clear()
        emulator.create(pod("late"))
        await until(lambda: p.outbox.unacknowledged == 1)
        assert p.informer is not None and p.informer.reflector is not None
        await until(
            lambda: (
                p.informer.reflector.last_sync_resource_version  # type: ignore[union-attr]
                == str(emulator.resource_version)
            )
        )
        await commit_cycles(p)  # commits that would store the reflector's position
        assert await beat.beat()
        stuck = sink.events[-1].data
        assert stuck["watermark"] == committed
        assert (stuck["objects"], stuck["unacknowledged"]) == (4, 1)
        sink.gate.set()
        await settled(harness, p)
        assert await beat.beat()
        assert sink.events[-1].data["watermark"] == str(emulator.resource_version)
    ids = [e.id for e in sink.events if e.type == HEARTBEAT_TYPE]
    assert len(ids) == len(set(ids)) == 3


async def test_heartbeats_reach_jetstream_on_their_own_subject_and_skip_a_bus_that_is_down(
    harness: Harness, emulator: Emulator, nats_server: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    stream, cluster = f"HB{tag}", f"c{tag}"
    sink = NatsSink([nats_server], stream=stream, subjects=[f"k8s.{cluster}.>"])
    await sink.start()
    emulator.create(pod("one"))
    p = await harness.pipeline()
    beat = heartbeat_for(p, sink, cluster)
    try:
        async with running(p):
            await settled(harness, p)
            assert await beat.beat()
            assert await beat.beat()
            # The pipeline finds the bus unreachable: heartbeats skip, nothing waits.
            p.sink_healthy = False
            assert not await beat.beat()
    finally:
        await sink.close()
    nc = await nats.connect(nats_server)
    try:
        js = nc.jetstream()
        msgs = [await js.get_msg(stream, seq) for seq in (1, 2)]
        assert (await js.stream_info(stream)).state.messages == 2
    finally:
        await nc.close()
    assert {m.subject for m in msgs} == {f"k8s.{cluster}.heartbeat.core.v1.pods._"}
    docs = [orjson.loads(m.data or b"{}") for m in msgs]
    assert [m.headers["Nats-Msg-Id"] for m in msgs if m.headers] == [d["id"] for d in docs]
    assert docs[0]["id"] != docs[1]["id"]
    assert docs[0]["type"] == HEARTBEAT_TYPE
    assert docs[0]["data"]["watermark"] == p.committed_resource_version
    assert (beat.sent, beat.skipped) == (2, 1)
