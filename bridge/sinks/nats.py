"""NATS JetStream sink, publishing through the pipelined JetStream publisher of
bridge/ground/nats.py.

Order per subject: one connection delivers in order and JetStream stores in
arrival order. A batch that is not fully acknowledged (timeout, error,
disconnect) is resent from its first unacknowledged message onwards, in the
original order; messages that did land are dropped by the stream's duplicate
window, as each carries ``Nats-Msg-Id`` = event id.

Routes (``sink.routes``): an event that names routes goes to each route's
subject (the route's prefix in place of the leading ``k8s``) with
``Nats-Msg-Id`` ``{id}@{route}``, as the duplicate window is per stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client

from bridge.errors import SinkError, SinkUnavailableError
from bridge.ground.envelope import Event
from bridge.ground.nats import (
    MSG_ID,
    NO_RESPONDERS,
    JetStreamPublisher,
    Outgoing,
    PublishTimeout,
    close_quietly,
    connect,
    drop_queued,
)
from bridge.ground.natsconfig import subject_matches, tls_context
from bridge.sinks import deadletter
from bridge.sinks.deadletter import DeadLetter

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

# What an HPUB's header block adds to a message besides the id itself
# ("NATS/1.0\r\n" + "Nats-Msg-Id: " + "\r\n\r\n"): counted against max_payload.
_HEADER_OVERHEAD = 10 + len(MSG_ID) + 2 + 4
# How long a publish that met "no responders" waits for the stream's info.
_STREAM_CHECK_TIMEOUT = 1.0


def _transient(error: str) -> bool:
    """A PubAck error that says "not now" rather than "never" (JetStream 5xx codes)."""
    return error.startswith("5") and NO_RESPONDERS not in error


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
        dead_letter_subject: str | None = None,
        routes: Mapping[str, str] | None = None,
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
        # poisonPolicy deadLetter: where refused events go (bridge/sinks/deadletter.py).
        self.dead_letter_subject = dead_letter_subject
        # sink.routes: route name → the prefix that replaces the leading ``k8s`` of an
        # event's subject on that route. An event names its routes; none: the default.
        self.routes = dict(routes or {})
        self._nc: Client | None = None
        self._publisher: JetStreamPublisher | None = None
        self._lock = asyncio.Lock()

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
            drop_queued(nc)
        if self._publisher is not None:
            self._publisher.fail_all(f"disconnected from NATS at {self.where}")

    @property
    def dead_letter_stream(self) -> str | None:
        """The stream the bridge creates for the dead-letter subject when the main
        stream's subjects do not hold it (None: they do, or no dead letters)."""
        subject = self.dead_letter_subject
        if subject is None or any(subject_matches(p, subject) for p in self.subjects):
            return None
        return f"{self.stream}_DEAD_LETTERS"

    async def _ensure_stream(self, nc: Client, timeout: float | None = None) -> None:
        await self._ensure(nc, self.stream, self.subjects, timeout)
        if self.dead_letter_stream is not None and self.dead_letter_subject is not None:
            await self._ensure(nc, self.dead_letter_stream, [self.dead_letter_subject], timeout)
        if self.routes:
            await self._check_routes(nc)

    async def _check_routes(self, nc: Client) -> None:
        """An existing stream is used as is: one whose subjects leave a route's out would
        answer its messages with "no responders" forever. Said at start, in one line."""
        js = nc.jetstream(timeout=self.connect_timeout)
        try:
            info = await js.stream_info(self.stream)
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            raise SinkUnavailableError(f"NATS at {self.where}: {exc!r}") from exc
        subjects = list(info.config.subjects or [])
        for name, prefix in self.routes.items():
            # A route's subjects: the prefix and the six tokens of an event's subject.
            if not any(subject_matches(p, prefix + ".c.g.v.r.n.n") for p in subjects):
                raise SinkError(
                    f"NATS stream {self.stream!r} (subjects {subjects}) does not store route"
                    f" {name!r} (sink.routes subjectPrefix {prefix!r}): add '{prefix}.>' to"
                    " the stream's subjects"
                )

    async def _ensure(
        self, nc: Client, stream: str, subjects: list[str], timeout: float | None = None
    ) -> None:
        js = nc.jetstream(timeout=timeout or self.connect_timeout)
        try:
            try:
                await js.stream_info(stream)
                return
            except nats.js.errors.NotFoundError:
                if not self.create_stream:
                    raise SinkError(
                        f"NATS stream {stream!r} does not exist and create_stream is off"
                    ) from None
            try:
                await js.add_stream(
                    name=stream,
                    subjects=subjects,
                    duplicate_window=self.duplicate_window,
                )
            except nats.js.errors.BadRequestError as exc:
                # Created meanwhile by another replica: use it as is. Otherwise the
                # server refused the stream (e.g. subjects overlap another stream).
                try:
                    await js.stream_info(stream)
                except nats.js.errors.NotFoundError:
                    raise SinkError(
                        f"NATS at {self.where}: cannot create stream {stream!r}"
                        f" for {subjects}: {exc.description}"
                    ) from exc
        except nats.js.errors.ServiceUnavailableError as exc:
            raise SinkUnavailableError(
                f"JetStream not available at {self.where}: {exc}", soon=True
            ) from exc
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
            headers = {MSG_ID: msg_id}
            if e.traceparent:  # tracing on (bridge/delivery/tracing.py): "name: value\r\n"
                headers["traceparent"] = e.traceparent
                size += len("traceparent") + len(e.traceparent) + 4
                if e.tracestate:
                    headers["tracestate"] = e.tracestate
                    size += len("tracestate") + len(e.tracestate) + 4
            if e.routes:  # a route's id is longer: "@{route}"
                size += 1 + max(len(r) for r in e.routes)
            if size > limit:
                refused[i] = f"{size} bytes; the NATS server takes at most {limit} (max_payload)"
                continue
            if not e.routes:
                messages.append((e.nats_subject, payload, headers))
                sent.append(i)
                continue
            # One message per route, each with its own Nats-Msg-Id ({id}@{route}): the
            # duplicate window is per stream, and would drop the second copy. The event
            # is acknowledged when every route's message is; one refused refuses it.
            for route in e.routes:
                prefix = self.routes.get(route)
                if prefix is None:
                    raise SinkError(f"event {e.id} names route {route!r}, not in sink.routes")
                routed = {**headers, MSG_ID: e.route_msg_id(route)}
                messages.append((prefix + e.nats_subject.removeprefix("k8s"), payload, routed))
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
        soon = False  # the last problem was "no responders": a stream electing its leader
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.retry_backoff * attempt)
            soon = False
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
            missing = [j for j, err in batch.errors.items() if j < settled and NO_RESPONDERS in err]
            if missing:
                # No stream stores the subject (deleted meanwhile?): not this event's fault.
                if not self.create_stream:
                    raise SinkError(
                        f"NATS stream {self.stream!r} does not store {todo[missing[0]][0]!r}"
                        " and createStream is off"
                    )
                settled = min(missing)
                problem = f"NATS stream {self.stream!r} is missing; re-creating it"
                soon = True
                try:
                    # A stream electing its leader answers no API request until it
                    # has one (5 s and more after its leader died): asked with the
                    # connect timeout, that wait came on top of the election. A
                    # deleted stream is answered at once, so a second is plenty.
                    await self._ensure_stream(nc, timeout=_STREAM_CHECK_TIMEOUT)
                except SinkUnavailableError as exc:
                    problem = str(exc)
            for j, err in batch.errors.items():
                if j < settled:
                    refused[start + j] = f"JetStream refused it: {err}"
            start += settled
            if start >= len(messages):
                return refused
        raise SinkUnavailableError(f"NATS at {self.where}: {problem}", soon=soon)

    async def publish_dead_letters(self, letters: Sequence[DeadLetter]) -> Mapping[int, str]:
        """Dead letters on ``deadLetterSubject``, whole or cut to the server's
        ``max_payload`` (headers count against it too); those refused are returned."""
        nc, publisher = self._nc, self._publisher
        if nc is None or publisher is None:
            raise SinkError("NATS sink is not started")
        subject = self.dead_letter_subject
        if subject is None:
            raise SinkError("a dead letter, but sink.nats.deadLetterSubject is not set")
        messages: list[Outgoing] = []
        for letter in letters:
            msg_id = letter.event.id + deadletter.MSG_ID_SUFFIX

            def overhead(headers: list[tuple[str, str]], msg_id: str = msg_id) -> int:
                # "NATS/1.0\r\n", "name: value\r\n" each, "\r\n": what the server counts.
                fields = [(MSG_ID, msg_id), *headers]
                return 10 + sum(len(k) + len(v) + 4 for k, v in fields) + 2

            payload, headers = deadletter.fitted(letter, nc.max_payload, overhead)
            messages.append((subject, payload, {MSG_ID: msg_id, **dict(headers)}))
        async with self._lock:
            return await self._publish_with_retries(nc, publisher, messages)

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
