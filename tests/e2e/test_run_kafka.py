"""``k8s-bridge run`` as a process against the emulator and a real Apache Kafka broker.

What a consumer of the topic relies on: the initial list and every live
change, key = subject (so one object keeps one partition, hence its order),
CloudEvents binding headers, values the CloudEvents SDK parses, Secret values
never in the bytes, and nothing new after a graceful restart.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRecord
from cloudevents.v1.http import from_json

from bridge.emulator import Emulator
from tests.e2e.bridge_process import BridgeProcess, kafka_sink, published_once, write_config
from tests.fixtures.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SECRET_B64 = "aHVudGVyMg=="
SECRET_TEXT = "s3cr3t-value"


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "nginx:1"}]},
        "status": {"phase": "Pending"},
    }


class Topic:
    """Reads a topic from the start with a consumer of the test's own."""

    def __init__(self, bootstrap: str, name: str) -> None:
        self.bootstrap = bootstrap
        self.name = name
        self.records: list[ConsumerRecord[bytes, bytes]] = []
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> Topic:
        self._consumer = AIOKafkaConsumer(
            self.name,
            bootstrap_servers=self.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            group_id=None,
        )
        await self._consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._consumer is not None:
            await self._consumer.stop()

    async def poll(self) -> int:
        assert self._consumer is not None
        batch = await self._consumer.getmany(timeout_ms=200)
        for recs in batch.values():
            self.records.extend(recs)
        return len(self.records)

    async def at_least(self, n: int, timeout: float = 30.0) -> None:
        async def enough() -> bool:
            return await self.poll() >= n

        await until(enough, timeout, lambda: f"{len(self.records)} of {n} records on {self.name}")

    async def to_end(self) -> None:
        """Read up to the end offsets the topic has now: every record acknowledged so
        far. After the bridge's published count reached its value, nothing it
        published is missing, and nothing extra it published can be hidden."""
        consumer = self._consumer
        assert consumer is not None
        while not consumer.assignment():  # no group: every partition, once known
            await self.poll()
        ends = await consumer.end_offsets(list(consumer.assignment()))
        while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
            await self.poll()


@pytest.fixture
def topic() -> str:
    return "k8s-" + uuid.uuid4().hex[:8]


@pytest.fixture
def config(tmp_path: Path, kubeconfig: Path, kafka_broker: str, topic: str) -> Path:
    return write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink=kafka_sink(kafka_broker, topic),
    )


def decoded(r: ConsumerRecord[bytes, bytes]) -> dict[str, Any]:
    assert r.value is not None
    doc: dict[str, Any] = orjson.loads(r.value)
    return doc


async def test_initial_and_live_changes_reach_the_topic_keyed_with_headers_in_order(
    config: Path, emulator: Emulator, kafka_broker: str, topic: str
) -> None:
    emulator.create(pod("before"))
    emulator.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds", "namespace": "default"},
            "data": {"password": SECRET_B64},
            "stringData": {"token": SECRET_TEXT},
        }
    )
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready(30)
        emulator.create(pod("web"))
        for phase in ("Running", "Succeeded"):
            emulator.patch("v1", "Pod", "web", {"status": {"phase": phase}}, namespace="default")
        # An ignored field only: no event.
        emulator.patch(
            "v1",
            "Pod",
            "web",
            {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
            namespace="default",
        )
        emulator.create(
            {
                "apiVersion": "example.com/v1",
                "kind": "Widget",
                "metadata": {"name": "w1", "namespace": "default"},
                "spec": {"size": 1},
            }
        )
        emulator.delete("v1", "Pod", "web", namespace="default")
        emulator.delete("v1", "Pod", "before", namespace="default")
        async with Topic(kafka_broker, topic) as t:
            await t.at_least(8, 30)
            assert await published_once(bridge, 8, resource=None) == 8
            await t.to_end()
            records = t.records
    finally:
        assert await bridge.stop() == 0

    events = [decoded(r) for r in records]
    got = sorted(
        (e["type"].rsplit(".", 2)[-2], e["type"].rsplit(".", 1)[-1], e["subject"]) for e in events
    )
    assert got == sorted(
        [
            ("Pod", "added", "default/before"),
            ("Secret", "added", "default/creds"),
            ("Pod", "added", "default/web"),
            ("Pod", "modified", "default/web"),
            ("Pod", "modified", "default/web"),
            ("Widget", "added", "default/w1"),
            ("Pod", "deleted", "default/web"),
            ("Pod", "deleted", "default/before"),
        ]
    )
    assert {e["subject"] for e in events if e["initial"]} == {"default/before", "default/creds"}
    for r, e in zip(records, events, strict=True):
        assert r.key == e["subject"].encode()
        headers = {k: v.decode() for k, v in r.headers}
        assert headers["ce_id"] == e["id"]
        assert headers["ce_type"] == e["type"]
        assert headers["ce_source"] == e["source"]
        assert headers["ce_subject"] == e["subject"]
        assert r.value is not None
        ce = from_json(r.value)
        assert ce["specversion"] == "1.0" and ce["id"] == e["id"]
        assert ce["source"].startswith("k8s://e2e/")
    # Per key: one partition, offsets in resourceVersion order, the story in order.
    web = [(r, e) for r, e in zip(records, events, strict=True) if e["subject"] == "default/web"]
    assert len({r.partition for r, _ in web}) == 1
    assert [e["type"].rsplit(".", 1)[-1] for _, e in web] == [
        "added",
        "modified",
        "modified",
        "deleted",
    ]
    assert [r.offset for r, _ in web] == sorted(r.offset for r, _ in web)
    rvs = [int(e["resourceversion"]) for _, e in web]
    assert rvs == sorted(rvs) and len(set(rvs)) == len(rvs)
    assert [e["data"]["object"]["status"]["phase"] for _, e in web[1:3]] == [
        "Running",
        "Succeeded",
    ]
    raw = b"".join((r.value or b"") + b"".join(v for _, v in r.headers) for r in records)
    assert SECRET_B64.encode() not in raw and SECRET_TEXT.encode() not in raw
    assert b"hunter2" not in raw


async def test_graceful_restart_publishes_nothing_new(
    config: Path, emulator: Emulator, kafka_broker: str, topic: str
) -> None:
    for name in ("a", "b", "c"):
        emulator.create(pod(name))
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready(30)
        async with Topic(kafka_broker, topic) as t:
            await t.at_least(3, 30)
    finally:
        assert await bridge.stop(signal.SIGTERM) == 0

    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready(30)
        # A change after the restart does arrive: the second run is live, not just idle.
        # Anything the restart republished would be counted before it.
        emulator.patch("v1", "Pod", "a", {"status": {"phase": "Running"}}, namespace="default")
        assert await published_once(bridge, 1, resource=None) == 1
        async with Topic(kafka_broker, topic) as t:
            await t.at_least(4, 30)
            await t.to_end()
            records = t.records
    finally:
        assert await bridge.stop(signal.SIGINT) == 0
    events = [decoded(r) for r in records]
    assert len(events) == 4, [(e["type"], e["subject"]) for e in events]
    # Records of different keys may sit in different partitions: no order across them.
    assert sorted((e["type"].rsplit(".", 1)[-1], e["subject"]) for e in events) == [
        ("added", "default/a"),
        ("added", "default/b"),
        ("added", "default/c"),
        ("modified", "default/a"),
    ]
    assert len({e["id"] for e in events}) == 4
