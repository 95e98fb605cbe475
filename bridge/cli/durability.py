"""What the bus keeps of an acknowledged event, for ``k8s-bridge check``.

The bridge advances its checkpoint once the bus acknowledged an event, so every
guarantee it gives is only as durable as that acknowledgement. These read the
stream or topic ``run`` publishes to, through the clients' public admin APIs, and
name each setting below what the guarantees need (docs/operations.md, "The bus's
durability"). They are warnings, never failures: a dev bus of one node cannot
meet them and must still pass ``check``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from bridge.service.settings import KafkaSettings, NatsSettings

# What the guarantees need of the bus (docs/operations.md).
MIN_REPLICAS = 3
MIN_INSYNC = 2


@dataclass
class Durability:
    """What was read of one stream or topic (``seen``) and each setting below need."""

    what: str
    seen: str
    problems: list[str] = field(default_factory=list)


async def nats_stream(n: NatsSettings, timeout: float) -> Durability | None:
    """The JetStream stream's storage and replicas; None if it does not exist (the
    sink's own check says so). ``sync_interval`` is the server's configuration,
    which no client can read: the line says so rather than guess."""
    return await _jetstream_durability(
        n, n.stream, f"sink nats stream {n.stream}", f"stream {n.stream}", timeout, "events"
    )


async def nats_kv_bucket(n: NatsSettings, bucket: str, timeout: float) -> Durability | None:
    """The checkpoint's KV bucket (the stream ``KV_<bucket>``), as the stream: a bucket
    on one replica or in memory loses the checkpoint with that server, and the
    restart then republishes from nothing. None if it does not exist yet (the
    checkpoint's own line says the first start creates it)."""
    return await _jetstream_durability(
        n,
        f"KV_{bucket}",
        f"checkpoint nats-kv bucket {bucket}",
        f"bucket {bucket}",
        timeout,
        "checkpoint rows",
    )


async def _jetstream_durability(
    n: NatsSettings, stream: str, what: str, name: str, timeout: float, holds: str
) -> Durability | None:
    import nats.js.errors

    from bridge.ground.nats import close_quietly, connect
    from bridge.ground.natsconfig import tls_context

    nc = await connect(
        n.servers,
        connect_timeout=timeout,
        credentials=n.credentials,
        nkey_seed=n.nkey_seed,
        tls=tls_context(n.tls.ca, n.tls.cert, n.tls.key) if n.tls else None,
        name="k8s-bridge-check",
    )
    try:
        try:
            async with asyncio.timeout(timeout):
                info = await nc.jetstream(timeout=timeout).stream_info(stream)
        except nats.js.errors.NotFoundError:
            return None
    finally:
        await close_quietly(nc)
    config = info.config
    storage = str(getattr(config.storage, "value", config.storage) or "file")
    replicas = config.num_replicas or 1
    result = Durability(
        what,
        f"{storage} storage, {replicas} replica(s); sync_interval is the server's "
        "(jetstream.sync_interval), not visible to a client: 'always' survives an OS crash",
    )
    if storage == "memory":
        result.problems.append(
            f"{name} has memory storage: a server restart loses every "
            f"acknowledged {'event' if holds == 'events' else 'checkpoint row'}; use file storage"
        )
    if replicas < MIN_REPLICAS:
        result.problems.append(
            f"{name} has {replicas} replica(s): the loss of that server's disk "
            f"loses acknowledged {holds}; use {MIN_REPLICAS} replicas on a cluster of "
            f"{MIN_REPLICAS} or more servers"
        )
    return result


async def kafka_topic(k: KafkaSettings, timeout: float) -> Durability:
    """The topic's replication factor, ``min.insync.replicas`` and unclean leader
    election, and the producer's acks. A topic that does not exist yet, or one
    named per resource (placeholders), is created with the broker's defaults:
    those are read instead."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(
        **k.connection_options("k8s-bridge-check"), request_timeout_ms=int(timeout * 1000)
    )
    await admin.start()
    try:
        async with asyncio.timeout(timeout):
            described = None
            # list_topics first, not a metadata request naming a missing topic: a
            # broker with auto.create.topics.enable would create it, and check
            # changes nothing.
            if "{" not in k.topic and k.topic in await admin.list_topics():
                (described,) = await admin.describe_topics([k.topic])
            if described is not None and not described["error_code"]:
                what = f"sink kafka topic {k.topic}"
                replicas = min(len(p["replicas"]) for p in described["partitions"])
                resource = ConfigResource(ConfigResourceType.TOPIC, k.topic)
                replicas_key = "replication factor"
            else:
                what = f"sink kafka topics {k.topic} (to be created with the broker's defaults)"
                cluster = await admin.describe_cluster()
                broker = min(b["node_id"] for b in cluster["brokers"])
                resource = ConfigResource(ConfigResourceType.BROKER, str(broker))
                replicas = None
                replicas_key = "default.replication.factor"
            configs = _configs(await admin.describe_configs([resource]))
    finally:
        await admin.close()
    if replicas is None:
        replicas = int(configs.get("default.replication.factor") or 1)
    insync = int(configs.get("min.insync.replicas") or 1)
    unclean = (configs.get("unclean.leader.election.enable") or "false").lower() == "true"
    result = Durability(
        what,
        f"{replicas_key} {replicas}, min.insync.replicas {insync}, unclean leader election "
        f"{'on' if unclean else 'off'}, acks {k.acks}",
    )
    if str(k.acks) != "all":
        result.problems.append(
            f"sink.kafka.acks is {k.acks}: the broker acknowledges before the in-sync "
            "replicas have the event, so a leader failover loses acknowledged events; "
            "set acks: all"
        )
    if replicas < MIN_REPLICAS:
        result.problems.append(
            f"{replicas_key} is {replicas}: the loss of one broker's disk loses acknowledged "
            f"events; use {MIN_REPLICAS} or more"
        )
    if insync < MIN_INSYNC:
        result.problems.append(
            f"min.insync.replicas is {insync}: acks=all is then satisfied by the leader "
            f"alone; set it to {MIN_INSYNC} or more (with a replication factor of "
            f"{MIN_REPLICAS})"
        )
    if unclean:
        result.problems.append(
            "unclean.leader.election.enable is true: an out-of-sync replica may become "
            "leader and drop acknowledged events; set it to false"
        )
    return result


def _configs(responses: list[Any]) -> dict[str, str]:
    """Name → value of every config entry in DescribeConfigs responses."""
    out: dict[str, str] = {}
    for response in responses:
        for resource in response.to_object()["resources"]:
            for entry in resource["config_entries"]:
                if entry["config_value"] is not None:
                    out[entry["config_names"]] = entry["config_value"]
    return out
