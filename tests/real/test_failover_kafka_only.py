"""High availability with Kafka alone: two replicas on a real Lease, events and
checkpoint in one Apache Kafka cluster (``checkpoint.kind: kafka``), each batch in a
transaction with its checkpoint records (``sink.kafka.exactlyOnce``). No NATS.

The leader is killed (-9) under churn; the standby takes over from the Kafka
checkpoint within the lease, its transactional producer fences the dead leader's
and aborts what it left open, and a read_committed consumer sees every change,
per object in order, each id once.
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

from tests.e2e.bridge_process import BridgeProcess, is_leader, kill9, until, write_config
from tests.fixtures.kube import KubeCluster
from tests.fixtures.realkafka import KafkaBroker
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
    tmp_path: Path, kubeconfig: Path, kafka: KafkaBroker, ns: str, identity: str, tag: str
) -> BridgeProcess:
    home = tmp_path / identity
    home.mkdir()
    config = write_config(
        home / "bridge.yaml",
        kubeconfig=kubeconfig,
        resources=[{"apiVersion": "v1", "kind": "ConfigMap", "namespaces": [ns]}],
        sink={
            "kind": "kafka",
            "kafka": {
                "bootstrapServers": [kafka.bootstrap],
                "topic": f"ha-{tag}",
                "exactlyOnce": True,
                "transactionalIdPrefix": f"ha-{tag}",
            },
        },
        checkpoint={"kind": "kafka", "kafka": {"topic": f"ha-cp-{tag}"}, "flushInterval": 0.5},
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


async def test_kill9_failover_with_kafka_alone_publishes_every_change_once(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, real_kafka: KafkaBroker
) -> None:
    ns, tag = kube_namespace, uuid.uuid4().hex[:8]
    seed = random.randrange(1 << 30)
    kubeconfig = kube_cluster.write_kubeconfig(tmp_path / "kubeconfig")
    for i in range(3):
        kube_cluster.create(configmap(ns, f"before-{i}", 0))
    a = replica(tmp_path, kubeconfig, real_kafka, ns, "replica-a", tag)
    b = replica(tmp_path, kubeconfig, real_kafka, ns, "replica-b", tag)
    churn = Churn(kube_cluster, ns, seed)

    async def committed() -> list[dict[str, Any]]:
        records = await read_topic(
            real_kafka.bootstrap, f"ha-{tag}", isolation_level="read_committed"
        )
        return [orjson.loads(r.value) for r in records if r.value is not None]

    await a.start()
    try:
        await until(lambda: is_leader(a), 60, a.tail_log)
        await a.wait_ready(60)
        await b.start()
        await b.wait_ready(60)  # a ready standby: it started no producer, read no checkpoint
        assert "resuming from checkpoint" not in b.log.read_text()
        churn.start()

        async def some_published() -> bool:
            return len(await committed()) >= 30

        await until(some_published, 60, a.tail_log)
        await asyncio.sleep(random.Random(seed).uniform(0, 2 * RETRY))
        kill9(a)
        killed_at = time.monotonic()
        assert a.proc is not None
        await a.proc.wait()
        await until(lambda: is_leader(b), 4 * LEASE + 10, b.tail_log)
        takeover = time.monotonic() - killed_at

        async def b_publishes() -> bool:
            return len(await committed()) >= len(churn.made) // 2 + 5

        await until(b_publishes, 60, b.tail_log)
        await churn.stop()
        items = kube_cluster.list("v1", "ConfigMap", ns)["items"]
        live = {o["metadata"]["uid"]: o["metadata"]["resourceVersion"] for o in items}

        async def caught_up() -> bool:
            last = {uid_of(e): (change_of(e), e["resourceversion"]) for e in await committed()}
            current = all(last.get(uid, ("", ""))[1] == rv for uid, rv in live.items())
            gone = all(last.get(uid, ("deleted", ""))[0] == "deleted" for uid in churn.deleted)
            return current and gone

        await until(caught_up, 60, b.tail_log)
        events = await committed()
        assert await b.stop() == 0
    finally:
        await churn.stop()
        for r in (a, b):
            if r.proc is not None and r.proc.returncode is None:
                kill9(r)
                await r.proc.wait()

    assert takeover <= LEASE + 2.2 * RETRY + 2.0, takeover
    ids = Counter(e["id"] for e in events)
    assert not {k: n for k, n in ids.items() if n > 1}, "an id twice on read_committed"
    by_uid: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        by_uid[uid_of(e)].append(e)
    for uid, evs in by_uid.items():
        rvs = [int(e["resourceversion"]) for e in evs if change_of(e) != "deleted"]
        assert rvs == sorted(rvs), (uid, rvs)
        assert all(change_of(e) != "deleted" for e in evs[:-1]), uid
    resumed = [
        orjson.loads(line)
        for line in b.log.read_text().splitlines()
        if "resuming from checkpoint" in line
    ]
    assert len(resumed) == 1, resumed
    if not resumed[0]["relist"]:
        # A watch from the new leader's watermark brings every change made.
        on_bus = {(uid_of(e), e["resourceversion"]) for e in events if change_of(e) != "deleted"}
        missing = set(churn.made) - on_bus
        assert not missing, f"{len(missing)} changes never published: {sorted(missing)[:5]}"
    print(
        f"seed {seed}: take-over {takeover:.2f}s after kill -9 (lease {LEASE}s);"
        f" {len(churn.made)} changes, {len(churn.deleted)} deletes, {len(events)} events,"
        f" resumed by {'relist' if resumed[0]['relist'] else 'watch'}"
    )
