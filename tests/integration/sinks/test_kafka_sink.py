"""KafkaSink against a real Kafka-protocol broker (Tansu)."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer
from cloudevents.v1.http import from_json

from bridge.changes import ChangeDetector, Fingerprinter
from bridge.errors import ConfigError, SinkUnavailableError
from bridge.events import Event, EventBuilder
from bridge.sinks.kafka import KafkaSink
from tests.fixtures.nats import free_port

pytestmark = pytest.mark.integration

detector = ChangeDetector(Fingerprinter([]))


def deployment(i: int, name: str, rv: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": str(rv),
        },
        "spec": {"replicas": i},
    }


def make_events(n: int, names: int = 5) -> list[Event]:
    b = EventBuilder(
        cluster="kc", group="apps", version="v1", kind="Deployment", plural="deployments"
    )
    return [
        b.build(c)
        for i in range(n)
        for c in detector.on_update(None, deployment(i, f"d{i % names}", i + 1))
    ]


async def consume(bootstrap: str, topic: str, expected: int) -> list[Any]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    records: list[Any] = []
    try:
        for _ in range(50):
            batch = await consumer.getmany(timeout_ms=200)
            for recs in batch.values():
                records.extend(recs)
            if len(records) >= expected:
                break
    finally:
        await consumer.stop()
    return records


async def test_key_headers_and_per_key_order(kafka_broker: str) -> None:
    topic = "events-" + uuid.uuid4().hex[:8]
    sink = KafkaSink([kafka_broker], topic=topic, enable_idempotence=False)
    await sink.start()
    try:
        assert await sink.ping()
        events = make_events(200)
        await sink.publish(events[:120])
        await sink.publish(events[120:])
    finally:
        await sink.close()
    records = await consume(kafka_broker, topic, 200)
    assert len(records) == 200
    by_id = {e.id: e for e in events}
    per_key: dict[bytes, list[int]] = {}
    for r in records:
        headers = dict(r.headers)
        event = by_id[headers["ce_id"].decode()]
        assert r.key == event.subject.encode()
        assert headers == {
            "ce_id": event.id.encode(),
            "ce_type": b"io.k8s.apps.v1.Deployment.modified",
            "ce_source": b"k8s://kc/apps/v1/deployments",
            "ce_subject": event.subject.encode(),
        }
        assert from_json(r.value)["id"] == event.id
        per_key.setdefault(r.key, []).append(int(event.resource_version))
    assert len(per_key) == 5
    for rvs in per_key.values():
        assert rvs == sorted(rvs)


async def test_state_table_mode_tombstones_deletes(kafka_broker: str) -> None:
    topic = "state-" + uuid.uuid4().hex[:8]
    b = EventBuilder(
        cluster="kc", group="apps", version="v1", kind="Deployment", plural="deployments"
    )
    live = deployment(1, "web", 10)
    events = [b.build(c) for c in detector.on_add(live, None)]
    events += [b.build(c) for c in detector.on_delete(deployment(1, "web", 11))]
    sink = KafkaSink([kafka_broker], topic=topic, enable_idempotence=False, state_table=True)
    await sink.start()
    try:
        await sink.publish(events)
    finally:
        await sink.close()
    records = await consume(kafka_broker, topic, 2)
    assert [r.key for r in records] == [b"apps/v1/Deployment/ns/web"] * 2
    assert orjson.loads(records[0].value) == live
    assert records[1].value is None


async def test_topic_template(kafka_broker: str) -> None:
    tag = uuid.uuid4().hex[:6]
    sink = KafkaSink(
        [kafka_broker], topic="k8s-{cluster}-{group}-{resource}-" + tag, enable_idempotence=False
    )
    await sink.start()
    try:
        await sink.publish(make_events(3))
    finally:
        await sink.close()
    assert len(await consume(kafka_broker, f"k8s-kc-apps-deployments-{tag}", 3)) == 3


def test_bad_topic_template_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="namespace"):
        KafkaSink(["127.0.0.1:1"], topic="t-{namespace}")


async def test_unreachable_broker_is_unavailable() -> None:
    sink = KafkaSink(
        [f"127.0.0.1:{free_port()}"], enable_idempotence=False, request_timeout_ms=1000
    )
    with pytest.raises(SinkUnavailableError, match="Kafka"):
        await sink.start()
    assert not await sink.ping()


async def test_a_record_over_max_request_size_is_refused_and_the_rest_land(
    kafka_broker: str,
) -> None:
    topic = "big-" + uuid.uuid4().hex[:8]
    sink = KafkaSink([kafka_broker], topic=topic, enable_idempotence=False, max_request_size=20_000)
    await sink.start()
    try:
        small = make_events(3, names=3)
        obj = {**small[1].data["object"], "spec": {"blob": "x" * 50_000}}
        huge = dataclasses.replace(small[1], data={**small[1].data, "object": obj})
        refused = await sink.publish([small[0], huge, small[2]])
    finally:
        await sink.close()
    assert list(refused) == [1] and "maxRequestSize" in refused[1]
    records = await consume(kafka_broker, topic, 2)
    assert sorted(dict(r.headers)["ce_id"].decode() for r in records) == sorted(
        [small[0].id, small[2].id]
    )


async def test_each_key_lands_in_the_partition_send_would_pick_in_order(
    kafka_broker: str,
) -> None:
    """The sink fills the producer's batches itself: a key must still land where the
    producer's own ``send`` puts it (murmur2 of the key), so that per-object order
    holds across bridge versions, and batches that fill up must leave in order."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    topic = "parts-" + uuid.uuid4().hex[:8]
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=4, replication_factor=1)])
    finally:
        await admin.close()
    # Batches of ~2 KB hold about three of these events: every partition gets several.
    sink = KafkaSink([kafka_broker], topic=topic, enable_idempotence=False, max_batch_size=2_000)
    await sink.start()
    try:
        events = make_events(240, names=12)
        assert await sink.publish(events) == {}
    finally:
        await sink.close()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_broker, enable_idempotence=False)
    await producer.start()
    try:
        await producer.partitions_for(topic)
        expected = {e.key: producer._partition(topic, None, None, None, e.key, b"") for e in events}
    finally:
        await producer.stop()
    assert len(set(expected.values())) > 1, "the keys should spread over partitions"
    records = await consume(kafka_broker, topic, 240)
    assert len(records) == 240
    by_id = {e.id: e for e in events}
    per_key: dict[bytes, list[int]] = {}
    for r in records:
        assert r.partition == expected[r.key], r.key
        per_key.setdefault(r.key, []).append(
            int(by_id[dict(r.headers)["ce_id"].decode()].resource_version)
        )
    assert len(per_key) == 12
    for rvs in per_key.values():
        assert rvs == sorted(rvs) and len(rvs) == 20
