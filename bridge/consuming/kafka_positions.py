"""A group's positions in a compacted Kafka topic of its own (``{group}.positions``).

One record per uid (key = uid, value = ``{resourceVersion}`` or
``{resourceVersion}:deleted``), compacted, one partition. ``flush`` sends what
was recorded since the last flush and waits for the broker's acks (``acks=all``,
idempotent producer): only then does the consumer commit offsets. On every
assignment (a start, a rebalance) the worker reads the whole topic to its end,
so a uid that moved from another worker carries the position that worker
flushed before it let the partition go, or before it crashed. Reading the whole
topic costs about a second per 100k objects, once per rebalance; one partition
keeps it a single ordered log.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code

from bridge.consuming.positions import BusPositions, Position
from bridge.errors import SinkUnavailableError


def encode(position: Position) -> bytes:
    rv = str(position.resource_version)
    return (rv + ":deleted" if position.deleted else rv).encode()


def decode(value: bytes) -> Position:
    rv, _, deleted = value.decode().partition(":")
    return Position(int(rv), deleted == "deleted")


class KafkaTopicPositions(BusPositions):
    _unavailable = (KafkaError,)

    def __init__(self, options: dict[str, Any], topic: str) -> None:
        super().__init__()
        self.options = options  # connection_options(...) of the sink's cluster
        self.topic = topic
        self._where = f"positions topic {topic!r}"
        self._producer: AIOKafkaProducer | None = None

    async def open(self) -> None:
        if self._producer is not None:
            return
        admin = AIOKafkaAdminClient(**{k: v for k, v in self.options.items() if k != "client_id"})
        try:
            await admin.start()
            brokers = (await admin.describe_cluster()).get("brokers") or []
            replicas = max(1, min(3, len(brokers)))
            response = await admin.create_topics(
                [NewTopic(self.topic, 1, replicas, topic_configs={"cleanup.policy": "compact"})]
            )
            for error in response.topic_errors:
                if error[1] and error[1] != TopicAlreadyExistsError.errno:
                    raise for_code(error[1])(error[2] if len(error) > 2 else "")
        except KafkaError as e:
            raise SinkUnavailableError(f"positions topic {self.topic!r}: {e!r}") from e
        finally:
            await admin.close()
        producer = AIOKafkaProducer(acks="all", enable_idempotence=True, **self.options)
        await producer.start()
        self._producer = producer
        await self._load()

    async def _read(self) -> dict[str, Position]:
        consumer = AIOKafkaConsumer(
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            **self.options,
        )
        await consumer.start()
        try:
            tp = TopicPartition(self.topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            for attempt in range(50):  # a topic just created: its leader takes a moment
                try:
                    end = (await consumer.end_offsets([tp]))[tp]
                    break
                except KafkaError:
                    if attempt == 49:
                        raise
                    await asyncio.sleep(0.1)
            positions: dict[str, Position] = {}
            while await consumer.position(tp) < end:
                for records in (await consumer.getmany(tp, timeout_ms=500)).values():
                    for r in records:
                        if r.key is None:
                            continue
                        if r.value is None:
                            positions.pop(r.key.decode(), None)
                        else:
                            positions[r.key.decode()] = decode(r.value)
        finally:
            await consumer.stop()
        return positions

    async def _write(self, pending: dict[str, Position]) -> None:
        producer = self._producer
        assert producer is not None, "open() first"
        sent = [
            await producer.send(self.topic, key=uid.encode(), value=encode(p), partition=0)
            for uid, p in pending.items()
        ]
        await asyncio.gather(*sent)

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()
