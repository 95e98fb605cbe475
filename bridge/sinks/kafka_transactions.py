"""Exactly-once publishing to Kafka: a transactional producer per resource.

A batch of events and the checkpoint records saying they were published go to
Kafka in one transaction (the checkpoint is a compacted topic of the same
cluster, bridge/checkpoints/kafka.py), so for a consumer reading committed
records (``isolation.level=read_committed``) either both are there or neither
is: a crash at any moment leaves no event whose checkpoint row is missing and
no row whose event is missing, and a restart, reading the checkpoint committed,
republishes nothing that reached the consumer (KIP-98; Kafka Connect's
exactly-once source connectors, KIP-618, rest on the same two facts).

Each resource has its own ``transactional.id`` (``<prefix>.<resource id>``),
the same in every replica: a new leader's producer, started, fences the old
one (its epoch is bumped; an old leader still running gets ``ProducerFenced``
and stops) and aborts whatever transaction the old one left open. That is why
a channel is started only by the leader, and before the checkpoint is read:
before that, the last stable offset of the checkpoint topic can still stand
behind a transaction the old leader never ended.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import aiokafka.errors as kerrors
from aiokafka import AIOKafkaProducer
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from bridge.errors import CheckpointError, SinkError, SinkUnavailableError
from bridge.ground.envelope import Event
from bridge.logging import get_logger
from bridge.sinks.kafka import OUT_OF_STEP

if TYPE_CHECKING:
    from bridge.sinks.kafka import KafkaSink

log = get_logger(__name__)

# (key, value) of a checkpoint record; value None is a tombstone.
CheckpointRecord = tuple[bytes, bytes | None]

# (topic, key, value, headers) of one record of a transaction.
_Record = tuple[str, bytes, bytes | None, list[tuple[str, bytes]]]

# Another producer took the transactional id: a newer leader. Nothing to retry.
_FENCED: tuple[type[BaseException], ...] = (
    kerrors.ProducerFenced,
    kerrors.InvalidProducerEpoch,
    kerrors.TransactionalIdAuthorizationFailed,
)

# Record refusals that a person, not a retry, must fix; the rest is "retry later".
_REFUSALS: tuple[type[BaseException], ...] = (
    kerrors.MessageSizeTooLargeError,
    kerrors.RecordTooLargeError,
    kerrors.InvalidTopicError,
    kerrors.TopicAuthorizationFailedError,
    kerrors.CorruptRecordException,
    kerrors.RecordListTooLargeError,
)


class FencedError(SinkError):
    """Another bridge took this resource's transactional id: it leads now."""


def transactional_id(prefix: str, resource_id: str) -> str:
    return f"{prefix}.{resource_id}"


class TransactionalChannel:
    """One resource's transactional producer: publishes a batch with its checkpoint
    records in one transaction, or checkpoint records alone (the commits behind the
    bus), one transaction at a time, in call order."""

    def __init__(
        self, sink: KafkaSink, transactional_id: str, checkpoint_topic: str, timeout_ms: int
    ) -> None:
        self._sink = sink
        self.transactional_id = transactional_id
        self.checkpoint_topic = checkpoint_topic
        self._timeout_ms = timeout_ms
        self._producer: AIOKafkaProducer | None = None
        # Transactions are one at a time per producer; the lock also keeps call order,
        # so checkpoint rows of one key land in the order they were decided.
        self._lock = asyncio.Lock()
        self.transactions = 0
        self.aborted = 0
        # Producers left inside a transaction by a cancelled call, to stop.
        self._stale: list[AIOKafkaProducer] = []

    async def start(self) -> None:
        """Start the producer and have its id initialised: from here on, an older
        producer with the same id is fenced and its open transaction aborted."""
        async with self._lock:
            if self._producer is None:
                self._producer = await self._new_producer()

    async def _new_producer(self) -> AIOKafkaProducer:
        options = dict(self._sink._options)
        options.update(
            enable_idempotence=True,
            acks="all",
            transactional_id=self.transactional_id,
            transaction_timeout_ms=self._timeout_ms,
        )
        producer = AIOKafkaProducer(**options)
        try:
            async with asyncio.timeout(self._sink.delivery_timeout):
                await producer.start()
                # An empty transaction: the public way to wait for InitProducerId,
                # which is what fences the previous holder of the id.
                await producer.begin_transaction()
                await producer.commit_transaction()
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await producer.stop()
            if isinstance(exc, _FENCED):
                raise self._fenced(exc) from exc
            if isinstance(exc, (kerrors.KafkaError, OSError, TimeoutError)):
                raise SinkUnavailableError(
                    f"Kafka at {self._sink.where}: cannot start the transactional producer"
                    f" {self.transactional_id!r}: {exc!r}"
                ) from exc
            raise
        return producer

    def _fenced(self, exc: BaseException) -> FencedError:
        self._sink.fenced += 1
        return FencedError(
            f"Kafka transactional id {self.transactional_id!r} was taken by another bridge"
            f" (a newer leader fenced this one): {exc!r}; this replica stops publishing"
        )

    async def publish(
        self,
        events: Sequence[Event],
        checkpoint: Callable[[Collection[int]], list[CheckpointRecord]],
        extra: Sequence[_Record] = (),
    ) -> Mapping[int, str]:
        """``events``, then ``extra`` records (dead letters), and the checkpoint records
        in one transaction; the events the broker refused for good (index → reason;
        an index past the events is an ``extra`` record's) are left out of the one
        that commits, and so are the records ``checkpoint(refused events)`` leaves out."""
        sink = self._sink
        refused: dict[int, str] = {}
        limit = sink._options["max_request_size"]
        estimate = DefaultRecordBatchBuilder.estimate_size_in_bytes
        n_events = len(events)
        # One record per route of each event (sink.routes), all in this one transaction;
        # ``owners[j]``: the index (in the caller's numbering) record j belongs to.
        owners: list[int] = []
        records: list[_Record] = []
        for i, topic, key, value, headers in sink.records(events):
            size = estimate(key, value, headers)
            if size > limit:
                refused[i] = (
                    f"the record is {size} bytes, over the {limit} bytes a request"
                    " may carry (sink.kafka.maxRequestSize)"
                )
            owners.append(i)
            records.append((topic, key, value, headers))
        for k, record in enumerate(extra):
            owners.append(n_events + k)
            records.append(record)
        topic = self.checkpoint_topic
        n_sent = len(records)
        # Records to send alone (a refusal is for a whole record batch, not one record).
        alone: set[int] = set()
        while True:
            refused_events = [i for i in refused if i < n_events]
            rows: list[_Record] = [
                (topic, key, value, []) for key, value in checkpoint(refused_events)
            ]
            # A refused event is left out whole: none of its routes' records commit.
            skip = {j: refused[owner] for j, owner in enumerate(owners) if owner in refused}
            failed = await self._transaction([*records, *rows], skip=skip, alone=alone)
            if not failed:
                return refused
            # Refused records: the transaction was aborted. A record refused alone is
            # refused for good (and so is its event, on every route); one refused
            # with others goes again alone.
            for indices, exc in failed:
                if any(j >= n_sent for j in indices):
                    raise CheckpointError(
                        f"Kafka refused a checkpoint record of topic {topic!r}: {exc!r}"
                    ) from exc
                if len(indices) == 1:
                    owner = owners[indices[0]]
                    refused[owner] = (
                        sink._refusal(events[owner], exc)
                        if owner < n_events
                        else f"topic {records[indices[0]][0]!r} refused the dead letter: {exc!r}"
                    )
                else:
                    alone.update(indices)

    async def write(self, resource_id: str, records: list[CheckpointRecord]) -> None:
        """Checkpoint records alone, in a transaction of their own."""
        if not records:
            return
        topic = self.checkpoint_topic
        try:
            failed = await self._transaction([(topic, k, v, []) for k, v in records])
        except FencedError:
            raise
        except SinkError as exc:
            raise CheckpointError(f"checkpoint of {resource_id}: {exc}") from exc
        if failed:
            raise CheckpointError(
                f"Kafka refused checkpoint records of {resource_id} (topic {topic!r}):"
                f" {failed[0][1]!r}"
            )

    async def _transaction(
        self,
        records: list[_Record],
        *,
        skip: Mapping[int, str] | None = None,
        alone: set[int] | None = None,
    ) -> list[tuple[list[int], kerrors.KafkaError]]:
        """Send ``records`` (but those in ``skip``) in one transaction and commit it.
        Returns the record batches the broker refused (then the transaction was
        aborted); raises SinkUnavailableError when it cannot tell or reach Kafka
        (aborted too, as far as it can be)."""
        sink = self._sink
        async with self._lock:
            producer = self._producer
            if producer is None:
                # Dropped after a failure: started again, which fences only itself.
                await self._stop_stale()
                producer = self._producer = await self._new_producer()
            submitted: list[tuple[list[int], asyncio.Future[Any]]] = []
            failed: list[tuple[list[int], kerrors.KafkaError]] = []
            try:
                async with asyncio.timeout(sink.delivery_timeout):
                    await producer.begin_transaction()
                    submitted = await self._send(producer, records, skip or {}, alone or set())
                    for indices, fut in submitted:
                        try:
                            await fut
                        except kerrors.KafkaError as exc:
                            failed.append((indices, exc))
                if not failed or any(isinstance(e, _FENCED) for _, e in failed):
                    if failed:
                        raise next(e for _, e in failed if isinstance(e, _FENCED))
                    # Not under the delivery timeout: once EndTxn(commit) may have been
                    # sent, the outcome is unknown until the coordinator answers, and
                    # giving up here would publish the batch again in a new transaction.
                    await producer.commit_transaction()
                    self.transactions += 1
                    return []
            except _FENCED as exc:
                await self._drop(producer)
                raise self._fenced(exc) from exc
            except (kerrors.KafkaError, OSError, TimeoutError) as exc:
                await self._abort(producer)
                raise SinkUnavailableError(
                    f"Kafka at {sink.where}: transaction of {self.transactional_id!r}"
                    f" aborted: {exc!r}"
                ) from exc
            except BaseException:
                # Cancelled inside the transaction: this producer is left in it. The
                # next call starts a new one, which aborts it (so does the broker
                # after transaction.timeout.ms if no call comes).
                self._producer = None
                self._stale.append(producer)
                raise
            finally:
                for _, fut in submitted:
                    if fut.done() and not fut.cancelled():
                        fut.exception()
            retry = [e for _, e in failed if not isinstance(e, _REFUSALS)]
            await self._abort(producer)
            if len(retry) < len(failed):
                # The producer numbered the refused batches, which the broker did not
                # take: its sequence numbers for their partitions are out of step, and
                # every later batch there fails as out of order (in this transaction
                # and the next). A new producer (a new epoch) numbers afresh, and those
                # batches go again with it.
                await self._drop(producer)
                retry = [e for e in retry if not isinstance(e, OUT_OF_STEP)]
                failed = [(i, e) for i, e in failed if isinstance(e, _REFUSALS)]
            if retry:
                raise SinkUnavailableError(
                    f"Kafka at {sink.where}: transaction of {self.transactional_id!r}"
                    f" aborted: {retry[0]!r}"
                ) from retry[0]
            return failed

    async def _send(
        self,
        producer: AIOKafkaProducer,
        records: list[_Record],
        skip: Mapping[int, str],
        alone: set[int],
    ) -> list[tuple[list[int], asyncio.Future[Any]]]:
        """One record batch per partition (``alone`` records each in their own),
        handed over whole, as the plain sink does."""
        sink = self._sink
        submitted: list[tuple[list[int], asyncio.Future[Any]]] = []
        open_batches: dict[tuple[str, int], tuple[Any, list[int]]] = {}
        partitions: dict[str, tuple[list[int], list[int]]] = {}
        cluster = producer.client.cluster
        try:
            for i, (topic, key, value, headers) in enumerate(records):
                if i in skip:
                    continue
                known = partitions.get(topic)
                if known is None:
                    known = partitions[topic] = (
                        sorted(await sink._partitions(producer, topic)),
                        sorted(cluster.available_partitions_for_topic(topic)),
                    )
                partition = sink._partitioner(key, *known)
                if i in alone:
                    builder = producer.create_batch()
                    builder.append(timestamp=None, key=key, value=value, headers=headers)
                    fut = await producer.send_batch(builder, topic, partition=partition)
                    submitted.append(([i], fut))
                    continue
                slot = open_batches.get((topic, partition))
                if slot is not None:
                    builder, indices = slot
                    if builder.append(timestamp=None, key=key, value=value, headers=headers):
                        indices.append(i)
                        continue
                    fut = await producer.send_batch(builder, topic, partition=partition)
                    submitted.append((indices, fut))
                builder = producer.create_batch()
                builder.append(timestamp=None, key=key, value=value, headers=headers)
                open_batches[(topic, partition)] = (builder, [i])
            for (topic, partition), (builder, indices) in list(open_batches.items()):
                del open_batches[(topic, partition)]
                fut = await producer.send_batch(builder, topic, partition=partition)
                submitted.append((indices, fut))
        finally:
            for builder, _ in open_batches.values():
                builder.close()
        return submitted

    async def _abort(self, producer: AIOKafkaProducer) -> None:
        """Abort the open transaction; a producer that cannot is replaced (starting
        the new one aborts it for us)."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self._sink.delivery_timeout):
                await producer.abort_transaction()
                self.aborted += 1
                return
        await self._drop(producer)

    async def _drop(self, producer: AIOKafkaProducer) -> None:
        if self._producer is producer:
            self._producer = None
        with contextlib.suppress(Exception):
            async with asyncio.timeout(10):
                await producer.stop()

    async def _stop_stale(self) -> None:
        stale, self._stale = self._stale, []
        for producer in stale:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    await producer.stop()

    async def close(self) -> None:
        async with self._lock:
            producer, self._producer = self._producer, None
            await self._stop_stale()
        if producer is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    await producer.stop()


class KafkaTransactions:
    """The transactional channels of one bridge, one per resource id.

    Also the Kafka checkpoint store's writer (``RecordWriter``): the commits behind
    the bus go through the same producer as the batches, so the rows of one key
    land in the order they were decided.
    """

    def __init__(
        self, sink: KafkaSink, *, prefix: str, checkpoint_topic: str, timeout_ms: int = 60_000
    ) -> None:
        self._sink = sink
        self.prefix = prefix
        self.checkpoint_topic = checkpoint_topic
        self.timeout_ms = timeout_ms
        self._channels: dict[str, TransactionalChannel] = {}

    def channel(self, resource_id: str) -> TransactionalChannel:
        channel = self._channels.get(resource_id)
        if channel is None:
            channel = self._channels[resource_id] = TransactionalChannel(
                self._sink,
                transactional_id(self.prefix, resource_id),
                self.checkpoint_topic,
                self.timeout_ms,
            )
        return channel

    async def start(self, resource_ids: Sequence[str]) -> None:
        """Start (and so fence any older holder of) every resource's producer."""
        await asyncio.gather(*(self.channel(r).start() for r in resource_ids))

    async def write(self, resource_id: str, records: list[CheckpointRecord]) -> None:
        await self.channel(resource_id).write(resource_id, records)

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)
