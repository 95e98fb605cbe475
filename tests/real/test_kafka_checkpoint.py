"""The checkpoint in a compacted Kafka topic (``checkpoint.kind: kafka``), on a real
Apache Kafka broker: how the topic is made or refused, what a read after a long
and compacted history gives, what an unreachable broker does, and a bridge
killed with -9 that publishes, on restart, exactly the deletes made while it
was down (Kafka only: the sink and the checkpoint, no NATS anywhere), and what
``k8s-bridge check`` does with the topic: describes it, never creates it, never
reads its records.

The contract every store keeps runs against this one too
(tests/integration/checkpoints/test_contract.py).
"""

from __future__ import annotations

import asyncio
import io
import random
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from bridge.checkpoints.base import Checkpoint
from bridge.checkpoints.kafka import KafkaCheckpointStore
from bridge.checkpoints.memory import MemoryCheckpointStore
from bridge.errors import CheckpointError, ConfigError
from bridge.ground.digest import CERTAIN, DELETING, UNCERTAIN, Digest
from tests.e2e.bridge_process import BridgeProcess, cli, free_port, kill9, write_config
from tests.fixtures.kube import KubeCluster
from tests.fixtures.realkafka import KafkaBroker
from tests.fixtures.waiting import until
from tests.real.kafkabus import decoded, pod, read_topic
from tests.real.test_kube_scenarios import log_lines

pytestmark = [pytest.mark.timeout(180)]


def store(bootstrap: str, topic: str, **kw: Any) -> KafkaCheckpointStore:
    return KafkaCheckpointStore({"bootstrap_servers": [bootstrap]}, topic, **kw)


async def topic_config(bootstrap: str, topic: str) -> tuple[str, int]:
    """``cleanup.policy`` and the number of partitions of ``topic``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        [response] = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, {"cleanup.policy": None})]
        )
        [described] = await admin.describe_topics([topic])
    finally:
        await admin.close()
    [resource] = response.resources
    policy = next(entry[1] for entry in resource[4] if entry[0] == "cleanup.policy")
    return policy, len(described["partitions"])


async def create_topic(bootstrap: str, topic: str, partitions: int, **configs: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1, topic_configs=configs)])
    finally:
        await admin.close()


async def test_a_missing_topic_is_created_compacted_with_one_partition(
    real_kafka: KafkaBroker,
) -> None:
    topic = f"cp-{uuid.uuid4().hex[:8]}"
    s = store(real_kafka.bootstrap, topic)
    await s.open()
    try:
        await s.commit("r", "5", [Digest("ns/a", "ua", "5", "f")], [])
    finally:
        await s.close()
    assert await topic_config(real_kafka.bootstrap, topic) == ("compact", 1)


@pytest.mark.parametrize(
    ("partitions", "configs", "says"),
    [
        (1, {}, "cleanup.policy=delete"),
        (1, {"cleanup.policy": "compact,delete"}, "cleanup.policy=compact,delete"),
        (3, {"cleanup.policy": "compact"}, "has 3 partitions"),
    ],
)
async def test_an_existing_topic_that_cannot_hold_a_checkpoint_is_refused_in_one_line(
    real_kafka: KafkaBroker, partitions: int, configs: dict[str, str], says: str
) -> None:
    """Retention would delete the digests of objects that never change (and their
    deletes would never be published); several partitions would let a watermark
    overtake its digests. A person must act: a configuration error, not retried."""
    topic = f"cp-{uuid.uuid4().hex[:8]}"
    await create_topic(real_kafka.bootstrap, topic, partitions, **configs)
    s = store(real_kafka.bootstrap, topic)
    with pytest.raises(ConfigError) as caught:
        await s.open()
    await s.close()
    message = str(caught.value)
    assert "\n" not in message and message.startswith("config error: checkpoint.kafka.topic")
    assert repr(topic) in message and says in message and "checkpoint.kafka.topic" in message


async def checkpoints(s: KafkaCheckpointStore | MemoryCheckpointStore) -> dict[str, Any]:
    out: dict[str, Checkpoint | None] = {}
    for rid in ("core/v1/pods@a", "core/v1/pods@b", "apps/v1/deployments"):
        out[rid] = await s.load(rid)
    return out


async def history(s: KafkaCheckpointStore, oracle: MemoryCheckpointStore, seed: int) -> None:
    """A bridge's life in commits: write-ahead rows, acknowledgements, deletes and
    re-creations of the same names, watermarks moving on, over three resources:
    many records per key, most of them overwritten or deleted since."""
    rnd = random.Random(seed)
    rids = ["core/v1/pods@a", "core/v1/pods@b", "apps/v1/deployments"]
    keys = [f"ns/p{i}" for i in range(40)]
    rv = 100
    for _ in range(300):
        rid = rnd.choice(rids)
        rv += 1
        picked = rnd.sample(keys, rnd.randint(1, 8))
        kind = rnd.random()
        if kind < 0.4:  # written ahead of a publish
            state = rnd.choice([UNCERTAIN, DELETING])
            ups = [Digest(k, f"u{k}{rv}", str(rv), f"f{rv}", state) for k in picked]
            args: tuple[Any, ...] = (rid, None, ups, [])
        elif kind < 0.8:  # acknowledged: certain rows, some deletes, the watermark
            cut = len(picked) // 2
            ups = [Digest(k, f"u{k}{rv}", str(rv), f"f{rv}", CERTAIN) for k in picked[cut:]]
            args = (rid, str(rv), ups, picked[:cut])
        else:  # deleted and created again under the same name in one step
            ups = [Digest(k, f"u{k}{rv}", str(rv), "g", CERTAIN, prior="old") for k in picked]
            args = (rid, str(rv), ups, picked)
        await s.commit(*args)
        await oracle.commit(*args)


async def records_on(bootstrap: str, topic: str) -> int:
    return len(await read_topic(bootstrap, topic))


async def test_a_long_history_reads_back_exactly_before_and_after_compaction(
    real_kafka: KafkaBroker,
) -> None:
    """The last record of each key wins, tombstones remove, the watermark is the
    last one, whatever compaction has removed: the reopened store equals a model
    that applied the same commits. The topic is made to compact at once (small
    segments, any dirt cleanable, tombstones kept 0 ms), and the test waits for
    the log cleaner to have removed records (fewer on the topic than written)."""
    topic = f"cp-{uuid.uuid4().hex[:8]}"
    await create_topic(
        real_kafka.bootstrap,
        topic,
        1,
        **{
            "cleanup.policy": "compact",
            "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.001",
            "delete.retention.ms": "0",
            "min.compaction.lag.ms": "0",
        },
    )
    oracle = MemoryCheckpointStore()
    s = store(real_kafka.bootstrap, topic)
    await s.open()
    try:
        await history(s, oracle, seed=25)
    finally:
        await s.close()
    written = await records_on(real_kafka.bootstrap, topic)
    expected = await checkpoints(oracle)

    s = store(real_kafka.bootstrap, topic)
    await s.open()
    try:
        assert await checkpoints(s) == expected
        # The cleaner compacts only closed segments: a later write rolls the one
        # the history is in (segment.ms has passed by then).
        await asyncio.sleep(0.2)
        await s.commit("other", "1", [], [])
    finally:
        await s.close()

    async def compacted() -> bool:
        return await records_on(real_kafka.bootstrap, topic) < written // 2

    await until(compacted, timeout=90, message=lambda: "the log cleaner did not compact")
    s = store(real_kafka.bootstrap, topic)
    await s.open()
    try:
        assert await checkpoints(s) == expected
        assert await s.resource_ids() == sorted([*expected, "other"])
    finally:
        await s.close()


async def test_kafka_down_fails_commits_and_open_and_nothing_advances(
    real_kafka_private: KafkaBroker,
) -> None:
    """An unreachable broker is a CheckpointError (the pipeline retries it, not
    ready meanwhile), within the store's timeout; what was committed before is
    what a store opened after the broker is back reads, and commits work again."""
    broker = real_kafka_private
    topic = f"cp-{uuid.uuid4().hex[:8]}"
    s = store(broker.bootstrap, topic, timeout=5)
    await s.open()
    try:
        await s.commit("r", "10", [Digest("ns/a", "ua", "10", "f")], [])
        broker.stop()
        with pytest.raises(CheckpointError) as caught:
            await s.commit("r", "11", [Digest("ns/b", "ub", "11", "f")], ["ns/a"])
        assert repr(topic) in str(caught.value) and "\n" not in str(caught.value)
        down = store(broker.bootstrap, topic, timeout=5)
        with pytest.raises(CheckpointError):
            await down.open()
        await down.close()
        broker.start()
        await s.commit("r", "12", [Digest("ns/c", "uc", "12", "f")], [])
    finally:
        await s.close()
    s = store(broker.bootstrap, topic, timeout=5)
    await s.open()
    try:
        cp = await s.load("r")
    finally:
        await s.close()
    assert cp is not None and cp.resource_version == "12"
    # Whatever of the failed commit reached the broker came before commit 12 in the
    # log; the two rows it never reached it with are not there.
    assert set(cp.digests) in ({"ns/a", "ns/c"}, {"ns/b", "ns/c"})


# --- end to end: kill -9, changes and a compaction while down ---------------------


def kafka_only_config(
    tmp_path: Path, cluster: KubeCluster, ns: str, bootstrap: str, events: str, checkpoints: str
) -> Path:
    return write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=cluster.write_kubeconfig(tmp_path / "kubeconfig"),
        sink={"kind": "kafka", "kafka": {"bootstrapServers": [bootstrap], "topic": events}},
        resources=[{"apiVersion": "v1", "kind": "Pod", "namespaces": [ns]}],
        checkpoint={"kind": "kafka", "kafka": {"topic": checkpoints}, "commitInterval": 0.1},
    )


async def settled(bootstrap: str, topic: str, resource_id: str, rv: int, keys: set[str]) -> bool:
    """The bridge's checkpoint has a watermark at ``rv`` or later, the digests of
    exactly ``keys`` and no row still written ahead: every event decided is
    acknowledged and committed."""
    s = store(bootstrap, topic)
    await s.open()
    try:
        cp = await s.load(resource_id)
    finally:
        await s.close()
    return (
        cp is not None
        and int(cp.resource_version or 0) >= rv
        and set(cp.digests) == keys
        and all(d.state == CERTAIN for d in cp.digests.values())
    )


async def test_kill9_and_a_compaction_while_down_publish_exactly_the_deletes(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, real_kafka: KafkaBroker
) -> None:
    """Kafka only: events and checkpoint in one cluster. The bridge is killed with
    -9 once settled; while it is down, Pods are deleted and etcd is compacted
    (the API server restarted, so the watermark is 410 Gone). The restart relists
    and diffs against the digests read from the checkpoint topic: the deletes
    are published, once each, and not one unchanged Pod."""
    ns = kube_namespace
    events, cp_topic = f"ev-{uuid.uuid4().hex[:8]}", f"cp-{uuid.uuid4().hex[:8]}"
    rid = f"core/v1/pods@{ns}"
    pods = {f"p{i}": kube_cluster.create(pod(f"p{i}", ns)) for i in range(20)}
    last = max(int(p["metadata"]["resourceVersion"]) for p in pods.values())
    config = kafka_only_config(tmp_path, kube_cluster, ns, real_kafka.bootstrap, events, cp_topic)

    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await until(
            lambda: settled(real_kafka.bootstrap, cp_topic, rid, last, {f"{ns}/{n}" for n in pods}),
            timeout=60,
            message=bridge.tail_log,
        )
    finally:
        kill9(bridge)
        if bridge.proc is not None:
            await bridge.proc.wait()
    before = decoded(await read_topic(real_kafka.bootstrap, events))
    assert sorted(e["id"] for e in before) == sorted(
        f"{p['metadata']['uid']}:{p['metadata']['resourceVersion']}" for p in pods.values()
    )

    gone = sorted(random.Random(7).sample(sorted(pods), 6))
    for name in gone:
        kube_cluster.delete("v1", "Pod", name, namespace=ns)
    # Pods are deleted gracefully: wait until the API server has removed them.
    await until(
        lambda: (
            not {p["metadata"]["name"] for p in kube_cluster.list("v1", "Pod", ns)["items"]}
            & set(gone)
        ),
        timeout=60,
    )
    kube_cluster.compact()
    kube_cluster.restart_apiserver()
    survivors = {f"{ns}/{n}" for n in pods if n not in gone}

    since = bridge.log.stat().st_size
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        # Past the last create: the relist's resourceVersion, the deletes in it.
        await until(
            lambda: settled(real_kafka.bootstrap, cp_topic, rid, last + 1, survivors),
            timeout=90,
            message=bridge.tail_log,
        )
        await bridge.wait_ready(30)
    finally:
        code = await bridge.stop()
    assert code == 0, bridge.tail_log()
    # The restart read all 20 digests from the topic, and its watermark was gone: it
    # relisted and diffed the list against them.
    resumed = log_lines(bridge, "resuming from checkpoint", since)
    assert [x["objects"] for x in resumed] == [20], resumed
    assert log_lines(bridge, "listed", since), bridge.tail_log()
    published = decoded(await read_topic(real_kafka.bootstrap, events))[len(before) :]
    assert sorted(e["id"] for e in published) == sorted(
        f"{pods[name]['metadata']['uid']}:deleted" for name in gone
    ), bridge.tail_log()
    assert {e["type"].rsplit(".", 1)[-1] for e in published} == {"deleted"}


async def test_records_of_aborted_and_open_transactions_are_not_the_checkpoint(
    real_kafka: KafkaBroker,
) -> None:
    """A transactional writer (the exactly-once sink) puts checkpoint records in the
    transactions of its events: what an aborted transaction wrote never happened,
    and what an open one wrote has not happened yet (the read stops at the last
    stable offset). Committed ones read as if written plainly."""
    from aiokafka import AIOKafkaProducer

    from bridge.checkpoints.kafka import PARTITION, commit_records

    topic = f"cp-{uuid.uuid4().hex[:8]}"
    s = store(real_kafka.bootstrap, topic)
    await s.open()
    await s.close()
    committed = commit_records("r", "10", [Digest("ns/a", "ua", "10", "f")], [])
    aborted = commit_records("r", "11", [Digest("ns/b", "ub", "11", "f")], ["ns/a"])
    pending = commit_records("r", "12", [Digest("ns/c", "uc", "12", "f")], [])
    after = commit_records("q", "3", [Digest("x", "ux", "3", "f")], [])
    producers = [
        AIOKafkaProducer(bootstrap_servers=real_kafka.bootstrap, transactional_id=f"{topic}-{i}")
        for i in range(2)
    ]
    for p in producers:
        await p.start()
    try:
        one, other = producers

        async def send(p: AIOKafkaProducer, records: list[tuple[bytes, bytes | None]]) -> None:
            for key, value in records:
                await p.send_and_wait(topic, value, key=key, partition=PARTITION)

        async with one.transaction():
            await send(one, committed)
        await one.begin_transaction()
        await send(one, aborted)
        await one.abort_transaction()
        await other.begin_transaction()  # left open while the store reads
        await send(other, pending)
        async with one.transaction():  # committed, but behind the open one
            await send(one, after)

        s = store(real_kafka.bootstrap, topic)
        await s.open()
        try:
            assert await s.load("r") == Checkpoint("10", {"ns/a": Digest("ns/a", "ua", "10", "f")})
            # Behind the open transaction: not read yet.
            assert await s.load("q") is None
        finally:
            await s.close()
        await other.commit_transaction()
        s = store(real_kafka.bootstrap, topic)
        await s.open()
        try:
            cp = await s.load("r")
            assert cp is not None and cp.resource_version == "12"
            assert set(cp.digests) == {"ns/a", "ns/c"}
            assert await s.load("q") == Checkpoint("3", {"x": Digest("x", "ux", "3", "f")})
        finally:
            await s.close()
    finally:
        for p in producers:
            await p.stop()


async def test_a_watermark_is_read_without_taking_the_rows(real_kafka: KafkaBroker) -> None:
    """Re-sharding compares watermarks before any resource loads: reading one leaves
    the rows to ``load``, and a commit since the read is seen."""
    topic = f"cp-{uuid.uuid4().hex[:8]}"
    s = store(real_kafka.bootstrap, topic)
    await s.open()
    try:
        await s.commit("r", "7", [Digest("ns/a", "ua", "7", "f")], [])
        await s.commit("ahead", None, [Digest("ns/b", "ub", "3", "f", UNCERTAIN)], [])
    finally:
        await s.close()
    s = store(real_kafka.bootstrap, topic)
    await s.open()
    try:
        assert await s.watermark("r") == "7"
        assert await s.watermark("ahead") is None  # rows, no watermark
        assert await s.watermark("never") is None
        assert await s.load("r") == Checkpoint("7", {"ns/a": Digest("ns/a", "ua", "7", "f")})
        await s.commit("r", "8", [], ["ns/a"])
        assert await s.watermark("r") == "8"
    finally:
        await s.close()


# --- k8s-bridge check: the topic described, never created, its records never read ----


def check_config(tmp_path: Path, kubeconfig: Path, bootstrap: str, topic: str) -> Path:
    return write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={
            "kind": "kafka",
            "kafka": {"bootstrapServers": [bootstrap], "topic": f"ev-{uuid.uuid4().hex[:8]}"},
        },
        resources=[{"apiVersion": "v1", "kind": "Pod"}],
        checkpoint={"kind": "kafka", "kafka": {"topic": topic}},
    )


def events_topic(config: Path) -> str:
    topic: str = yaml.safe_load(config.read_text())["sink"]["kafka"]["topic"]
    return topic


async def check(config: Path) -> tuple[int, list[str]]:
    code, out, err = await cli("check", "--config", str(config), timeout=60)
    assert "Traceback" not in err, err
    return code, out.splitlines()


async def topics(bootstrap: str) -> list[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return await admin.list_topics()
    finally:
        await admin.close()


async def test_check_leaves_a_missing_topic_missing_and_says_the_first_start_creates_it(
    tmp_path: Path, kubeconfig: Path, real_kafka: KafkaBroker
) -> None:
    """The store's open creates the topic; check only says so, on a broker that would
    auto-create it too (a metadata request naming it would). The events topic, missing
    too, is left missing as well: its durability is read from the broker's defaults."""
    topic = f"cp-{uuid.uuid4().hex[:8]}"
    config = check_config(tmp_path, kubeconfig, real_kafka.bootstrap, topic)
    events = events_topic(config)
    code, lines = await check(config)
    assert code == 0, lines
    assert (
        f"ok    checkpoint kafka: topic {topic!r} does not exist yet: the first start creates it"
        " (one partition, cleanup.policy=compact, replication factor 1)"
    ) in lines, lines
    assert any("to be created with the broker's defaults" in line for line in lines), lines
    present = await topics(real_kafka.bootstrap)
    assert topic not in present and events not in present


async def test_check_describes_a_topic_with_records_without_reading_them(
    tmp_path: Path, kubeconfig: Path, real_kafka: KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``check`` in process, with spies on the store's read path (its consumer and
    its fetch): the store's own open goes through them, check's probe does not."""
    import bridge.checkpoints.kafka as kafka_store
    from bridge.cli.check import run_checks
    from bridge.service.settings import load_settings

    topic = f"cp-{uuid.uuid4().hex[:8]}"
    s = store(real_kafka.bootstrap, topic)
    await s.open()
    try:
        digests = [Digest(f"ns/p{i}", f"u{i}", "9", "f") for i in range(5000)]
        await s.commit("core/v1/pods", "9", digests, [])
    finally:
        await s.close()

    consumers: list[dict[str, Any]] = []
    fetches: list[int] = []
    real_fetch = kafka_store._fetch_into

    class SpyConsumer(kafka_store.AIOKafkaConsumer):
        def __init__(self, *args: Any, **kw: Any) -> None:
            consumers.append(kw)
            super().__init__(*args, **kw)

    async def spy_fetch(consumer: Any, tp: Any, position: int, fold: Any) -> int:
        fetches.append(position)
        return await real_fetch(consumer, tp, position, fold)

    monkeypatch.setattr(kafka_store, "AIOKafkaConsumer", SpyConsumer)
    monkeypatch.setattr(kafka_store, "_fetch_into", spy_fetch)
    # The spies see a read: the store's open reads the 5000 records through them.
    s = store(real_kafka.bootstrap, topic)
    await s.open()
    await s.close()
    assert consumers and fetches
    consumers.clear()
    fetches.clear()

    out = io.StringIO()
    settings = load_settings(str(check_config(tmp_path, kubeconfig, real_kafka.bootstrap, topic)))
    code = await run_checks(settings, out)
    lines = out.getvalue().splitlines()
    assert code == 0, lines
    assert (
        f"ok    checkpoint kafka: topic {topic!r} has one partition and cleanup.policy=compact"
        " (its records not read)"
    ) in lines, lines
    assert consumers == [] and fetches == []


@pytest.mark.parametrize(
    ("partitions", "configs", "says"),
    [
        (2, {"cleanup.policy": "compact"}, "the topic has 2 partitions"),
        (1, {"cleanup.policy": "delete"}, "the topic has cleanup.policy=delete"),
    ],
)
async def test_check_fails_on_a_topic_the_store_would_refuse_in_its_one_line(
    tmp_path: Path,
    kubeconfig: Path,
    real_kafka: KafkaBroker,
    partitions: int,
    configs: dict[str, str],
    says: str,
) -> None:
    topic = f"cp-{uuid.uuid4().hex[:8]}"
    await create_topic(real_kafka.bootstrap, topic, partitions, **configs)
    code, lines = await check(check_config(tmp_path, kubeconfig, real_kafka.bootstrap, topic))
    assert code == 1, lines
    (failed,) = [line for line in lines if line.startswith("FAIL")]
    assert failed.startswith(
        f"FAIL  checkpoint kafka: config error: checkpoint.kafka.topic {topic!r}: {says}"
    ), failed
    # The store's own message, the same open raises.
    s = store(real_kafka.bootstrap, topic)
    with pytest.raises(ConfigError) as caught:
        await s.open()
    await s.close()
    assert failed == f"FAIL  checkpoint kafka: {caught.value}"


async def test_the_probe_of_an_unreachable_cluster_is_a_checkpoint_error_in_one_line() -> None:
    """What ``open`` raises for a cluster it cannot reach: ``check`` fails the line."""
    s = store(f"127.0.0.1:{free_port()}", "cp-nowhere", timeout=5)
    with pytest.raises(CheckpointError) as caught:
        await s.probe()
    await s.close()
    message = str(caught.value)
    assert "\n" not in message and "cannot describe the topic" in message, message
    assert "'cp-nowhere'" in message
