"""Checkpoints in a NATS JetStream key-value bucket (for bridges with no disk).

Layout, per resource id R (keys base64url-encoded, as KV keys allow only
``[-/_=.a-zA-Z0-9]`` and object names may hold ``:``):

    <R>.d.<key>   one value per object digest: JSON [uid, resourceVersion, fingerprint]
                  or, written ahead of a publish, [uid, rv, fingerprint, state, prior]
    <R>.w         the watermark: the resourceVersion as a JSON string, written last
                  (JSON so an empty watermark is a value, not an empty message)

Why not one value per resource: a large resource (100k objects) would exceed
the server's max payload, and every flush would rewrite all of it. Why
digests first and the watermark last: JetStream KV has no multi-key
transaction, so a crash between the two leaves digests *ahead* of the
watermark, never behind. That is safe because a checkpoint is only written
after the sink acknowledged the events: on restart the watch replays from the
older watermark, the replayed adds and updates match the newer digests and
publish nothing (they were published), and a replayed delete is published
again with the same event id (a recognisable redelivery). A watermark ahead of
its digests, the other order, could lose a change; that order is never written.

Writes go through the pipelined ``JetStreamPublisher`` (a KV put is a publish
to ``$KV.<bucket>.<key>``), one batch per commit, so a flush of thousands of
digests costs about one round trip, not thousands. Commits go one at a time, in
the order they were called, as SQLite's do: a row read later lands later.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Iterable

import nats.errors
import nats.js.api
import nats.js.errors
import orjson
from nats.aio.client import Client
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from bridge.checkpoints.base import Checkpoint
from bridge.errors import CheckpointError, SinkError
from bridge.ground.digest import Digest
from bridge.ground.nats import (
    NO_RESPONDERS,
    JetStreamPublisher,
    Outgoing,
    PublishTimeout,
    close_quietly,
    connect,
    drop_queued,
)
from bridge.ground.natsconfig import tls_context

_KV_OP = "KV-Operation"
_KV_MARKER = "Nats-Marker-Reason"
_DEL = {_KV_OP: "DEL"}


def _digest_value(d: Digest) -> bytes:
    if d.state or d.prior:
        return orjson.dumps([d.uid, d.resource_version, d.fingerprint, d.state, d.prior])
    return orjson.dumps([d.uid, d.resource_version, d.fingerprint])


def _watermark(value: bytes | None) -> str:
    """The stored watermark: a JSON string; a bare one was written by older versions."""
    if not value:
        return ""
    try:
        decoded = orjson.loads(value)
    except orjson.JSONDecodeError:
        return value.decode()
    return decoded if isinstance(decoded, str) else value.decode()


def _enc(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=") or "-"


def _dec(token: str) -> str:
    if token == "-":
        return ""
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()


class NatsKvCheckpointStore:
    def __init__(
        self,
        servers: list[str] | str,
        bucket: str = "k8s-bridge",
        *,
        connect_timeout: float = 5.0,
        ack_timeout: float = 10.0,
        credentials: str | None = None,
        nkey_seed: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        self.servers = [servers] if isinstance(servers, str) else list(servers)
        self.bucket = bucket
        self.connect_timeout = connect_timeout
        self.ack_timeout = ack_timeout
        self.credentials = credentials
        self.nkey_seed = nkey_seed
        self.tls_ca, self.tls_cert, self.tls_key = tls_ca, tls_cert, tls_key
        self._prefix = f"$KV.{bucket}."
        self._nc: Client | None = None
        self._kv: KeyValue | None = None
        self._js: JetStreamContext | None = None
        self._publisher: JetStreamPublisher | None = None
        # One commit's puts at a time, in call order (the lock is first come, first
        # served): the publisher interleaves concurrent batches once its window is
        # full, and a write-ahead row must land after a commit step read before it.
        self._writes = asyncio.Lock()

    @property
    def where(self) -> str:
        return f"NATS KV bucket {self.bucket!r} at {','.join(self.servers)}"

    async def _connect(self) -> Client:
        try:
            return await connect(
                self.servers,
                connect_timeout=self.connect_timeout,
                credentials=self.credentials,
                nkey_seed=self.nkey_seed,
                tls=tls_context(self.tls_ca, self.tls_cert, self.tls_key),
                on_disconnect=self._on_disconnect,
            )
        except SinkError as exc:
            raise CheckpointError(f"{self.where}: {exc}") from exc

    async def _on_disconnect(self) -> None:
        # As the sink does (bridge/sinks/nats.py): the puts waiting for an ack from
        # the server just lost fail now, rather than after ack_timeout, and the
        # frames queued behind them are dropped, so the retry resends them in order
        # over the next server (a write-ahead row must not land before one read
        # earlier). With the bucket's leader killed, this is ack_timeout sooner.
        nc = self._nc
        if nc is not None:
            drop_queued(nc)
        if self._publisher is not None:
            self._publisher.fail_all(f"disconnected from NATS at {','.join(self.servers)}")

    async def probe(self) -> str:
        """What ``open`` would find, without creating a missing bucket
        (``k8s-bridge check``); raises ``CheckpointError`` as ``open`` does."""
        nc = await self._connect()
        try:
            js = nc.jetstream(timeout=self.connect_timeout)
            try:
                await js.key_value(self.bucket)
            except nats.js.errors.BucketNotFoundError:
                return (
                    f"bucket {self.bucket!r} does not exist yet: the first start creates it"
                    " (history 1)"
                )
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            raise CheckpointError(f"{self.where}: cannot open: {exc!r}") from exc
        finally:
            await close_quietly(nc)
        return f"bucket {self.bucket!r} exists"

    async def open(self) -> None:
        if self._nc is not None:
            return
        nc = await self._connect()
        try:
            js = nc.jetstream(timeout=self.connect_timeout)
            try:
                kv = await js.key_value(self.bucket)
            except nats.js.errors.BucketNotFoundError:
                kv = await js.create_key_value(bucket=self.bucket, history=1)
            publisher = JetStreamPublisher(nc, ack_timeout=self.ack_timeout)
            await publisher.start()
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            await close_quietly(nc)
            raise CheckpointError(f"{self.where}: cannot open: {exc!r}") from exc
        self._nc, self._kv, self._publisher, self._js = nc, kv, publisher, js

    def _parts(self) -> tuple[KeyValue, JetStreamPublisher]:
        if self._kv is None or self._publisher is None:
            raise CheckpointError(f"{self.where}: store is not open")
        return self._kv, self._publisher

    async def load(self, resource_id: str) -> Checkpoint | None:
        kv, _ = self._parts()
        rid = _enc(resource_id)
        try:
            watermark: str | None = None
            try:
                entry = await kv.get(f"{rid}.w")
            except nats.js.errors.KeyNotFoundError:
                pass
            else:
                watermark = _watermark(entry.value)
            digests = await self._read_digests(rid)
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            raise CheckpointError(f"{self.where}: cannot load {resource_id}: {exc!r}") from exc
        if watermark is None and not digests:
            return None
        return Checkpoint(watermark or "", digests)

    async def watermark(self, resource_id: str) -> str | None:
        kv, _ = self._parts()
        try:
            entry = await kv.get(f"{_enc(resource_id)}.w")
        except nats.js.errors.KeyNotFoundError:
            return None
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            raise CheckpointError(f"{self.where}: cannot read {resource_id}: {exc!r}") from exc
        return _watermark(entry.value)

    async def resource_ids(self) -> list[str]:
        """Every resource id with a watermark (a resource whose first commit has landed).

        Read from the watermark subjects alone (``*.w``: an encoded id holds no dot),
        so a bucket of a million digests lists in one short read."""
        try:
            found = await self._last_values(f"{self._prefix}*.w")
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            raise CheckpointError(f"{self.where}: cannot list resources: {exc!r}") from exc
        prefix = len(self._prefix)
        return sorted(_dec(subject[prefix:].split(".", 1)[0]) for subject, _ in found)

    async def _read_digests(self, rid: str) -> dict[str, Digest]:
        """Every digest of one resource, read through a pull consumer.

        Not through ``KeyValue.watch``: its "no more initial values" marker is
        decided from the consumer's pending count while pushed messages may
        still sit unread in the client, so under load it can come first and a
        load would see an empty bucket. A pull consumer's pending count is
        exact before the first fetch, and every message says how many follow.
        """
        digests: dict[str, Digest] = {}
        for subject, data in await self._last_values(f"{self._prefix}{rid}.d.>"):
            key = _dec(subject.rsplit(".", 1)[1])
            digests[key] = Digest(key, *orjson.loads(data))
        return digests

    async def _last_values(self, subjects: str) -> list[tuple[str, bytes]]:
        """(subject, value) of every live key matching ``subjects``, read through a pull
        consumer (see ``_read_digests``); deleted keys and markers left out."""
        if self._js is None:
            raise CheckpointError(f"{self.where}: store is not open")
        config = nats.js.api.ConsumerConfig(
            deliver_policy=nats.js.api.DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=nats.js.api.AckPolicy.NONE,
            inactive_threshold=60.0,
        )
        sub = await self._js.pull_subscribe(subjects, stream=f"KV_{self.bucket}", config=config)
        found: list[tuple[str, bytes]] = []
        consumer = ""
        try:
            info = await sub.consumer_info()
            consumer, remaining = info.name or "", info.num_pending or 0
            while remaining > 0:
                msgs = await sub.fetch(min(remaining, 2048), timeout=self.ack_timeout)
                for msg in msgs:
                    remaining = msg.metadata.num_pending or 0
                    headers = msg.headers or {}
                    if _KV_OP in headers or _KV_MARKER in headers or not msg.data:
                        continue  # a deleted key (or a server-placed marker)
                    found.append((msg.subject, msg.data))
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            if consumer:
                with contextlib.suppress(Exception):
                    await self._js.delete_consumer(f"KV_{self.bucket}", consumer)
        return found

    async def commit(
        self,
        resource_id: str,
        resource_version: str | None,
        upserts: Iterable[Digest],
        deletes: Iterable[str],
    ) -> None:
        _, publisher = self._parts()
        rid = _enc(resource_id)
        base = f"{self._prefix}{rid}.d."
        # Deletes before upserts (a delete and re-create in one flush keeps the new one).
        digests: list[Outgoing] = [(base + _enc(key), b"", _DEL) for key in deletes]
        digests += [(base + _enc(d.key), _digest_value(d), None) for d in upserts]
        batches = [digests]
        if resource_version is not None:
            batches.append([(f"{self._prefix}{rid}.w", orjson.dumps(resource_version), None)])
        try:
            async with self._writes:
                for batch in batches:
                    if not batch:
                        continue
                    result = await publisher.publish(batch)
                    if result.errors:
                        first = min(result.errors)
                        error = result.errors[first]
                        raise CheckpointError(
                            f"{self.where}: commit of {resource_id} rejected: {error}",
                            soon=error.startswith(NO_RESPONDERS),
                        )
        except (PublishTimeout, nats.errors.Error, OSError) as exc:
            raise CheckpointError(f"{self.where}: commit of {resource_id}: {exc}") from exc

    async def close(self) -> None:
        nc, publisher = self._nc, self._publisher
        self._nc = self._kv = self._publisher = self._js = None
        if publisher is not None:
            await publisher.stop()
        if nc is not None:
            await close_quietly(nc)
