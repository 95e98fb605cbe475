"""Routes on the real buses: one copy of an event per route, acknowledged only
when every copy is.

Kafka (Apache Kafka, the producer at its defaults): one record per route, the
same key, value and ``ce_*`` headers on each; a record one route refuses
refuses the event (the poison policy's business) even though another route
took it. JetStream (nats-server): one message per route, on the route's
subject, with ``Nats-Msg-Id`` ``{id}@{route}`` (the default route keeps
``{id}``), so the stream's duplicate window keeps every route's copy and still
drops a redelivery of each.
"""

from __future__ import annotations

import uuid
from typing import Any

import nats
import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bridge.delivery.changes import ChangeDetector, Fingerprinter
from bridge.delivery.events import EventBuilder
from bridge.delivery.routes import Router
from bridge.errors import SinkError
from bridge.ground.envelope import Event
from bridge.ground.nats import MSG_ID
from bridge.sinks.kafka import KafkaSink
from bridge.sinks.nats import NatsSink
from tests.integration.sinks.test_kafka_sink import consume

pytestmark = pytest.mark.integration

TEAM_A = "object.metadata.namespace == 'team-a'"
EVEN = "object.metadata.name.matches('[02468]$')"


def configmap(ns: str, name: str, rv: int, size: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"u-{ns}-{name}",
            "resourceVersion": str(rv),
        },
        "data": {"blob": "x" * size},
    }


def events(cluster: str, objects: list[dict[str, Any]]) -> list[Event]:
    builder = EventBuilder(
        cluster=cluster,
        group="",
        version="v1",
        kind="ConfigMap",
        plural="configmaps",
        router=Router([("a", TEAM_A), ("b", EVEN)], "all"),
    )
    detector = ChangeDetector(Fingerprinter([]))
    return [builder.build(c) for o in objects for c in detector.on_add(o)]


OBJECTS = [
    configmap("team-a", "c1", 1),  # a
    configmap("team-a", "c2", 2),  # a, b
    configmap("team-b", "c3", 3),  # default
    configmap("team-b", "c4", 4),  # b
]


async def test_jetstream_one_message_per_route_each_with_its_own_msg_id(
    nats_server: str,
) -> None:
    tag = uuid.uuid4().hex[:8]
    cluster = f"c{tag}"
    evs = events(cluster, OBJECTS)
    assert [e.routes for e in evs] == [("a",), ("a", "b"), (), ("b",)]
    sink = NatsSink(
        [nats_server],
        stream=f"R{tag}",
        subjects=[f"k8s.{cluster}.>", f"ra{tag}.>", f"rb{tag}.>"],
        routes={"a": f"ra{tag}", "b": f"rb{tag}"},
    )
    await sink.start()
    try:
        assert await sink.publish(evs) == {}
        assert await sink.publish(evs) == {}  # a redelivery: every copy dropped as seen
    finally:
        await sink.close()
    nc = await nats.connect(nats_server)
    try:
        js = nc.jetstream()
        info = await js.stream_info(f"R{tag}")
        msgs = [await js.get_msg(f"R{tag}", seq) for seq in range(1, info.state.messages + 1)]
    finally:
        await nc.close()
    got = [
        (m.subject.split(".", 1)[0], m.headers[MSG_ID], orjson.loads(m.data)["id"]) for m in msgs
    ]
    ids = [e.id for e in evs]
    assert got == [
        (f"ra{tag}", f"{ids[0]}@a", ids[0]),
        (f"ra{tag}", f"{ids[1]}@a", ids[1]),
        (f"rb{tag}", f"{ids[1]}@b", ids[1]),
        ("k8s", ids[2], ids[2]),
        (f"rb{tag}", f"{ids[3]}@b", ids[3]),
    ]
    # The route's subject keeps the event's own tokens after its prefix.
    assert msgs[1].subject == f"ra{tag}" + evs[1].nats_subject.removeprefix("k8s")


async def make_topics(bootstrap: str, *topics: NewTopic) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(list(topics))
    finally:
        await admin.close()


async def test_kafka_one_record_per_route_with_the_same_key_value_and_headers(
    kafka_broker: str,
) -> None:
    tag = uuid.uuid4().hex[:8]
    default, ta, tb = f"d-{tag}", f"a-{tag}", f"b-{tag}"
    evs = events("kc", OBJECTS)
    sink = KafkaSink([kafka_broker], topic=default, routes={"a": ta, "b": tb})
    await sink.start()
    try:
        assert await sink.publish(evs) == {}
    finally:
        await sink.close()
    on = {t: await consume(kafka_broker, t, n) for t, n in [(default, 1), (ta, 2), (tb, 2)]}
    ids = [e.id for e in evs]

    def seen(topic: str) -> list[str]:
        return [dict(r.headers)["ce_id"].decode() for r in on[topic]]

    assert seen(default) == [ids[2]]
    assert seen(ta) == [ids[0], ids[1]]
    assert seen(tb) == [ids[1], ids[3]]
    a1, b1 = on[ta][1], on[tb][0]
    assert (a1.key, a1.value, a1.headers) == (b1.key, b1.value, b1.headers)


async def test_kafka_a_record_one_route_refuses_refuses_the_event(kafka_broker: str) -> None:
    """Route b's topic takes records of at most 2000 bytes, route a's any: the large
    event lands on a, but b refused it, so the event is refused (and its neighbours,
    sent again alone, land on both)."""
    tag = uuid.uuid4().hex[:8]
    ta, tb = f"a-{tag}", f"b-{tag}"
    await make_topics(
        kafka_broker,
        NewTopic(ta, 1, 1),
        NewTopic(tb, 1, 1, topic_configs={"max.message.bytes": "2000"}),
    )
    objects = [
        configmap("team-a", "c0", 1),
        configmap("team-a", "c2", 2, size=4000),
        configmap("team-a", "c4", 3),
    ]
    evs = events("kc", objects)
    assert all(e.routes == ("a", "b") for e in evs)
    sink = KafkaSink([kafka_broker], topic=f"d-{tag}", routes={"a": ta, "b": tb})
    await sink.start()
    try:
        refused = await sink.publish(evs)
    finally:
        await sink.close()
    assert list(refused) == [1], refused
    assert "too large" in refused[1]
    on_b = [dict(r.headers)["ce_id"].decode() for r in await consume(kafka_broker, tb, 2)]
    assert on_b == [evs[0].id, evs[2].id]


async def test_an_existing_stream_that_does_not_store_a_route_is_one_line_at_start(
    nats_server: str,
) -> None:
    tag = uuid.uuid4().hex[:8]
    # The stream exists with the change subjects only (made by a bridge without routes).
    first = NatsSink([nats_server], stream=f"S{tag}", subjects=[f"k8s.c{tag}.>"])
    await first.start()
    await first.close()
    sink = NatsSink(
        [nats_server],
        stream=f"S{tag}",
        subjects=[f"k8s.c{tag}.>", f"ra{tag}.>"],
        routes={"a": f"ra{tag}"},
    )
    with pytest.raises(SinkError) as e:
        await sink.start()
    assert f"does not store route 'a' (sink.routes subjectPrefix 'ra{tag}')" in str(e.value)
    assert "\n" not in str(e.value)
