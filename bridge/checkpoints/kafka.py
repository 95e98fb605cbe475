"""Checkpoints in a compacted Kafka topic of the sink's cluster (as Kafka Connect
keeps its source offsets): a Kafka-only deployment needs no disk and no second bus.

Records (keys and values are bytes; resource ids and object keys hold no NUL):

    d\\0<resource id>\\0<object key>   one per object digest: for a certain digest with
                                     no earlier incarnation whose values pack (nearly
                                     all), the 41 bytes of the cache's packed state
                                     (bridge/ground/records.py: a zero flags byte, uid,
                                     fingerprint, resourceVersion); for any other, JSON
                                     [uid, resourceVersion, fingerprint, state, prior];
                                     a delete is the same key with no value (a tombstone)
    w\\0<resource id>                 the watermark: the resourceVersion as a JSON string

Compaction keeps the last record of each key, so the topic stays about as large
as the checkpoint itself; a read from the beginning to the end, last record per
key winning and tombstones removing, gives exactly what was committed.

One partition, written in call order (``PARTITION``): a commit's records are
deletes, upserts, then the watermark, and in one partition's log they land in
that order, so a watermark is never stored ahead of its digests (a crash inside
a commit leaves digests ahead of the watermark, which replays as recognisable
redeliveries, as the NATS KV store explains), and a write-ahead row written
after a commit step lands after it. Several partitions would need the writer to
wait for the digests' acks before sending each watermark (a second round trip
per commit) and buy nothing: the read at start is bound by decoding on one
core, not by the broker.

Loading reads the topic once, in ``open``, up to its last stable offset with
``read_committed`` (transactional writers' aborted or open records are not
the checkpoint), and holds each resource's rows (key and value bytes, nothing
decoded) until ``load``/``load_bulk`` takes them; taken rows are freed. A
resource committed to since that read is read again when it is loaded.

Writes go through a ``RecordWriter``: by default the store's own idempotent
producer (acks=all); the exactly-once sink hands in its transactional one, so
events and the checkpoint records that cover them commit together.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any, Protocol

import aiokafka.errors as kerrors
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.record.control_record import ABORT_MARKER, ControlRecord
from aiokafka.record.memory_records import MemoryRecords

from bridge.checkpoints.base import BulkCheckpoint, Checkpoint
from bridge.errors import CheckpointError, ConfigError
from bridge.ground.digest import Digest
from bridge.ground.records import PACKED_WIDTH, PackedColumns, pack_state, unpack_state

if TYPE_CHECKING:
    pass

# The checkpoint topic's one partition (see the module's docstring).
PARTITION = 0

_DIGEST = b"d\x00"
_WATERMARK = b"w\x00"

Record = tuple[bytes, bytes | None]


# --- the record format (the seam with transactional writers) ---------------------


def digest_key(resource_id: str, key: str) -> bytes:
    return b"%s%s\x00%s" % (_DIGEST, resource_id.encode(), key.encode())


def watermark_key(resource_id: str) -> bytes:
    return _WATERMARK + resource_id.encode()


def digest_value(d: Digest) -> bytes:
    """The record value of a digest. Packed when it can be: a restart then hands the
    value to the cache as it is, with nothing decoded (``load_bulk``)."""
    if not d.state and not d.prior:
        packed = pack_state(d.uid, d.resource_version, d.fingerprint)
        if packed is not None:
            return packed
    return orjson.dumps([d.uid, d.resource_version, d.fingerprint, d.state, d.prior])


def digest_of(key: str, value: bytes) -> Digest:
    """The digest a record value holds (``digest_value`` read back)."""
    if value[:1] == b"[":
        return Digest(key, *orjson.loads(value))
    if len(value) == PACKED_WIDTH and value[0] == 0:
        uid, resource_version, fingerprint, _ = unpack_state(value)
        return Digest(key, uid, resource_version, fingerprint)
    raise CheckpointError(f"checkpoint record of {key!r}: not a digest ({value[:16]!r})")


def commit_records(
    resource_id: str,
    resource_version: str | None,
    upserts: Iterable[Digest],
    deletes: Iterable[str],
) -> list[Record]:
    """The records of one ``CheckpointStore.commit``, in the order they must land:
    deletes, then upserts (a key in both ends upserted), then the watermark (if any)."""
    rid = resource_id.encode()
    prefix = _DIGEST + rid + b"\x00"
    ups: dict[bytes, bytes] = {prefix + d.key.encode(): digest_value(d) for d in upserts}
    records: list[Record] = []
    for key in deletes:
        k = prefix + key.encode()
        if k not in ups:
            records.append((k, None))
    records.extend(ups.items())
    if resource_version is not None:
        records.append((_WATERMARK + rid, orjson.dumps(resource_version)))
    return records


class RecordWriter(Protocol):
    """Stores records in the checkpoint topic (partition ``PARTITION``), durably
    (acks=all) and in order, before returning; raises ``CheckpointError`` when
    Kafka cannot take them (the pipeline retries). Called one call at a time, in
    the order of the store's commits."""

    async def write(self, resource_id: str, records: list[Record]) -> None: ...


# --- connection ------------------------------------------------------------------


# Errors that mean "Kafka cannot be reached or cannot take it now".
_UNREACHABLE: tuple[type[BaseException], ...] = (kerrors.KafkaError, TimeoutError, OSError)


class ProducerWriter:
    """The store's own writer: an idempotent producer with acks=all.

    A failed write leaves the producer's sequence numbers for the partition out of
    step with the broker's; the next write starts a fresh producer.
    """

    def __init__(self, topic: str, options: dict[str, Any], timeout: float) -> None:
        self.topic = topic
        self.timeout = timeout
        self._options = options
        self._producer: AIOKafkaProducer | None = None
        self._retiring: set[asyncio.Task[None]] = set()

    @property
    def where(self) -> str:
        return f"checkpoint topic {self.topic!r} at {','.join(self._options['bootstrap_servers'])}"

    async def _ready(self) -> AIOKafkaProducer:
        if self._producer is None:
            producer = AIOKafkaProducer(
                **self._options,
                acks="all",
                enable_idempotence=True,
                linger_ms=0,
                max_batch_size=1_048_576,
                request_timeout_ms=int(self.timeout * 1000),
            )
            try:
                async with asyncio.timeout(self.timeout):
                    await producer.start()
            except BaseException:
                with contextlib.suppress(Exception):
                    await producer.stop()
                raise
            self._producer = producer
        return self._producer

    async def write(self, resource_id: str, records: list[Record]) -> None:
        if not records:
            return
        futures: list[asyncio.Future[Any]] = []
        try:
            async with asyncio.timeout(self.timeout):
                producer = await self._ready()
                builder = producer.create_batch()
                for key, value in records:
                    if builder.append(timestamp=None, key=key, value=value, headers=[]) is None:
                        # Full: this batch goes, and its acks are awaited before the
                        # next is sent, so a commit's watermark (its last record)
                        # never lands ahead of its digests whatever the producer does.
                        futures.append(
                            await producer.send_batch(builder, self.topic, partition=PARTITION)
                        )
                        await futures[-1]
                        builder = producer.create_batch()
                        builder.append(timestamp=None, key=key, value=value, headers=[])
                futures.append(await producer.send_batch(builder, self.topic, partition=PARTITION))
                await futures[-1]
        except _UNREACHABLE as exc:
            for fut in futures:
                if fut.done() and not fut.cancelled():
                    fut.exception()
            await self._discard()
            raise CheckpointError(
                f"{self.where}: commit of {resource_id} not stored: {exc!r}"
            ) from exc

    async def _discard(self) -> None:
        """Stop the producer in the background: its stop waits for the batches it
        still holds, which fail once their delivery timeout (``timeout``) has passed
        when the broker stays away; ``close`` waits for that."""
        producer, self._producer = self._producer, None
        if producer is not None:
            task = asyncio.create_task(self._stop(producer), name="checkpoint-producer-stop")
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _stop(self, producer: AIOKafkaProducer) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2 * self.timeout + 10):  # a broker that never answers
                await producer.stop()

    async def close(self) -> None:
        await self._discard()
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)


# --- the store -------------------------------------------------------------------


class _Rows:
    """One resource's rows as read from the topic: record key → digest value; the
    object key is the record key after ``prefix_length`` bytes."""

    __slots__ = ("digests", "prefix_length", "watermark")

    def __init__(self, prefix_length: int) -> None:
        self.digests: dict[bytes, bytes] = {}
        self.prefix_length = prefix_length
        self.watermark: bytes | None = None


# Records sorted between two yields to the event loop when a restart loads a
# checkpoint that is not all packed.
_CHUNK = 10_000
# Bytes per fetch while reading the topic: large enough that a million records
# take tens of round trips, not thousands.
_FETCH_BYTES = 32 * 1_048_576
_READ_COMMITTED = 1


class KafkaCheckpointStore:
    def __init__(
        self,
        options: dict[str, Any],
        topic: str = "k8s-bridge-checkpoints",
        *,
        replication_factor: int | None = None,
        timeout: float = 30.0,
        writer: RecordWriter | None = None,
    ) -> None:
        self.topic = topic
        self.replication_factor = replication_factor
        self.timeout = timeout
        self._options = options
        self._own_writer = ProducerWriter(topic, options, timeout) if writer is None else None
        self._writer: RecordWriter = writer or self._own_writer  # type: ignore[assignment]
        self._open = False
        self._rows: dict[bytes, _Rows] = {}
        # Resources committed to since the topic was read: their held rows are stale.
        self._stale: set[bytes] = set()
        # Resources whose rows were handed over (and freed): a second load reads again.
        self._taken: set[bytes] = set()
        self._ids: set[str] = set()
        self._watermarks: dict[bytes, bytes | None] = {}
        # One commit at a time, in call order (the lock is first come, first served).
        self._writes = asyncio.Lock()

    @property
    def where(self) -> str:
        return f"checkpoint topic {self.topic!r} at {','.join(self._options['bootstrap_servers'])}"

    async def open(self) -> None:
        if self._open:
            return
        try:
            async with asyncio.timeout(self.timeout):
                await self._ensure_topic()
            self._rows = await self._read(None)
        except _UNREACHABLE as exc:
            raise CheckpointError(f"{self.where}: cannot open: {exc!r}") from exc
        self._ids = {rid.decode() for rid in self._rows}
        # Kept apart from the rows, which ``load`` hands over and frees.
        self._watermarks = {rid: rows.watermark for rid, rows in self._rows.items()}
        self._stale.clear()
        self._taken.clear()
        self._open = True

    async def probe(self) -> str:
        """What ``open`` would find, without what it does (``k8s-bridge check``): the
        topic is described, never created, and its records are not read.

        Returns one line for a topic ``open`` would take, or would create; raises as
        ``open`` does: ``ConfigError`` for a topic it refuses (``_check``, the same
        checks), ``CheckpointError`` when Kafka cannot be reached.
        """
        try:
            async with asyncio.timeout(self.timeout), self._admin() as admin:
                if self.topic not in await admin.list_topics():
                    replicas = await self._replicas(admin)
                    return (
                        f"topic {self.topic!r} does not exist yet: the first start creates it"
                        f" (one partition, cleanup.policy=compact, replication factor {replicas})"
                    )
                await self._check(admin)
        except _UNREACHABLE as exc:
            raise CheckpointError(f"{self.where}: cannot describe the topic: {exc!r}") from exc
        return (
            f"topic {self.topic!r} has one partition and cleanup.policy=compact"
            " (its records not read)"
        )

    @contextlib.asynccontextmanager
    async def _admin(self) -> AsyncIterator[AIOKafkaAdminClient]:
        admin = AIOKafkaAdminClient(**self._options, request_timeout_ms=int(self.timeout * 1000))
        await admin.start()
        try:
            yield admin
        finally:
            await admin.close()

    async def _ensure_topic(self) -> None:
        async with self._admin() as admin:
            # list_topics, not a metadata request naming the topic: a broker with
            # auto.create.topics.enable would create it, uncompacted.
            if self.topic not in await admin.list_topics():
                await self._create(admin)
                await self._led(admin)
            await self._check(admin)

    async def _led(self, admin: AIOKafkaAdminClient) -> None:
        """Until the topic just created has a leader for its partition (within the
        open's timeout). The controller answers the creation before every broker has
        the partition: read at once, it was unknown (UnknownTopicOrPartitionError,
        one open in seven on a one-broker cluster), and described at once it has no
        partitions, which ``_check`` would refuse for good."""
        while True:
            [described] = await admin.describe_topics([self.topic])
            partitions = described.get("partitions") or ()
            if (
                not described.get("error_code")
                and partitions
                and all(not p.get("error_code") and p.get("leader", -1) >= 0 for p in partitions)
            ):
                return
            await asyncio.sleep(0.05)

    async def _replicas(self, admin: AIOKafkaAdminClient) -> int:
        """Replicas of the topic when the store creates it: as configured, else the
        cluster's brokers, one to three."""
        if self.replication_factor is not None:
            return self.replication_factor
        brokers = (await admin.describe_cluster()).get("brokers") or []
        return max(1, min(3, len(brokers)))

    async def _create(self, admin: AIOKafkaAdminClient) -> None:
        replicas = await self._replicas(admin)
        response = await admin.create_topics(
            [NewTopic(self.topic, 1, replicas, topic_configs={"cleanup.policy": "compact"})]
        )
        for error in response.topic_errors:
            code = error[1]
            if code and code != kerrors.TopicAlreadyExistsError.errno:
                message = error[2] if len(error) > 2 else ""
                raise CheckpointError(
                    f"{self.where}: cannot create the topic: {kerrors.for_code(code).__name__}"
                    f"{': ' + message if message else ''} (checkpoint.kafka.replicationFactor"
                    f" {replicas})"
                )

    async def _check(self, admin: AIOKafkaAdminClient) -> None:
        [response] = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, self.topic, {"cleanup.policy": None})]
        )
        policy = ""
        for resource in response.resources:
            if resource[0]:
                raise kerrors.for_code(resource[0])(resource[1])
            for entry in resource[4]:
                if entry[0] == "cleanup.policy":
                    policy = entry[1] or ""
        # A person must act on these two, so they stop the bridge (a ConfigError)
        # instead of being retried as an unreachable store is.
        if policy.replace(" ", "") != "compact":
            raise ConfigError(
                f"config error: checkpoint.kafka.topic {self.topic!r}: the topic has"
                f" cleanup.policy={policy or '?'}; a checkpoint topic must be compact only"
                " (delete would drop the digests of objects that never change): set"
                " cleanup.policy=compact on it or name another topic"
            )
        [described] = await admin.describe_topics([self.topic])
        partitions = len(described.get("partitions") or ())
        if not partitions:
            # No topic has no partitions: this broker's metadata has not caught up
            # with a topic just created (one open in a few on a three-broker cluster,
            # though another broker already named its leader). Retried as an
            # unreachable store is, not refused for good.
            raise CheckpointError(
                f"{self.where}: the topic {self.topic!r} is not known to every broker yet"
            )
        if partitions != 1:
            raise ConfigError(
                f"config error: checkpoint.kafka.topic {self.topic!r}: the topic has"
                f" {partitions} partitions; a checkpoint topic has one (its watermarks must"
                " follow their digests in one log): name another topic"
            )

    async def _read(self, only: bytes | None) -> dict[bytes, _Rows]:
        """The topic up to its last stable offset: each resource's last record per key
        (or only the resource ``only``)."""
        consumer = AIOKafkaConsumer(
            **self._options,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            request_timeout_ms=int(self.timeout * 1000),
        )
        tp = TopicPartition(self.topic, PARTITION)
        fold = _Fold(only)
        try:
            async with asyncio.timeout(self.timeout):
                await consumer.start()
                start = (await consumer.beginning_offsets([tp]))[tp]
                # Under read_committed the end is the last stable offset: records of
                # transactions still open are not the checkpoint (yet).
                end = (await consumer.end_offsets([tp]))[tp]
            position = start
            while position < end:
                async with asyncio.timeout(self.timeout):
                    position = await _fetch_into(consumer, tp, position, fold)
        finally:
            await consumer.stop()
        return fold.rows

    async def _take(self, resource_id: str) -> _Rows | None:
        """The rows of ``resource_id``, handed over once: held since ``open``, or read
        again if committed to since then or taken before."""
        rid = resource_id.encode()
        rows = self._rows.pop(rid, None)
        if rows is None:
            if rid not in self._stale and rid not in self._taken:
                return None  # not in the topic when it was read, and no commit since
            # Fresh before the read: a commit made while it runs makes it stale again.
            self._stale.discard(rid)
            try:
                rows = (await self._read(rid)).get(rid)
            except _UNREACHABLE as exc:
                self._stale.add(rid)
                raise CheckpointError(f"{self.where}: cannot load {resource_id}: {exc!r}") from exc
        self._taken.add(rid)
        if rows is None or (rows.watermark is None and not rows.digests):
            return None
        return rows

    async def load(self, resource_id: str) -> Checkpoint | None:
        self._require_open()
        rows = await self._take(resource_id)
        if rows is None:
            return None
        digests: dict[str, Digest] = {}
        cut = rows.prefix_length
        for k, v in rows.digests.items():
            key = k[cut:].decode()
            digests[key] = digest_of(key, v)
        return Checkpoint(_watermark(rows.watermark), digests)

    async def load_bulk(self, resource_id: str) -> BulkCheckpoint | None:
        self._require_open()
        rows = await self._take(resource_id)
        if rows is None:
            return None
        bulk = BulkCheckpoint(_watermark(rows.watermark))
        digests = rows.digests
        rows.digests = {}
        cut = rows.prefix_length
        packed = _packed_columns(digests, cut)
        if packed is None:
            # After a crash, some records are JSON (written ahead, deleting, an earlier
            # incarnation, or values that do not pack): taken out first, so the rest
            # still goes over in columns.
            odd = [k for k, v in digests.items() if len(v) != PACKED_WIDTH or v[0]]
            for k in odd:
                key = k[cut:].decode()
                d = digest_of(key, digests.pop(k))
                if d.state or d.prior:
                    bulk.others.append(d)
                else:
                    bulk.add_plain(key, d.uid, d.resource_version, d.fingerprint)
            packed = _packed_columns(digests, cut)
        if packed is None:  # keys the columns cannot split: one by one
            packed = PackedColumns()
            for n, (k, v) in enumerate(digests.items()):
                packed.keys.append(k[cut:].decode())
                packed.packed.append(v)
                if n % _CHUNK == _CHUNK - 1:
                    await asyncio.sleep(0)
        digests.clear()  # the fetched records' bytes, freed before the cache is built
        bulk.packed = packed
        return bulk

    async def watermark(self, resource_id: str) -> str | None:
        """The stored watermark of ``resource_id`` (None: none stored), without taking
        its rows: as read at open, or read again if committed to since."""
        self._require_open()
        rid = resource_id.encode()
        if rid in self._stale:
            try:
                rows = (await self._read(rid)).get(rid)
            except _UNREACHABLE as exc:
                raise CheckpointError(f"{self.where}: cannot read {resource_id}: {exc!r}") from exc
            value = None if rows is None else rows.watermark
        else:
            value = self._watermarks.get(rid)
        return None if value is None else _watermark(value)

    async def resource_ids(self) -> list[str]:
        """Every resource id with a checkpoint in the topic (read at open, or committed since)."""
        self._require_open()
        return sorted(self._ids)

    async def commit(
        self,
        resource_id: str,
        resource_version: str | None,
        upserts: Iterable[Digest],
        deletes: Iterable[str],
    ) -> None:
        self._require_open()
        # Encoded before any await and queued on the lock in call order: records land
        # in the order the calls came.
        records = commit_records(resource_id, resource_version, upserts, deletes)
        if not records:
            return
        async with self._writes:
            rid = resource_id.encode()
            # Stale from now on even if the write fails: part of it may have landed.
            self._stale.add(rid)
            self._rows.pop(rid, None)
            self._ids.add(resource_id)
            await self._writer.write(resource_id, records)

    def _require_open(self) -> None:
        if not self._open:
            raise CheckpointError(f"{self.where}: store is not open")

    async def close(self) -> None:
        self._open = False
        self._rows = {}
        if self._own_writer is not None:
            await self._own_writer.close()


class _Fold:
    """Folds fetched records into rows: the last record of a key wins, a tombstone
    removes it. The loop a restart spends its read in: nothing is decoded, and a
    digest record of the resource the previous one belonged to (commits come in
    runs of one resource) costs one prefix check and one dict operation."""

    __slots__ = ("_digests", "_only", "_prefix", "rows")

    def __init__(self, only: bytes | None) -> None:
        self.rows: dict[bytes, _Rows] = {}
        self._only = only
        self._prefix = b"\xff"  # no key starts with it
        self._digests: dict[bytes, bytes] = {}

    def add(self, records: Iterable[Any]) -> None:
        prefix, digests = self._prefix, self._digests
        for r in records:
            key: bytes | None = r.key
            if key is not None and key.startswith(prefix):
                value = r.value
                if value is None:
                    digests.pop(key, None)
                else:
                    digests[key] = value
            elif self._other(key, r.value):
                prefix, digests = self._prefix, self._digests

    def _other(self, key: bytes | None, value: bytes | None) -> bool:
        """A record not of the current resource's digests; True when it became current."""
        if key is None:
            return False  # not ours: a checkpoint topic holds nothing else
        if key.startswith(_WATERMARK):
            rid = key[2:]
            if self._only is None or rid == self._only:
                self._slot(rid).watermark = value
            return False
        if not key.startswith(_DIGEST) or key.find(b"\x00", 2) < 0:
            return False  # not ours: a checkpoint topic holds nothing else
        rid = key[2 : key.index(b"\x00", 2)]
        if self._only is not None and rid != self._only:
            return False
        slot = self._slot(rid)
        self._prefix, self._digests = _DIGEST + rid + b"\x00", slot.digests
        if value is None:
            slot.digests.pop(key, None)
        else:
            slot.digests[key] = value
        return True

    def _slot(self, rid: bytes) -> _Rows:
        slot = self.rows.get(rid)
        if slot is None:
            slot = self.rows[rid] = _Rows(len(rid) + 3)
        return slot


async def _fetch_into(
    consumer: AIOKafkaConsumer, tp: TopicPartition, position: int, fold: _Fold
) -> int:
    """One fetch of ``tp`` from ``position`` under read_committed, folded into ``fold``;
    returns the position after it.

    A private path, measured: the consumer's ``getmany`` builds a ``ConsumerRecord``
    (eleven fields) per record, and a restart of a million digests spent more time
    in that than in anything else. Here the records of aiokafka's C batch parser go
    straight into the fold: the read takes half the CPU, and a whole restart of 1M
    objects (bench restart --stores kafka, read and conversion into the cache) took
    7.3-7.5 s of CPU instead of 10.0-11.3 s (1.45x) and 125 MiB instead of 203 MiB.
    Aborted transactions are skipped as the
    consumer's fetcher skips them (KIP-98): a transactional batch of a producer
    whose abort lies ahead, and every control batch.
    """
    client = consumer._client  # private: see the docstring
    node = client.cluster.leader_for_partition(tp)
    if node is None or node < 0:
        await client.force_metadata_update()
        raise kerrors.LeaderNotAvailableError(f"no leader for {tp}")
    request = FetchRequest(
        100,
        1,
        _FETCH_BYTES,
        _READ_COMMITTED,
        [(tp.topic, [(tp.partition, position, _FETCH_BYTES)])],
    )
    response = await client.send(node, request)
    for _topic, partitions in response.topics:
        for _partition, code, _highwater, *data in partitions:
            if code:
                error = kerrors.for_code(code)
                if error in (
                    kerrors.NotLeaderForPartitionError,
                    kerrors.UnknownTopicOrPartitionError,
                ):
                    await client.force_metadata_update()
                raise error(f"fetch of {tp} at {position}")
            # v4-v10: [lso, (log start,) aborted, records]; v11+: [lso, log start,
            # aborted, preferred read replica, records].
            # (producer id, first offset) pairs, taken in log order: by first offset.
            # Sorted as tuples they come by producer id, and with several producers
            # sharing the partition one's abort was applied at another's place.
            aborted = sorted(
                data[2] if response.API_VERSION >= 11 else data[-2] or (),
                key=_first_offset,
            )
            records = MemoryRecords(data[-1])
            aborting: set[int] = set()
            while records.has_next():
                batch = records.next_batch()
                if batch is None:
                    break  # a partial batch at the end of the response: fetched next time
                if batch.producer_id is not None and batch.producer_id >= 0:
                    while aborted and aborted[0][1] <= batch.base_offset:
                        aborting.add(aborted.pop(0)[0])
                if batch.is_control_batch:
                    if any(ControlRecord.parse(r.key) == ABORT_MARKER for r in batch):
                        aborting.discard(batch.producer_id)
                elif not (batch.is_transactional and batch.producer_id in aborting):
                    fold.add(batch)
                position = batch.next_offset
    return position


def _first_offset(aborted: tuple[int, int]) -> int:
    return aborted[1]


def _watermark(value: bytes | None) -> str:
    if not value:
        return ""
    decoded = orjson.loads(value)
    return decoded if isinstance(decoded, str) else ""


def _packed_columns(digests: dict[bytes, bytes], cut: int) -> PackedColumns | None:
    """The object keys and values of ``digests`` as two columns when every value is a
    packed state (the common case), else None.

    Checked and decoded over whole columns in C: the keys joined and decoded once
    and split at their shared prefix (it holds a NUL, which no object key does: a
    count that does not match says otherwise), the values' lengths mapped and
    their flags bytes sliced out of one join. None when some are not packed.
    """
    n = len(digests)
    if not n:
        return PackedColumns()
    if set(map(len, digests.values())) != {PACKED_WIDTH}:
        return None
    joined = b"".join(digests.values())
    if joined[::PACKED_WIDTH] != bytes(n):
        return None  # a flags byte other than zero: not a certain digest
    prefix = next(iter(digests))[:cut]
    try:
        keys = b"".join(digests).decode().split(prefix.decode())
    except UnicodeDecodeError:
        return None
    if len(keys) != n + 1 or keys[0]:
        return None
    del keys[0]
    # The values sliced anew rather than the fetched ones: those lie among the
    # records' keys, and once both are freed their memory goes back whole
    # (BENCHMARKS.md, "Restart from a Kafka checkpoint").
    values = [joined[i : i + PACKED_WIDTH] for i in range(0, len(joined), PACKED_WIDTH)]
    return PackedColumns(keys, values)
