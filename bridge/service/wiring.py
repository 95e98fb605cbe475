"""Components from settings: the one place the service, ``replay``, ``check`` and the
benchmarks build sinks, checkpoint stores, event builders and decoders from, so each
command decides, encodes and names things exactly as the running bridge does."""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence

from bridge.checkpoints.base import CheckpointStore
from bridge.delivery.changes import Fingerprinter
from bridge.delivery.events import EventBuilder
from bridge.delivery.filters import Filter
from bridge.delivery.publisher import SettledRows, TransactionalSend
from bridge.delivery.routes import Router
from bridge.delivery.views import fingerprinter_for
from bridge.errors import ConfigError
from bridge.ground.envelope import Event
from bridge.kube.client import KubeClient
from bridge.kube.discovery import ResourceInfo
from bridge.kube.listwatch import ListWatch
from bridge.kube.rawjson import ObjectDecoder
from bridge.kube.sharding import ShardRange
from bridge.service.settings import ResourceSettings, Settings
from bridge.sinks.base import Sink
from bridge.sinks.deadletter import DeadLetter


def build_sink(settings: Settings) -> Sink:
    """The sink the settings ask for (imported lazily: each pulls its own client library)."""
    kind = settings.sink.kind
    if kind == "stdout":
        from bridge.sinks.stdout import StdoutSink

        return StdoutSink()
    if kind == "nats":
        from bridge.sinks.nats import NatsSink

        n = settings.sink.nats
        return NatsSink(
            servers=n.servers,
            stream=n.stream,
            subjects=n.subjects,
            create_stream=n.create_stream,
            max_in_flight=n.max_in_flight,
            credentials=n.credentials,
            nkey_seed=n.nkey_seed,
            tls_ca=n.tls.ca if n.tls else None,
            tls_cert=n.tls.cert if n.tls else None,
            tls_key=n.tls.key if n.tls else None,
            dead_letter_subject=n.dead_letter_subject,
            routes={r.name: r.subject_prefix or "" for r in settings.sink.routes},
        )
    if kind == "kafka":
        from bridge.sinks.kafka import KafkaSink

        k = settings.sink.kafka
        sink = KafkaSink(
            bootstrap_servers=k.bootstrap_servers,
            topic=k.topic,
            acks=k.acks,
            enable_idempotence=k.enable_idempotence,
            compression=k.compression,
            linger_ms=k.linger_ms,
            max_batch_size=k.max_batch_size,
            max_request_size=k.max_request_size,
            security_protocol=k.security_protocol,
            sasl_mechanism=k.sasl_mechanism,
            sasl_username=k.sasl_username,
            sasl_password=k.sasl_password.get_secret_value() if k.sasl_password else None,
            ssl_cafile=k.ssl.cafile if k.ssl else None,
            ssl_certfile=k.ssl.certfile if k.ssl else None,
            ssl_keyfile=k.ssl.keyfile if k.ssl else None,
            state_table=k.state_table,
            heartbeat_topic=k.heartbeat_topic,
            dead_letter_topic=k.dead_letter_topic,
            routes={r.name: r.topic or "" for r in settings.sink.routes},
        )
        if k.exactly_once:
            from bridge.sinks.kafka_transactions import KafkaTransactions

            sink.transactions = KafkaTransactions(
                sink,
                prefix=settings.transactional_id_prefix,
                checkpoint_topic=settings.checkpoint.kafka.topic,
                timeout_ms=settings.sink.kafka.transaction_timeout_ms,
            )
        return sink
    raise ConfigError(f"config error: sink.kind: {kind!r} is not one of nats, kafka, stdout")


def build_checkpoints(settings: Settings, sink: Sink | None = None) -> CheckpointStore:
    """The checkpoint store; with exactly-once, ``sink``'s transactions write the Kafka
    one, so commits and batches of a resource share its transactional producer."""
    kind = settings.checkpoint.kind
    if kind == "memory":
        from bridge.checkpoints.memory import MemoryCheckpointStore

        return MemoryCheckpointStore()
    if kind == "sqlite":
        from bridge.checkpoints.sqlite import SqliteCheckpointStore

        return SqliteCheckpointStore(
            settings.checkpoint.path, sync_write_ahead=settings.checkpoint.sync_write_ahead
        )
    if kind == "nats-kv":
        from bridge.checkpoints.nats_kv import NatsKvCheckpointStore

        # The bucket lives on the sink's NATS: the same credentials and TLS reach it.
        n = settings.sink.nats
        return NatsKvCheckpointStore(
            servers=n.servers,
            bucket=settings.checkpoint.bucket,
            credentials=n.credentials,
            nkey_seed=n.nkey_seed,
            tls_ca=n.tls.ca if n.tls else None,
            tls_cert=n.tls.cert if n.tls else None,
            tls_key=n.tls.key if n.tls else None,
        )
    if kind == "kafka":
        from bridge.checkpoints.kafka import KafkaCheckpointStore

        if settings.sink.kind != "kafka":
            raise ConfigError(
                f"config error: checkpoint.kind: kafka keeps the checkpoint in the sink's Kafka"
                f" cluster, but sink.kind is {settings.sink.kind!r}; use sqlite or nats-kv"
            )
        # The topic lives in the sink's Kafka cluster: the same credentials and TLS reach it.
        c = settings.checkpoint.kafka
        return KafkaCheckpointStore(
            settings.sink.kafka.connection_options("k8s-bridge-checkpoint"),
            c.topic,
            replication_factor=c.replication_factor,
            timeout=c.timeout,
            writer=getattr(sink, "transactions", None),
        )
    raise ConfigError(
        f"config error: checkpoint.kind: {kind!r} is not one of sqlite, memory, nats-kv, kafka"
    )


def transactional_send(sink: Sink, resource_id: str) -> TransactionalSend | None:
    """How the pipeline of ``resource_id`` publishes a batch with its checkpoint rows in
    one Kafka transaction (``sink.kafka.exactlyOnce``); None for any other sink."""
    transactions = getattr(sink, "transactions", None)
    if transactions is None:
        return None
    from bridge.checkpoints.kafka import commit_records

    channel = transactions.channel(resource_id)

    async def send(
        events: Sequence[Event], rows: SettledRows, dead_letters: Sequence[DeadLetter] = ()
    ) -> Mapping[int, str]:
        def records(refused: Collection[int]) -> list[tuple[bytes, bytes | None]]:
            return commit_records(resource_id, None, *rows(refused))

        if not dead_letters:
            return await channel.publish(events, records)
        extra = [sink.dead_letter_record(letter) for letter in dead_letters]  # type: ignore[attr-defined]
        return await channel.publish(events, records, extra)

    return send


def list_watch(
    client: KubeClient,
    info: ResourceInfo,
    namespace: str | None,
    res: ResourceSettings,
    *,
    decoder: ObjectDecoder | None = None,
    shard: ShardRange | None = None,
) -> ListWatch:
    """The resource's lists and watches in one namespace (None: all), with its selectors:
    ``run``, ``replay`` and ``check`` ask the API server the same way."""
    return ListWatch(
        client,
        info,
        namespace=namespace,
        label_selector=res.label_selector,
        field_selector=res.field_selector,
        decoder=decoder,
        shard=shard,
        metadata_only=res.metadata_only,
    )


def resource_id(info: ResourceInfo, namespace: str | None, res: ResourceSettings) -> str:
    """The checkpoint key of one resource in one scope: readable, and distinct per selector."""
    rid = f"{info.group or 'core'}/{info.version}/{info.plural}"
    if namespace:
        rid += f"@{namespace}"
    if res.label_selector or res.field_selector:
        selectors = f"{res.label_selector}|{res.field_selector}".encode()
        rid += "#" + hashlib.sha256(selectors).hexdigest()[:12]
    return rid


def checkpoint_id(
    settings: Settings, info: ResourceInfo, namespace: str | None, res: ResourceSettings
) -> str:
    """The checkpoint key this replica uses for one resource in one scope: its
    ``resource_id``, plus its slice under ``sharding.by`` uid or namespace (each
    shard keeps its own watermark and digests; bridge/delivery/reshard.py)."""
    rid = resource_id(info, namespace, res)
    shard = settings.sharding.range()
    if shard is None:
        return rid
    from bridge.delivery.reshard import sharded_id

    return sharded_id(rid, shard.field, settings.sharding.shard_index, settings.sharding.shards)


def event_builder(settings: Settings, res: ResourceSettings, info: ResourceInfo) -> EventBuilder:
    """The event builder of one resource; replay uses the same, so its events equal the originals."""
    return EventBuilder(
        cluster=settings.cluster.name,
        group=info.group,
        version=info.version,
        kind=info.kind,
        plural=info.plural,
        redact_secrets=res.redact_secrets,
        mask_paths=res.mask_paths,
        include_old=res.include_old,
        patch=res.patch,
        fields=res.fields,
        router=router(settings, res, info.plural),
    )


def router(
    settings: Settings, res: ResourceSettings | None = None, label: str = ""
) -> Router | None:
    """The compiled ``sink.routes`` of one resource (those its ``routes`` names, all when
    it names none); None without routes: its events go to the default."""
    routes = settings.sink.routes
    if res is not None and res.routes is not None:
        routes = [r for r in routes if r.name in res.routes]
    if not routes:
        return None
    return Router([(r.name, r.when) for r in routes], settings.sink.routing, label=label)


def resource_fingerprinter(res: ResourceSettings) -> Fingerprinter:
    """What decides a change for one resource (ignoreFields, triggerPaths, fields); replay
    uses the same, so a replay decides as the live bridge did."""
    return fingerprinter_for(
        ignore_fields=res.ignore_fields,
        trigger=res.trigger_paths,
        generation_only=res.generation_only,
        fields=res.fields,
        label=res.gvk,
    )


def object_decoder(
    fingerprinter: Fingerprinter, builder: EventBuilder, filter: Filter | None
) -> ObjectDecoder | None:
    """How one resource decodes objects: only the top-level keys its fingerprint, events
    and filter read are parsed, the rest stays the server's bytes (bridge/kube/rawjson.py);
    None when something reads whole objects. Replay decodes the same way, so its
    fingerprints agree with the live bridge's."""
    keys: frozenset[str] = frozenset()
    for reader in (fingerprinter, builder, filter):
        if reader is None:
            continue
        reads = reader.reads()
        if reads is None:
            return None
        keys |= reads
    return ObjectDecoder(keys)
