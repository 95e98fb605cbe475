"""A kill -9 in the middle of a long first sync, at-least-once (no transactions):
what the restart publishes again is bounded by the outbox window, not by the sync.

What a crash can leave uncertain is what was written ahead and not yet known to be
acknowledged: the events not yet acknowledged (at most ``pending_limit``, two
batches by default) and the batch acknowledged last, whose certain rows ride with
the next write-ahead (``Outbox.acknowledged_rows``). Before that, acknowledged
rows waited for a commit on its own cadence, and a kill a third of the way
through a first sync of 5,000 objects published 1,919 of the 1,999 events
already acknowledged again. Kafka keeps every copy (JetStream's duplicate window
would hide them), so the count is read from the topic itself, by aiokafka.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bridge.delivery.settings import PipelineSettings
from bridge.emulator import Emulator
from tests.e2e.bridge_process import BridgeProcess, kill9, write_config
from tests.e2e.crash_world import kafka_checkpoint_settled, kafka_events
from tests.fixtures.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

OBJECTS = 5000
# The bound: every event not yet acknowledged at the kill, and the batch acknowledged last.
WINDOW = PipelineSettings().pending_limit + PipelineSettings().max_batch


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "sync"}},
        "spec": {"containers": [{"name": "c", "image": "nginx:1"}]},
    }


@pytest.mark.parametrize("checkpoint", ["kafka", "sqlite"])
async def test_a_kill_in_a_first_sync_publishes_again_at_most_the_window(
    tmp_path: Path, emulator: Emulator, kafka_broker: str, checkpoint: str
) -> None:
    for i in range(OBJECTS):
        emulator.create(pod(f"p{i}"))
    tag = uuid.uuid4().hex[:8]
    topic, cp_topic = f"sync-{tag}", f"sync-cp-{tag}"
    store: dict[str, Any] = (
        {"kind": "kafka", "kafka": {"topic": cp_topic}}
        if checkpoint == "kafka"
        else {"kind": "sqlite", "path": str(tmp_path / "state.db")}
    )
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=emulator.write_kubeconfig(tmp_path / "kubeconfig"),
        resources=[{"apiVersion": "v1", "kind": "Pod"}],
        sink={"kind": "kafka", "kafka": {"bootstrapServers": [kafka_broker], "topic": topic}},
        checkpoint=store,  # the default cadence: flushInterval 1 s
    )
    # The topic made first (one partition, as a broker auto-creates it), so the
    # probe's end offset is read without waiting for the bridge to make it.
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    probe = AIOKafkaConsumer(bootstrap_servers=kafka_broker, enable_auto_commit=False)
    await probe.start()
    bridge = BridgeProcess(config)
    try:
        await bridge.start()
        tp = TopicPartition(topic, 0)
        async with asyncio.timeout(60):  # a look every few ms: the kill lands near a third
            while (await probe.end_offsets([tp]))[tp] < OBJECTS // 3:
                assert bridge.proc is not None and bridge.proc.returncode is None, bridge.tail_log()
                await asyncio.sleep(0.005)
        kill9(bridge)
        assert bridge.proc is not None
        await bridge.proc.wait()
    finally:
        await probe.stop()
    before = len(await kafka_events(kafka_broker, topic))
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready(60)
        if checkpoint == "kafka":
            settled = kafka_checkpoint_settled(kafka_broker, cp_topic, "core/v1/pods")

            async def done() -> bool:
                return len(await kafka_events(kafka_broker, topic)) >= OBJECTS and await settled(
                    _World(emulator.resource_version)
                )

        else:

            async def done() -> bool:
                return len({e["id"] for e in await kafka_events(kafka_broker, topic)}) >= OBJECTS

        await until(done, 60, bridge.tail_log)
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
    ids = Counter(e["id"] for e in await kafka_events(kafka_broker, topic))
    again = sum(n - 1 for n in ids.values())
    assert len(ids) == OBJECTS
    print(f"{checkpoint}: {before} events on the topic at the kill, {again} published again")
    assert again <= WINDOW, f"{again} of {before} published again (bound {WINDOW})"


class _World:
    """What ``kafka_checkpoint_settled`` asks of a world: the resourceVersion to reach."""

    def __init__(self, rv: int) -> None:
        self.rv = rv

    def settled_rv(self) -> int:
        return self.rv
