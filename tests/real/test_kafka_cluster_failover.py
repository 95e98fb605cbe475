"""A partition leader of a three-broker Apache Kafka cluster dies, or stalls, under churn.

Three KRaft brokers (each also a controller) on loopback; the events topic and
the checkpoint topic have 3 replicas, ``min.insync.replicas`` 2, unclean
leader election off; the producer runs at its defaults (acks=all, idempotent).

- ``kill -9`` of the events partition's leader, twice (the first back in sync
  before the second): the bridge does not exit; the seconds from each kill to
  the partition's first new acknowledged record are printed; at the end a
  read_committed consumer of the test's own reads the topic: nothing lost,
  nothing out of order per object, and a LIST on kube-apiserver agrees.
- ``SIGSTOP`` of the leader: Kafka's client neither fails nor lands anything
  while the broker hangs (the produce request stays in flight up to the client's
  request timeout), so no error says so. ``k8s_bridge_oldest_unacked_age_seconds``
  grows and ``/readyz`` turns 503 past ``health.stallSeconds``; after ``SIGCONT``
  both recover.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tests.e2e.bridge_process import BridgeProcess, until, write_config
from tests.e2e.crash_world import kafka_checkpoint_settled, kafka_events, seed
from tests.fixtures.kafkacluster import KafkaCluster
from tests.fixtures.kube import KubeCluster
from tests.real.failover import check_against_the_api, churning, new_world, recovery_after

pytestmark = [pytest.mark.timeout(240)]

# A dead leader is replaced once the controller fences it: broker.session.timeout.ms
# (9 s) after its last heartbeat, then the client's metadata refresh. Measured
# 7.4 to 13.8 s on this cluster.
RECOVERY_BOUND = 25.0
GAUGE = "k8s_bridge_oldest_unacked_age_seconds"


class Topics:
    """The oracle's own admin client and consumer: leaders, ISR, end offsets."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=3000)

    async def __aenter__(self) -> Topics:
        await self.admin.start()
        await self.consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.stop()
        await self.admin.close()

    async def create(self, *names: str) -> None:
        await self.admin.create_topics([NewTopic(n, 1, 3) for n in names])

    async def partition(self, topic: str) -> dict[str, Any]:
        (described,) = await self.admin.describe_topics([topic])
        part: dict[str, Any] = described["partitions"][0]
        return part

    async def end(self, topic: str) -> int:
        tp = TopicPartition(topic, 0)
        return int((await self.consumer.end_offsets([tp]))[tp])


@pytest.fixture(scope="module")
def cluster() -> Iterator[KafkaCluster]:
    """One cluster for this module's tests (starting three JVMs takes ~15 s)."""
    import shutil
    import tempfile

    workdir = Path(tempfile.mkdtemp(prefix="k8s-bridge-kafka-cluster-"))
    c = KafkaCluster(workdir)
    try:
        c.start()
        yield c
    finally:
        c.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def bridge_config(
    tmp_path: Path, kube: KubeCluster, ns: str, cluster: KafkaCluster, tag: str, **extra: Any
) -> Path:
    return write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kube.write_kubeconfig(tmp_path / "kubeconfig"),
        sink={
            "kind": "kafka",
            "kafka": {"bootstrapServers": cluster.bootstrap.split(","), "topic": tag},
        },
        resources=[{"apiVersion": "v1", "kind": "Pod", "namespaces": [ns]}],
        checkpoint={"kind": "kafka", "kafka": {"topic": f"{tag}-cp"}, "flushInterval": 1.0},
        **extra,
    )


async def test_kill9_of_the_partition_leader_loses_nothing(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, cluster: KafkaCluster
) -> None:
    s = seed()
    ns, tag = kube_namespace, f"fail-{uuid.uuid4().hex[:8]}"
    world = new_world(kube_cluster, ns, s, initial=60)
    recoveries: list[tuple[int, float]] = []
    async with Topics(cluster.bootstrap) as topics:
        await topics.create(tag)
        bridge = BridgeProcess(bridge_config(tmp_path, kube_cluster, ns, cluster, tag))
        await bridge.start()
        try:
            await bridge.wait_ready(90)
            async with churning(world) as changes:
                for _ in range(2):
                    await until(lambda: changes[0] > 40, 30)
                    changes[0] = 0
                    victim = cluster.broker((await topics.partition(tag))["leader"])

                    async def acknowledged() -> int:
                        return await topics.end(tag)

                    seconds = await recovery_after(victim.kill, acknowledged, bridge)
                    recoveries.append((victim.node_id, seconds))
                    print(
                        f"\nkafka: kill -9 of partition leader broker {victim.node_id}:"
                        f" first new ack after {seconds:.2f} s"
                    )
                    await until(lambda: changes[0] > 40, 30)
                    victim.start()

                    async def in_sync() -> bool:
                        return len((await topics.partition(tag))["isr"]) == 3

                    await until(in_sync, 60, lambda: "the restarted broker never rejoined the ISR")
            settled = kafka_checkpoint_settled(
                cluster.brokers[0].bootstrap, f"{tag}-cp", f"core/v1/pods@{ns}"
            )
            started = time.monotonic()
            await until(lambda: settled(world), 60, lambda: f"never settled:\n{bridge.tail_log()}")
            print(f"kafka: settled {time.monotonic() - started:.1f} s after the churn stopped")
            assert bridge.proc is not None and bridge.proc.returncode is None, bridge.tail_log()
        finally:
            await bridge.stop()
    events = await kafka_events(cluster.bootstrap, tag, isolation_level="read_committed")
    check_against_the_api(world, events, s, "kube-apiserver+kafka 3 brokers")
    slow = [r for r in recoveries if r[1] > RECOVERY_BOUND]
    assert len(recoveries) == 2 and not slow, recoveries


async def test_a_stalled_partition_leader_shows_in_the_metric_and_readiness(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, cluster: KafkaCluster
) -> None:
    ns, tag = kube_namespace, f"stall-{uuid.uuid4().hex[:8]}"
    world = new_world(kube_cluster, ns, seed(), initial=20)
    resource = f'{GAUGE}{{resource="v1/pods@{ns}"}}'
    seen: list[tuple[float, int, float]] = []  # (since the pause, /readyz, the gauge)

    async def look(since: float) -> tuple[int, str, float]:
        code, body = await bridge.readyz()
        text = await bridge.metrics()
        line = next((x for x in text.splitlines() if x.startswith(resource)), f"{resource} -1")
        age = float(line.rsplit(" ", 1)[1])
        seen.append((round(time.monotonic() - since, 1), code, age))
        return code, body, age

    async with Topics(cluster.bootstrap) as topics:
        await topics.create(tag)
        config = bridge_config(tmp_path, kube_cluster, ns, cluster, tag, health={"stallSeconds": 3})
        bridge = BridgeProcess(config)
        await bridge.start()
        try:
            await bridge.wait_ready(90)
            async with churning(world):
                await until(lambda: topics.end(tag), 30)  # events flowing
                victim = cluster.broker((await topics.partition(tag))["leader"])
                victim.pause()
                paused = time.monotonic()
                try:

                    async def stalled() -> bool:
                        code, body, age = await look(paused)
                        return code == 503 and "has not acknowledged an event" in body and age >= 3

                    await until(stalled, 30, lambda: f"no stall shown: {seen}")
                    shown = seen[-1]
                    print(f"\nkafka: paused leader {victim.node_id}; stall shown: {shown}")

                    async def grew() -> bool:
                        return (await look(paused))[2] >= shown[2] + 2

                    await until(grew, 30, lambda: f"the age did not grow: {seen}")
                finally:
                    victim.resume()
                resumed = time.monotonic()

                async def recovered() -> bool:
                    code, _, age = await look(paused)
                    return code == 200 and 0 <= age < 3

                await until(recovered, 60, lambda: f"never recovered: {seen}\n{bridge.tail_log()}")
                print(
                    f"kafka: ready again {time.monotonic() - resumed:.1f} s after the"
                    f" broker resumed: {seen[-1]}"
                )
            assert max(age for _, _, age in seen) >= 3, seen
            assert bridge.proc is not None and bridge.proc.returncode is None, bridge.tail_log()
        finally:
            await bridge.stop()
