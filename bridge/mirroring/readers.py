"""What feeds a ``Mirror`` (bridge/mirroring/mirror.py): one reader per bus and bootstrap.

A reader bootstraps (applies the state up to the moment it started), calls
``mirror.mark_synced()``, then follows the change stream until cancelled. The
mirror keeps no offsets of its own: a restarted mirror bootstraps again, as a
restarted informer lists again.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import orjson

from bridge.errors import SinkError
from bridge.ground.envelope import ReceivedEvent
from bridge.logging import get_logger

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from bridge.mirroring.mirror import Mirror

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
    headers ``ce_*`` of the event it stands for) as that event. A tombstone (null
    value: the object was deleted or left the filter) is its ``deleted`` /
    ``filtered`` event, named by its headers; without them it is not ours: None."""
    headers = {k: v.decode() for k, v in (record.headers or ())}
    if record.value is None:
        if "ce_type" not in headers or "ce_id" not in headers or record.key is None:
            return None
        *_, namespace, name = record.key.decode().split("/")
        parts = headers["ce_id"].split(":")
        return ReceivedEvent(
            id=headers["ce_id"],
            type=headers["ce_type"],
            source=headers.get("ce_source", ""),
            subject=headers.get("ce_subject", ""),
            time="",
            resource_version=parts[2] if len(parts) > 2 else "",
            initial=False,
            data={"object": {"metadata": {"name": name, "namespace": namespace}}},
            raw=b"",
        )
    obj = orjson.loads(record.value)
    if not isinstance(obj, dict):
        raise ValueError("a state-table value that is not an object")
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


async def _subscribed(
    options: dict[str, Any], pattern: str, wait: float
) -> tuple[AIOKafkaConsumer, list[TopicPartition]]:
    """A consumer without a group on every partition of the topics ``pattern`` matches
    (the partitions of topics made later are added as they appear, from their start)."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        metadata_max_age_ms=2000,  # new topics of a templated name are found within seconds
        **options,
    )
    await consumer.start()
    consumer.subscribe(pattern=pattern)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while not consumer.assignment() and loop.time() < deadline:
        await asyncio.sleep(0.05)
    return consumer, sorted(consumer.assignment())


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
                if event is None:
                    mirror.stats.skipped += 1
                else:
                    mirror.apply(event)
        if mirror.handlers_pending:
            await mirror.drain_handlers()
        todo = {tp for tp in todo if await consumer.position(tp) < ends[tp]}


async def kafka_reader(mirror: Mirror, state_table_topic: str | None) -> None:

    k = mirror.settings.sink.kafka
    options = k.connection_options("k8s-bridge-mirror")
    if "{" in k.topic:  # one topic per resource (their heartbeat topics start alike)
        pattern = "^" + re.escape(k.topic.split("{", 1)[0]) + ".*"
    else:
        heartbeats = k.heartbeat_topic or f"{k.topic}.heartbeats"
        pattern = f"^({re.escape(k.topic)}|{re.escape(heartbeats)})$"
    starts: dict[TopicPartition, int] = {}
    since: int | None = None
    if state_table_topic is not None:
        table, parts = await _subscribed(options, f"^{re.escape(state_table_topic)}$", 5.0)
        try:
            if parts:
                await _read_to(mirror, table, parts, await table.end_offsets(parts), True)
                newest = max([r.timestamp for r in await _last_records(table, parts)] or [0])
                # The change topic from a little before the table's newest record: the
                # overlap is applied idempotently, a gap would lose changes.
                since = max(0, newest - int(mirror.state_table_margin * 1000))
        finally:
            await table.stop()
    consumer, parts = await _subscribed(options, pattern, 5.0)
    try:
        if since is not None and parts:
            found = await consumer.offsets_for_times(dict.fromkeys(parts, since))
            ends = await consumer.end_offsets(parts)
            for tp in parts:
                hit = found.get(tp)
                starts[tp] = hit.offset if hit is not None else ends[tp]
                consumer.seek(tp, starts[tp])
        if parts:
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
    """An ephemeral pull consumer without acks, fetched in batches (twice the rate of
    nats-py's ordered push consumer here); re-made from the next stream sequence when
    the server forgets it (a restart, ``inactive_threshold``), as an ordered consumer
    would be."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    from bridge.ground.envelope import nats_token
    from bridge.ground.nats import close_quietly, connect

    n = mirror.settings.sink.nats
    subject = f"k8s.{nats_token(mirror.settings.cluster.name)}.>"
    nc = await connect(
        n.servers,
        credentials=n.credentials,
        nkey_seed=n.nkey_seed,
        tls=mirror.settings.sink.nats.tls_context(),
        name="k8s-bridge-mirror",
    )
    sub: Any = None
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
        # LAST_PER_SUBJECT gives the newest message of every subject (each object's
        # latest event, each resource's latest heartbeat), then every new one.
        policy = (
            DeliverPolicy.LAST_PER_SUBJECT
            if mirror.bootstrap == "last-per-subject"
            else DeliverPolicy.ALL
        )
        next_seq: int | None = None

        async def subscribe() -> Any:
            config = ConsumerConfig(
                ack_policy=AckPolicy.NONE,
                inactive_threshold=60.0,
                filter_subject=subject,
                deliver_policy=policy if next_seq is None else DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=next_seq,
            )
            return await js.pull_subscribe(subject, durable=None, stream=n.stream, config=config)

        sub = await subscribe()
        while True:
            try:
                msgs = await sub.fetch(1000, timeout=1.0)
            except TimeoutError:  # nats-py raises its own and, from fetch, asyncio's
                continue
            except (nats.js.errors.NotFoundError, nats.js.errors.ServiceUnavailableError):
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
                await asyncio.sleep(0.5)
                sub = await subscribe()
                continue
            for msg in msgs:
                mirror.apply_raw(msg.data)
            if msgs:
                # Parsed from the reply subject at each access: once per batch, not per message.
                meta = msgs[-1].metadata
                next_seq = meta.sequence.stream + 1
                if not mirror.has_synced and meta.num_pending == 0:
                    mirror.mark_synced()
            if mirror.handlers_pending:
                await mirror.drain_handlers()
    finally:
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        await close_quietly(nc)
