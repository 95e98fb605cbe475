"""``k8s-bridge mirror`` on the real servers: PostgreSQL equals kube-apiserver.

Two bridges (``cluster.name`` east and west, the same namespace of one real
kube-apiserver, so the same uids in two clusters) publish into one bus — a
Kafka topic of three partitions, or the JetStream stream K8S — and one mirror
process writes PostgreSQL. Pods churn
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

import asyncio
import random
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tests.e2e.bridge_process import BridgeProcess, jetstream_events, write_config
from tests.e2e.crash_world import (
    Target,
    World,
    annotation_patch,
    kafka_checkpoint_settled,
    kafka_events,
    seed,
    sqlite_settled,
)
from tests.e2e.mirror_process import MirrorProcess, query, write_mirror_config
from tests.fixtures.kube import KubeCluster
from tests.fixtures.nats import NatsServer
from tests.fixtures.postgres import PostgresServer
from tests.fixtures.realkafka import KafkaBroker
from tests.fixtures.waiting import until
from tests.real.kafkabus import read_topic

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


def bridge_config(tmp: Path, cluster: KubeCluster, ns: str, name: str, bus: Any) -> Path:
    d = tmp / name
    d.mkdir()
    return write_config(
        d / "bridge.yaml",
        kubeconfig=cluster.write_kubeconfig(d / "kubeconfig"),
        cluster={"kubeconfig": str(d / "kubeconfig"), "name": name},
        resources=[{"apiVersion": "v1", "kind": "Pod", "namespaces": [ns]}],
        **bus.bridge(name, d),
    )


async def assert_mirror_equals_api(
    cluster: KubeCluster, namespaces: dict[str, str], dsn: str, where: str
) -> None:
    """Each cluster's rows against a LIST of the namespace its bridge watches."""
    for name, ns in namespaces.items():
        listed = cluster.list("v1", "Pod", ns)["items"]
        want = {p["metadata"]["name"]: p for p in listed}
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


class KafkaBus:
    """One topic of three partitions; late copies produced again (plainly) with their keys.
    With ``exactly_once`` each bridge publishes in transactions with its checkpoint in
    Kafka (sink.kafka.exactlyOnce): the topic then holds transaction markers too."""

    # Both bridges watch one namespace: the same uids (and event ids) in two clusters.
    shared_namespace = True

    def __init__(self, broker: KafkaBroker, *, exactly_once: bool = False) -> None:
        self.bootstrap = broker.bootstrap
        self.topic = "mirror-" + uuid.uuid4().hex[:8]
        self.exactly_once = exactly_once
        self.source = {
            "kind": "kafka",
            "kafka": {"bootstrapServers": [self.bootstrap], "topic": self.topic},
        }

    def bridge(self, name: str, d: Path) -> dict[str, Any]:
        kafka: dict[str, Any] = {"bootstrapServers": [self.bootstrap], "topic": self.topic}
        if not self.exactly_once:
            checkpoint = {"kind": "sqlite", "path": str(d / "state.db"), "commitInterval": 0.2}
            return {"sink": {"kind": "kafka", "kafka": kafka}, "checkpoint": checkpoint}
        kafka |= {"exactlyOnce": True, "transactionalIdPrefix": f"{self.topic}-{name}"}
        checkpoint = {"kind": "kafka", "kafka": {"topic": f"{self.topic}-cp-{name}"}}
        return {"sink": {"kind": "kafka", "kafka": kafka}, "checkpoint": checkpoint}

    def settled(self, name: str, d: Path, ns: str) -> Any:
        if self.exactly_once:
            return kafka_checkpoint_settled(
                self.bootstrap, f"{self.topic}-cp-{name}", f"core/v1/pods@{ns}"
            )
        return sqlite_settled(d / "state.db", f"core/v1/pods@{ns}")

    async def create(self) -> None:
        await create_topic(self.bootstrap, self.topic, PARTITIONS)

    async def events(self) -> list[dict[str, Any]]:
        return await kafka_events(self.bootstrap, self.topic, isolation_level="read_committed")

    async def put_back(self, events: list[dict[str, Any]]) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap)
        await producer.start()
        try:
            for e in events:
                await producer.send_and_wait(self.topic, orjson.dumps(e), key=e["subject"].encode())
        finally:
            await producer.stop()

    async def data_positions(self) -> dict[int, set[int]]:
        """The offsets of the committed records, per partition (markers and aborted
        records left out)."""
        out: dict[int, set[int]] = {p: set() for p in range(PARTITIONS)}
        for r in await read_topic(self.bootstrap, self.topic, isolation_level="read_committed"):
            out[r.partition].add(r.offset)
        return out


class JetStreamBus:
    """The bridges' stream K8S (they create it); late copies published without a
    Nats-Msg-Id, so the duplicate window keeps them."""

    # A namespace each: two bridges publishing the same event ids (Nats-Msg-Id) into
    # one stream would have JetStream drop one of each pair as a duplicate (two real
    # clusters never share uids).
    shared_namespace = False

    def __init__(self, server: NatsServer) -> None:
        self.url = server.url
        self.source = {"kind": "nats", "nats": {"servers": [self.url]}}

    def bridge(self, name: str, d: Path) -> dict[str, Any]:
        checkpoint = {"kind": "sqlite", "path": str(d / "state.db"), "commitInterval": 0.2}
        return {"sink": self.source, "checkpoint": checkpoint}

    def settled(self, name: str, d: Path, ns: str) -> Any:
        return sqlite_settled(d / "state.db", f"core/v1/pods@{ns}")

    async def create(self) -> None:
        pass

    async def events(self) -> list[dict[str, Any]]:
        return await jetstream_events(self.url)

    async def put_back(self, events: list[dict[str, Any]]) -> None:
        import nats

        nc = await nats.connect(self.url)
        try:
            js = nc.jetstream()
            for e in events:
                await js.publish(e["_subject"], e["_raw"])
        finally:
            await nc.close()

    async def data_positions(self) -> dict[int, set[int]]:
        import nats

        nc = await nats.connect(self.url)
        try:
            info = await nc.jetstream().stream_info("K8S")
        finally:
            await nc.close()
        return {0: set(range(info.state.first_seq, info.state.last_seq + 1))}


@pytest.fixture(params=["kafka", "kafka-exactly-once", "jetstream"])
def bus(request: pytest.FixtureRequest) -> Any:
    if request.param.startswith("kafka"):
        broker = request.getfixturevalue("real_kafka")
        return KafkaBus(broker, exactly_once=request.param == "kafka-exactly-once")
    return JetStreamBus(request.getfixturevalue("nats_control"))


async def test_mirror_equals_kube_apiserver_through_kill9_and_a_postgres_restart(
    tmp_path: Path,
    kube_cluster: KubeCluster,
    kube_namespace: str,
    bus: Any,
    postgres_control: PostgresServer,
    request: pytest.FixtureRequest,
) -> None:
    s = seed()
    rng = random.Random(s)
    ns = kube_namespace
    where = f"(CRASH_SEED={s})"
    await bus.create()
    dsn = postgres_control.new_database()
    mirror_config = write_mirror_config(
        tmp_path / "mirror.yaml",
        source=bus.source,
        dsn=dsn,
        history=True,
        keepDeleted=True,
        # Small transactions: many commits for the kills to land between and inside.
        batch={"maxEvents": 10, "maxWait": 0.02},
    )
    namespaces = {
        name: ns if bus.shared_namespace or i == 0 else kube_cluster.namespace()
        for i, name in enumerate(CLUSTERS)
    }
    for n in set(namespaces.values()) - {ns}:
        request.addfinalizer(lambda n=n: kube_cluster.raw("DELETE", f"/api/v1/namespaces/{n}"))
    worlds = {
        n: World(
            Target(kube_cluster, n, lambda: "", mutate=annotation_patch, rate=40.0),
            random.Random(s + 1 + i),
        )
        for i, n in enumerate(dict.fromkeys(namespaces.values()))
    }

    async def churn(seconds: float) -> None:
        await asyncio.gather(*(w.churn(seconds) for w in worlds.values()))

    for w in worlds.values():
        for _ in range(150 // len(worlds)):
            w.create()
    bridges = {
        name: BridgeProcess(bridge_config(tmp_path, kube_cluster, namespaces[name], name, bus))
        for name in CLUSTERS
    }
    for b in bridges.values():
        await b.start()
    mirror = MirrorProcess(mirror_config)
    kills = 0
    try:
        for b in bridges.values():
            await b.wait_ready(60)
        restart_round = rng.randrange(ROUNDS)
        for r in range(ROUNDS):
            # A backlog builds while the mirror is down, so the kill below lands, as
            # often as not, while it is catching up: inside or between its transactions.
            await churn(rng.uniform(0.3, 1.5))
            await mirror.start()
            await churn(rng.uniform(0.5, 2.0))
            if r == restart_round:
                # The database crashes and comes back while the mirror writes and Pods churn.
                postgres_control.stop("immediate")
                await churn(rng.uniform(0.2, 1.5))
                postgres_control.start()
                await churn(rng.uniform(0.5, 1.5))
            assert mirror.running, f"the mirror exited: {mirror.tail_log()}"
            await mirror.kill9()
            kills += 1
            for w in worlds.values():
                for _ in range(rng.randrange(10)):
                    w.step(recent_first=True)
        # Settle: both bridges published everything, then the mirror read it all.
        for name, b in bridges.items():
            world = worlds[namespaces[name]]
            settled = bus.settled(name, b.config.parent, namespaces[name])
            await until(
                lambda settled=settled, world=world: settled(world),
                60,
                lambda b=b: f"bridge not settled {where}:\n{b.tail_log()}",
            )
        # Late copies of old events: a sample of what is on the bus, put back at its end.
        old = await bus.events()
        published = await bus.data_positions()  # the late copies come after these
        await bus.put_back(rng.sample(old, min(200, len(old))))
        await mirror.start()
        ends = {p: max(ps) + 1 for p, ps in (await bus.data_positions()).items() if ps}

        async def caught_up() -> bool:
            rows = await query(dsn, "SELECT part, next_position FROM k8s.positions")
            got = {int(p): int(n) for p, n in rows}
            return all(got.get(p, 0) >= end for p, end in ends.items())

        await until(caught_up, 60, lambda: f"mirror behind {where}:\n{mirror.tail_log()}")
        assert await mirror.stop() == 0, mirror.tail_log()
    finally:
        for b in bridges.values():
            if b.proc is not None and b.proc.returncode is None:
                await b.stop()
        if mirror.running:
            await mirror.kill9()
    # Every event the bridges published is in the history once, at its own position: no
    # gap. (The late copies that follow repeat event ids already recorded, which the
    # history keeps once; transaction markers and aborted records hold no event.)
    for part, positions in published.items():
        got = {p for (p,) in await query(
            dsn, "SELECT position FROM k8s.changes WHERE part = $1", part
        )}  # fmt: skip
        holes = sorted(positions - got)
        assert not holes, (
            f"part {part}: {len(holes)} positions never written, from {holes[:5]} {where}"
        )
    await assert_mirror_equals_api(kube_cluster, namespaces, dsn, where)
    # Every change once in the history, whatever the kills: no event id twice.
    (dups,) = await query(
        dsn, "SELECT count(*) - count(DISTINCT (cluster, event_id)) FROM k8s.changes"
    )
    assert dups == (0,), where
    # Every deleted object that reached the database is in deleted_objects.
    gone = await query(dsn, "SELECT DISTINCT uid FROM k8s.deleted_objects WHERE reason = 'deleted'")
    seen = await query(dsn, "SELECT DISTINCT uid FROM k8s.changes")
    deleted = set().union(*(w.deleted for w in worlds.values()))
    assert {u for (u,) in seen} & deleted <= {u for (u,) in gone}, where
    assert kills == ROUNDS


async def test_a_kafka_broker_that_goes_away_and_comes_back_costs_no_change(
    tmp_path: Path, real_kafka_private: KafkaBroker, postgres_dsn: str
) -> None:
    from tests.doubles.memory_source import event

    broker = real_kafka_private
    topic = "mirror-down-" + uuid.uuid4().hex[:8]
    await create_topic(broker.bootstrap, topic, 2)

    async def produce(first: int, n: int) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        try:
            for i in range(first, first + n):
                await producer.send_and_wait(
                    topic, event(f"p{i}", f"u{i}", 10 + i), key=f"ns/p{i}".encode()
                )
        finally:
            await producer.stop()

    async def written(n: int) -> bool:
        return await query(postgres_dsn, "SELECT count(*) FROM k8s.changes") == [(n,)]

    config = write_mirror_config(
        tmp_path / "mirror.yaml",
        source={"kind": "kafka", "kafka": {"bootstrapServers": [broker.bootstrap], "topic": topic}},
        dsn=postgres_dsn,
        history=True,
    )
    mirror = MirrorProcess(config)
    await produce(0, 100)
    await mirror.start()
    try:
        await until(lambda: written(100), 30, mirror.tail_log)
        broker.stop()
        await asyncio.sleep(3)
        assert mirror.running, mirror.tail_log()
        broker.start()
        await produce(100, 100)
        await until(lambda: written(200), 60, mirror.tail_log)
        assert await mirror.stop() == 0, mirror.tail_log()
    finally:
        if mirror.running:
            await mirror.kill9()
    positions = await query(postgres_dsn, "SELECT part, next_position FROM k8s.positions")
    assert sum(n for _, n in positions) == 200
    assert await query(postgres_dsn, "SELECT count(*) FROM k8s.objects") == [(200,)]


async def test_an_aborted_kafka_transaction_never_reaches_the_database(
    tmp_path: Path, real_kafka: KafkaBroker, postgres_dsn: str
) -> None:
    """read_committed: what a bridge with sink.kafka.exactlyOnce wrote in a transaction it
    never committed (killed inside it) is not a change; the committed ones around it are."""
    from tests.doubles.memory_source import event

    topic = "mirror-txn-" + uuid.uuid4().hex[:8]
    await create_topic(real_kafka.bootstrap, topic, 1)
    producer = AIOKafkaProducer(
        bootstrap_servers=real_kafka.bootstrap, transactional_id=f"t-{topic}"
    )
    await producer.start()
    try:
        for rvs, commit in (((1, 2), True), ((3, 4), False), ((5,), True)):
            await producer.begin_transaction()
            for rv in rvs:
                await producer.send_and_wait(topic, event("a", "u1", rv), key=b"ns/a")
            if commit:
                await producer.commit_transaction()
            else:
                await producer.abort_transaction()
    finally:
        await producer.stop()
    config = write_mirror_config(
        tmp_path / "mirror.yaml",
        source={
            "kind": "kafka",
            "kafka": {"bootstrapServers": [real_kafka.bootstrap], "topic": topic},
        },
        dsn=postgres_dsn,
        history=True,
    )
    mirror = MirrorProcess(config)
    await mirror.start()
    try:

        async def history() -> list[tuple[Any, ...]]:
            return await query(postgres_dsn, "SELECT resource_version FROM k8s.changes ORDER BY 1")

        await until(lambda: _equal(history(), [(1,), (2,), (5,)]), 30, mirror.tail_log)
        assert await mirror.stop() == 0, mirror.tail_log()
    finally:
        if mirror.running:
            await mirror.kill9()
    assert await query(postgres_dsn, "SELECT resource_version FROM k8s.objects") == [(5,)]


async def _equal(rows: Any, want: list[tuple[Any, ...]]) -> bool:
    return await rows == want
