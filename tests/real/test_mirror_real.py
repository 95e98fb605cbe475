"""``bridge.Mirror`` equals the API server: after churn, a bridge restart and a
consumer restart, ``mirror.list()`` is a LIST on kube-apiserver (uid,
resourceVersion, content), for each way a mirror bootstraps.

Pods in the test's namespace are created, relabelled and deleted (names
re-used) at random while bridges publish them: one to a change topic on Apache
Kafka, one to a ``stateTable`` topic, or one to JetStream. The bridges are
stopped and started again between rounds of churn (changes made while they
are down come as the restart's relist diff). A first mirror follows all along
and is then replaced by a second, started from scratch (the consumer restart).
Each must end equal to the API server's LIST: the same objects, each at the
same resourceVersion, with the same content (the LIST's items have no
``apiVersion``/``kind``, so those two are left out of the comparison).

The seed is in every failure message (``CRASH_SEED=… pytest …`` replays a run).
"""

from __future__ import annotations

import asyncio
import random
import uuid
from pathlib import Path
from typing import Any

import pytest

from bridge.mirroring.mirror import Mirror
from bridge.service.settings import load_settings
from tests.e2e.bridge_process import BridgeProcess
from tests.e2e.crash_world import seed
from tests.fixtures.kube import KubeCluster
from tests.fixtures.nats import NatsServer
from tests.fixtures.realkafka import KafkaBroker
from tests.fixtures.waiting import until
from tests.real.kafkabus import PodBridge, pod

pytestmark = [pytest.mark.timeout(120)]


class Churn:
    def __init__(self, cluster: KubeCluster, ns: str, rng: random.Random) -> None:
        self.cluster, self.ns, self.rng = cluster, ns, rng
        self.live: list[str] = []
        self.gone: list[str] = []
        self.n = 0

    def step(self) -> None:
        r = self.rng.random()
        if not self.live or r < 0.35:
            if self.gone and self.rng.random() < 0.3:
                name = self.gone.pop()  # the same name, a new uid
            else:
                self.n += 1
                name = f"p{self.n}"
            self.cluster.create(pod(name, self.ns))
            self.live.append(name)
        elif r < 0.8:
            name = self.rng.choice(self.live)
            patch = {"metadata": {"labels": {"v": str(self.rng.randrange(10**6))}}}
            self.cluster.patch("v1", "Pod", name, patch, namespace=self.ns)
        else:
            name = self.live.pop(self.rng.randrange(len(self.live)))
            self.cluster.delete("v1", "Pod", name, namespace=self.ns)
            self.gone.append(name)

    async def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()
            await asyncio.sleep(0.005)


def listed(cluster: KubeCluster, ns: str) -> dict[str, dict[str, Any]]:
    items = cluster.list("v1", "Pod", ns)["items"]
    return {i["metadata"]["uid"]: i for i in items}


def mirrored(mirror: Mirror, ns: str) -> dict[str, dict[str, Any]]:
    out = {}
    for obj in mirror.list("Pod", namespace=ns):
        obj = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
        out[obj["metadata"]["uid"]] = obj
    return out


def difference(want: dict[str, Any], got: dict[str, Any]) -> str:
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    stale = [
        f"{u}: rv {got[u]['metadata']['resourceVersion']} != {want[u]['metadata']['resourceVersion']}"
        for u in set(want) & set(got)
        if got[u] != want[u]
    ]
    return f"missing {missing[:5]}, extra {extra[:5]}, differing {stale[:5]}"


async def equal_after_restarts(
    cluster: KubeCluster,
    ns: str,
    bridges: list[BridgeProcess],
    settings: Any,
    s: int,
    lagging: BridgeProcess | None = None,
    heartbeats: bool = False,
    **kw: Any,
) -> None:
    """``lagging``: one of ``bridges`` stopped before the last churn and left down, so
    what it publishes (a state table) is behind the change stream."""
    rng = random.Random(s)
    churn = Churn(cluster, ns, rng)
    for _ in range(20):
        churn.step()
    for b in bridges:
        await b.start()
    first = Mirror(settings, **kw)
    try:
        for b in bridges:
            await b.wait_ready(60)
        await first.start()
        await first.synced(60)
        await churn.run(rng.randrange(60, 120))
        for b in bridges:
            assert await b.stop() == 0, b.tail_log()
        await churn.run(rng.randrange(10, 30))  # while the bridges are down
        for b in bridges:
            await b.start()
        if lagging is not None:
            await lagging.wait_ready(60)
            assert await lagging.stop() == 0, lagging.tail_log()
        await churn.run(rng.randrange(30, 60))
        await until(
            lambda: mirrored(first, ns) == listed(cluster, ns),
            45,
            lambda: (
                f"first mirror (CRASH_SEED={s}): "
                + difference(listed(cluster, ns), mirrored(first, ns))
            ),
        )
    finally:
        await first.stop()
    # The consumer restarts: a new mirror bootstraps from the bus alone.
    second = Mirror(settings, **kw)
    try:
        await second.start()
        await second.synced(60)
        await until(
            lambda: mirrored(second, ns) == listed(cluster, ns),
            30,
            lambda: (
                f"restarted mirror (CRASH_SEED={s}): "
                + difference(listed(cluster, ns), mirrored(second, ns))
            ),
        )
        assert len(second.list("Pod", namespace=ns)) == len(churn.live)
        if heartbeats:
            # Heartbeats flow: fresh (changes were recent). The bridges stop: after three
            # intervals without one the mirror says the bridge is stuck, not quiet.
            await until(lambda: second.freshness("Pod").state == "fresh", 15)
            for b in bridges:
                assert await b.stop() == 0, b.tail_log()
            await until(lambda: second.freshness("Pod").state == "stuck", 15)
            assert "no heartbeat" in second.freshness("Pod").reason
    finally:
        await second.stop()
        for b in bridges:
            if b.proc is not None and b.proc.returncode is None:
                assert await b.stop() == 0, b.tail_log()


def kafka_settings(config: Path) -> Any:
    return load_settings(str(config))


async def test_a_mirror_of_a_kafka_change_topic_equals_the_api_server(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, real_kafka: KafkaBroker
) -> None:
    topic = "mirror-" + uuid.uuid4().hex[:8]
    bridge = PodBridge(tmp_path, kube_cluster, kube_namespace,
                       {"bootstrapServers": [real_kafka.bootstrap], "topic": topic})  # fmt: skip
    await equal_after_restarts(
        kube_cluster, kube_namespace, [BridgeProcess(bridge.config)],
        load_settings(str(bridge.config)), seed(), bootstrap="stream",
    )  # fmt: skip


async def test_a_mirror_from_a_state_table_equals_the_api_server(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, real_kafka: KafkaBroker
) -> None:
    """Bootstrapped from a compacted ``stateTable`` topic (another bridge publishes it,
    and is down for the last churn: the table is behind), then following the change
    topic from a little before the table's newest record."""
    topic = "mirror-" + uuid.uuid4().hex[:8]
    (tmp_path / "changes").mkdir()
    (tmp_path / "table").mkdir()
    kafka = {"bootstrapServers": [real_kafka.bootstrap]}
    changes = PodBridge(
        tmp_path / "changes", kube_cluster, kube_namespace, kafka | {"topic": topic}
    )
    table = PodBridge(tmp_path / "table", kube_cluster, kube_namespace,
                      kafka | {"topic": topic + ".state", "stateTable": True})  # fmt: skip
    behind = BridgeProcess(table.config)
    await equal_after_restarts(
        kube_cluster, kube_namespace, [BridgeProcess(changes.config), behind],
        load_settings(str(changes.config)), seed(), lagging=behind,
        bootstrap="state-table", state_table_topic=topic + ".state",
    )  # fmt: skip


async def test_a_mirror_of_jetstream_equals_the_api_server(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, nats_control: NatsServer
) -> None:
    """Bootstrapped from the last message of every subject; with heartbeats, its
    freshness: fresh while the bridge runs, stuck once it stopped."""
    from tests.e2e.bridge_process import write_config

    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kube_cluster.write_kubeconfig(tmp_path / "kubeconfig"),
        sink={"kind": "nats", "nats": {"servers": [nats_control.url]}},
        resources=[{"apiVersion": "v1", "kind": "Pod", "namespaces": [kube_namespace],
                    "heartbeatInterval": 1}],
        checkpoint={"kind": "sqlite", "path": str(tmp_path / "state.db"), "commitInterval": 0.1},
    )  # fmt: skip
    await equal_after_restarts(
        kube_cluster, kube_namespace, [BridgeProcess(config)],
        load_settings(str(config)), seed(), heartbeats=True, bootstrap="last-per-subject",
    )  # fmt: skip
