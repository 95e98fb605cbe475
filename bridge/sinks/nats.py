"""NATS JetStream sink, with a pipelined publish path.

nats-py's ``js.publish`` sends one message and awaits its PubAck before the
next: one round trip per event, a few thousand events/s. Here messages go out
as plain core-NATS publishes whose reply subjects live under one inbox
subscription; JetStream answers each with a PubAck on its reply subject, and
the acks of a batch are matched in bulk (one counter and one wake-up per
batch, no future per message). A bounded window of unacknowledged messages
keeps memory and the server's pending queue in check.

Order per subject: one connection delivers in order and JetStream stores in
arrival order. A batch that is not fully acknowledged (timeout, error,
disconnect) is resent from its first unacknowledged message onwards, in the
original order; messages that did land are dropped by the stream's duplicate
window, as each carries ``Nats-Msg-Id`` = event id.

Both shortcuts (``_send``, ``_take_acks``) reach into nats-py's private parts.
``JetStreamPublisher.start`` checks they are all there and shaped as expected
(``_fast_path_fits``); a nats-py that reshaped them gets its public API
instead (``publish`` per message, a subscription callback per ack): slower,
never wrong.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import logging
import re
import ssl
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import nats
import nats.errors
import nats.js.errors
import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from bridge.delivery.events import Event
from bridge.errors import SinkError, SinkUnavailableError

if TYPE_CHECKING:
    from bridge.service.settings import NatsSettings

log = logging.getLogger(__name__)

MSG_ID = "Nats-Msg-Id"

# What an HPUB's header block adds to a message besides the id itself
# ("NATS/1.0\r\n" + "Nats-Msg-Id: " + "\r\n\r\n"): counted against max_payload.
_HEADER_OVERHEAD = 10 + len(MSG_ID) + 2 + 4
_NO_STREAM = "no responders"
# Where nats-py's public Msg keeps the status of a header block (``NATS/1.0 503``).
_STATUS = "Status"
# Frames are written to the socket in pieces of about this size (``_send``): below
# glibc's mmap threshold as the bridge sets it (bridge/service/runtime.py).
WRITE_PIECE = 64 << 10

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
        self._fast = True  # decided by ``start``

    async def start(self) -> None:
        nc = self._nc
        self._inbox = nc.new_inbox()
        # With the fallback's callback either way: whether the fast path fits is
        # known only once the subscription (its private sid) exists.
        self._sub = sub = await nc.subscribe(
            self._inbox + ".*", cb=self._ack_msg, pending_msgs_limit=self._max_in_flight * 4
        )
        self._fast = _fast_path_fits(nc, sub)
        if self._fast:
            # The callback never runs: ``_take_acks`` takes this subscription's
            # messages off the connection's read loop before nats-py sees them.
            _take_acks(nc, sub._id, self._ack, self._inbox + ".", self._settle)
        else:
            log.warning(
                "nats-py %s: its internals differ from the ones the fast publish path"
                " was built for; publishing through its public API (slower)",
                _nats_py_version(),
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

    def _ack(self, subject: bytes, data: bytes, headers: bytes | None) -> None:
        """One PubAck (or error) off the read loop: settles its message of a batch."""
        try:
            token = int(subject.rpartition(b".")[2])
        except ValueError:
            return
        self._settle(token, data, headers)

    async def _ack_msg(self, msg: Msg) -> None:
        """One PubAck (or error) as nats-py's public API hands it over: the fallback's."""
        status = msg.headers.get(_STATUS) if msg.headers else None
        # ``_settle`` reads a status from the raw header block the fast path sees.
        self._ack(
            msg.subject.encode(), msg.data, b"NATS/1.0 %b\r\n" % status.encode() if status else None
        )

    def _settle(self, token: int, data: bytes, headers: bytes | None = None) -> None:
        """The answer to the message sent with reply token ``token``."""
        entry = self._pending.pop(token, None)
        if entry is None:
            return  # a late ack of a batch that already gave up
        batch, index = entry
        error: str | None = None
        if headers and _status(headers) == b"503":
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
        pending = self._pending
        prefix = self._inbox + "."
        tokens: list[int] = []
        total = len(messages)
        index = 0
        max_payload = self._nc.max_payload
        try:
            while index < total and batch.transport_error is None:
                room = self._max_in_flight - len(pending)
                if room <= 0:
                    self._window_open.clear()
                    async with asyncio.timeout(self._ack_timeout):
                        await self._window_open.wait()
                    continue
                # Everything the window allows goes out as one write: the
                # protocol frames are built here, queued together and flushed once.
                end = min(total, index + room)
                frames: list[bytes] = []
                for i in range(index, end):
                    subject, payload, headers = messages[i]
                    if len(payload) > max_payload:
                        raise nats.errors.MaxPayloadError(
                            f"message {i} is {len(payload)} bytes; the server takes {max_payload}"
                        )
                    self._seq += 1
                    token = self._seq
                    pending[token] = (batch, i)
                    tokens.append(token)
                    frames.append(_frame(subject, prefix + str(token), payload, headers))
                if self._fast:
                    await self._send(frames)
                else:
                    # ``_frame`` checked each message as the fast path does; nats-py
                    # encodes them again.
                    await self._publish_each(messages[index:end], prefix, tokens[index - end :])
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

    async def _publish_each(
        self, messages: Sequence[Outgoing], prefix: str, tokens: list[int]
    ) -> None:
        """The fallback's ``_send``: nats-py's own publish, one message after the other."""
        publish = self._nc.publish
        for (subject, payload, headers), token in zip(messages, tokens, strict=True):
            await publish(subject, payload, reply=prefix + str(token), headers=headers or None)

    async def _send(self, frames: list[bytes]) -> None:
        """Hand ready-made PUB/HPUB frames to the connection, in order.

        nats-py offers no batch publish: ``publish`` re-encodes headers and
        queues one frame per await. Its outgoing queue (``_pending``, flushed by
        its flusher task, buffered while reconnecting) is where each of those
        frames ends up. While that queue is empty, everything queued before
        these frames is already with the socket, so they go to the socket too,
        in pieces below ``WRITE_PIECE``: the flusher joins its whole queue into
        one buffer (1.4 MB for a batch of 500 pods), which on Python 3.11 is
        freshly mapped memory each time, 0.8 ms of page faults per batch.
        Otherwise (reconnecting, or frames still queued) they join the queue,
        with nats-py's own checks.
        """
        nc = self._nc
        if nc.is_closed:
            raise nats.errors.ConnectionClosedError
        size = sum(map(len, frames))
        transport = nc._transport
        if nc.is_connected and not nc._pending and transport is not None:
            nc.stats["out_msgs"] += len(frames)
            nc.stats["out_bytes"] += size
            piece: list[bytes] = []
            piece_size = 0
            try:
                for frame in frames:
                    piece.append(frame)
                    piece_size += len(frame)
                    if piece_size >= WRITE_PIECE:
                        transport.write(b"".join(piece))
                        piece, piece_size = [], 0
                if piece:
                    transport.write(b"".join(piece))
                # As the flusher does after a write: wait while the socket is backed up.
                await transport.drain()
            except OSError as exc:
                # The connection broke under the write: nats-py reconnects, and the
                # batch is resent from its first unacknowledged message.
                raise nats.errors.UnexpectedEOF() from exc
            return
        if not nc.is_connected and (
            nc._max_pending_size <= 0 or size + nc._pending_data_size > nc._max_pending_size
        ):
            raise nats.errors.OutboundBufferLimitError
        nc._pending.extend(frames)
        nc._pending_data_size += size
        nc.stats["out_msgs"] += len(frames)
        nc.stats["out_bytes"] += size
        # As nats-py's own publish: one kick of the flusher covers whatever is queued.
        if nc._flush_queue is not None and nc._flush_queue.empty():
            await nc._flush_pending()


_CRLF = b"\r\n"
_HEADER_LINE = b"NATS/1.0\r\n"
_NOT_IN_SUBJECT = re.compile(r"[\s]")
_NOT_IN_HEADER = re.compile(r"[\r\n]")


def _frame(subject: str, reply: str, payload: bytes, headers: dict[str, str] | None) -> bytes:
    """One NATS protocol frame: ``PUB`` or, with headers, ``HPUB`` (NATS/1.0 header block)."""
    if not subject or _NOT_IN_SUBJECT.search(subject):
        raise nats.errors.BadSubjectError(f"invalid subject {subject!r}")
    if not headers:
        head = f"PUB {subject} {reply} {len(payload)}\r\n".encode()
        return b"".join((head, payload, _CRLF))
    if len(headers) == 1 and MSG_ID in headers:
        # Every event's frame: one known header, its value cleaned as below. A third
        # of the general path's cost, paid per event.
        value = headers[MSG_ID].strip()
        if "\r" in value or "\n" in value:
            value = _NOT_IN_HEADER.sub(" ", value)
        block = f"NATS/1.0\r\n{MSG_ID}: {value}\r\n\r\n".encode()
    else:
        parts = [_HEADER_LINE]
        for key, value in headers.items():
            if not key or _NOT_IN_SUBJECT.search(key) or ":" in key:
                raise nats.errors.BadHeaderError(key)
            parts.append(f"{key}: {_NOT_IN_HEADER.sub(' ', value.strip())}\r\n".encode())
        parts.append(_CRLF)
        block = b"".join(parts)
    size = len(block)
    head = f"HPUB {subject} {reply} {size} {size + len(payload)}\r\n".encode()
    return b"".join((head, block, payload, _CRLF))


AckHandler = Callable[[bytes, bytes, "bytes | None"], None]
Settle = Callable[[int, bytes], None]

# nats-py's parser (nats/protocol/parser.py): its state between messages, and the
# longest control line it waits for before it calls the stream broken.
_AWAITING_CONTROL_LINE = 1
_MAX_CONTROL_LINE = 4096


def _take_acks(nc: Client, sid: int, on_ack: AckHandler, inbox: str, settle: Settle) -> None:
    """Hand the messages of subscription ``sid`` to ``on_ack`` straight from the
    connection's read loop: raw subject, payload and header block; and the plain
    ones, PubAcks to ``inbox`` + token, to ``settle(token, payload)`` straight from
    the bytes read.

    nats-py makes each message a ``Msg`` (its headers parsed into a dict), puts
    it on the subscription's queue and wakes a task per message to await the
    callback: ~9% of the bridge's CPU during a burst went to acks that need one
    dict lookup each. The parser hands every message to the client's
    ``_process_msg``; this wraps it, for this one sid (as ``_send`` feeds the
    client's outgoing queue directly). Even so, the parser's own work per
    message (a regex per operation tried, a buffer copied in and cut, a
    coroutine per message) was 6% of the loop's time in a burst, so a read that
    holds acks is taken here first (``_parse_acks``).
    """
    process = nc._process_msg

    # ``headers`` is None for a message without a header block, whatever nats-py declares.
    async def _process_msg(
        msg_sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes
    ) -> None:
        if msg_sid != sid:
            await process(msg_sid, subject, reply, data, headers)
            return
        stats = nc.stats
        stats["in_msgs"] += 1
        stats["in_bytes"] += len(data)
        on_ack(subject, data, headers)

    nc._process_msg = _process_msg  # type: ignore[method-assign,assignment]

    parser = nc._ps
    parse = parser.parse
    # nats-server writes an empty reply field: two spaces between the sid and the size.
    ack = re.compile(rb"MSG %s(\d+) %d +(\d+)\r\n" % (re.escape(inbox.encode()), sid))

    async def _parse_acks(data: bytes = b"") -> None:
        if parser.state != _AWAITING_CONTROL_LINE:
            await parse(data)  # inside a message nats-py started: its own to finish
            return
        if parser.buf:
            # The start of a message a previous read cut off.
            data = bytes(parser.buf) + data
            parser.buf.clear()
        rest, cut = _parse_acks_in(data, ack, settle, nc.stats)
        if cut:
            parser.buf.extend(rest)  # kept, as nats-py keeps it, for the next read
        elif rest:
            await parse(rest)

    parser.parse = _parse_acks  # type: ignore[method-assign]


def _parse_acks_in(
    data: bytes, ack: re.Pattern[bytes], settle: Settle, stats: dict[str, int]
) -> tuple[bytes, bool]:
    """Settle the plain acks at the start of ``data``, in order. Returns what follows
    the last one, and whether it is the start of an operation cut off at the end of
    the read (to keep for the next) rather than an operation that is not a plain ack
    (for nats-py to parse, with everything after it in this read)."""
    match = ack.match
    pos, end = 0, len(data)
    taken = size_taken = 0
    cut = False
    while pos < end:
        m = match(data, pos)
        if m is None:
            # No whole control line yet: cut off, whatever operation it starts.
            cut = end - pos < _MAX_CONTROL_LINE and data.find(b"\r\n", pos) < 0
            break
        start = m.end()
        stop = start + int(m.group(2))
        if stop + 2 > end:
            cut = True  # the payload is still on its way
            break
        settle(int(m.group(1)), data[start:stop])
        taken += 1
        size_taken += stop - start
        pos = stop + 2
    stats["in_msgs"] += taken
    stats["in_bytes"] += size_taken
    return (data[pos:] if pos else data), cut


def _fast_path_fits(nc: Client, sub: Subscription) -> bool:
    """Whether every private part of nats-py that ``_send``, ``_take_acks`` and
    ``_drop_queued`` use is there and shaped as they expect.

    nats-py promises none of them: a release that renames one would make the
    fast path fail at run time, or, worse, misread the stream (a parser state
    renumbered). Checked once per connection, before any of them is used.
    """
    try:
        parser = nc._ps
        transport = nc._transport
        flush_queue = nc._flush_queue
        return (
            isinstance(nc._pending, list)
            and type(nc._pending_data_size) is int
            and type(nc._max_pending_size) is int
            and inspect.iscoroutinefunction(nc._flush_pending)
            and (flush_queue is None or callable(flush_queue.empty))
            and (
                transport is None
                or (callable(transport.write) and inspect.iscoroutinefunction(transport.drain))
            )
            and all(
                type(nc.stats.get(k)) is int
                for k in ("in_msgs", "in_bytes", "out_msgs", "out_bytes")
            )
            and _takes_a_message(nc._process_msg)
            # The parser must reach ``_process_msg`` through this client, where it is wrapped.
            and parser.nc is nc
            and inspect.iscoroutinefunction(parser.parse)
            and isinstance(parser.buf, bytearray)
            and type(parser.state) is int
            and _parser_states_fit(parser)
            and type(sub._id) is int
        )
    except Exception:  # whatever a reshaped nats-py raises, the answer is no
        return False


def _takes_a_message(process_msg: Any) -> bool:
    """``_process_msg(sid, subject, reply, data, headers)``, awaited by the parser."""
    try:
        inspect.signature(process_msg).bind(0, b"", b"", b"", None)
    except (TypeError, ValueError):
        return False
    return inspect.iscoroutinefunction(process_msg)


def _parser_states_fit(parser: Any) -> bool:
    """``_take_acks`` reads the parser's state as the number its module gives "between
    messages"; a module that names no such state is judged by the rest of the check."""
    module = sys.modules.get(type(parser).__module__)
    state = getattr(module, "AWAITING_CONTROL_LINE", _AWAITING_CONTROL_LINE)
    return state == _AWAITING_CONTROL_LINE


def _nats_py_version() -> str:
    try:
        return importlib.metadata.version("nats-py")
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def _drop_queued(nc: Client) -> None:
    """Empty nats-py's outgoing queue, if it still keeps the one ``_send`` knows.

    A nats-py that does not would send what it queued after a reconnect: the
    public API has no way to drop it.
    """
    if isinstance(getattr(nc, "_pending", None), list) and hasattr(nc, "_pending_data_size"):
        nc._pending = []
        nc._pending_data_size = 0


def _status(headers: bytes) -> bytes:
    """The status code of a NATS header block (``NATS/1.0 503`` → ``503``), or b""."""
    line = headers.split(b"\r\n", 1)[0]
    return line[9:12] if line.startswith(b"NATS/1.0 ") else b""


def _transient(error: str) -> bool:
    """A PubAck error that says "not now" rather than "never" (JetStream 5xx codes)."""
    return error.startswith("5") and _NO_STREAM not in error


def tls_context(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if not (ca or cert):
        return None
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


class NatsSink:
    """Publishes events to a JetStream stream (created if missing, else used as is)."""

    def __init__(
        self,
        servers: list[str] | str,
        stream: str = "K8S",
        subjects: list[str] | tuple[str, ...] = ("k8s.>",),
        create_stream: bool = True,
        max_in_flight: int = 2048,
        credentials: str | None = None,
        nkey_seed: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        connect_timeout: float = 5.0,
        ack_timeout: float = 5.0,
        retries: int = 2,
        retry_backoff: float = 0.2,
        duplicate_window: float = 120.0,
    ) -> None:
        self.servers = [servers] if isinstance(servers, str) else list(servers)
        self.stream = stream
        self.subjects = list(subjects)
        self.create_stream = create_stream
        self.max_in_flight = max_in_flight
        self.credentials = credentials
        self.nkey_seed = nkey_seed
        self.tls_ca, self.tls_cert, self.tls_key = tls_ca, tls_cert, tls_key
        self.connect_timeout = connect_timeout
        self.ack_timeout = ack_timeout
        self.retries = retries
        self.retry_backoff = retry_backoff
        self.duplicate_window = duplicate_window
        self._nc: Client | None = None
        self._publisher: JetStreamPublisher | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def from_settings(cls, n: NatsSettings) -> NatsSink:
        """The sink of a validated ``sink.nats`` section (the defaults live there)."""
        return cls(
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
        )

    @property
    def where(self) -> str:
        return ",".join(self.servers)

    async def start(self) -> None:
        if self._nc is not None:
            return
        try:
            nc = await connect(
                self.servers,
                connect_timeout=self.connect_timeout,
                credentials=self.credentials,
                nkey_seed=self.nkey_seed,
                tls=tls_context(self.tls_ca, self.tls_cert, self.tls_key),
                on_disconnect=self._on_disconnect,
            )
        except SinkError:
            raise
        try:
            await self._ensure_stream(nc)
            publisher = JetStreamPublisher(
                nc, max_in_flight=self.max_in_flight, ack_timeout=self.ack_timeout
            )
            await publisher.start()
        except BaseException:
            await close_quietly(nc)
            raise
        self._nc, self._publisher = nc, publisher

    async def _on_disconnect(self) -> None:
        # nats-py would send the frames still queued once it reconnects. Some
        # earlier frames may have died with the socket, so those queued ones
        # would land ahead of the retries of the lost ones: per-subject order
        # broken. Drop them; every unacknowledged batch is retried in order.
        # (nats-py awaits this callback before it reconnects.)
        nc = self._nc
        if nc is not None:
            _drop_queued(nc)
        if self._publisher is not None:
            self._publisher.fail_all(f"disconnected from NATS at {self.where}")

    async def _ensure_stream(self, nc: Client) -> None:
        js = nc.jetstream(timeout=self.connect_timeout)
        try:
            try:
                await js.stream_info(self.stream)
                return
            except nats.js.errors.NotFoundError:
                if not self.create_stream:
                    raise SinkError(
                        f"NATS stream {self.stream!r} does not exist and create_stream is off"
                    ) from None
            try:
                await js.add_stream(
                    name=self.stream,
                    subjects=self.subjects,
                    duplicate_window=self.duplicate_window,
                )
            except nats.js.errors.BadRequestError as exc:
                # Created meanwhile by another replica: use it as is. Otherwise the
                # server refused the stream (e.g. subjects overlap another stream).
                try:
                    await js.stream_info(self.stream)
                except nats.js.errors.NotFoundError:
                    raise SinkError(
                        f"NATS at {self.where}: cannot create stream {self.stream!r}"
                        f" for {self.subjects}: {exc.description}"
                    ) from exc
        except nats.js.errors.ServiceUnavailableError as exc:
            raise SinkUnavailableError(f"JetStream not available at {self.where}: {exc}") from exc
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            raise SinkUnavailableError(f"NATS at {self.where}: {exc!r}") from exc

    async def publish(self, events: Sequence[Event]) -> Mapping[int, str]:
        if not events:
            return {}
        nc, publisher = self._nc, self._publisher
        if nc is None or publisher is None:
            raise SinkError("NATS sink is not started")
        # The server's max_payload (from its INFO) is known before sending: an
        # event over it is refused here, and the rest of the batch goes on.
        limit = nc.max_payload
        refused: dict[int, str] = {}
        messages: list[Outgoing] = []
        sent: list[int] = []
        for i, e in enumerate(events):
            if not e.nats_subject:
                raise SinkError(f"event {e.id} has no NATS subject")
            payload = e.to_json()
            msg_id = e.msg_id or e.id
            size = len(payload) + len(msg_id) + _HEADER_OVERHEAD
            if size > limit:
                refused[i] = f"{size} bytes; the NATS server takes at most {limit} (max_payload)"
                continue
            messages.append((e.nats_subject, payload, {MSG_ID: msg_id}))
            sent.append(i)
        if messages:
            # One batch at a time keeps per-subject order across concurrent callers.
            async with self._lock:
                errors = await self._publish_with_retries(nc, publisher, messages)
            for j, reason in errors.items():
                refused[sent[j]] = reason
        return refused

    async def _publish_with_retries(
        self, nc: Client, publisher: JetStreamPublisher, messages: list[Outgoing]
    ) -> dict[int, str]:
        """Publish ``messages`` in order; return the ones JetStream refused for good."""
        start = 0  # messages before this one are settled: acknowledged or refused
        refused: dict[int, str] = {}
        problem = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.retry_backoff * attempt)
            if not nc.is_connected:
                problem = f"not connected to NATS at {self.where}"
                continue
            todo = messages[start:]
            try:
                batch = await publisher.publish(todo)
                settled = len(todo)
            except PublishTimeout as exc:
                problem = str(exc)
                batch = exc.batch
                # Resend from the first message with no answer, in order.
                settled = next(
                    (j for j, ok in enumerate(batch.acked) if not ok and j not in batch.errors),
                    len(todo),
                )
            except nats.errors.Error as exc:
                problem = f"{type(exc).__name__}: {exc}"
                continue
            transient = [j for j, err in batch.errors.items() if j < settled and _transient(err)]
            if transient:
                settled = min(transient)
                problem = f"JetStream could not store a message: {batch.errors[settled]}"
            missing = [j for j, err in batch.errors.items() if j < settled and _NO_STREAM in err]
            if missing:
                # No stream stores the subject (deleted meanwhile?): not this event's fault.
                if not self.create_stream:
                    raise SinkError(
                        f"NATS stream {self.stream!r} does not store {todo[missing[0]][0]!r}"
                        " and createStream is off"
                    )
                settled = min(missing)
                problem = f"NATS stream {self.stream!r} is missing; re-creating it"
                try:
                    await self._ensure_stream(nc)
                except SinkUnavailableError as exc:
                    problem = str(exc)
            for j, err in batch.errors.items():
                if j < settled:
                    refused[start + j] = f"JetStream refused it: {err}"
            start += settled
            if start >= len(messages):
                return refused
        raise SinkUnavailableError(f"NATS at {self.where}: {problem}")

    async def ping(self) -> bool:
        nc = self._nc
        if nc is None or not nc.is_connected:
            return False
        try:
            await nc.flush(timeout=2)
        except (nats.errors.Error, TimeoutError):
            return False
        return True

    async def close(self) -> None:
        nc, publisher = self._nc, self._publisher
        self._nc = self._publisher = None
        if publisher is not None:
            await publisher.stop()
        if nc is not None:
            await close_quietly(nc)


async def close_quietly(nc: Client) -> None:
    """Close a connection, also one whose server is gone.

    nats-py flushes its reconnect buffer on close and raises
    ConnectionResetError half-way when the socket is dead, leaving its
    subscription tasks behind. Nothing buffered matters once we close: every
    unacknowledged publish is retried by the caller anyway.
    """
    if not nc.is_connected:
        _drop_queued(nc)
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
