"""Replay's count of what JetStream kept, read back from a real nats-server."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from bridge.cli.stored import JetStreamCounter
from bridge.delivery.changes import ChangeDetector, Fingerprinter
from bridge.delivery.events import EventBuilder
from bridge.ground.envelope import Event
from bridge.sinks.nats import NatsSink

pytestmark = pytest.mark.integration


def events(cluster: str, n: int, *, start: int = 1, kind: str = "ConfigMap") -> list[Event]:
    plural = kind.lower() + "s"
    builder = EventBuilder(cluster=cluster, group="", version="v1", kind=kind, plural=plural)
    detector = ChangeDetector(Fingerprinter([]))
    out: list[Event] = []
    for i in range(start, start + n):
        obj = {
            "apiVersion": "v1",
            "kind": kind,
            "metadata": {
                "name": f"o{i}",
                "namespace": "ns",
                "uid": f"{kind}-{i}",
                "resourceVersion": str(i),
            },
        }
        out.extend(builder.build(c) for c in detector.on_add(obj))
    return out


def as_run(batch: list[Event], run: str) -> list[Event]:
    return [replace(e, msg_id=f"{e.id}:replay:{run}") for e in batch]


@pytest.fixture
def stream_and_cluster() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"T{tag}", f"c{tag}"


async def test_counts_only_the_runs_messages_the_stream_kept(
    nats_server: str, stream_and_cluster: tuple[str, str]
) -> None:
    stream, cluster = stream_and_cluster
    sink = NatsSink([nats_server], stream=stream, subjects=[f"k8s.{cluster}.>"])
    await sink.start()
    counter = JetStreamCounter([nats_server], stream, ":replay:r1")
    try:
        await sink.publish(events(cluster, 3))  # before the mark: not this run's
        await counter.start()
        run = as_run(events(cluster, 5), "r1")
        await sink.publish(run[:3])
        # A running bridge publishes meanwhile, to the same stream and subjects.
        await sink.publish(events(cluster, 4, start=100, kind="Secret"))
        await sink.publish(run[3:])
        await sink.publish(run[1:3])  # resent: the duplicate window drops these
        await sink.publish(as_run(events(cluster, 2, start=50), "other-run"))
        assert await counter.count(5 + 2) == 5
    finally:
        await counter.close()
        await sink.close()


async def test_a_large_run_is_counted_whole(
    nats_server: str, stream_and_cluster: tuple[str, str]
) -> None:
    stream, cluster = stream_and_cluster
    sink = NatsSink([nats_server], stream=stream, subjects=[f"k8s.{cluster}.>"])
    await sink.start()
    counter = JetStreamCounter([nats_server], stream, ":replay:big")
    try:
        await counter.start()
        await sink.publish(as_run(events(cluster, 3000), "big"))
        assert await counter.count(3000) == 3000
    finally:
        await counter.close()
        await sink.close()


async def test_nothing_published_counts_zero_without_reading(
    nats_server: str, stream_and_cluster: tuple[str, str]
) -> None:
    stream, cluster = stream_and_cluster
    sink = NatsSink([nats_server], stream=stream, subjects=[f"k8s.{cluster}.>"])
    await sink.start()
    counter = JetStreamCounter([nats_server], stream, ":replay:none")
    try:
        await counter.start()
        assert await counter.count(0) == 0
    finally:
        await counter.close()
        await sink.close()
