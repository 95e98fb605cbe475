"""``k8s-bridge mirror`` on the real servers: PostgreSQL equals kube-apiserver.

Two bridges (``cluster.name`` east and west, the same namespace of one real
kube-apiserver, so the same uids in two clusters) publish into one Kafka topic
of three partitions; one mirror process writes PostgreSQL. Pods churn
(created, annotated, deleted, names reused) while the mirror is killed with
``kill -9`` at random instants and restarted, and PostgreSQL itself is
restarted (immediate mode: a crash) in the middle of the churn. Late copies of
old events (what a replay or a second publisher leaves on the bus) are put
back on the topic at the end. Then the oracle: a LIST on kube-apiserver
against PostgreSQL's own query of each cluster's rows.

Break the guarantees on purpose and this fails: without newer-wins the late
copies overwrite newer states; with the position stored outside the rows'
transaction a kill between the two loses or doubles changes.
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tests.e2e.bridge_process import BridgeProcess, until, write_config
from tests.e2e.crash_world import (
    Target,
    World,
    annotation_patch,
    kafka_events,
    seed,
    sqlite_settled,
)
from tests.e2e.mirror_process import MirrorProcess, query, write_mirror_config
from tests.fixtures.kube import KubeCluster
from tests.fixtures.postgres import PostgresServer
from tests.fixtures.realkafka import KafkaBroker

pytestmark = [pytest.mark.timeout(240)]

CLUSTERS = ("east", "west")
PARTITIONS = 3
ROUNDS = 5


async def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()


async def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = await consumer.end_offsets(tps)
        return {tp.partition: off for tp, off in ends.items()}
    finally:
        await consumer.stop()


def bridge_config(tmp: Path, cluster: KubeCluster, ns: str, name: str, sink: Any) -> Path:
    d = tmp / name
    d.mkdir()
    return write_config(
        d / "bridge.yaml",
        kubeconfig=cluster.write_kubeconfig(d / "kubeconfig"),
        sink=sink,
        cluster={"kubeconfig": str(d / "kubeconfig"), "name": name},
        resources=[{"apiVersion": "v1", "kind": "Pod", "namespaces": [ns]}],
        checkpoint={"kind": "sqlite", "path": str(d / "state.db"), "flushInterval": 0.2},
    )


async def assert_mirror_equals_api(cluster: KubeCluster, ns: str, dsn: str, where: str) -> None:
    listed = cluster.list("v1", "Pod", ns)["items"]
    want = {p["metadata"]["name"]: p for p in listed}
    for name in CLUSTERS:
        rows = await query(
            dsn,
            "SELECT name, uid, resource_version, object FROM k8s.objects"
            " WHERE cluster = $1 AND namespace = $2 AND kind = 'Pod'",
            name,
            ns,
        )
        got = {r[0]: r for r in rows}
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        assert not missing and not extra, f"{name}: missing {missing}, extra {extra} {where}"
        for pod_name, pod in want.items():
            _, uid, rv, obj = got[pod_name]
            md = pod["metadata"]
            assert uid == md["uid"], f"{name}: {pod_name} is another uid {where}"
            # The same resourceVersion is the same state; a newer one on the server is
            # fine only for a write the bridge does not publish (nothing but the rv moved).
            stored = orjson.loads(obj)["metadata"]
            same = rv == int(md["resourceVersion"]) or (
                rv < int(md["resourceVersion"])
                and stored.get("annotations") == md.get("annotations")
                and stored.get("labels") == md.get("labels")
            )
            assert same, (
                f"{name}: {pod_name} at rv {rv}, the server's {md['resourceVersion']} {where}"
            )


async def test_mirror_equals_kube_apiserver_through_kill9_and_a_postgres_restart(
    tmp_path: Path,
    kube_cluster: KubeCluster,
    kube_namespace: str,
    real_kafka: KafkaBroker,
    postgres_control: PostgresServer,
) -> None:
    s = seed()
    rng = random.Random(s)
    ns = kube_namespace
    where = f"(CRASH_SEED={s})"
    topic = "mirror-" + uuid.uuid4().hex[:8]
    await create_topic(real_kafka.bootstrap, topic, PARTITIONS)
    sink = {"kind": "kafka", "kafka": {"bootstrapServers": [real_kafka.bootstrap], "topic": topic}}
    dsn = postgres_control.new_database()
    mirror_config = write_mirror_config(
        tmp_path / "mirror.yaml",
        source={
            "kind": "kafka",
            "kafka": {"bootstrapServers": [real_kafka.bootstrap], "topic": topic},
        },
        dsn=dsn,
        history=True,
        keepDeleted=True,
        # Small transactions: many commits for the kills to land between and inside.
        batch={"maxEvents": 10, "maxWait": 0.02},
    )
    world = World(
        Target(kube_cluster, ns, lambda: "", mutate=annotation_patch, rate=40.0),
        random.Random(s + 1),
    )
    for _ in range(150):
        world.create()
    bridges = [
        BridgeProcess(bridge_config(tmp_path, kube_cluster, ns, name, sink)) for name in CLUSTERS
    ]
    for b in bridges:
        await b.start()
    mirror = MirrorProcess(mirror_config)
    kills = 0
    try:
        for b in bridges:
            await b.wait_ready(60)
        restart_round = rng.randrange(ROUNDS)
        for r in range(ROUNDS):
            world.round = r
            # A backlog builds while the mirror is down, so the kill below lands, as
            # often as not, while it is catching up: inside or between its transactions.
            await world.churn(rng.uniform(0.3, 1.5))
            await mirror.start()
            await world.churn(rng.uniform(0.5, 2.0))
            if r == restart_round:
                # The database crashes and comes back while the mirror writes and Pods churn.
                world.log.append(f"r{r} postgres restart")
                postgres_control.stop("immediate")
                await world.churn(rng.uniform(0.2, 1.5))
                postgres_control.start()
                await world.churn(rng.uniform(0.5, 1.5))
            assert mirror.running, f"the mirror exited: {mirror.tail_log()}"
            await mirror.kill9()
            kills += 1
        # Settle: both bridges published everything, then the mirror read it all.
        for b in bridges:
            db = b.config.parent / "state.db"
            await until(
                lambda db=db: sqlite_settled(db, f"core/v1/pods@{ns}")(world),
                60,
                lambda b=b: f"bridge not settled {where}:\n{b.tail_log()}",
            )
        # Late copies of old events: a sample of what is on the topic, put back at its end.
        old = await kafka_events(real_kafka.bootstrap, topic)
        late = rng.sample(old, min(200, len(old)))
        producer = AIOKafkaProducer(bootstrap_servers=real_kafka.bootstrap)
        await producer.start()
        try:
            for e in late:
                await producer.send_and_wait(topic, orjson.dumps(e), key=e["subject"].encode())
        finally:
            await producer.stop()
        await mirror.start()
        ends = await end_offsets(real_kafka.bootstrap, topic, PARTITIONS)

        async def caught_up() -> bool:
            rows = await query(dsn, "SELECT part, next_position FROM k8s.positions")
            got = {int(p): int(n) for p, n in rows}
            return all(got.get(p, 0) >= end for p, end in ends.items() if end)

        await until(caught_up, 60, lambda: f"mirror behind {where}:\n{mirror.tail_log()}")
        assert await mirror.stop() == 0, mirror.tail_log()
    finally:
        for b in bridges:
            if b.proc is not None and b.proc.returncode is None:
                await b.stop()
        if mirror.running:
            await mirror.kill9()
    await assert_mirror_equals_api(kube_cluster, ns, dsn, where)
    # Every change once in the history, whatever the kills: no event id twice.
    (dups,) = await query(
        dsn, "SELECT count(*) - count(DISTINCT (cluster, event_id)) FROM k8s.changes"
    )
    assert dups == (0,), where
    # Every deleted object that reached the database is in deleted_objects.
    gone = await query(dsn, "SELECT DISTINCT uid FROM k8s.deleted_objects WHERE reason = 'deleted'")
    seen = await query(dsn, "SELECT DISTINCT uid FROM k8s.changes")
    assert {u for (u,) in seen} & world.deleted <= {u for (u,) in gone}, where
    assert kills == ROUNDS
