"""Exactly-once through Kafka transactions, on Apache Kafka: a batch and the
checkpoint records that cover it land together or not at all, and a new holder
of a resource's transactional id fences the old one and aborts what it left open."""

from __future__ import annotations

import contextlib
import gc
import uuid

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from bridge.delivery.events import Event
from bridge.sinks.kafka import KafkaSink
from bridge.sinks.kafka_transactions import FencedError, KafkaTransactions
from tests.fixtures.realkafka import KafkaBroker
from tests.real.kafkabus import read_topic

pytestmark = [pytest.mark.timeout(120)]

RID = "core/v1/pods@ns"


def event(name: str, rv: int) -> Event:
    return Event(
        id=f"{name}:{rv}",
        type="io.k8s.core.v1.Pod.modified",
        source="k8s://t/v1/pods",
        subject=f"ns/{name}",
        time="2026-01-01T00:00:00Z",
        resource_version=str(rv),
        initial=False,
        data={"object": {"metadata": {"name": name, "namespace": "ns"}}},
    )


def row(name: str, rv: int) -> tuple[bytes, bytes]:
    return f"d\x00{RID}\x00ns/{name}".encode(), orjson.dumps([name, str(rv), "f", "", ""])


class Bus:
    """A sink and its transactional channels on fresh topics of the real broker."""

    def __init__(self, kafka: KafkaBroker, prefix: str, topic: str, checkpoint_topic: str) -> None:
        self.sink = KafkaSink([kafka.bootstrap], topic=topic)
        self.transactions = KafkaTransactions(
            self.sink, prefix=prefix, checkpoint_topic=checkpoint_topic
        )
        self.sink.transactions = self.transactions

    async def __aenter__(self) -> Bus:
        await self.sink.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.sink.close()


def names(records: list) -> list[str]:  # type: ignore[type-arg]
    return [orjson.loads(r.value)["id"] for r in records if r.value is not None]


async def test_a_batch_and_its_checkpoint_records_commit_together(real_kafka: KafkaBroker) -> None:
    tag = uuid.uuid4().hex[:8]
    topic, cp = f"eos-{tag}", f"eos-cp-{tag}"
    async with Bus(real_kafka, f"t-{tag}", topic, cp) as bus:
        channel = bus.transactions.channel(RID)
        await channel.start()
        events = [event(f"p{i}", 10 + i) for i in range(20)]
        refused = await channel.publish(events, lambda _: [row(f"p{i}", 10 + i) for i in range(20)])
        assert refused == {}
        assert channel.transactions == 1
    committed = await read_topic(real_kafka.bootstrap, topic, isolation_level="read_committed")
    assert names(committed) == [e.id for e in events]
    rows = await read_topic(real_kafka.bootstrap, cp, isolation_level="read_committed")
    assert [r.key for r in rows] == [row(f"p{i}", 0)[0] for i in range(20)]


async def test_a_new_holder_fences_the_old_and_aborts_its_open_transaction(
    real_kafka: KafkaBroker,
) -> None:
    """A leader killed (or paused) inside a transaction: its records never reach a
    read_committed consumer once the next leader has started its channel."""
    tag = uuid.uuid4().hex[:8]
    topic, cp = f"eos-{tag}", f"eos-cp-{tag}"
    async with (
        Bus(real_kafka, f"t-{tag}", topic, cp) as old,
        Bus(real_kafka, f"t-{tag}", topic, cp) as new,
    ):
        zombie = old.transactions.channel(RID)
        await zombie.start()
        await zombie.publish([event("before", 1)], lambda _: [row("before", 1)])
        # A transaction never ended, what a kill -9 inside one leaves on the broker.
        killed = AIOKafkaProducer(
            bootstrap_servers=real_kafka.bootstrap, transactional_id=zombie.transactional_id
        )
        await killed.start()
        try:
            await killed.begin_transaction()
            ghost = event("ghost", 2)
            await (await killed.send(topic, ghost.to_json(), key=ghost.key))
            await (await killed.send(cp, row("ghost", 2)[1], key=row("ghost", 2)[0]))

            leader = new.transactions.channel(RID)
            await leader.start()  # fences both; the open transaction is aborted
            await leader.publish([event("after", 3)], lambda _: [row("after", 3)])
            with pytest.raises(FencedError, match="taken by another bridge"):
                await zombie.publish([event("late", 4)], lambda _: [row("late", 4)])
        finally:
            with contextlib.suppress(Exception):
                await killed.stop()
    # aiokafka leaves the fenced producers' errors in futures no public call awaits;
    # collected here, asyncio logs them now rather than at some later collection.
    gc.collect()

    committed = await read_topic(real_kafka.bootstrap, topic, isolation_level="read_committed")
    assert names(committed) == ["before:1", "after:3"]
    everything = await read_topic(real_kafka.bootstrap, topic)
    assert "ghost:2" in names(everything)  # written, then aborted: only read_uncommitted sees it
    rows = await read_topic(real_kafka.bootstrap, cp, isolation_level="read_committed")
    assert row("ghost", 2)[0] not in [r.key for r in rows]
