"""A JetStream durable consumer for ``consume(..., group=...)``, and its positions in NATS KV.

JetStream has no partitions: two workers pulling from one durable would get
messages of the same object at the same time and could handle them out of
order. So the workers of a group share the durable one at a time: a lease
(key ``holder`` in the KV bucket ``{group}-lease``, whose entries expire after
``lease_seconds``) says who reads; the others wait and take over when it
expires (a crash) or is given back (a clean stop). That is the rebalance of
JetStream.

The holder (re)creates the durable at its ack floor before reading. A
durable's unacknowledged messages come back only after ``ack_wait``, while
newer ones are delivered meanwhile: after a crash that would break per-object
order. Recreated from ``ack_floor + 1`` it delivers everything not
acknowledged, in stream order, at once; what was handled but not yet
acknowledged is recognised by its position.

Acks are explicit, sent after the handler returned and the positions were
flushed, batched like Kafka's commits; ``max_ack_pending`` bounds what is out.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, KeyValueConfig
from nats.js.errors import KeyWrongLastSequenceError, NotFoundError

from bridge.consuming.positions import BusPositions, Position
from bridge.consuming.source import Incoming
from bridge.errors import SinkError, SinkUnavailableError
from bridge.ground.envelope import nats_token
from bridge.logging import get_logger

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js.client import JetStreamContext
    from nats.js.kv import KeyValue

    from bridge.consuming.positions import PositionStore
    from bridge.service.settings import Settings

log = get_logger(__name__)


def bucket_name(group: str, suffix: str) -> str:
    """A KV bucket name of the group (``[A-Za-z0-9_-]`` only)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", group) + "-" + suffix


class NatsKvPositions(BusPositions):
    """Positions in the KV bucket ``{group}-positions`` (key uid, value as on Kafka).

    Loaded whole when the lease is taken (``assigned``); afterwards only the
    lease holder writes, so its memory is the truth until it lets go."""

    _unavailable = (nats.errors.Error, TimeoutError)

    def __init__(self, js: JetStreamContext, bucket: str) -> None:
        super().__init__()
        self.js = js
        self.bucket = bucket
        self._where = f"NATS KV {bucket!r}"
        self._kv: KeyValue | None = None

    async def open(self) -> None:
        if self._kv is not None:
            return
        try:
            self._kv = await self.js.key_value(self.bucket)
        except nats.js.errors.BucketNotFoundError:
            self._kv = await self.js.create_key_value(KeyValueConfig(bucket=self.bucket, history=1))

    async def _read(self) -> dict[str, Position]:
        assert self._kv is not None
        from bridge.consuming.kafka_positions import decode

        positions: dict[str, Position] = {}
        watcher = await self._kv.watchall()
        try:
            async for entry in watcher:
                if entry is None:  # the end of what the bucket held
                    break
                if entry.operation is None and entry.value:
                    positions[entry.key] = decode(entry.value)
                else:
                    positions.pop(entry.key, None)
        finally:
            await watcher.stop()
        return positions

    async def _write(self, pending: dict[str, Position]) -> None:
        from bridge.consuming.kafka_positions import encode

        kv = self._kv
        assert kv is not None
        await asyncio.gather(*(kv.put(uid, encode(p)) for uid, p in pending.items()))

    async def close(self) -> None:
        self._kv = None


class NatsDurableSource:
    def __init__(
        self,
        settings: Settings,
        group: str,
        positions: PositionStore | None,
        *,
        from_start: bool,
        commit_interval: float = 1.0,
        max_ack_pending: int = 1000,
        ack_wait: float = 30.0,
        lease_seconds: float = 5.0,
        batch: int = 200,
    ) -> None:
        self.settings = settings
        self.group = group
        self.durable = re.sub(r"[^A-Za-z0-9_-]", "_", group)
        self._positions = positions
        self.from_start = from_start
        self.commit_interval = commit_interval
        self.max_ack_pending = max_ack_pending
        self.ack_wait = ack_wait
        self.lease_seconds = lease_seconds
        self.batch = min(batch, max_ack_pending)
        self.worker = uuid.uuid4().hex[:12]
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._lease: KeyValue | None = None
        self._lease_rev = 0
        self._lease_lost = False
        self._renewer: asyncio.Task[None] | None = None
        self._sub: Any = None
        self._done: list[Any] = []
        self._last_commit = time.monotonic()

    @property
    def positions(self) -> PositionStore:
        assert self._positions is not None, "start() first"
        return self._positions

    @property
    def js(self) -> JetStreamContext:
        assert self._js is not None, "start() first"
        return self._js

    async def start(self) -> None:
        from bridge.ground.nats import connect

        n = self.settings.sink.nats
        self._nc = await connect(
            n.servers,
            credentials=n.credentials,
            nkey_seed=n.nkey_seed,
            tls=self.settings.sink.nats.tls_context(),
            name=f"k8s-bridge-consumer-{self.group}",
        )
        self._js = self._nc.jetstream()
        if self._positions is None:
            self._positions = NatsKvPositions(self._js, bucket_name(self.group, "positions"))
        await self._positions.open()
        bucket = bucket_name(self.group, "lease")
        try:
            self._lease = await self.js.key_value(bucket)
        except nats.js.errors.BucketNotFoundError:
            self._lease = await self.js.create_key_value(
                KeyValueConfig(bucket=bucket, history=1, ttl=self.lease_seconds)
            )

    async def _acquire(self) -> None:
        """Wait until this worker holds the lease, then start the durable at its ack floor."""
        kv = self._lease
        assert kv is not None
        waited = False
        while True:
            try:
                self._lease_rev = await kv.create("holder", self.worker.encode())
                break
            except KeyWrongLastSequenceError:
                if not waited:
                    log.info("waiting for the group's lease", group=self.group)
                    waited = True
                await asyncio.sleep(min(1.0, self.lease_seconds / 4))
        self._lease_lost = False
        self._renewer = asyncio.create_task(self._renew(), name=f"lease-{self.group}")
        await self.positions.assigned([0])
        await self._subscribe()
        log.info("holding the group's lease", group=self.group, worker=self.worker)

    async def _renew(self) -> None:
        kv = self._lease
        assert kv is not None
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                self._lease_rev = await kv.update(
                    "holder", self.worker.encode(), last=self._lease_rev
                )
            except KeyWrongLastSequenceError:
                self._lease_lost = True  # another worker took it: stop reading
                return
            except (nats.errors.Error, TimeoutError) as e:
                log.warning("lease renewal failed", group=self.group, error=repr(e))

    async def _subscribe(self) -> None:
        n = self.settings.sink.nats
        js = self.js
        config = ConsumerConfig(
            durable_name=self.durable,
            ack_policy=AckPolicy.EXPLICIT,
            max_ack_pending=self.max_ack_pending,
            ack_wait=self.ack_wait,
            filter_subject=f"k8s.{nats_token(self.settings.cluster.name)}.>",
        )
        try:
            info = await js.consumer_info(n.stream, self.durable)
        except NotFoundError:
            config.deliver_policy = DeliverPolicy.ALL if self.from_start else DeliverPolicy.NEW
        else:
            # Everything not acknowledged, again and in order (see the module doc).
            config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
            config.opt_start_seq = info.ack_floor.stream_seq + 1 if info.ack_floor else 1
            await js.delete_consumer(n.stream, self.durable)
        try:
            self._sub = await js.pull_subscribe(
                config.filter_subject or "", durable=self.durable, stream=n.stream, config=config
            )
        except NotFoundError as e:
            raise SinkError(f"NATS stream {n.stream!r} not found (nothing published yet?)") from e

    async def messages(self) -> AsyncIterator[Incoming]:
        await self._acquire()
        while True:
            if self._lease_lost:
                raise SinkError(f"group {self.group!r}: another worker took the lease")
            if self._done and time.monotonic() - self._last_commit >= self.commit_interval:
                await self._commit()
            try:
                msgs = await self._sub.fetch(self.batch, timeout=0.5)
            except TimeoutError:  # nats-py raises its own and, from fetch, asyncio's
                if self._done:
                    await self._commit()
                continue
            except nats.errors.Error as e:
                raise SinkUnavailableError(
                    f"NATS: cannot read durable {self.durable!r}: {e!r}"
                ) from e
            for msg in msgs:
                if self._done and time.monotonic() - self._last_commit >= self.commit_interval:
                    await self._commit()  # within a batch too: it bounds what comes again
                yield Incoming(msg.data, 0, msg)

    async def done(self, message: Incoming) -> None:
        self._done.append(message.token)

    async def _commit(self) -> None:
        self._last_commit = time.monotonic()
        await self.positions.flush()
        done, self._done = self._done, []
        for msg in done:
            await msg.ack()
        if done and self._nc is not None:
            await self._nc.flush()

    async def close(self) -> None:
        try:
            if self._sub is not None and self._nc is not None and self._nc.is_connected:
                await self._commit()
        finally:
            if self._renewer is not None:
                self._renewer.cancel()
                await asyncio.gather(self._renewer, return_exceptions=True)
                self._renewer = None
                if self._lease is not None and not self._lease_lost:
                    try:  # hand over now rather than after the lease expires
                        await self._lease.delete("holder", last=self._lease_rev)
                    except (nats.errors.Error, TimeoutError, KeyWrongLastSequenceError):
                        pass
            if self._nc is not None:
                from bridge.ground.nats import close_quietly

                await close_quietly(self._nc)
                self._nc = None
