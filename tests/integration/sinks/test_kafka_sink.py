"""KafkaSink against a real Apache Kafka broker, the producer at its defaults (acks=all, idempotent)."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer
from cloudevents.v1.http import from_json

from bridge.delivery.changes import ChangeDetector, Fingerprinter
from bridge.delivery.events import EventBuilder
from bridge.errors import ConfigError, SinkError, SinkUnavailableError
from bridge.ground.envelope import Event
from bridge.sinks.kafka import KafkaSink
from tests.fixtures.nats import free_port
from tests.fixtures.realkafka import SASL_PASSWORD, SASL_USER, KafkaBroker

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
    sink = KafkaSink([kafka_broker], topic=topic)
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
    sink = KafkaSink([kafka_broker], topic=topic, state_table=True)
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
    sink = KafkaSink([kafka_broker], topic="k8s-{cluster}-{group}-{resource}-" + tag)
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
    sink = KafkaSink([f"127.0.0.1:{free_port()}"], request_timeout_ms=1000)
    with pytest.raises(SinkUnavailableError, match="Kafka"):
        await sink.start()
    assert not await sink.ping()


async def test_a_record_over_max_request_size_is_refused_and_the_rest_land(
    kafka_broker: str,
) -> None:
    topic = "big-" + uuid.uuid4().hex[:8]
    sink = KafkaSink([kafka_broker], topic=topic, max_request_size=20_000)
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
    sink = KafkaSink([kafka_broker], topic=topic, max_batch_size=2_000)
    await sink.start()
    try:
        events = make_events(240, names=12)
        assert await sink.publish(events) == {}
    finally:
        await sink.close()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_broker)
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


@pytest.mark.kafka_settings(message_max_bytes=20_000)
async def test_a_record_the_broker_refuses_as_too_large_leaves_the_rest_landing(
    real_kafka_private: KafkaBroker,
) -> None:
    """Kafka refuses a whole batch when one record is over ``message.max.bytes``, and
    the idempotent producer had numbered that batch: every later batch of the
    partition was then refused as out of order (OutOfOrderSequenceNumber), so each
    later event met the poison policy. Only the large record is refused now."""
    bootstrap = real_kafka_private.bootstrap
    topic = "too-large-" + uuid.uuid4().hex[:8]
    events = make_events(12, names=2)
    obj = {**events[1].data["object"], "spec": {"blob": "x" * 50_000}}
    huge = dataclasses.replace(events[1], data={**events[1].data, "object": obj})
    sink = KafkaSink([bootstrap], topic=topic)  # maxRequestSize above the broker's limit
    await sink.start()
    try:
        assert await sink.publish(events[8:]) == {}
        refused = await sink.publish([events[0], huge, events[2], events[3]])
        assert list(refused) == [1] and "message.max.bytes" in refused[1], refused
        assert await sink.publish(events[4:6]) == {}
        assert list(await sink.publish([huge])) == [0]
        assert await sink.publish(events[6:8]) == {}
    finally:
        await sink.close()
    records = await consume(bootstrap, topic, 11)
    ids = [dict(r.headers)["ce_id"].decode() for r in records]
    expected = [e.id for e in [*events[8:], events[0], events[2], events[3], *events[4:8]]]
    assert ids == expected  # one partition: the order they were published in


@pytest.mark.kafka_settings(auto_create=False)
async def test_a_missing_topic_is_named_and_publishing_resumes_once_it_exists(
    real_kafka_private: KafkaBroker,
) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    bootstrap = real_kafka_private.bootstrap
    topic = "missing-" + uuid.uuid4().hex[:8]
    sink = KafkaSink([bootstrap], topic=topic, metadata_timeout=2.0)
    await sink.start()
    try:
        events = make_events(3)
        with pytest.raises(SinkUnavailableError, match=f"topic '{topic}' does not exist"):
            await sink.publish(events)
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
        finally:
            await admin.close()
        assert await sink.publish(events) == {}
    finally:
        await sink.close()
    assert len(await consume(bootstrap, topic, 3)) == 3


async def test_a_wrong_sasl_password_is_refused_in_one_line_not_retried(
    real_kafka: KafkaBroker,
) -> None:
    """aiokafka reports a refused login as "Unable to bootstrap": the sink must not
    take it for a bus to wait for."""
    topic = "sasl-" + uuid.uuid4().hex[:8]

    def sink(password: str) -> KafkaSink:
        return KafkaSink(
            [real_kafka.sasl_bootstrap],
            topic=topic,
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN",
            sasl_username=SASL_USER,
            sasl_password=password,
        )

    wrong = sink("not-" + SASL_PASSWORD)
    with pytest.raises(SinkError) as refused:
        await wrong.start()
    assert not isinstance(refused.value, SinkUnavailableError)
    message = str(refused.value)
    assert f"authentication failed for user '{SASL_USER}'" in message
    assert real_kafka.sasl_bootstrap in message and "\n" not in message
    assert SASL_PASSWORD not in message
    right = sink(SASL_PASSWORD)
    await right.start()
    try:
        assert await right.publish(make_events(2)) == {}
    finally:
        await right.close()
    assert len(await consume(real_kafka.bootstrap, topic, 2)) == 2


@pytest.mark.kafka_settings(message_max_bytes=20_000)
async def test_publishes_beside_a_refused_record_all_land_once_the_producer_is_renewed(
    real_kafka_private: KafkaBroker,
) -> None:
    """Resources publish through one producer at once (each its own objects): a
    publish still using the producer that another's refusal renewed sees its
    batches refused as out of order, or the producer closed under it; it sends
    them again (or the pipeline's retry does, for "unavailable"), in order per
    object, and none is taken for a poison event."""
    bootstrap = real_kafka_private.bootstrap
    topic = "beside-" + uuid.uuid4().hex[:8]
    b = EventBuilder(
        cluster="kc", group="apps", version="v1", kind="Deployment", plural="deployments"
    )

    def resource(prefix: str, n: int) -> list[Event]:
        return [
            b.build(c)
            for i in range(n)
            for c in detector.on_update(None, deployment(i, f"{prefix}{i % 4}", i + 1))
        ]

    first_resource, second, third = resource("a", 40), resource("b", 40), resource("c", 40)
    big = {**first_resource[0].data["object"], "spec": {"blob": "x" * 50_000}}
    huge = dataclasses.replace(first_resource[0], data={**first_resource[0].data, "object": big})
    sink = KafkaSink([bootstrap], topic=topic, max_batch_size=2_000)
    await sink.start()

    async def publish(batch: list[Event]) -> dict[int, str]:
        while True:  # as the pipeline does: "unavailable" is published again
            try:
                return dict(await sink.publish(batch))
            except SinkUnavailableError:
                await asyncio.sleep(0.1)

    try:
        async with asyncio.TaskGroup() as group:  # a failure cancels the others
            tasks = [
                group.create_task(publish(batch))
                for batch in ([*first_resource[:20], huge, *first_resource[20:]], second, third)
            ]
    finally:
        await sink.close()
    results = [t.result() for t in tasks]
    assert list(results[0]) == [20] and "too large" in results[0][20]
    assert results[1:] == [{}, {}]
    events = [*first_resource, *second, *third]
    records = await consume(bootstrap, topic, len(events))
    first: dict[str, int] = {}
    for r in records:
        first.setdefault(dict(r.headers)["ce_id"].decode(), r.offset)
    assert sorted(first) == sorted(e.id for e in events)
    per_key: dict[str, list[int]] = {}
    for e in sorted(events, key=lambda e: first[e.id]):
        per_key.setdefault(e.key.decode(), []).append(int(e.resource_version))
    assert len(per_key) == 12
    for rvs in per_key.values():
        assert rvs == sorted(rvs)
