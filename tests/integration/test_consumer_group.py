"""``consume(..., group=...)`` on a real Apache Kafka broker and a real JetStream:
resuming where the group left, redeliveries recognised by the group's positions
kept on its own bus (a compacted topic, a KV bucket), bad input skipped and counted.

The kill -9 property of the same code is tests/e2e/test_consumer_crash.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from bridge.cli.tail import tail
from bridge.consumer import LAST, ConsumerStats, ReceivedEvent, consume
from bridge.delivery.events import EventBuilder
from bridge.errors import ConfigError
from bridge.ground.envelope import Event
from bridge.service.settings import Settings, load_settings
from bridge.sinks.kafka import KafkaSink
from bridge.sinks.nats import NatsSink
from tests.integration.test_consumer import builder, detector
from tests.integration.test_consumer import configmap as configmap_with

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def configmap(name: str, rv: int) -> dict[str, Any]:
    return configmap_with(name, rv, str(rv))


def added(name: str, rv: int) -> Event:
    (e,) = [builder.build(c) for c in detector.on_add(configmap(name, rv))]
    return e


def settings_for(sink: dict[str, Any], tmp_path: Path) -> Settings:
    raw = {
        "cluster": {"kubeconfig": str(tmp_path / "unused-kubeconfig"), "name": "it"},
        "resources": [{"apiVersion": "v1", "kind": "ConfigMap"}],
        "sink": sink,
        "checkpoint": {"kind": "memory"},
    }
    return load_settings(None, raw, env={})


async def take(events: Any, n: int, *, last: bool = True, timeout: float = 30.0) -> list[str]:
    """``n`` events' ids (fewer if ``timeout`` passes first); the n-th is handled
    (``asend(LAST)``) when ``last``."""
    got: list[str] = []
    try:
        async with asyncio.timeout(timeout):
            e: ReceivedEvent = await anext(events)
            while True:
                got.append(e.id)
                if len(got) == n:
                    if last:
                        with pytest.raises(StopAsyncIteration):
                            await events.asend(LAST)
                    break
                e = await anext(events)
    except TimeoutError:
        pass
    finally:
        await events.aclose()
    return got


async def resumes_and_recognises(settings: Settings, publish: Any) -> None:
    group = "g-" + uuid.uuid4().hex[:6]
    await publish([added("a", 1), added("b", 2), added("c", 3)])
    first = await take(consume(settings, group=group, from_start=True), 2)
    assert first == ["uid-a:1", "uid-b:2"]
    # An older state of a (a redelivery the id window would have forgotten), a new one of a.
    await publish([added("a", 1), added("a", 4)])
    stats = ConsumerStats()
    second = await take(consume(settings, group=group, from_start=True, stats=stats), 2)
    assert second == ["uid-c:3", "uid-a:4"]
    assert stats.redeliveries == 1
    # Closed while holding an event: it was not handled, so it comes again.
    assert await take(consume(settings, group=group), 1, last=False, timeout=5) == []  # nothing new
    await publish([added("d", 5)])
    assert await take(consume(settings, group=group), 1, last=False) == ["uid-d:5"]
    assert await take(consume(settings, group=group), 1) == ["uid-d:5"]


async def test_a_kafka_group_resumes_and_recognises_redeliveries(
    kafka_broker: str, tmp_path: Path
) -> None:
    topic = f"group-{uuid.uuid4().hex[:8]}"
    settings = settings_for(
        {"kind": "kafka", "kafka": {"bootstrapServers": [kafka_broker], "topic": topic}}, tmp_path
    )

    async def publish(events: list[Event]) -> None:
        sink = KafkaSink(kafka_broker, topic=topic)
        await sink.start()
        try:
            await sink.publish(events)
        finally:
            await sink.close()

    await resumes_and_recognises(settings, publish)


async def test_a_jetstream_durable_resumes_and_recognises_redeliveries(
    nats_server: str, tmp_path: Path
) -> None:
    stream = "G" + uuid.uuid4().hex[:6].upper()
    cluster = "it" + uuid.uuid4().hex[:4]
    settings = settings_for(
        {"kind": "nats", "nats": {"servers": [nats_server], "stream": stream,
                                  "subjects": [f"k8s.{cluster}.>"]}},
        tmp_path,
    )  # fmt: skip
    settings.cluster.name = cluster
    mine = EventBuilder(
        cluster=cluster, group="", version="v1", kind="ConfigMap", plural="configmaps"
    )

    async def publish(events: list[Event]) -> None:
        sink = NatsSink([nats_server], stream=stream, subjects=[f"k8s.{cluster}.>"])
        await sink.start()
        try:
            again = []
            for e in events:
                (c,) = detector.on_add(configmap(e.subject.split("/")[1], int(e.resource_version)))
                # A fresh Nats-Msg-Id, as replay gives its copies: JetStream's duplicate
                # window keeps the redelivery, the consumer must recognise it.
                ev = mine.build(c)
                again.append(dataclasses.replace(ev, msg_id=f"{ev.id}:replay:{uuid.uuid4().hex}"))
            await sink.publish(again)
        finally:
            await sink.close()

    await resumes_and_recognises(settings, publish)


async def test_bad_input_is_counted_and_skipped_by_a_group(
    kafka_broker: str, tmp_path: Path
) -> None:
    topic = f"group-{uuid.uuid4().hex[:8]}"
    settings = settings_for(
        {"kind": "kafka", "kafka": {"bootstrapServers": [kafka_broker], "topic": topic}}, tmp_path
    )
    producer = AIOKafkaProducer(bootstrap_servers=kafka_broker)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"hello, not an event", key=b"ns/a")
        await producer.send_and_wait(topic, None, key=b"ns/b")
        await producer.send_and_wait(topic, b'{"id": "x"}', key=b"ns/c")
        await producer.send_and_wait(topic, added("a", 3).to_json(), key=b"ns/a")
    finally:
        await producer.stop()
    stats = ConsumerStats()
    got = await take(consume(settings, group="bad", from_start=True, stats=stats), 1)
    assert got == ["uid-a:3"]
    assert stats.skipped == 3, stats
    assert stats.skipped_reasons == {"parse": 2, "null": 1}


async def test_tail_with_a_group_prints_each_event_once(kafka_broker: str, tmp_path: Path) -> None:
    topic = f"group-{uuid.uuid4().hex[:8]}"
    settings = settings_for(
        {"kind": "kafka", "kafka": {"bootstrapServers": [kafka_broker], "topic": topic}}, tmp_path
    )
    sink = KafkaSink(kafka_broker, topic=topic)
    await sink.start()
    try:
        await sink.publish([added("a", 1), added("b", 2), added("c", 3)])
    finally:
        await sink.close()
    outs = []
    for _ in range(2):
        out = io.StringIO()
        await tail(settings, resource=None, count=0, from_start=True, idle_timeout=3,
                   stop=asyncio.Event(), out=out, as_json=False, group="t",
                   positions=str(tmp_path / "pos.db"))  # fmt: skip
        outs.append(out.getvalue().splitlines())
    assert [line.split()[2] for line in outs[0]] == ["ns/a", "ns/b", "ns/c"]
    assert outs[1] == []
    with pytest.raises(ConfigError, match="--positions"):
        await tail(settings, resource=None, count=1, from_start=True, idle_timeout=1,
                   stop=asyncio.Event(), out=io.StringIO(), positions="x.db")  # fmt: skip
