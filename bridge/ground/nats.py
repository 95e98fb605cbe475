"""NATS connections and the pipelined JetStream publisher, on nats-py's public API:
what the sink, the NATS KV checkpoint store, ``check`` and the consumer share.

nats-py's ``js.publish`` sends one message and awaits its PubAck before the
next: one round trip per event, a few thousand events/s. Here messages go out
as plain core-NATS publishes (``nc.publish`` with a reply subject) under one
inbox subscription of the publisher's own; JetStream answers each with a
PubAck on its reply subject. A bounded window of unacknowledged messages keeps
memory and the server's pending queue in check.

nats-py's ``js.publish_async`` pipelines too, but gives a future per message
that never times out and is not failed by a disconnect; the batch here knows
which message is the first without an answer, which is what a retry needs.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import nats
import nats.errors
import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from bridge.errors import SinkUnavailableError

log = logging.getLogger(__name__)

MSG_ID = "Nats-Msg-Id"
# How a PubAck error starts when no stream serves the subject right now (a stream
# electing its leader, or none at all).
NO_RESPONDERS = "no responders"

# Where nats-py's Msg keeps the status of a header block (``NATS/1.0 503``).
_STATUS = "Status"
_NOT_IN_SUBJECT = re.compile(r"\s")
# Below nats-py's default ``pending_size`` (2 MB), past which a publish waits on its
# flusher, and below the mmap threshold the bridge sets (bridge/service/tuning.py):
# the flusher joins what is queued into one buffer, which then reuses heap memory.
_FLUSH_EVERY = 256 << 10

Outgoing = tuple[str, bytes, dict[str, str] | None]


class PublishTimeout(Exception):
    """Not every message of a batch was acknowledged in time (or the connection dropped)."""

    def __init__(self, message: str, batch: _Batch) -> None:
        super().__init__(message)
        self.batch = batch

    @property
    def first_unacked(self) -> int:
        acked = self.batch.acked
        return next((i for i, ok in enumerate(acked) if not ok), len(acked))


@dataclass(slots=True)
class _Batch:
    remaining: int
    done: asyncio.Event = field(default_factory=asyncio.Event)
    acked: list[bool] = field(default_factory=list)
    errors: dict[int, str] = field(default_factory=dict)
    transport_error: str | None = None


class JetStreamPublisher:
    """Pipelined JetStream publishes over one core-NATS connection.

    ``publish`` sends messages in order and returns when each has a PubAck,
    raising ``PublishTimeout`` (or returning errors per index) otherwise. Also
    used by the NATS KV checkpoint store: a KV put is a publish to
    ``$KV.<bucket>.<key>``.
    """

    def __init__(self, nc: Client, *, max_in_flight: int = 2048, ack_timeout: float = 5.0) -> None:
        self._nc = nc
        self._max_in_flight = max(1, max_in_flight)
        self._ack_timeout = ack_timeout
        self._inbox = ""
        self._sub: Subscription | None = None
        self._pending: dict[int, tuple[_Batch, int]] = {}
        self._seq = 0
        self._window_open = asyncio.Event()
        self._window_open.set()

    async def start(self) -> None:
        nc = self._nc
        self._inbox = nc.new_inbox()
        self._sub = await nc.subscribe(
            self._inbox + ".*", cb=self._ack_msg, pending_msgs_limit=self._max_in_flight * 4
        )

    async def stop(self) -> None:
        self.fail_all("publisher stopped")
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except (nats.errors.Error, OSError):
                pass  # the subscription stops processing before the UNSUB is sent

    def fail_all(self, reason: str) -> None:
        """Wake every waiting batch with a transport error (disconnect, stop)."""
        for batch, _ in self._pending.values():
            batch.transport_error = reason
            batch.done.set()
        self._pending.clear()
        self._window_open.set()

    async def _ack_msg(self, msg: Msg) -> None:
        """One PubAck (or error) on the inbox: settles its message of a batch."""
        try:
            token = int(msg.subject.rpartition(".")[2])
        except ValueError:
            return
        status = msg.headers.get(_STATUS) if msg.headers else None
        self._settle(token, msg.data, status)

    def _settle(self, token: int, data: bytes, status: str | None = None) -> None:
        """The answer to the message sent with reply token ``token``."""
        entry = self._pending.pop(token, None)
        if entry is None:
            return  # a late ack of a batch that already gave up
        batch, index = entry
        error: str | None = None
        if status == "503":
            error = "no responders: no stream stores this subject"
        elif not data:
            error = "empty PubAck"
        elif b'"error"' in data:
            # A plain PubAck ({"stream":..,"seq":..}) needs no parsing: only errors do.
            try:
                ack: dict[str, Any] = orjson.loads(data)
            except orjson.JSONDecodeError:
                error = f"unreadable PubAck {data[:80]!r}"
            else:
                err = ack.get("error") or {}
                error = f"{err.get('code')}/{err.get('err_code')}: {err.get('description')}"
        if error is None:
            batch.acked[index] = True
        else:
            batch.errors[index] = error
        batch.remaining -= 1
        if batch.remaining == 0:
            batch.done.set()
        if len(self._pending) <= self._max_in_flight // 2:
            self._window_open.set()

    async def publish(self, messages: Sequence[Outgoing]) -> _Batch:
        """Send ``messages`` in order; return the batch (``acked``, ``errors``).

        Raises ``PublishTimeout`` if acks did not all arrive, ``nats.errors.Error``
        if the connection refused a publish.
        """
        batch = _Batch(remaining=len(messages), acked=[False] * len(messages))
        if not messages:
            return batch
        nc = self._nc
        pending = self._pending
        prefix = self._inbox + "."
        tokens: list[int] = []
        total = len(messages)
        index = 0
        try:
            while index < total and batch.transport_error is None:
                room = self._max_in_flight - len(pending)
                if room <= 0:
                    self._window_open.clear()
                    async with asyncio.timeout(self._ack_timeout):
                        await self._window_open.wait()
                    continue
                end = min(total, index + room)
                # A message nats-py would refuse stops its window before any of it
                # leaves: a refusal half-way would leave a gap in the order.
                _check_window(messages, index, end, nc.max_payload)
                queued = 0
                async with asyncio.timeout(self._ack_timeout):
                    for i in range(index, end):
                        subject, payload, headers = messages[i]
                        self._seq += 1
                        token = self._seq
                        pending[token] = (batch, i)
                        tokens.append(token)
                        await nc.publish(
                            subject, payload, reply=prefix + str(token), headers=headers
                        )
                        queued += len(payload)
                        if queued >= _FLUSH_EVERY:
                            # nats-py queues what ``publish`` gets and its flusher task
                            # writes it once it runs; past ``pending_size`` each publish
                            # waits for that flusher, which a disconnect may leave
                            # waiting. Letting it run keeps the queue below that.
                            queued = 0
                            await asyncio.sleep(0)
                        if batch.transport_error is not None:
                            break  # a disconnect: the retry resends from here
                index = end
            if batch.transport_error is None:
                async with asyncio.timeout(self._ack_timeout):
                    await batch.done.wait()
        except TimeoutError as exc:
            raise PublishTimeout(
                f"{batch.remaining} of {len(messages)} messages unacknowledged "
                f"after {self._ack_timeout}s",
                batch,
            ) from exc
        finally:
            for token in tokens:
                pending.pop(token, None)
            if len(pending) <= self._max_in_flight // 2:
                self._window_open.set()
        if batch.transport_error is not None:
            raise PublishTimeout(batch.transport_error, batch)
        return batch


def _check_window(messages: Sequence[Outgoing], start: int, end: int, max_payload: int) -> None:
    """Raise what ``nc.publish`` would raise for one of ``messages[start:end]``."""
    for i in range(start, end):
        subject, payload, headers = messages[i]
        if not subject or _NOT_IN_SUBJECT.search(subject):
            raise nats.errors.BadSubjectError(f"invalid subject {subject!r}")
        if len(payload) > max_payload:
            raise nats.errors.MaxPayloadError(
                f"message {i} is {len(payload)} bytes; the server takes {max_payload}"
            )
        if headers and not (len(headers) == 1 and MSG_ID in headers):
            for key in headers:
                if not key or _NOT_IN_SUBJECT.search(key) or ":" in key:
                    raise nats.errors.BadHeaderError(key)


def drop_queued(nc: Client) -> None:
    """Empty nats-py's outgoing queue, if it still keeps it where this expects.

    nats-py sends what it queued before a disconnect once it reconnects, ahead
    of the retries of what died with the socket; its public API has no way to
    drop it. This is the sink's one reach into nats-py's private parts; a
    nats-py that keeps the queue elsewhere is left alone.
    """
    if isinstance(getattr(nc, "_pending", None), list) and hasattr(nc, "_pending_data_size"):
        nc._pending = []
        nc._pending_data_size = 0


async def close_quietly(nc: Client) -> None:
    """Close a connection, also one whose server is gone.

    nats-py flushes its reconnect buffer on close and raises
    ConnectionResetError half-way when the socket is dead, leaving its
    subscription tasks behind. Nothing buffered matters once we close: every
    unacknowledged publish is retried by the caller anyway.
    """
    if not nc.is_connected:
        drop_queued(nc)
    try:
        await nc.close()
    except (nats.errors.Error, OSError):
        pass


async def _quiet_error(exc: Exception) -> None:
    log.debug("nats connection error: %r", exc)


async def connect(
    servers: list[str],
    *,
    connect_timeout: float = 5.0,
    credentials: str | None = None,
    nkey_seed: str | None = None,
    tls: ssl.SSLContext | None = None,
    on_disconnect: Any = None,
    name: str = "k8s-bridge",
) -> Client:
    """Connect to NATS; the first connect fails fast, later reconnects never give up."""
    options: dict[str, Any] = {
        "servers": servers,
        "name": name,
        "connect_timeout": connect_timeout,
        "allow_reconnect": True,
        # The first connect gives up after two rounds over the servers (a bad
        # address must fail start); once connected, reconnect forever.
        "max_reconnect_attempts": 1,
        "reconnect_time_wait": 0.5,
        "error_cb": _quiet_error,
    }
    if on_disconnect is not None:
        options["disconnected_cb"] = on_disconnect
    if credentials:
        options["user_credentials"] = credentials
    if nkey_seed:
        options["nkeys_seed"] = nkey_seed
    if tls is not None:
        options["tls"] = tls
    try:
        nc = await nats.connect(**options)
    except (nats.errors.Error, OSError, TimeoutError) as exc:
        raise SinkUnavailableError(
            f"cannot connect to NATS at {','.join(servers)}: {exc!r}"
        ) from exc
    nc.options["max_reconnect_attempts"] = -1
    return nc
