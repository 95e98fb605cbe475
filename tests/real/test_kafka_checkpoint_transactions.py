"""The Kafka checkpoint store reads exactly what a ``read_committed`` consumer reads,
when several transactional producers share the checkpoint partition.

That is the shape exactly-once runs in: one transactional producer per resource,
every one writing the topic's one partition, their transactions committed,
aborted (a refused record, a broker that went away) or left open (a bridge killed
inside one, later fenced by its successor) in any interleaving. The store reads
the partition with a fetch of its own (bridge/checkpoints/kafka.py,
``_fetch_into``), so the oracle here is aiokafka's consumer with
``isolation_level="read_committed"``, which the store's code does not use: both
must agree, key for key, after every step of a random schedule.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field

import pytest
from aiokafka import AIOKafkaProducer

from bridge.checkpoints.base import Checkpoint
from bridge.checkpoints.kafka import PARTITION, KafkaCheckpointStore, commit_records, digest_of
from bridge.ground.digest import CERTAIN, UNCERTAIN, Digest
from tests.fixtures.realkafka import KafkaBroker
from tests.real.kafkabus import read_topic

pytestmark = [pytest.mark.timeout(240)]

PRODUCERS = 5
RESOURCES = [f"core/v1/r{i}" for i in range(PRODUCERS)]
KEYS = [f"ns/o{i}" for i in range(12)]


def reference(records: list) -> dict[str, Checkpoint]:  # type: ignore[type-arg]
    """The checkpoint of every resource as the records read by aiokafka's consumer say:
    the last record of a key wins, a tombstone removes it."""
    last: dict[bytes, bytes | None] = {}
    for r in records:
        last[r.key] = r.value
    out: dict[str, Checkpoint] = {}
    for key, value in last.items():
        kind, rid, *rest = key.split(b"\x00")
        cp = out.setdefault(rid.decode(), Checkpoint("", {}))
        if kind == b"w":
            if value is not None:
                out[rid.decode()] = Checkpoint(value.decode().strip('"'), cp.digests)
        elif value is not None:
            name = rest[0].decode()
            cp.digests[name] = digest_of(name, value)
    return out


async def committed(bootstrap: str, topic: str) -> dict[str, Checkpoint]:
    return reference(await read_topic(bootstrap, topic, isolation_level="read_committed"))


@dataclass
class Writer:
    """One transactional producer: the records of its open transaction, if any."""

    producer: AIOKafkaProducer
    resource_id: str
    open: bool = False
    rv: int = 0
    sent: list[tuple[bytes, bytes | None]] = field(default_factory=list)


async def store_view(bootstrap: str, topic: str) -> dict[str, Checkpoint]:
    store = KafkaCheckpointStore({"bootstrap_servers": [bootstrap]}, topic)
    await store.open()
    try:
        out: dict[str, Checkpoint] = {}
        for rid in await store.resource_ids():
            cp = await store.load(rid)
            if cp is not None:
                out[rid] = cp
        # Bulk loading reads the same rows another way (columns): it must agree too.
        store2 = KafkaCheckpointStore({"bootstrap_servers": [bootstrap]}, topic)
        await store2.open()
        try:
            for rid, cp in out.items():
                bulk = await store2.load_bulk(rid)
                assert bulk is not None
                keys = [*bulk.packed.keys, *(r.key for r in bulk.loose)]
                keys += [d.key for d in bulk.others]
                assert sorted(keys) == sorted(cp.digests), rid
        finally:
            await store2.close()
        return out
    finally:
        await store.close()


def commit_of(rng: random.Random, w: Writer) -> list[tuple[bytes, bytes | None]]:
    """A commit of the writer's resource as the pipeline writes it: rows written
    ahead, rows settled with a watermark, rows deleted."""
    w.rv += rng.randint(1, 5)
    keys = rng.sample(KEYS, rng.randint(1, 4))
    deletes = rng.sample(KEYS, rng.randint(0, 2))
    ups = [
        Digest(k, f"u-{k}", str(w.rv), f"f{rng.randint(0, 3)}", rng.choice([CERTAIN, UNCERTAIN]))
        for k in keys
    ]
    watermark = str(w.rv) if rng.random() < 0.7 else None
    return commit_records(w.resource_id, watermark, ups, deletes)


async def new_producer(bootstrap: str, txid: str) -> AIOKafkaProducer:
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=txid)
    await p.start()
    return p


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_the_store_reads_what_read_committed_reads_with_interleaved_aborts(
    real_kafka: KafkaBroker, seed: int
) -> None:
    rng = random.Random(seed)
    bootstrap = real_kafka.bootstrap
    topic = f"cp-tx-{uuid.uuid4().hex[:8]}"
    created = KafkaCheckpointStore({"bootstrap_servers": [bootstrap]}, topic)
    await created.open()  # creates the topic as the bridge does: compact, one partition
    await created.close()
    writers = [Writer(await new_producer(bootstrap, f"{topic}.{rid}"), rid) for rid in RESOURCES]
    aborts = compared = 0
    try:
        for step in range(60):
            w = rng.choice(writers)
            if not w.open:
                await w.producer.begin_transaction()
                w.open = True
            records = commit_of(rng, w)
            for key, value in records:
                await w.producer.send_and_wait(topic, value, key=key, partition=PARTITION)
            roll = rng.random()
            if roll < 0.35:
                await w.producer.commit_transaction()
                w.open = False
            elif roll < 0.7:
                await w.producer.abort_transaction()
                w.open = False
                aborts += 1
            # Every few steps (and at the end), the two readers must agree.
            if step % 3 == 2:
                expected = await committed(bootstrap, topic)
                assert await store_view(bootstrap, topic) == expected, f"seed {seed}, step {step}"
                compared += 1
        # Some transactions are still open: the read stops at the first of them.
        still_open = [w for w in writers if w.open]
        expected = await committed(bootstrap, topic)
        assert await store_view(bootstrap, topic) == expected
        # Their successors fence them (a new leader, a restart): the broker aborts them.
        for w in still_open:
            successor = await new_producer(bootstrap, f"{topic}.{w.resource_id}")
            await w.producer.stop()
            w.producer, w.open = successor, False
            aborts += 1
        expected = await committed(bootstrap, topic)
        assert await store_view(bootstrap, topic) == expected
        assert aborts >= 10, aborts  # the schedule did interleave aborts
        assert compared >= 19
    finally:
        for w in writers:
            await w.producer.stop()
