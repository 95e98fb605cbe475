"""How many of a replay's messages the bus kept, read back from the bus itself.

A replayed event keeps its CloudEvent ``id`` but carries a ``Nats-Msg-Id`` of
its own run (``{id}:replay:{run}``), so JetStream's duplicate window does not
take it for a redelivery of the original. The stream may still drop some of
them (a batch the sink resent after lost acks), and the sink does not surface
the PubAck's ``duplicate`` flag, so the count comes from the stream: the
messages after its last sequence before the replay began, read headers only,
whose ``Nats-Msg-Id`` carries this run's suffix. Counting by suffix rather
than by the difference of sequences leaves out what a running bridge
publishes to the same stream meanwhile.

Kafka keeps every record it acknowledged (it drops nothing by id across
producers), so there the count is what the sink had acknowledged.
"""

from __future__ import annotations

import ssl
from typing import Protocol

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy

from bridge.errors import SinkUnavailableError
from bridge.ground.nats import MSG_ID, close_quietly, connect


class StoredCounter(Protocol):
    async def start(self) -> None:
        """Note where the bus stands before anything is published."""

    async def count(self, acked: int) -> int | None:
        """How many of the ``acked`` messages published since ``start`` the bus kept; None: unknown."""

    async def close(self) -> None: ...


class AckedCounter:
    """For buses that keep every message they acknowledge."""

    async def start(self) -> None:
        return None

    async def count(self, acked: int) -> int | None:
        return acked

    async def close(self) -> None:
        return None


class JetStreamCounter:
    """Counts the messages of one replay run in a JetStream stream (see the module docstring)."""

    def __init__(
        self,
        servers: list[str],
        stream: str,
        msg_id_suffix: str,
        *,
        credentials: str | None = None,
        nkey_seed: str | None = None,
        tls: ssl.SSLContext | None = None,
        timeout: float = 5.0,
    ) -> None:
        self.servers = servers
        self.stream = stream
        self.suffix = msg_id_suffix
        self._credentials = credentials
        self._nkey_seed = nkey_seed
        self._tls = tls
        self._timeout = timeout
        self._nc: Client | None = None
        self._since = 0

    @property
    def where(self) -> str:
        return ",".join(self.servers)

    async def start(self) -> None:
        self._nc = await connect(
            self.servers,
            credentials=self._credentials,
            nkey_seed=self._nkey_seed,
            tls=self._tls,
            name="k8s-bridge-replay-count",
        )
        try:
            self._since = await self._last_seq()
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            raise SinkUnavailableError(
                f"NATS at {self.where}: cannot read stream {self.stream!r}: {exc!r}"
            ) from exc

    async def _last_seq(self) -> int:
        assert self._nc is not None
        info = await self._nc.jetstream(timeout=self._timeout).stream_info(self.stream)
        return int(info.state.last_seq)

    async def count(self, acked: int) -> int | None:
        if acked == 0:
            return 0
        try:
            end = await self._last_seq()
            if end <= self._since:
                return 0
            return await self._scan(end)
        except (nats.errors.Error, TimeoutError, OSError):
            return None

    async def _scan(self, end: int) -> int:
        assert self._nc is not None
        js = self._nc.jetstream(timeout=self._timeout)
        sub = await js.subscribe(
            "",  # no filter: every message after the mark, whatever its subject
            stream=self.stream,
            ordered_consumer=True,
            headers_only=True,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            config=ConsumerConfig(opt_start_seq=self._since + 1),
        )
        kept: set[str] = set()
        try:
            while True:
                msg = await sub.next_msg(timeout=self._timeout)
                msg_id = (msg.headers or {}).get(MSG_ID, "")
                if msg_id.endswith(self.suffix):
                    kept.add(msg_id)
                md = msg.metadata
                if md.sequence.stream >= end or md.num_pending == 0:
                    return len(kept)
        finally:
            try:
                await sub.unsubscribe()
            except nats.errors.Error:
                pass  # the ephemeral consumer goes away with the connection anyway

    async def close(self) -> None:
        nc, self._nc = self._nc, None
        if nc is not None:
            await close_quietly(nc)
