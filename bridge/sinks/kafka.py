"""Kafka sink (aiokafka).

Event mode: key = subject (one object, one partition, hence per-object order),
value = the structured CloudEvent, headers ``ce_id``/``ce_type``/``ce_source``/
``ce_subject``. State-table mode (a compacted topic holding each object's latest
state): key = ``apiVersion/kind/namespace/name`` (namespace empty for
cluster-scoped objects), value = the object JSON, and a null value (tombstone)
when the object is deleted.

Routes (``sink.routes``): an event that names routes (``Event.routes``) goes to
each route's topic instead of ``topic``, the same record (key, value, headers)
on each; it counts as published only when every one landed, and a record one
route refuses refuses the event.

Heartbeats (bridge/delivery/heartbeat.py) go to their own topic (``heartbeatTopic``,
by default the change topic + ``.heartbeats``, placeholders filled from the
heartbeat's resource), as structured CloudEvents keyed by the resource scope:
consumers of changes, and a compacted state topic, never see one.

``publish`` fills one record batch per partition (the producer's own
partitioner picks it from the key, as its ``send`` would), hands each over
whole when it is full or the events run out, then awaits the batches' acks.
aiokafka sends one request per broker at a time and a partition's batches in
the order they came, so records of one key stay in order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import aiokafka.errors as kerrors
import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.conn import collect_hosts, create_conn
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from bridge.errors import ConfigError, SinkError, SinkUnavailableError
from bridge.ground.envelope import HEARTBEAT_TYPE, Event
from bridge.ground.kafka import connection_options
from bridge.sinks import deadletter
from bridge.sinks.deadletter import DeadLetter

if TYPE_CHECKING:
    from bridge.sinks.kafka_transactions import KafkaTransactions

_TEMPLATE_FIELDS = ("group", "version", "kind", "resource", "cluster")

# (index of its event, topic, key, value, headers): one record of a publish.
_Owned = tuple[int, str, bytes, bytes | None, list[tuple[str, bytes]]]

# Errors that mean "the cluster cannot take this now", as opposed to a rejection.
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    kerrors.KafkaConnectionError,
    kerrors.KafkaTimeoutError,
    kerrors.NodeNotReadyError,
    kerrors.RequestTimedOutError,
    kerrors.NotLeaderForPartitionError,
    kerrors.LeaderNotAvailableError,
    kerrors.NotEnoughReplicasError,
    kerrors.NotEnoughReplicasAfterAppendError,
    kerrors.UnknownTopicOrPartitionError,
    TimeoutError,
    OSError,
)

# A batch refused with these was not refused for its records: the idempotent
# producer's sequence numbers for its partition are out of step with the broker's
# (a batch before it was refused, or the broker forgot the producer).
OUT_OF_STEP: tuple[type[BaseException], ...] = (
    kerrors.OutOfOrderSequenceNumber,
    kerrors.UnknownProducerId,
    kerrors.InvalidProducerIdMapping,
)

# Refusals that are about the bridge, not about one record: a person must act.
_FATAL: tuple[type[BaseException], ...] = (
    kerrors.ClusterAuthorizationFailedError,
    kerrors.SaslAuthenticationFailed,
    kerrors.TransactionalIdAuthorizationFailed,
)


def _retry_later(exc: BaseException) -> bool:
    """The bus cannot take it now (or another publish renewed the producer under
    this one): the whole batch is published again."""
    return isinstance(exc, (*_UNAVAILABLE, kerrors.ProducerClosed))


def event_coordinates(event: Event) -> dict[str, str]:
    """``group``, ``version``, ``kind``, ``resource``, ``cluster`` of an event, read
    back from its ``type`` (``io.k8s.{group}.{version}.{kind}.{change}``; the group
    may hold dots) and ``source`` (``k8s://{cluster}/{apiVersion}/{resource}``)."""
    parts = event.type.split(".")
    source = event.source.removeprefix("k8s://").split("/")
    return {
        "group": ".".join(parts[2:-3]),
        "version": parts[-3],
        "kind": parts[-2],
        "resource": source[-1],
        "cluster": source[0],
    }


def heartbeat_coordinates(event: Event) -> dict[str, str]:
    """The template fields of a heartbeat, read from its data (it has no change type)."""
    data = event.data
    group, _, version = str(data.get("apiVersion", "")).rpartition("/")
    return {
        "group": group or "core",
        "version": version,
        "kind": str(data.get("kind", "")),
        "resource": str(data.get("resource", "")),
        "cluster": str(data.get("cluster", "")),
    }


def _check_template(key: str, topic: str) -> bool:
    """Whether ``topic`` has placeholders; ConfigError naming ``key`` for unknown ones."""
    if "{" not in topic:
        return False
    try:
        topic.format(**dict.fromkeys(_TEMPLATE_FIELDS, "x"))
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(
            f"{key} {topic!r}: unknown placeholder {exc}; "
            f"allowed: {', '.join('{' + f + '}' for f in _TEMPLATE_FIELDS)}"
        ) from None
    return True


def _encoded(headers: list[tuple[str, str]]) -> list[tuple[str, bytes]]:
    return [(k, v.encode()) for k, v in headers]


def state_key(event: Event) -> bytes:
    obj = event.data.get("object") or {}
    md = obj.get("metadata") or {}
    api_version = obj.get("apiVersion") or ""
    kind = obj.get("kind") or ""
    if not api_version or not kind:
        c = event_coordinates(event)
        group = "" if c["group"] == "core" else c["group"]
        api_version = api_version or (f"{group}/{c['version']}" if group else c["version"])
        kind = kind or c["kind"]
    return f"{api_version}/{kind}/{md.get('namespace') or ''}/{md.get('name', '')}".encode()


class KafkaSink:
    def __init__(
        self,
        bootstrap_servers: list[str] | str,
        topic: str = "k8s-events",
        acks: str | int = "all",
        enable_idempotence: bool = True,
        compression: str | None = None,
        linger_ms: int = 0,
        max_batch_size: int = 65_536,
        security_protocol: str = "PLAINTEXT",
        sasl_mechanism: str | None = None,
        sasl_username: str | None = None,
        sasl_password: str | None = None,
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        state_table: bool = False,
        request_timeout_ms: int = 30_000,
        delivery_timeout: float = 60.0,
        max_request_size: int = 1_048_576,
        heartbeat_topic: str | None = None,
        metadata_timeout: float = 10.0,
        dead_letter_topic: str | None = None,
        routes: Mapping[str, str] | None = None,
    ) -> None:
        self.bootstrap_servers = (
            [bootstrap_servers] if isinstance(bootstrap_servers, str) else list(bootstrap_servers)
        )
        self.topic = topic
        self._templated = _check_template("sink.kafka.topic", topic)
        self.heartbeat_topic = heartbeat_topic or f"{topic}.heartbeats"
        self._heartbeat_templated = _check_template(
            "sink.kafka.heartbeatTopic", self.heartbeat_topic
        )
        self._topics: dict[tuple[str, str], str] = {}
        # sink.routes: route name → its topic (placeholders as ``topic``). An event
        # names its routes (``Event.routes``); none named: ``topic``.
        self.routes = dict(routes or {})
        for name, route_topic in self.routes.items():
            _check_template(f"sink.routes ({name}).topic", route_topic)
        self._route_topics: dict[tuple[str, str, str], str] = {}
        # poisonPolicy deadLetter: where refused events go whole (bridge/sinks/deadletter.py).
        self.dead_letter_topic = dead_letter_topic
        self.state_table = state_table
        self.delivery_timeout = delivery_timeout
        self._options: dict[str, Any] = connection_options(
            self.bootstrap_servers,
            "k8s-bridge",
            security_protocol=security_protocol,
            sasl_mechanism=sasl_mechanism,
            sasl_username=sasl_username,
            sasl_password=sasl_password,
            ssl_cafile=ssl_cafile,
            ssl_certfile=ssl_certfile,
            ssl_keyfile=ssl_keyfile,
        ) | {
            "acks": acks if acks == "all" else int(acks),
            "enable_idempotence": enable_idempotence,
            "compression_type": compression,
            "linger_ms": linger_ms,
            "max_batch_size": max_batch_size,
            "request_timeout_ms": request_timeout_ms,
            "max_request_size": max_request_size,
        }
        self._producer: AIOKafkaProducer | None = None
        self._renewing = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()
        # How long a topic not in the metadata may take to appear (auto-created).
        self.metadata_timeout = metadata_timeout
        # The producer's default partitioner (murmur2 of the key), which ``send`` would use.
        self._partitioner = DefaultPartitioner()
        # With sink.kafka.exactlyOnce, each resource's transactional producer
        # (bridge/sinks/kafka_transactions.py); this producer then carries only
        # heartbeats, which no checkpoint covers.
        self.transactions: KafkaTransactions | None = None
        # Times one of those producers was fenced (a newer leader took its id); the
        # metric k8s_bridge_producer_fenced_total follows it.
        self.fenced = 0

    @property
    def where(self) -> str:
        return ",".join(self.bootstrap_servers)

    async def start(self) -> None:
        if self._producer is not None:
            return
        self._producer = await self._new_producer()

    async def _new_producer(self) -> AIOKafkaProducer:
        producer = AIOKafkaProducer(**self._options)
        try:
            await producer.start()
        except BaseException as exc:
            await producer.stop()
            if isinstance(exc, kerrors.KafkaConnectionError):
                refused = await self._credentials_refused()
                if refused is not None:
                    raise refused from exc
            if isinstance(exc, _UNAVAILABLE):
                raise SinkUnavailableError(f"cannot reach Kafka at {self.where}: {exc!r}") from exc
            if isinstance(exc, kerrors.KafkaError):
                raise self._translate(exc) from exc
            raise
        return producer

    async def _credentials_refused(self) -> SinkError | None:
        """The broker's refusal of our SASL credentials, if that is why no bootstrap
        server answered: aiokafka only logs it and reports them all unreachable,
        and a wrong password must not look like a bus to wait for."""
        mechanism = self._options.get("sasl_mechanism")
        if not mechanism:
            return None
        user = self._options.get("sasl_plain_username")
        for host, port, _ in collect_hosts(self.bootstrap_servers):
            try:
                async with asyncio.timeout(self._options["request_timeout_ms"] / 1000):
                    conn = await create_conn(
                        host,
                        port,
                        client_id="k8s-bridge",
                        security_protocol=self._options["security_protocol"],
                        ssl_context=self._options.get("ssl_context"),
                        sasl_mechanism=mechanism,
                        sasl_plain_username=user,
                        sasl_plain_password=self._options.get("sasl_plain_password"),
                    )
            except kerrors.SaslAuthenticationFailed as exc:
                return SinkError(
                    f"Kafka at {self.where}: authentication failed for user {user!r}"
                    f" (SASL {mechanism}): {exc}; check sink.kafka.saslUsername and saslPassword"
                )
            except (kerrors.KafkaError, OSError, TimeoutError):
                continue
            conn.close()
        return None

    async def _renew(self, used: AIOKafkaProducer) -> AIOKafkaProducer:
        """A fresh producer in place of ``used`` (once, however many publishes ask)."""
        async with self._renewing:
            current = self._producer
            if current is used:
                current = self._producer = await self._new_producer()
                # The old one delivers (or fails) the batches other publishes still
                # have with it, then closes; ``close`` waits for that.
                retiring = asyncio.create_task(self._retire(used), name="kafka-retire")
                self._retiring.add(retiring)
                retiring.add_done_callback(self._retiring.discard)
        if current is None:
            raise SinkError("Kafka sink is closed")
        return current

    async def _retire(self, producer: AIOKafkaProducer) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(30):  # a broker that does not answer
                await producer.stop()

    async def _partitions(self, producer: AIOKafkaProducer, topic: str) -> set[int]:
        """The topic's partitions, waiting a while for a topic the broker is creating."""
        try:
            async with asyncio.timeout(self.metadata_timeout):
                return set(await producer.partitions_for(topic))
        except (TimeoutError, kerrors.UnknownTopicOrPartitionError) as exc:
            raise SinkUnavailableError(
                f"Kafka at {self.where}: topic {topic!r} does not exist (not in the cluster's"
                f" metadata after {self.metadata_timeout:g} s; a broker with"
                " auto.create.topics.enable=false does not create it): create the topic;"
                " publishing waits for it"
            ) from exc

    def topic_for(self, event: Event) -> str:
        if event.type == HEARTBEAT_TYPE:
            if not self._heartbeat_templated:
                return self.heartbeat_topic
            return self.heartbeat_topic.format(**heartbeat_coordinates(event))
        if not self._templated:
            return self.topic
        cache_key = (event.type.rsplit(".", 1)[0], event.source)
        topic = self._topics.get(cache_key)
        if topic is None:
            topic = self._topics[cache_key] = self.topic.format(**event_coordinates(event))
        return topic

    def route_topic(self, event: Event, route: str) -> str:
        """The topic of ``event`` on the route named ``route``."""
        template = self.routes.get(route)
        if template is None:
            raise SinkError(f"event {event.id} names route {route!r}, not in sink.routes")
        if "{" not in template:
            return template
        cache_key = (route, event.type.rsplit(".", 1)[0], event.source)
        topic = self._route_topics.get(cache_key)
        if topic is None:
            topic = self._route_topics[cache_key] = template.format(**event_coordinates(event))
        return topic

    def _record(self, e: Event) -> tuple[str, bytes, bytes | None, list[tuple[str, bytes]]]:
        """``(topic, key, value, headers)`` of one event's record (default route)."""
        if self.state_table and e.type != HEARTBEAT_TYPE:
            value = None if e.removes else orjson.dumps(e.data.get("object"))
            return self.topic_for(e), state_key(e), value, e.headers
        return self.topic_for(e), e.key, e.to_json(), e.headers

    def records(self, events: Sequence[Event]) -> list[_Owned]:
        """``(event index, topic, key, value, headers)``: one record per event on the
        default route, one per route an event names, the same key, value and
        headers on each (the same ids), in event order."""
        if not self.routes and not self.state_table:
            # No routes configured: one record per event, made in one step (this is the
            # path of every bridge without routes; ``python -m bench routes``).
            topic_for = self.topic_for
            return [(i, topic_for(e), e.key, e.to_json(), e.headers) for i, e in enumerate(events)]
        out: list[_Owned] = []
        for i, e in enumerate(events):
            topic, key, value, headers = self._record(e)
            if not e.routes:
                out.append((i, topic, key, value, headers))
                continue
            for route in e.routes:
                out.append((i, self.route_topic(e, route), key, value, headers))
        return out

    async def publish(self, events: Sequence[Event]) -> Mapping[int, str]:
        producer = self._producer
        if producer is None:
            raise SinkError("Kafka sink is not started")
        if not events:
            return {}
        refused: dict[int, str] = {}
        # One record batch per partition, filled here and handed over whole: the
        # producer's per-record ``send`` (a coroutine, a metadata wait and a
        # delivery future per record, then a gather over them) costs more than
        # the records themselves. A batch lands or fails as one, as the
        # producer's own batches do.
        submitted: list[tuple[tuple[str, int], list[int], asyncio.Future[Any]]] = []
        open_batches: dict[tuple[str, int], tuple[Any, list[int]]] = {}
        partitions: dict[str, tuple[list[int], list[int]]] = {}
        cluster = producer.client.cluster
        limit = self._options["max_request_size"]
        estimate = DefaultRecordBatchBuilder.estimate_size_in_bytes
        failures: list[tuple[int, kerrors.KafkaError]] = []
        # An event is acknowledged when the records of all its routes are; one refused
        # record refuses the event (for the poison policy). Batches hold record indices.
        records = self.records(events)
        try:
            async with asyncio.timeout(self.delivery_timeout):
                for j, (i, topic, key, value, headers) in enumerate(records):
                    size = estimate(key, value, headers)
                    if size > limit:
                        # Known before sending: refused, the rest go on.
                        refused[i] = (
                            f"the record is {size} bytes, over the {limit} bytes a request"
                            " may carry (sink.kafka.maxRequestSize)"
                        )
                        continue
                    known = partitions.get(topic)
                    if known is None:
                        # Waits for the topic's metadata, as ``send`` does.
                        known = partitions[topic] = (
                            sorted(await self._partitions(producer, topic)),
                            sorted(cluster.available_partitions_for_topic(topic)),
                        )
                    # The producer's own choice for a keyed record: same key, same partition.
                    partition = self._partitioner(key, *known)
                    slot = open_batches.get((topic, partition))
                    if slot is not None:
                        builder, indices = slot
                        added = builder.append(
                            timestamp=None, key=key, value=value, headers=headers
                        )
                        if added is not None:
                            indices.append(j)
                            continue
                        # Full: it goes now, and a new one takes this record.
                        fut = await producer.send_batch(builder, topic, partition=partition)
                        submitted.append(((topic, partition), indices, fut))
                    builder = producer.create_batch()
                    # A batch's first record always fits.
                    builder.append(timestamp=None, key=key, value=value, headers=headers)
                    open_batches[(topic, partition)] = (builder, [j])
                for (topic, partition), (builder, indices) in open_batches.items():
                    fut = await producer.send_batch(builder, topic, partition=partition)
                    submitted.append(((topic, partition), indices, fut))
                open_batches.clear()
                for n, (_, _, fut) in enumerate(submitted):
                    try:
                        await fut
                    except kerrors.KafkaError as exc:
                        failures.append((n, exc))
        except (*_UNAVAILABLE, kerrors.ProducerClosed) as exc:
            # ProducerClosed: another publish renewed the producer under this one.
            raise SinkUnavailableError(f"Kafka at {self.where}: {exc!r}") from exc
        except kerrors.KafkaError as exc:
            raise self._translate(exc) from exc
        finally:
            for builder, _ in open_batches.values():
                builder.close()  # filled, never handed over: nothing of it is sent
            # Futures still pending after a failure must not log "exception never retrieved".
            for _, _, fut in submitted:
                if fut.done() and not fut.cancelled():
                    fut.exception()
                elif not fut.done():
                    fut.cancel()
        if failures:
            again = self._refusals(events, records, submitted, failures, refused)
            if self._options["enable_idempotence"]:
                # The producer numbered the refused batches, the broker did not take
                # them: it would refuse every later batch of their partitions as out
                # of order. A new producer id starts the numbering afresh.
                producer = await self._renew(producer)
            if again:
                await self._send_alone(producer, events, records, again, partitions, refused)
        return refused

    def _refusals(
        self,
        events: Sequence[Event],
        records: list[_Owned],
        submitted: list[tuple[tuple[str, int], list[int], asyncio.Future[Any]]],
        failures: list[tuple[int, kerrors.KafkaError]],
        refused: dict[int, str],
    ) -> list[int]:
        """Sort the refused batches (of record indices): records refused for themselves
        refuse their events (``refused``); those to send again alone are returned. The broker refuses a batch whole (its
        ``message.max.bytes`` counts the batch), so the records beside a refused one
        are sent again, unless a later batch of their partition landed first (they
        would arrive behind newer events of their objects)."""
        failed = {n for n, _ in failures}
        again: list[int] = []
        for n, failure in failures:
            if _retry_later(failure):
                raise SinkUnavailableError(f"Kafka at {self.where}: {failure!r}") from failure
            error = self._translate(failure)
            if isinstance(error, SinkUnavailableError) or self._fatal(failure):
                raise error from failure
            tp, indices, _ = submitted[n]
            overtaken = any(
                m > n and m not in failed and later == tp
                for m, (later, _, _) in enumerate(submitted)
            )
            if (len(indices) > 1 or isinstance(failure, OUT_OF_STEP)) and not overtaken:
                again.extend(indices)
            else:
                for j in indices:
                    i = records[j][0]
                    refused[i] = self._refusal(events[i], failure)
        return sorted(again)

    async def _send_alone(
        self,
        producer: AIOKafkaProducer,
        events: Sequence[Event],
        records: list[_Owned],
        indices: list[int],
        partitions: dict[str, tuple[list[int], list[int]]],
        refused: dict[int, str],
    ) -> None:
        """Send each record (of ``records``, by index) in a batch of its own, in order;
        a refused one refuses its event (and renews an idempotent producer, as
        ``publish`` does)."""
        try:
            async with asyncio.timeout(self.delivery_timeout):
                for j in indices:
                    i, topic, key, value, headers = records[j]
                    builder = producer.create_batch()
                    builder.append(timestamp=None, key=key, value=value, headers=headers)
                    partition = self._partitioner(key, *partitions[topic])
                    try:
                        await (await producer.send_batch(builder, topic, partition=partition))
                    except kerrors.KafkaError as exc:
                        error = self._translate(exc)
                        if isinstance(
                            exc, (*_UNAVAILABLE, kerrors.ProducerClosed, *OUT_OF_STEP)
                        ) or isinstance(error, SinkUnavailableError):
                            raise SinkUnavailableError(f"Kafka at {self.where}: {exc!r}") from exc
                        if self._fatal(exc):
                            raise error from exc
                        refused[i] = self._refusal(events[i], exc)
                        if self._options["enable_idempotence"]:
                            producer = await self._renew(producer)
        except _UNAVAILABLE as exc:
            raise SinkUnavailableError(f"Kafka at {self.where}: {exc!r}") from exc

    def dead_letter_record(
        self, letter: DeadLetter
    ) -> tuple[str, bytes, bytes | None, list[tuple[str, bytes]]]:
        """``(topic, key, value, headers)`` of a dead letter: keyed like its event, the
        value whole or cut to ``maxRequestSize`` (bridge/sinks/deadletter.py)."""
        topic = self.dead_letter_topic
        if topic is None:
            raise SinkError("a dead letter, but sink.kafka.deadLetterTopic is not set")
        key = letter.event.key
        estimate = DefaultRecordBatchBuilder.estimate_size_in_bytes

        def overhead(headers: list[tuple[str, str]]) -> int:
            # The value's length varint (up to 5 bytes) is not in an empty value's estimate.
            return estimate(key, b"", _encoded(headers)) + 5

        value, headers = deadletter.fitted(letter, self._options["max_request_size"], overhead)
        return topic, key, value, _encoded(headers)

    async def publish_dead_letters(self, letters: Sequence[DeadLetter]) -> Mapping[int, str]:
        """Each dead letter in a record batch of its own, in order (they are rare);
        those the dead-letter topic refuses in turn are returned (index → reason)."""
        producer = self._producer
        if producer is None:
            raise SinkError("Kafka sink is not started")
        refused: dict[int, str] = {}
        try:
            async with asyncio.timeout(self.delivery_timeout):
                for i, letter in enumerate(letters):
                    topic, key, value, headers = self.dead_letter_record(letter)
                    known = (
                        sorted(await self._partitions(producer, topic)),
                        sorted(producer.client.cluster.available_partitions_for_topic(topic)),
                    )
                    builder = producer.create_batch()
                    builder.append(timestamp=None, key=key, value=value, headers=headers)
                    partition = self._partitioner(key, *known)
                    try:
                        await (await producer.send_batch(builder, topic, partition=partition))
                    except kerrors.KafkaError as exc:
                        error = self._translate(exc)
                        if isinstance(
                            exc, (*_UNAVAILABLE, kerrors.ProducerClosed, *OUT_OF_STEP)
                        ) or isinstance(error, SinkUnavailableError):
                            raise SinkUnavailableError(f"Kafka at {self.where}: {exc!r}") from exc
                        if self._fatal(exc):
                            raise error from exc
                        refused[i] = f"topic {topic!r} refused the dead letter: {exc!r}"
                        if self._options["enable_idempotence"]:
                            producer = await self._renew(producer)
        except _UNAVAILABLE as exc:
            raise SinkUnavailableError(f"Kafka at {self.where}: {exc!r}") from exc
        return refused

    def _refusal(self, event: Event, failure: BaseException) -> str:
        if isinstance(failure, kerrors.MessageSizeTooLargeError):
            _, key, value, headers = self._record(event)
            size = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers)
            return (
                f"Kafka refused the record ({size} bytes) as too large: over the broker's"
                " message.max.bytes or the topic's max.message.bytes (keep"
                " sink.kafka.maxRequestSize at or below them)"
            )
        return f"Kafka refused the record: {failure!r}"

    def _idempotence_refused(self, exc: BaseException) -> bool:
        # Brokers without the idempotent producer (some Kafka-protocol servers)
        # answer its InitProducerId with an error the client cannot name.
        return isinstance(exc, kerrors.UnknownError) and bool(self._options["enable_idempotence"])

    def _fatal(self, exc: BaseException) -> bool:
        return isinstance(exc, _FATAL) or self._idempotence_refused(exc)

    def _translate(self, exc: kerrors.KafkaError) -> SinkError:
        if self._idempotence_refused(exc):
            return SinkError(
                f"Kafka at {self.where} refused the idempotent producer ({exc!r});"
                " set sink.kafka.enableIdempotence: false for this broker"
            )
        if getattr(exc, "retriable", False):
            return SinkUnavailableError(f"Kafka at {self.where}: {exc!r}")
        return SinkError(f"Kafka at {self.where} refused: {exc!r}")

    async def ping(self) -> bool:
        producer = self._producer
        if producer is None:
            return False
        try:
            async with asyncio.timeout(5):
                return bool(await producer.client.force_metadata_update())
        except (kerrors.KafkaError, TimeoutError, OSError):
            return False

    async def close(self) -> None:
        if self.transactions is not None:
            await self.transactions.close()
        producer, self._producer = self._producer, None
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
        if producer is not None:
            try:
                await producer.stop()
            except (kerrors.KafkaError, OSError):
                pass
