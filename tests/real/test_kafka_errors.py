"""The Kafka errors a user meets, with ``k8s-bridge run`` as a process, the real
kube-apiserver and Apache Kafka, the producer at its defaults (acks=all,
idempotent).

The contract (docs/operations.md, "Exit codes"): a bus that refuses the
bridge (a wrong password) stops ``run`` at start with exit 1 and one line
naming the problem; a bus that cannot take events now (a missing topic, a
broker down) makes the bridge not-ready while it retries, and the checkpoint
never passes what the bus acknowledged, so nothing is lost.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tests.e2e.bridge_process import BridgeProcess, cli, run_until_exit
from tests.fixtures.kube import KubeCluster
from tests.fixtures.realkafka import SASL_PASSWORD, SASL_USER, KafkaBroker
from tests.fixtures.waiting import until
from tests.real.kafkabus import PodBridge, decoded, pod, read_topic, running

pytestmark = [pytest.mark.timeout(180)]


def sasl(broker: KafkaBroker, topic: str, password: str) -> dict[str, object]:
    return {
        "bootstrapServers": [broker.sasl_bootstrap],
        "topic": topic,
        "securityProtocol": "SASL_PLAINTEXT",
        "saslMechanism": "PLAIN",
        "saslUsername": SASL_USER,
        "saslPassword": password,
    }


async def test_a_wrong_sasl_password_stops_run_in_one_line_and_the_right_one_publishes(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, real_kafka: KafkaBroker
) -> None:
    ns, topic = kube_namespace, "sasl-" + uuid.uuid4().hex[:8]
    created = kube_cluster.create(pod("web", ns))
    wrong_password = "wrong-" + uuid.uuid4().hex[:8]
    wrong = PodBridge(tmp_path, kube_cluster, ns, sasl(real_kafka, topic, wrong_password))
    code, log = await run_until_exit(BridgeProcess(wrong.config), timeout=60)
    assert code == 1, log
    last = log.strip().splitlines()[-1]
    assert last.startswith("k8s-bridge run: Kafka at ") and real_kafka.sasl_bootstrap in last
    assert f"authentication failed for user '{SASL_USER}' (SASL PLAIN)" in last, last
    assert "retrying" not in log  # refused, not waited for
    assert wrong_password not in log
    assert wrong.watermark() == 0
    # `check` says the same on the sink's line.
    code, out, err = await cli("check", "--config", str(wrong.config), timeout=60)
    failed = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert code == 1 and len(failed) == 1 and "sink kafka" in failed[0], (out, err)
    assert f"authentication failed for user '{SASL_USER}'" in failed[0], failed

    right = PodBridge(
        tmp_path, kube_cluster, ns, sasl(real_kafka, topic, SASL_PASSWORD), name="right.yaml"
    )
    async with running(BridgeProcess(right.config)) as bridge:
        await bridge.wait_ready(60)
        rv = int(created["metadata"]["resourceVersion"])
        await until(lambda: right.watermark() >= rv, 30, bridge.tail_log)
    events = decoded(await read_topic(real_kafka.bootstrap, topic))
    assert [(e["type"], e["subject"]) for e in events] == [
        ("io.k8s.core.v1.Pod.added", f"{ns}/web")
    ]
    assert SASL_PASSWORD not in bridge.log.read_text()


@pytest.mark.kafka_settings(auto_create=False)
async def test_a_missing_topic_is_named_nothing_is_lost_and_publishing_resumes_once_created(
    tmp_path: Path,
    kube_cluster: KubeCluster,
    kube_namespace: str,
    real_kafka_private: KafkaBroker,
) -> None:
    ns, topic = kube_namespace, "absent-" + uuid.uuid4().hex[:8]
    broker = real_kafka_private
    before = [kube_cluster.create(pod(f"p{i}", ns)) for i in range(3)]
    setup = PodBridge(
        tmp_path, kube_cluster, ns, {"bootstrapServers": [broker.bootstrap], "topic": topic}
    )
    async with running(BridgeProcess(setup.config)) as bridge:
        named = f"topic '{topic}' does not exist"
        await until(lambda: named in bridge.log.read_text(), 60, bridge.tail_log)
        status, reasons = await bridge.readyz()
        assert status == 503 and "sink unreachable, publishing paused" in reasons, reasons
        # Changes while the topic is missing wait too.
        during = kube_cluster.patch(
            "v1", "Pod", "p0", {"metadata": {"labels": {"v": "1"}}}, namespace=ns
        )
        assert setup.watermark(settled=False) == 0  # nothing acknowledged: nothing checkpointed
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
        finally:
            await admin.close()
        last = int(during["metadata"]["resourceVersion"])
        await until(lambda: setup.watermark() >= last, 60, bridge.tail_log)
        await bridge.wait_ready(30)
    events = decoded(await read_topic(broker.bootstrap, topic))
    assert sorted(
        (e["type"].rsplit(".", 1)[-1], e["subject"], e["resourceversion"]) for e in events
    ) == sorted(
        [
            ("added", f"{ns}/{p['metadata']['name']}", p["metadata"]["resourceVersion"])
            for p in before
        ]
        + [("modified", f"{ns}/p0", during["metadata"]["resourceVersion"])]
    )
    lines = [line for line in bridge.log.read_text().splitlines() if named in line]
    assert lines and all("publish failed; will retry" in line for line in lines), lines[:2]


async def test_a_broker_down_for_10_s_under_churn_loses_nothing_and_keeps_order(
    tmp_path: Path,
    kube_cluster: KubeCluster,
    kube_namespace: str,
    real_kafka_private: KafkaBroker,
) -> None:
    ns, topic = kube_namespace, "outage-" + uuid.uuid4().hex[:8]
    broker = real_kafka_private
    rng = random.Random()
    names = [f"p{i}" for i in range(6)]
    made = [kube_cluster.create(pod(n, ns)) for n in names]
    setup = PodBridge(
        tmp_path, kube_cluster, ns, {"bootstrapServers": [broker.bootstrap], "topic": topic}
    )
    async with running(BridgeProcess(setup.config)) as bridge:
        await bridge.wait_ready(60)
        acked = max(int(p["metadata"]["resourceVersion"]) for p in made)
        await until(lambda: setup.watermark() >= acked, 30, bridge.tail_log)

        broker.stop()
        loop = asyncio.get_running_loop()
        changes: list[tuple[str, int]] = []  # (name, resourceVersion) of every change made
        not_ready = False
        highest = setup.watermark(settled=False)
        end = loop.time() + 10
        i = 0
        while loop.time() < end:
            name = rng.choice(names)
            out = kube_cluster.patch(
                "v1", "Pod", name, {"metadata": {"labels": {"v": str(i)}}}, namespace=ns
            )
            changes.append((name, int(out["metadata"]["resourceVersion"])))
            i += 1
            status, _ = await bridge.readyz()
            not_ready = not_ready or status == 503
            highest = max(highest, setup.watermark(settled=False))
            await asyncio.sleep(0.1)
        first = changes[0][1]
        # The checkpoint never passed what the bus acknowledged before it went down.
        assert highest < first, (highest, first)
        assert not_ready, "the bridge stayed ready with its broker down for 10 s"
        broker.start()
        last = changes[-1][1]
        await until(lambda: setup.watermark() >= last, 90, bridge.tail_log)
        await bridge.wait_ready(30)
    records = await read_topic(broker.bootstrap, topic)
    events = decoded(records)
    # Per object, in resourceVersion order (first copies: a redelivery repeats an id).
    seen: set[str] = set()
    per_object: dict[str, list[int]] = {}
    for e in events:
        if e["id"] in seen:
            continue
        seen.add(e["id"])
        per_object.setdefault(e["subject"].split("/")[1], []).append(int(e["resourceversion"]))
    for name, rvs in per_object.items():
        assert rvs == sorted(rvs), (name, rvs)
    want: dict[str, list[int]] = {
        p["metadata"]["name"]: [int(p["metadata"]["resourceVersion"])] for p in made
    }
    for name, rv in changes:
        want[name].append(rv)
    assert per_object == want
    print(
        f"{len(changes)} changes while the broker was down; {len(events)} records,"
        f" {len(events) - len(seen)} redelivered"
    )
