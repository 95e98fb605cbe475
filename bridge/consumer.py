"""Reading the stream back: a typed consumer that drops redeliveries (``k8s-bridge tail`` prints it).

Downstream services can use ``consume()`` as it is: it yields each event once
in bus order, which is resourceVersion order per object.

- Without ``group``: from now (or the start of the retained stream), no state;
  redeliveries are dropped by id, in memory (``Deduplicator``).
- With ``group``: resumable and shared (bridge/consuming/): a Kafka consumer
  group or a JetStream durable, acknowledged only after the handler returned,
  and redeliveries recognised by the group's durable positions (uid → last
  handled resourceVersion, bridge/consuming/positions.py). docs/consuming.md
  says which crash windows deliver again and how each is recognised.

Messages that are not ours (not a CloudEvent, not JSON, a null value) are
counted in ``ConsumerStats.skipped`` and skipped with one log line: another
producer on the topic must not stop the consumer.
"""

from __future__ import annotations

import contextlib
import re
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bridge.errors import SinkError, SinkUnavailableError
from bridge.ground.envelope import HEARTBEAT_TYPE, ReceivedEvent, nats_token
from bridge.logging import get_logger
from bridge.service.settings import Settings

if TYPE_CHECKING:
    from bridge.consuming.positions import PositionStore
    from bridge.consuming.source import GroupSource

log = get_logger(__name__)


@dataclass(slots=True)
class ConsumerStats:
    """What a ``consume()`` did with what it read."""

    delivered: int = 0  # handed to the caller
    redeliveries: int = 0  # recognised (by id, or by position with a group) and dropped
    skipped: int = 0  # not ours: not a CloudEvent, not JSON, a null value
    heartbeats: int = 0
    other_resources: int = 0  # not the ``resource`` asked for
    skipped_reasons: dict[str, int] = field(default_factory=dict)


class Deduplicator:
    """Remembers the last ``capacity`` event ids; ``seen(id)`` is True for a redelivery."""

    def __init__(self, capacity: int = 100_000) -> None:
        if capacity < 1:
            raise ValueError(f"Deduplicator capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def seen(self, event_id: str) -> bool:
        if event_id in self._ids:
            self._ids.move_to_end(event_id)
            return True
        self._ids[event_id] = None
        if len(self._ids) > self.capacity:
            self._ids.popitem(last=False)
        return False

    def __len__(self) -> int:
        return len(self._ids)


def _matches(event: ReceivedEvent, resource: str | None) -> bool:
    """``resource`` is ``Kind`` or ``apiVersion/Kind`` (the ``--resource`` of the CLI)."""
    if not resource:
        return True
    api_version, _, kind = resource.rpartition("/")
    if event.kind.lower() != kind.lower():
        return False
    if not api_version:
        return True
    group, _, version = api_version.rpartition("/")
    # type is io.k8s.{group or core}.{version}.{Kind}.{change}; groups contain dots.
    return event.type.startswith(f"io.k8s.{group or 'core'}.{version}.")


async def _nats_messages(settings: Settings, from_start: bool) -> AsyncGenerator[bytes, None]:
    import nats
    from nats.js.api import DeliverPolicy

    from bridge.ground.nats import close_quietly, connect

    n = settings.sink.nats
    where = ",".join(n.servers)
    nc = await connect(
        n.servers,
        credentials=n.credentials,
        nkey_seed=n.nkey_seed,
        tls=settings.sink.nats.tls_context(),
        name="k8s-bridge-tail",
    )
    try:
        js = nc.jetstream()
        try:
            sub = await js.subscribe(
                f"k8s.{nats_token(settings.cluster.name)}.>",
                stream=n.stream,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.ALL if from_start else DeliverPolicy.NEW,
            )
        except nats.js.errors.NotFoundError as e:
            raise SinkError(
                f"NATS stream {n.stream!r} not found at {where} (nothing published yet?)"
            ) from e
        except (nats.errors.Error, OSError, TimeoutError) as e:
            raise SinkUnavailableError(f"NATS at {where}: cannot read {n.stream!r}: {e!r}") from e
        async for msg in sub.messages:
            yield msg.data
    finally:
        await close_quietly(nc)


async def _kafka_messages(settings: Settings, from_start: bool) -> AsyncGenerator[bytes, None]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.errors import KafkaError

    k = settings.sink.kafka
    where = ",".join(k.bootstrap_servers)
    topics: tuple[str, ...] = ()
    pattern = ""
    if "{" in k.topic:
        # A templated topic (one per resource): everything that starts like it.
        pattern = "^" + re.escape(k.topic.split("{", 1)[0]) + ".*"
    else:
        topics = (k.topic,)
    consumer = AIOKafkaConsumer(
        *topics,
        auto_offset_reset="earliest" if from_start else "latest",
        enable_auto_commit=False,
        # Events of an aborted transaction (sink.kafka.exactlyOnce: a bridge killed
        # inside one) were never published; the same as read_uncommitted otherwise.
        isolation_level="read_committed",
        **k.connection_options("k8s-bridge-tail"),
    )
    try:
        await consumer.start()
    except KafkaError as e:
        await consumer.stop()
        raise SinkUnavailableError(f"cannot reach Kafka at {where}: {e!r}") from e
    try:
        if pattern:
            consumer.subscribe(pattern=pattern)
        try:
            async for record in consumer:
                if record.value is not None:
                    yield record.value
        except KafkaError as e:
            raise SinkUnavailableError(f"Kafka at {where}: {e!r}") from e
    finally:
        await consumer.stop()


def _group_source(
    settings: Settings,
    group: str,
    positions: PositionStore | None,
    from_start: bool,
    commit_interval: float,
    options: Mapping[str, Any],
) -> GroupSource:
    kind = settings.sink.kind
    if kind == "kafka":
        from bridge.consuming.kafka_group import KafkaGroupSource
        from bridge.consuming.kafka_positions import KafkaTopicPositions

        k = settings.sink.kafka
        if positions is None:
            positions = KafkaTopicPositions(
                k.connection_options(f"k8s-bridge-positions-{group}"), f"{group}.positions"
            )
        return KafkaGroupSource(
            k,
            group,
            positions,
            from_start=from_start,
            commit_interval=commit_interval,
            consumer_options=options,
        )
    if kind == "nats":
        from bridge.consuming.nats_durable import NatsDurableSource

        return NatsDurableSource(
            settings,
            group,
            positions,
            from_start=from_start,
            commit_interval=commit_interval,
            **options,
        )
    raise SinkUnavailableError(f"cannot read events back from sink.kind {kind!r}")


def _skip(stats: ConsumerStats, reason: str, error: str) -> None:
    stats.skipped += 1
    stats.skipped_reasons[reason] = stats.skipped_reasons.get(reason, 0) + 1
    # Another producer's message on the same topic/stream is not ours to fail on.
    log.warning("skipping a message that is not a CloudEvent", error=error, skipped=stats.skipped)


def consume(
    settings: Settings,
    *,
    resource: str | None = None,
    from_start: bool = False,
    dedupe: Deduplicator | None = None,
    heartbeats: bool = False,
    group: str | None = None,
    positions: PositionStore | None = None,
    commit_interval: float = 1.0,
    group_options: Mapping[str, Any] | None = None,
    stats: ConsumerStats | None = None,
) -> AsyncGenerator[ReceivedEvent, object]:
    """Yield the events of the configured bus once each.

    Heartbeats (``io.k8s.bridge.heartbeat``, on NATS in the same subject space)
    are not changes: they are dropped unless ``heartbeats`` asks for them.

    With ``group`` (a Kafka consumer group / a JetStream durable of that name),
    an event is *handled* when the caller asks for the next one: only then is
    its position recorded and, after the positions are flushed, its offset
    committed (its ack sent). Closing the generator while holding an event
    leaves it unhandled: it is delivered again; ``await events.asend(LAST)``
    instead says "handled, and that was the last": it is recorded and the
    generator ends. ``from_start`` applies to a group's first start only;
    later starts resume where the group left. ``positions`` defaults to the
    group's own store on its bus (Kafka topic ``{group}.positions``, NATS KV
    bucket ``{group}-positions``); pass a ``SqlitePositions`` to write the
    handler's effects in the same transaction.
    ``group_options``: on Kafka, options of aiokafka's consumer
    (``session_timeout_ms``, ...); on NATS, ``max_ack_pending``, ``ack_wait``,
    ``lease_seconds``, ``batch`` (bridge/consuming/nats_durable.py).
    """
    if stats is None:
        stats = ConsumerStats()
    if group is not None:
        return _consume_group(
            lambda: _group_source(
                settings, group, positions, from_start, commit_interval, group_options or {}
            ),
            resource=resource,
            heartbeats=heartbeats,
            stats=stats,
        )
    return _consume_plain(
        settings,
        resource=resource,
        from_start=from_start,
        dedupe=dedupe,
        heartbeats=heartbeats,
        stats=stats,
    )


# Sent into a group's consume() generator (``asend``): the event held is handled, stop.
LAST = object()


async def _consume_plain(
    settings: Settings,
    *,
    resource: str | None,
    from_start: bool,
    dedupe: Deduplicator | None,
    heartbeats: bool,
    stats: ConsumerStats,
) -> AsyncGenerator[ReceivedEvent, object]:
    kind = settings.sink.kind
    raw_source: AsyncGenerator[bytes, None]
    if kind == "nats":
        raw_source = _nats_messages(settings, from_start)
    elif kind == "kafka":
        raw_source = _kafka_messages(settings, from_start)
    else:
        raise SinkUnavailableError(f"cannot read events back from sink.kind {kind!r}")
    if dedupe is None:
        dedupe = Deduplicator()
    async with contextlib.aclosing(raw_source) as messages:
        async for raw in messages:
            try:
                event = ReceivedEvent.parse(raw)
            except ValueError as e:
                _skip(stats, "parse", str(e))
                continue
            if event.type == HEARTBEAT_TYPE and not heartbeats:
                stats.heartbeats += 1
                continue
            if dedupe.seen(event.id):
                stats.redeliveries += 1
                continue
            if not _matches(event, resource):
                stats.other_resources += 1
                continue
            stats.delivered += 1
            yield event


async def _consume_group(
    make_source: Callable[[], GroupSource],
    *,
    resource: str | None,
    heartbeats: bool,
    stats: ConsumerStats,
) -> AsyncGenerator[ReceivedEvent, object]:
    from bridge.consuming.positions import advanced, event_uid, is_new

    source = make_source()
    holding = started = False
    try:
        await source.start()
        started = True
        positions = source.positions
        async for message in source.messages():
            if message.raw is None:
                _skip(stats, "null", "a record without a value")
                await source.done(message)
                continue
            try:
                event = ReceivedEvent.parse(message.raw)
            except ValueError as e:
                _skip(stats, "parse", str(e))
                await source.done(message)
                continue
            if event.type == HEARTBEAT_TYPE:
                stats.heartbeats += 1
                sent: object = None
                if heartbeats:
                    holding = True
                    sent = yield event
                    holding = False
                await source.done(message)
                if sent is LAST:
                    return
                continue
            if not _matches(event, resource):
                stats.other_resources += 1
                await source.done(message)
                continue
            uid = event_uid(event)
            position = await positions.get(uid)
            if not is_new(position, event):
                stats.redeliveries += 1
                await source.done(message)
                continue
            holding = True
            sent = yield event
            holding = False
            # The handler returned: handled. Recorded before the message is done, so
            # no acknowledgement ever gets ahead of a position.
            positions.record(uid, advanced(position, event), message.partition)
            stats.delivered += 1
            await source.done(message)
            if sent is LAST:
                return
    finally:
        if holding:
            source.positions.unhandled()
        try:
            await source.close()
        finally:
            if started:
                await source.positions.close()
