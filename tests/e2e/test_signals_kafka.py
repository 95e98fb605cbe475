"""Heartbeats and ``k8s-bridge snapshot`` end to end on Kafka: ``k8s-bridge run`` as a
process, the emulator over HTTP, a real Apache Kafka broker.

Heartbeats go to their own topic (``{topic}.heartbeats``), never among the
changes; snapshot announcements go to the change topic with the object's key,
so they keep its partition and hence its order.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from bridge.emulator import Emulator
from tests.e2e.bridge_process import BridgeProcess, cli, kafka_sink, published_once, write_config
from tests.e2e.test_run_kafka import Topic, decoded, pod
from tests.e2e.test_signals_nats import pods_with_heartbeats

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


async def test_heartbeats_and_a_snapshot_signal_reach_kafka(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, kafka_broker: str
) -> None:
    topic = "k8s-" + uuid.uuid4().hex[:8]
    for i in range(5):
        emulator.create(pod(f"p{i}"))
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink=kafka_sink(kafka_broker, topic),
        resources=pods_with_heartbeats(0.3),
    )
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready()
        async with Topic(kafka_broker, topic) as changes:
            await changes.at_least(5)
            rc, out, err = await cli("snapshot", "--config", str(config), "--resource", "Pod")
            assert rc == 0, err
            await changes.at_least(10)
            assert await published_once(bridge, 10) == 10
            await changes.to_end()
        async with Topic(kafka_broker, f"{topic}.heartbeats") as beats:
            await beats.at_least(3, timeout=20)
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
    m = re.match(r"snapshot (\w+) of v1/pods: announced 5, skipped 0, listed 5 in ", out)
    assert m, out
    signal = m.group(1)
    events = [decoded(r) for r in changes.records]
    assert [e["type"] for e in events].count("io.k8s.core.v1.Pod.snapshot") == 5
    assert not any(e["type"] == "io.k8s.bridge.heartbeat" for e in events)
    for r, e in zip(changes.records, events, strict=True):
        assert r.key == e["subject"].encode()  # the object's partition, so its order
        if e["type"].endswith(".snapshot"):
            uid = e["data"]["object"]["metadata"]["uid"]
            assert e["id"] == f"{uid}:{e['resourceversion']}:snapshot:{signal}"
            assert dict(r.headers)["ce_id"] == e["id"].encode()
    hb = [decoded(r) for r in beats.records]
    assert all(e["type"] == "io.k8s.bridge.heartbeat" for e in hb)
    assert len({e["id"] for e in hb}) == len(hb)
    assert (hb[-1]["data"]["objects"], hb[-1]["data"]["synced"]) == (5, True)
