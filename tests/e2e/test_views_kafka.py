"""A filter, change triggers and a projection together, end to end on Kafka: ``k8s-bridge
run`` as a process, the emulator over HTTP, a real Apache Kafka broker.

Only pods of the filter reach the topic, only trigger changes as modifications,
each value carrying only the projected fields; leaving the filter is a
``filtered`` event keyed like the object's other events (same partition, so
consumers see it after them).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from bridge.emulator import Emulator
from tests.e2e.bridge_process import BridgeProcess, kafka_sink, published_once, write_config
from tests.e2e.test_run_kafka import Topic, decoded
from tests.e2e.test_views_nats import pod

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def patch(emulator: Emulator, name: str, body: dict[str, Any]) -> dict[str, Any]:
    return emulator.patch("v1", "Pod", name, body, namespace="default")


async def test_filter_triggers_and_projection_on_kafka(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, kafka_broker: str
) -> None:
    topic = "k8s-" + uuid.uuid4().hex[:8]
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink=kafka_sink(kafka_broker, topic),
        resources=[
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "filter": "object.metadata.labels['app'] == 'web'",
                "triggerPaths": ["spec.nodeName", "metadata.labels"],
                "fields": ["spec.nodeName"],
            }
        ],
    )
    emulator.create(pod("web"))
    other = pod("db")
    other["metadata"]["labels"] = {"app": "db"}
    emulator.create(other)
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready()
        async with Topic(kafka_broker, topic) as records:
            await records.at_least(1)
            patch(emulator, "web", {"status": {"phase": "Running"}})  # not a trigger
            patch(emulator, "db", {"spec": {"nodeName": "n2"}})  # outside the filter
            patch(emulator, "web", {"spec": {"nodeName": "n1"}})  # a trigger
            left = patch(emulator, "web", {"metadata": {"labels": {"app": "old"}}})  # leaves
            await records.at_least(3)
            # The changes that trigger nothing or are outside the filter were decided
            # before the last: counted by now, were they published.
            assert await published_once(bridge, 3) == 3
            await records.to_end()
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
    events = [decoded(r) for r in records.records]
    assert [(e["type"].rsplit(".", 1)[1], e["subject"]) for e in events] == [
        ("added", "default/web"),
        ("modified", "default/web"),
        ("filtered", "default/web"),
    ]
    assert {r.key for r in records.records} == {b"default/web"}
    assert events[1]["data"]["object"]["spec"] == {"nodeName": "n1"}
    assert "status" not in events[1]["data"]["object"]
    m = left["metadata"]
    assert events[2]["id"] == f"{m['uid']}:filtered:{m['resourceVersion']}"
