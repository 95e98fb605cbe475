"""A Kafka consumer group for ``consume(..., group=...)``.

- ``isolation_level=read_committed``: an aborted transaction of the bridge
  (``exactlyOnce``) was never published.
- Offsets are committed only for messages that are ``done`` (the handler
  returned, or the message was skipped), and only after the group's positions
  are flushed: an offset is never ahead of a position, so whatever the
  committed offset makes the group read again is recognised by its position.
- Commits are batched (``commit_interval``, and whenever the topic is idle):
  a redelivery costs a position lookup, a commit per message a round trip.
- Rebalances: aiokafka's group protocol is eager (every partition is revoked,
  then assigned). ``on_partitions_revoked`` waits until the caller is not
  inside a handler, flushes positions and commits; the rest of the current
  batch is dropped and read again from the committed offsets by whoever owns
  the partition next. ``on_partitions_assigned`` lets the position store load
  what the previous owner flushed.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import IllegalStateError, KafkaError

from bridge.consuming.positions import PositionStore
from bridge.consuming.source import Incoming
from bridge.errors import SinkUnavailableError
from bridge.logging import get_logger
from bridge.service.settings import KafkaSettings

log = get_logger(__name__)


def change_topics(k: KafkaSettings) -> tuple[tuple[str, ...], str]:
    """``(topics, pattern)`` of the sink's change topics: a templated topic (one per
    resource) is read as the pattern of everything that starts like it."""
    if "{" in k.topic:
        return (), "^" + re.escape(k.topic.split("{", 1)[0]) + ".*"
    return (k.topic,), ""


class KafkaGroupSource(ConsumerRebalanceListener):
    def __init__(
        self,
        k: KafkaSettings,
        group: str,
        positions: PositionStore,
        *,
        from_start: bool,
        commit_interval: float = 1.0,
        max_records: int = 500,
        client_id: str = "k8s-bridge-consumer",
        consumer_options: Mapping[str, Any] | None = None,
    ) -> None:

        self.k = k
        self.group = group
        self._positions = positions
        self.commit_interval = commit_interval
        self.max_records = max_records
        self._options: dict[str, Any] = k.connection_options(client_id) | dict(
            consumer_options or {}
        )
        self._from_start = from_start
        self._consumer: AIOKafkaConsumer | None = None
        self._done: dict[TopicPartition, int] = {}  # next offset to commit, per partition
        self._last_commit = time.monotonic()
        # Set while no message is out with the caller: a rebalance waits for it.
        self._idle = asyncio.Event()
        self._idle.set()
        self._revoking = False
        self._generation = 0
        self._committing = asyncio.Lock()

    @property
    def positions(self) -> PositionStore:
        return self._positions

    @property
    def where(self) -> str:
        return ",".join(self.k.bootstrap_servers)

    async def start(self) -> None:
        # Before joining: the first assignment loads positions through it.
        await self.positions.open()
        topics, pattern = change_topics(self.k)
        consumer = AIOKafkaConsumer(
            group_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest" if self._from_start else "latest",
            isolation_level="read_committed",
            **self._options,
        )
        try:
            await consumer.start()
        except KafkaError as e:
            await consumer.stop()
            await self._positions.close()
            raise SinkUnavailableError(f"cannot reach Kafka at {self.where}: {e!r}") from e
        if pattern:
            consumer.subscribe(pattern=pattern, listener=self)
        else:
            consumer.subscribe(topics=list(topics), listener=self)
        self._consumer = consumer

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self._revoking = True
        try:
            # Not while a handler runs: its message would be committed as not done,
            # or handed to the next owner while this one still handles it.
            await self._idle.wait()
            await self._commit()
        finally:
            self._done.clear()
            self._generation += 1
            self._revoking = False

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self.positions.assigned(sorted({tp.partition for tp in assigned}))
        log.info(
            "consumer group partitions assigned",
            group=self.group,
            partitions=",".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(assigned)),
        )

    async def messages(self) -> AsyncIterator[Incoming]:
        consumer = self._consumer
        assert consumer is not None, "start() first"
        while True:
            if self._done and time.monotonic() - self._last_commit >= self.commit_interval:
                await self._commit()
            generation = self._generation
            try:
                batch = await consumer.getmany(timeout_ms=200, max_records=self.max_records)
            except KafkaError as e:
                raise SinkUnavailableError(f"Kafka at {self.where}: {e!r}") from e
            if not batch:
                if self._done:
                    await self._commit()  # idle: nothing to batch the commit with
                continue
            for tp, records in batch.items():
                for i, record in enumerate(records):
                    if self._done and time.monotonic() - self._last_commit >= self.commit_interval:
                        await self._commit()  # within a batch too: it bounds what comes again
                    if self._generation != generation or self._revoking:
                        # A rebalance since the fetch: drop the rest, read it again from
                        # the committed offsets (or from here, if still ours).
                        self._seek_back(batch, tp, i)
                        break
                    self._idle.clear()
                    yield Incoming(record.value, tp.partition, (tp, record.offset))
                else:
                    continue
                break

    def _seek_back(
        self, batch: dict[TopicPartition, list[Any]], at: TopicPartition, index: int
    ) -> None:
        consumer = self._consumer
        assert consumer is not None
        owned = consumer.assignment()
        seen = False
        for tp, records in batch.items():
            seen = seen or tp == at
            if not seen or not records:
                continue
            first = records[index].offset if tp == at else records[0].offset
            if tp in owned:
                try:
                    consumer.seek(tp, first)
                except IllegalStateError:
                    pass  # revoked meanwhile: the next owner starts from the commit

    async def done(self, message: Incoming) -> None:
        tp, offset = message.token
        self._done[tp] = offset + 1
        self._idle.set()

    async def _commit(self) -> None:
        # One at a time: the reading loop's and a rebalance's would interleave.
        async with self._committing:
            await self._commit_now()

    async def _commit_now(self) -> None:
        consumer = self._consumer
        self._last_commit = time.monotonic()
        if consumer is None or not self._done:
            await self.positions.flush()
            return
        offsets = dict(self._done)
        # Positions first: an offset committed ahead of a position would make a
        # crash skip the recognition of what it reads again.
        await self.positions.flush()
        try:
            await consumer.commit(offsets)
        except (KafkaError, IllegalStateError) as e:
            # Kicked out of the group (a rebalance went on without us): the next owner
            # reads these again and recognises them by their flushed positions.
            log.warning("consumer group commit failed", group=self.group, error=repr(e))
            return
        for tp, offset in offsets.items():
            if self._done.get(tp) == offset:
                del self._done[tp]

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is None:
            return
        try:
            if self._done:
                self._consumer = consumer
                await self._commit()
                self._consumer = None
        finally:
            await consumer.stop()
