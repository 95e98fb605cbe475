"""Where the mirror reads: a Kafka topic or a JetStream stream, from positions it is given.

No consumer group and no durable consumer: the position lives in PostgreSQL,
written in the same transaction as the rows (Kafka Connect's JDBC sink does
the same), so the bus is only ever asked "from here on".

- Kafka: every partition of the topic assigned (``assign`` + ``seek``), read
  with ``isolation_level=read_committed`` (an aborted transaction of the
  bridge's ``exactlyOnce`` never reaches the database). Position: the offset.
- JetStream: an ordered consumer started at ``opt_start_seq`` = the stored
  next sequence. Position: the stream sequence; one partition, 0.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from bridge.errors import BridgeError
from bridge.logging import get_logger
from bridge.mirror.settings import MirrorSourceSettings

log = get_logger(__name__)


class SourceUnavailable(BridgeError):
    """The bus cannot be reached or lost the read: retry from the stored positions."""


@dataclass(frozen=True, slots=True)
class Message:
    partition: int
    position: int
    value: bytes | None


class Source(Protocol):
    identity: str

    async def seek(self, positions: Mapping[int, int]) -> None:
        """Read from these next positions (partition → position; absent: from the start)."""

    async def fetch(self, max_messages: int, wait: float) -> list[Message]:
        """Up to ``max_messages`` in bus order per partition; waits at most ``wait`` s idle."""

    async def close(self) -> None: ...


class KafkaSource:
    def __init__(self, settings: MirrorSourceSettings) -> None:
        self.settings = settings
        self.identity = settings.identity
        self.topic = settings.kafka.topic
        self._consumer: Any = None
        self._parts: list[Any] = []

    async def _open(self) -> Any:
        from aiokafka import AIOKafkaConsumer, TopicPartition
        from aiokafka.errors import KafkaError

        k = self.settings.kafka
        consumer = AIOKafkaConsumer(
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            **k.connection_options("k8s-bridge-mirror"),
        )
        where = ",".join(k.bootstrap_servers)
        try:
            parts = await self._partitions()
            await consumer.start()
        except (KafkaError, OSError) as e:
            await consumer.stop()
            raise SourceUnavailable(f"Kafka at {where}: {e!r}") from e
        if not parts:
            await consumer.stop()
            raise SourceUnavailable(f"Kafka at {where}: topic {self.topic!r} does not exist yet")
        self._parts = [TopicPartition(self.topic, p) for p in sorted(parts)]
        consumer.assign(self._parts)
        self._consumer = consumer
        return consumer

    async def _partitions(self) -> list[int]:
        """The topic's partitions, as the brokers describe it now ([] while it does not exist)."""
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(
            **self.settings.kafka.connection_options("k8s-bridge-mirror-admin")
        )
        try:
            await admin.start()
            (described,) = await admin.describe_topics([self.topic])
        finally:
            with contextlib.suppress(Exception):
                await admin.close()
        if described["error_code"]:
            return []
        return [p["partition"] for p in described["partitions"]]

    async def seek(self, positions: Mapping[int, int]) -> None:
        consumer = self._consumer or await self._open()
        for tp in self._parts:
            if tp.partition in positions:
                consumer.seek(tp, positions[tp.partition])
            else:
                await consumer.seek_to_beginning(tp)

    async def fetch(self, max_messages: int, wait: float) -> list[Message]:
        from aiokafka.errors import KafkaError

        if self._consumer is None:
            raise SourceUnavailable("Kafka: not open")
        try:
            got = await self._consumer.getmany(
                timeout_ms=int(wait * 1000), max_records=max_messages
            )
        except KafkaError as e:
            await self.close()
            raise SourceUnavailable(f"Kafka: {e!r}") from e
        out: list[Message] = []
        for tp, records in got.items():
            out.extend(Message(tp.partition, r.offset, r.value) for r in records)
        return out

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(Exception):
                await consumer.stop()


class NatsSource:
    def __init__(self, settings: MirrorSourceSettings) -> None:
        self.settings = settings
        self.identity = settings.identity
        n = settings.nats
        self.stream = n.stream
        self.subject = n.subjects[0] if len(n.subjects) == 1 else ">"
        self._nc: Any = None
        self._sub: Any = None
        self._reconnects = 0

    async def seek(self, positions: Mapping[int, int]) -> None:
        import nats
        from nats.js.api import ConsumerConfig, DeliverPolicy

        from bridge.ground.nats import connect
        from bridge.ground.natsconfig import tls_context

        n = self.settings.nats
        where = ",".join(n.servers)
        await self._unsubscribe()
        try:
            if self._nc is None or not self._nc.is_connected:
                await self.close()
                self._nc = await connect(
                    n.servers,
                    credentials=n.credentials,
                    nkey_seed=n.nkey_seed,
                    tls=tls_context(n.tls.ca, n.tls.cert, n.tls.key) if n.tls else None,
                    name="k8s-bridge-mirror",
                )
            start = positions.get(0)
            config = (
                ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start)
                if start
                else ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
            )
            self._reconnects = self._nc.stats["reconnects"]
            self._sub = await self._nc.jetstream().subscribe(
                self.subject,
                stream=self.stream,
                ordered_consumer=True,
                config=config,
                pending_msgs_limit=4 * 65_536,
            )
        except nats.js.errors.NotFoundError as e:
            raise SourceUnavailable(f"NATS at {where}: stream {self.stream!r} not found") from e
        except (nats.errors.Error, OSError, TimeoutError) as e:
            raise SourceUnavailable(f"NATS at {where}: {e!r}") from e

    async def fetch(self, max_messages: int, wait: float) -> list[Message]:
        import nats

        if self._sub is None:
            raise SourceUnavailable("NATS: not subscribed")
        if self._nc.stats["reconnects"] != self._reconnects:
            # The server (and with it the ephemeral consumer) may be new: subscribe again
            # from the stored position now, rather than when heartbeats are missed.
            await self._unsubscribe()
            raise SourceUnavailable("NATS reconnected")
        out: list[Message] = []
        timeout = max(wait, 0.001)
        while len(out) < max_messages:
            try:
                msg = await self._sub.next_msg(timeout=timeout)
            except nats.errors.TimeoutError:
                break
            except (nats.errors.Error, OSError) as e:
                await self._unsubscribe()
                raise SourceUnavailable(f"NATS: {e!r}") from e
            out.append(Message(0, msg.metadata.sequence.stream, msg.data))
            # Once something came, take what is already here without waiting long.
            timeout = 0.001
        return out

    async def _unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await sub.unsubscribe()

    async def close(self) -> None:
        await self._unsubscribe()
        nc, self._nc = self._nc, None
        if nc is not None:
            from bridge.ground.nats import close_quietly

            await close_quietly(nc)


def make_source(settings: MirrorSourceSettings) -> Source:
    return KafkaSource(settings) if settings.kind == "kafka" else NatsSource(settings)
