"""An event's bus-level dedupe id: ``Nats-Msg-Id`` is ``msg_id`` when set, else ``id``."""

from __future__ import annotations

import uuid
from dataclasses import replace

import nats
import orjson
import pytest

from bridge.delivery.changes import ChangeDetector, Fingerprinter
from bridge.delivery.events import EventBuilder
from bridge.ground.envelope import Event
from bridge.ground.nats import MSG_ID
from bridge.sinks.nats import NatsSink

pytestmark = pytest.mark.integration


def one_event(cluster: str) -> Event:
    builder = EventBuilder(
        cluster=cluster, group="", version="v1", kind="ConfigMap", plural="configmaps"
    )
    obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cm", "namespace": "ns", "uid": "u1", "resourceVersion": "7"},
    }
    [change] = ChangeDetector(Fingerprinter([])).on_add(obj)
    return builder.build(change)


async def test_a_copy_with_its_own_msg_id_lands_next_to_the_original_with_the_same_id(
    nats_server: str,
) -> None:
    tag = uuid.uuid4().hex[:8]
    stream, cluster = f"T{tag}", f"c{tag}"
    original = one_event(cluster)
    copy = replace(original, msg_id=f"{original.id}:replay:r1")
    sink = NatsSink([nats_server], stream=stream, subjects=[f"k8s.{cluster}.>"])
    await sink.start()
    try:
        await sink.publish([original])
        await sink.publish([copy])
        await sink.publish([copy])  # the same copy again: a redelivery, dropped
    finally:
        await sink.close()
    nc = await nats.connect(nats_server)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        msgs = [await js.get_msg(stream, seq) for seq in range(1, info.state.messages + 1)]
    finally:
        await nc.close()
    assert [m.headers[MSG_ID] for m in msgs] == [original.id, f"{original.id}:replay:r1"]
    assert [orjson.loads(m.data)["id"] for m in msgs] == [original.id, original.id]
