"""``bridge.consumer.consume`` against a real Apache Kafka broker.

Kafka keeps every copy of a record, so a redelivered event (the bridge
republishing after a crash before its checkpoint, or ``k8s-bridge replay``)
really is on the topic twice: the consumer must yield it once.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from bridge.consumer import Deduplicator, ReceivedEvent, consume
from bridge.delivery.changes import ChangeDetector, Fingerprinter
from bridge.delivery.events import EventBuilder
from bridge.ground.envelope import Event
from bridge.service.settings import Settings, load_settings
from bridge.sinks.kafka import KafkaSink

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

detector = ChangeDetector(Fingerprinter([]))
builder = EventBuilder(cluster="it", group="", version="v1", kind="ConfigMap", plural="configmaps")


def configmap(name: str, rv: int, value: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": str(rv),
        },
        "data": {"k": value},
    }


def settings_for(kafka_broker: str, topic: str, tmp_path: Path) -> Settings:
    raw = {
        "cluster": {"kubeconfig": str(tmp_path / "unused-kubeconfig"), "name": "it"},
        "resources": [{"apiVersion": "v1", "kind": "ConfigMap"}],
        "sink": {"kind": "kafka", "kafka": {"bootstrapServers": [kafka_broker], "topic": topic}},
        "checkpoint": {"kind": "memory"},
    }
    return load_settings(None, raw, env={})


async def publish(kafka_broker: str, topic: str, events: list[Event]) -> None:
    sink = KafkaSink(kafka_broker, topic=topic)
    await sink.start()
    try:
        await sink.publish(events)
    finally:
        await sink.close()


async def records_on(kafka_broker: str, topic: str, expected: int) -> int:
    """How many records the topic holds (read with a plain consumer, bounded)."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka_broker, auto_offset_reset="earliest")
    await consumer.start()
    n = 0
    try:
        for _ in range(50):
            for recs in (await consumer.getmany(timeout_ms=100)).values():
                n += len(recs)
            if n >= expected:
                break
    finally:
        await consumer.stop()
    return n


async def take_until(
    events: AsyncGenerator[ReceivedEvent, None], last: str, timeout: float = 20.0
) -> list[ReceivedEvent]:
    """Every event consumed up to the one with id ``last``. Published after the others
    to the topic's one partition, it comes after anything that should have been
    dropped: nothing else is waited for."""
    got: list[ReceivedEvent] = []
    try:
        async with asyncio.timeout(timeout):
            async for e in events:
                got.append(e)
                if e.id == last:
                    break
    finally:
        await events.aclose()
    return got


async def test_the_same_event_published_twice_is_consumed_once(
    kafka_broker: str, tmp_path: Path
) -> None:
    topic = f"consume-{uuid.uuid4().hex[:8]}"
    (added,) = [builder.build(c) for c in detector.on_add(configmap("a", 1, "x"))]
    (changed,) = [builder.build(c) for c in detector.on_update(None, configmap("a", 2, "y"))]
    # The redelivery is a new encoding (a new observed time) of the same change: same id.
    (again,) = [builder.build(c) for c in detector.on_add(configmap("a", 1, "x"))]
    assert again.id == added.id
    (last,) = [builder.build(c) for c in detector.on_add(configmap("z", 9, "z"))]
    await publish(kafka_broker, topic, [added, changed, again, last])
    assert await records_on(kafka_broker, topic, 4) == 4  # Kafka kept the duplicate

    settings = settings_for(kafka_broker, topic, tmp_path)
    got = await take_until(consume(settings, from_start=True), last.id)
    assert [e.id for e in got] == ["uid-a:1", "uid-a:2", "uid-z:9"]
    assert [e.change for e in got] == ["added", "modified", "added"]
    assert got[1].object["data"] == {"k": "y"}


async def test_a_shared_deduplicator_drops_what_an_earlier_consumer_saw(
    kafka_broker: str, tmp_path: Path
) -> None:
    """A consumer that restarts with its deduplicator reads the topic again without repeats."""
    topic = f"consume-{uuid.uuid4().hex[:8]}"
    events = [
        builder.build(c) for i in range(3) for c in detector.on_add(configmap(f"c{i}", i + 1, "v"))
    ]
    await publish(kafka_broker, topic, events)
    settings = settings_for(kafka_broker, topic, tmp_path)
    dedupe = Deduplicator()
    first = await take_until(consume(settings, from_start=True, dedupe=dedupe), events[-1].id)
    assert len(first) == 3
    more = [builder.build(c) for c in detector.on_add(configmap("c9", 9, "v"))]
    await publish(kafka_broker, topic, more)
    second = await take_until(consume(settings, from_start=True, dedupe=dedupe), "uid-c9:9")
    assert [e.id for e in second] == ["uid-c9:9"]


async def test_a_message_that_is_not_a_cloudevent_is_skipped(
    kafka_broker: str, tmp_path: Path
) -> None:
    topic = f"consume-{uuid.uuid4().hex[:8]}"
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=kafka_broker)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"hello, not an event", key=b"ns/a")
    finally:
        await producer.stop()
    (event,) = [builder.build(c) for c in detector.on_add(configmap("a", 3, "x"))]
    await publish(kafka_broker, topic, [event])
    got = await take_until(
        consume(settings_for(kafka_broker, topic, tmp_path), from_start=True), event.id
    )
    assert [e.id for e in got] == [event.id]
