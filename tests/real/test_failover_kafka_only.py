"""High availability with Kafka alone: two replicas on a real Lease, events and
checkpoint in one Apache Kafka cluster (``checkpoint.kind: kafka``), each batch in a
transaction with its checkpoint records (``sink.kafka.exactlyOnce``). No NATS.

The leader is killed (-9) under churn of four resources (ConfigMaps in four
namespaces: four pipelines, four transactional producers sharing the checkpoint
partition); the standby takes over from the Kafka checkpoint within the lease,
its transactional producers fence the dead leader's and abort what they left
open, every resource resumes from its own committed position (as aiokafka's
read_committed consumer reads the checkpoint topic), and a read_committed
consumer sees every change, per object in order, each id once.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.e2e.bridge_process import BridgeProcess, is_leader, kill9, write_config
from tests.fixtures.kube import KubeCluster
from tests.fixtures.realkafka import KafkaBroker
from tests.fixtures.waiting import until
from tests.real.kafkabus import read_topic
from tests.real.test_leader_election_real import (
    LEASE,
    LEASE_NAME,
    RENEW,
    RETRY,
    Churn,
    change_of,
    configmap,
    uid_of,
)

pytestmark = [pytest.mark.timeout(240)]


def replica(
    tmp_path: Path,
    kubeconfig: Path,
    kafka: KafkaBroker,
    namespaces: list[str],
    identity: str,
    tag: str,
) -> BridgeProcess:
    ns = namespaces[0]
    home = tmp_path / identity
    home.mkdir()
    config = write_config(
        home / "bridge.yaml",
        kubeconfig=kubeconfig,
        resources=[{"apiVersion": "v1", "kind": "ConfigMap", "namespaces": namespaces}],
        sink={
            "kind": "kafka",
            "kafka": {
                "bootstrapServers": [kafka.bootstrap],
                "topic": f"ha-{tag}",
                "exactlyOnce": True,
                "transactionalIdPrefix": f"ha-{tag}",
            },
        },
        checkpoint={"kind": "kafka", "kafka": {"topic": f"ha-cp-{tag}"}, "commitInterval": 0.5},
        leaderElection={
            "enabled": True,
            "namespace": ns,
            "leaseName": LEASE_NAME,
            "identity": identity,
            "leaseDuration": LEASE,
            "renewDeadline": RENEW,
            "retryPeriod": RETRY,
        },
    )
    return BridgeProcess(config)


def watermarks_before(records: list[Any], at_ms: int) -> dict[str, str]:
    """Each resource's last committed watermark written before ``at_ms`` (the records'
    create time), from the checkpoint topic as read_committed reads it."""
    out: dict[str, str] = {}
    for r in records:
        if r.key.startswith(b"w\x00") and r.timestamp <= at_ms and r.value is not None:
            out[r.key[2:].decode()] = orjson.loads(r.value)
    return out


async def test_kill9_failover_with_kafka_alone_publishes_every_change_once(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, real_kafka: KafkaBroker
) -> None:
    tag = uuid.uuid4().hex[:8]
    namespaces = [kube_namespace, *(kube_cluster.namespace("ha") for _ in range(3))]
    seed = random.randrange(1 << 30)
    kubeconfig = kube_cluster.write_kubeconfig(tmp_path / "kubeconfig")
    for ns in namespaces:
        for i in range(3):
            kube_cluster.create(configmap(ns, f"before-{i}", 0))
    a = replica(tmp_path, kubeconfig, real_kafka, namespaces, "replica-a", tag)
    b = replica(tmp_path, kubeconfig, real_kafka, namespaces, "replica-b", tag)
    churns = [Churn(kube_cluster, ns, seed + n) for n, ns in enumerate(namespaces)]

    async def committed() -> list[dict[str, Any]]:
        records = await read_topic(
            real_kafka.bootstrap, f"ha-{tag}", isolation_level="read_committed"
        )
        return [orjson.loads(r.value) for r in records if r.value is not None]

    made = lambda: sum(len(c.made) for c in churns)  # noqa: E731
    await a.start()
    try:
        await until(lambda: is_leader(a), 60, a.tail_log)
        await a.wait_ready(60)
        await b.start()
        await b.wait_ready(60)  # a ready standby: it started no producer, read no checkpoint
        assert "resuming from checkpoint" not in b.log.read_text()
        for c in churns:
            c.start()

        async def some_published() -> bool:
            return len(await committed()) >= 60

        await until(some_published, 60, a.tail_log)
        await asyncio.sleep(random.Random(seed).uniform(0, 2 * RETRY))
        kill9(a)
        killed_at = time.monotonic()
        killed_ms = int(time.time() * 1000)
        assert a.proc is not None
        await a.proc.wait()
        await until(lambda: is_leader(b), 4 * LEASE + 10, b.tail_log)
        takeover = time.monotonic() - killed_at
        made_at_takeover = made()

        async def b_publishes() -> bool:
            return len(await committed()) >= made_at_takeover + 5

        await until(b_publishes, 60, b.tail_log)
        for c in churns:
            await c.stop()
        live = {}
        for ns in namespaces:
            for o in kube_cluster.list("v1", "ConfigMap", ns)["items"]:
                live[o["metadata"]["uid"]] = o["metadata"]["resourceVersion"]
        deleted = set().union(*(c.deleted for c in churns))

        async def caught_up() -> bool:
            last = {uid_of(e): (change_of(e), e["resourceversion"]) for e in await committed()}
            current = all(last.get(uid, ("", ""))[1] == rv for uid, rv in live.items())
            gone = all(last.get(uid, ("deleted", ""))[0] == "deleted" for uid in deleted)
            return current and gone

        await until(caught_up, 60, b.tail_log)
        events = await committed()
        checkpoint = await read_topic(
            real_kafka.bootstrap, f"ha-cp-{tag}", isolation_level="read_committed"
        )
        assert await b.stop() == 0
    finally:
        for c in churns:
            await c.stop()
        for r in (a, b):
            if r.proc is not None and r.proc.returncode is None:
                kill9(r)
                await r.proc.wait()

    assert takeover <= LEASE + 2.2 * RETRY + 2.0, takeover
    ids = Counter(e["id"] for e in events)
    twice = {k: n for k, n in ids.items() if n > 1}
    assert not twice, (
        f"{len(twice)} ids twice on read_committed (seed {seed}):"
        f" {[(e['id'], e['subject'], e['type']) for e in events if e['id'] in twice]}"
        f"\n{b.log.read_text()[-6000:]}"
    )
    by_uid: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        by_uid[uid_of(e)].append(e)
    for uid, evs in by_uid.items():
        rvs = [int(e["resourceversion"]) for e in evs if change_of(e) != "deleted"]
        assert rvs == sorted(rvs), (uid, rvs)
        assert all(change_of(e) != "deleted" for e in evs[:-1]), uid
    resumed = {
        doc["resource"]: doc
        for doc in map(orjson.loads, b.log.read_text().splitlines())
        if doc.get("event") == "resuming from checkpoint"
    }
    assert sorted(resumed) == sorted(f"v1/configmaps@{ns}" for ns in namespaces), resumed
    # Each resource resumes from its own committed watermark, as aiokafka reads it.
    stored = watermarks_before(checkpoint, killed_ms)
    for ns in namespaces:
        assert resumed[f"v1/configmaps@{ns}"]["resource_version"] == stored.get(
            f"core/v1/configmaps@{ns}", ""
        ), (ns, resumed, stored)
    on_bus = {(uid_of(e), e["resourceversion"]) for e in events if change_of(e) != "deleted"}
    for ns, churn in zip(namespaces, churns, strict=True):
        if not resumed[f"v1/configmaps@{ns}"]["relist"]:
            # A watch from the new leader's watermark brings every change made.
            missing = set(churn.made) - on_bus
            assert not missing, (
                f"{ns}: {len(missing)} changes never published: {sorted(missing)[:5]}"
            )
    relisted = sum(1 for doc in resumed.values() if doc["relist"])
    print(
        f"seed {seed}: take-over {takeover:.2f}s after kill -9 (lease {LEASE}s);"
        f" {made()} changes, {len(deleted)} deletes, {len(events)} events,"
        f" {len(namespaces)} resources, {relisted} resumed by relist"
    )
