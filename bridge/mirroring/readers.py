"""What feeds a ``Mirror`` (bridge/mirror.py): one reader per bus and bootstrap.

A reader bootstraps (applies the state up to the moment it started), calls
``mirror.mark_synced()``, then follows the change stream until cancelled. The
mirror keeps no offsets of its own: a restarted mirror bootstraps again, as a
restarted informer lists again.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import orjson

from bridge.consumer import ReceivedEvent
from bridge.errors import SinkError
from bridge.logging import get_logger

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from bridge.mirror import Mirror

log = get_logger(__name__)


def reader_for(mirror: Mirror) -> Coroutine[Any, Any, None]:
    kind = mirror.settings.sink.kind
    if kind == "kafka":
        if mirror.bootstrap == "state-table":
            if not mirror.state_table_topic:
                raise SinkError("Mirror(bootstrap='state-table') needs state_table_topic")
            return kafka_reader(mirror, mirror.state_table_topic)
        if mirror.bootstrap != "stream":
            raise SinkError(f"Mirror on Kafka: bootstrap {mirror.bootstrap!r} is not available")
        return kafka_reader(mirror, None)
    if kind == "nats":
        if mirror.bootstrap not in ("last-per-subject", "stream"):
            raise SinkError(f"Mirror on NATS: bootstrap {mirror.bootstrap!r} is not available")
        return nats_reader(mirror)
    raise SinkError(f"a Mirror cannot read sink.kind {kind!r}")


# -- Kafka ---------------------------------------------------------------------------


def state_table_event(record: Any) -> ReceivedEvent | None:
    """A state-table record (key ``apiVersion/kind/namespace/name``, value the object,
    headers ``ce_*``) as the event it re-states; None for a tombstone."""
    if record.value is None:
        return None
    obj = orjson.loads(record.value)
    if not isinstance(obj, dict):
        raise ValueError("a state-table value that is not an object")
    headers = {k: v.decode() for k, v in (record.headers or ())}
    md = obj.get("metadata") or {}
    return ReceivedEvent(
        id=headers.get("ce_id", f"{md.get('uid', '')}:{md.get('resourceVersion', '')}"),
        type=headers["ce_type"],
        source=headers.get("ce_source", ""),
        subject=headers.get("ce_subject", ""),
        time="",
        resource_version=str(md.get("resourceVersion", "")),
        initial=False,
        data={"object": obj},
        raw=record.value,
    )


async def _partitions(consumer: AIOKafkaConsumer, wanted: re.Pattern[str]) -> list[TopicPartition]:
    from aiokafka import TopicPartition

    out = []
    for topic in sorted(await consumer.topics()):
        if wanted.fullmatch(topic):
            out += [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
    return out


async def _read_to(
    mirror: Mirror,
    consumer: AIOKafkaConsumer,
    parts: list[TopicPartition],
    ends: dict[TopicPartition, int],
    state_table: bool = False,
) -> None:
    """Apply ``parts`` up to ``ends``."""
    todo = {tp for tp in parts if await consumer.position(tp) < ends[tp]}
    while todo:
        batch = await consumer.getmany(*todo, timeout_ms=500, max_records=5000)
        for records in batch.values():
            for r in records:
                if not state_table:
                    mirror.apply_raw(r.value)
                    continue
                try:
                    event = state_table_event(r)
                except (ValueError, KeyError) as e:
                    mirror.stats.skipped += 1
                    log.warning("mirror: skipping a state-table record", error=repr(e))
                    continue
                if event is not None:
                    mirror.apply(event)
        if mirror.handlers_pending:
            await mirror.drain_handlers()
        todo = {tp for tp in todo if await consumer.position(tp) < ends[tp]}


async def kafka_reader(mirror: Mirror, state_table_topic: str | None) -> None:
    from aiokafka import AIOKafkaConsumer

    from bridge.sinks.kafka import connection_options

    k = mirror.settings.sink.kafka
    consumer = AIOKafkaConsumer(
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        **connection_options(k, "k8s-bridge-mirror"),
    )
    await consumer.start()
    try:
        if "{" in k.topic:  # one topic per resource (their heartbeat topics start alike)
            wanted = re.compile(re.escape(k.topic.split("{", 1)[0]) + ".*")
        else:
            heartbeats = k.heartbeat_topic or f"{k.topic}.heartbeats"
            wanted = re.compile(f"{re.escape(k.topic)}|{re.escape(heartbeats)}")
        starts: dict[TopicPartition, int] | None = None
        if state_table_topic is not None:
            table = await _partitions(consumer, re.compile(re.escape(state_table_topic)))
            if table:
                consumer.assign(table)
                await consumer.seek_to_beginning(*table)
                await _read_to(mirror, consumer, table, await consumer.end_offsets(table), True)
                # The change topic from a little before the table's newest record: the
                # overlap is applied idempotently, a gap would lose changes.
                newest = max([r.timestamp for r in (await _last_records(consumer, table))] or [0])
                since = newest - int(mirror.state_table_margin * 1000)
                starts = {}
                changes = await _partitions(consumer, wanted)
                found = await consumer.offsets_for_times(dict.fromkeys(changes, max(0, since)))
                ends = await consumer.end_offsets(changes)
                for tp in changes:
                    hit = found.get(tp)
                    starts[tp] = hit.offset if hit is not None else ends[tp]
        parts = await _partitions(consumer, wanted)
        while not parts:  # nothing published yet: an empty world is synced
            mirror.mark_synced()
            await asyncio.sleep(1.0)
            parts = await _partitions(consumer, wanted)
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        for tp, offset in (starts or {}).items():
            if tp in parts:
                consumer.seek(tp, offset)
        await _read_to(mirror, consumer, parts, await consumer.end_offsets(parts))
        mirror.mark_synced()
        while True:
            batch = await consumer.getmany(timeout_ms=1000, max_records=5000)
            for records in batch.values():
                for r in records:
                    mirror.apply_raw(r.value)
            if mirror.handlers_pending:
                await mirror.drain_handlers()
    finally:
        await consumer.stop()


async def _last_records(consumer: AIOKafkaConsumer, parts: list[TopicPartition]) -> list[Any]:
    """The newest record of each partition (its timestamp dates the state table)."""
    ends = await consumer.end_offsets(parts)
    out = []
    for tp in parts:
        if ends[tp] == 0:
            continue
        consumer.seek(tp, ends[tp] - 1)
        batch = await consumer.getmany(tp, timeout_ms=2000, max_records=1)
        out += batch.get(tp, [])
    return out


# -- NATS JetStream ------------------------------------------------------------------


async def nats_reader(mirror: Mirror) -> None:
    import nats
    from nats.js.api import DeliverPolicy

    from bridge.consumer import nats_tls
    from bridge.delivery.events import nats_token
    from bridge.sinks.nats import close_quietly, connect

    n = mirror.settings.sink.nats
    nc = await connect(
        n.servers,
        credentials=n.credentials,
        nkey_seed=n.nkey_seed,
        tls=nats_tls(mirror.settings),
        name="k8s-bridge-mirror",
    )
    try:
        js = nc.jetstream()
        while True:
            try:
                info = await js.stream_info(n.stream)
                break
            except nats.js.errors.NotFoundError:
                mirror.mark_synced()  # no stream yet: an empty world
                await asyncio.sleep(1.0)
        if info.state.messages == 0:
            mirror.mark_synced()
        policy = (
            DeliverPolicy.LAST_PER_SUBJECT
            if mirror.bootstrap == "last-per-subject"
            else DeliverPolicy.ALL
        )
        # LAST_PER_SUBJECT gives the newest message of every subject (each object's
        # latest event, each resource's latest heartbeat), then every new one.
        sub = await js.subscribe(
            f"k8s.{nats_token(mirror.settings.cluster.name)}.>",
            stream=n.stream,
            ordered_consumer=True,
            deliver_policy=policy,
        )
        async for msg in sub.messages:
            mirror.apply_raw(msg.data)
            if mirror.handlers_pending:
                await mirror.drain_handlers()
            if not mirror.has_synced and msg.metadata.num_pending == 0:
                mirror.mark_synced()
    finally:
        await close_quietly(nc)
