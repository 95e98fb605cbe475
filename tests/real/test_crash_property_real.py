"""kill -9 at random moments on a real kube-apiserver: the crash property of
tests/e2e/test_crash_property.py, through a real JetStream and a real Apache Kafka.

Pods in the test's own namespace change at random (created, annotated, deleted,
names reused) while ``k8s-bridge run`` is killed at random moments, changed
further while it is down, and sometimes the history is compacted: etcd
physically, and kube-apiserver restarted so its watch cache forgets too (a
compaction alone leaves the cache serving the old resourceVersions, see
tests/real/test_kube_scenarios.py), so the restarted bridge meets a real 410.
Kafka runs with the producer's defaults: acks=all, idempotence on.

The seed is in every failure message (``CRASH_SEED=… pytest …`` replays a run).
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.bridge_process import jetstream_events, write_config
from tests.e2e.crash_world import (
    Target,
    annotation_patch,
    check_property,
    crash_rounds,
    kafka_checkpoint_settled,
    kafka_events,
    seed,
    sqlite_settled,
)
from tests.fixtures.kube import KubeCluster
from tests.fixtures.nats import NatsServer
from tests.fixtures.realkafka import KafkaBroker

pytestmark = [pytest.mark.timeout(300)]

INITIAL = 300
ROUNDS = 5


def real_target(cluster: KubeCluster, ns: str, rng: random.Random) -> Target:
    def compact() -> str:
        rev = cluster.compact()
        # Half the time the watch cache forgets as well: the bridge then meets a 410.
        if rng.random() < 0.5:
            cluster.restart_apiserver()
            return f"compacted etcd at {rev}, restarted kube-apiserver"
        return f"compacted etcd at {rev}"

    # Real API calls are synchronous and slower than the emulator's: a realistic churn.
    return Target(
        cluster,
        ns,
        compact,
        mutate=annotation_patch,
        rate=40.0,
        down_changes=30,
        run_seconds=(0.0, 3.0),
        from_health=True,
    )


def config(
    tmp_path: Path,
    cluster: KubeCluster,
    ns: str,
    sink: dict[str, Any],
    checkpoint: dict[str, Any] | None = None,
    *,
    metadata_only: bool = False,
) -> Path:
    return write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=cluster.write_kubeconfig(tmp_path / "kubeconfig"),
        sink=sink,
        resources=[
            {"apiVersion": "v1", "kind": "Pod", "namespaces": [ns], "metadataOnly": metadata_only}
        ],
        # The default cadence: a second of acknowledged events not yet committed as certain.
        checkpoint=checkpoint
        or {"kind": "sqlite", "path": str(tmp_path / "state.db"), "commitInterval": 1.0},
    )


@pytest.mark.parametrize("metadata_only", [False, True], ids=["objects", "metadata-only"])
async def test_kill9_at_random_moments_on_kube_apiserver_against_jetstream(
    metadata_only: bool,
    tmp_path: Path,
    kube_cluster: KubeCluster,
    kube_namespace: str,
    nats_control: NatsServer,
) -> None:
    # metadata-only: lists and watches of PartialObjectMetadata (the churn changes
    # annotations, so every change is one of the metadata); the same property holds.
    s = seed()
    rng = random.Random(s)
    ns = kube_namespace
    path = config(
        tmp_path,
        kube_cluster,
        ns,
        {"kind": "nats", "nats": {"servers": [nats_control.url]}},
        metadata_only=metadata_only,
    )
    world = await crash_rounds(
        real_target(kube_cluster, ns, random.Random(s + 1)),
        path,
        rng,
        ROUNDS,
        sqlite_settled(tmp_path / "state.db", f"core/v1/pods@{ns}"),
        initial=INITIAL,
        seed=s,
    )
    events = await jetstream_events(nats_control.url)
    ids = [e["id"] for e in events]
    # The duplicate window drops every redelivery: ids are stable across crashes.
    assert len(ids) == len(set(ids)), f"an id reached the stream twice (CRASH_SEED={s})"
    check_property(world, events, s, "kube-apiserver+jetstream", metadata_only=metadata_only)
    if metadata_only:
        assert all(set(e["data"]["object"]) == {"apiVersion", "kind", "metadata"} for e in events)


async def test_kill9_at_random_moments_on_kube_apiserver_against_real_kafka(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, real_kafka: KafkaBroker
) -> None:
    s = seed()
    rng = random.Random(s)
    ns = kube_namespace
    topic = "crash-" + uuid.uuid4().hex[:8]
    # The producer's defaults (acks=all, enable.idempotence=true): no override here.
    sink = {"kind": "kafka", "kafka": {"bootstrapServers": [real_kafka.bootstrap], "topic": topic}}
    world = await crash_rounds(
        real_target(kube_cluster, ns, random.Random(s + 1)),
        config(tmp_path, kube_cluster, ns, sink),
        rng,
        ROUNDS,
        sqlite_settled(tmp_path / "state.db", f"core/v1/pods@{ns}"),
        initial=INITIAL,
        seed=s,
    )
    events = await kafka_events(real_kafka.bootstrap, topic)
    check_property(world, events, s, "kube-apiserver+kafka")


async def kafka_checkpoint_rounds(
    tmp_path: Path, cluster: KubeCluster, ns: str, kafka: KafkaBroker, exactly_once: bool, s: int
) -> tuple[list[dict[str, Any]], int]:
    """One crash_rounds run with events and checkpoint in Kafka: the events as a
    read_committed consumer sees them, and how many ids it saw twice."""
    tag = uuid.uuid4().hex[:8]
    topic, checkpoint_topic = f"crash-{tag}", f"crash-cp-{tag}"
    sink = {
        "kind": "kafka",
        "kafka": {
            "bootstrapServers": [kafka.bootstrap],
            "topic": topic,
            "exactlyOnce": exactly_once,
            "transactionalIdPrefix": f"crash-{tag}",
        },
    }
    checkpoint = {"kind": "kafka", "kafka": {"topic": checkpoint_topic}, "commitInterval": 1.0}
    world = await crash_rounds(
        real_target(cluster, ns, random.Random(s + 1)),
        config(tmp_path, cluster, ns, sink, checkpoint),
        random.Random(s),
        ROUNDS if exactly_once else 2 * ROUNDS,
        kafka_checkpoint_settled(kafka.bootstrap, checkpoint_topic, f"core/v1/pods@{ns}"),
        initial=INITIAL,
        seed=s,
    )
    events = await kafka_events(kafka.bootstrap, topic, isolation_level="read_committed")
    check_property(world, events, s, f"kube-apiserver+kafka, exactlyOnce {exactly_once}")
    ids = [e["id"] for e in events]
    return events, len(ids) - len(set(ids))


async def test_kill9_at_random_moments_with_exactly_once_and_the_checkpoint_in_kafka(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, real_kafka: KafkaBroker
) -> None:
    """No NATS anywhere: events and checkpoint in one Kafka cluster, each batch in a
    transaction with its checkpoint records: a read_committed consumer sees no id twice."""
    s = seed()
    _, twice = await kafka_checkpoint_rounds(
        tmp_path, kube_cluster, kube_namespace, real_kafka, True, s
    )
    assert twice == 0, f"{twice} ids reached read_committed twice (CRASH_SEED={s})"


async def test_kill9_at_random_moments_without_transactions_redelivers(
    tmp_path: Path, kube_cluster: KubeCluster, real_kafka: KafkaBroker
) -> None:
    """The same kills without transactions: the property holds, and redeliveries show
    (the proof that the test above can tell the two apart). A kill lands between an
    ack and the commit behind it only now and then: up to three runs."""
    twice = 0
    for attempt in range(3):
        s = seed() + attempt
        ns = kube_cluster.namespace()
        run_dir = tmp_path / str(attempt)
        run_dir.mkdir()
        try:
            _, twice = await kafka_checkpoint_rounds(
                run_dir, kube_cluster, ns, real_kafka, False, s
            )
        finally:
            kube_cluster.raw("DELETE", f"/api/v1/namespaces/{ns}")
        if twice:
            break
    assert twice > 0, f"no redelivery in 3 runs of {2 * ROUNDS} kills (CRASH_SEED={s})"
