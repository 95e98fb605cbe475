"""Delivery of one resource's decided events: batches, written ahead, published in order.

Two tasks:

- the **writer** takes a batch as soon as events are decided (a linger of a
  millisecond, or of ``steady_linger`` while changes come steadily and closely
  enough to share a batch), or, while the sender publishes, once the batch is
  full or the sender is done; it has the batch's rows written ahead to the
  checkpoint store and hands it on;
- the **sender** publishes batches in order, one at a time, retrying only
  while the bus is unavailable; events the bus refuses for good go through the
  poison policy and never block the events behind them.

With a transactional bus (``sink.kafka.exactlyOnce``) nothing is written ahead:
the sender publishes each batch together with its rows as they stand once it
landed (``Batch.settled_rows``), in one transaction, so the checkpoint never
holds a row its events did not land with, and never an uncertain one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Protocol

from bridge.aiotasks import run_group
from bridge.delivery.notify import Notifier
from bridge.delivery.outbox import Batch, Outbox
from bridge.delivery.retry import retrying
from bridge.delivery.settings import PipelineSettings
from bridge.delivery.stats import PipelineStats
from bridge.delivery.tracing import BatchTracer, traced
from bridge.errors import PoisonEventError, SinkError, SinkUnavailableError
from bridge.ground.digest import Digest
from bridge.ground.envelope import Event
from bridge.kube.backoff import Backoff
from bridge.logging import get_logger
from bridge.sinks.base import Sink
from bridge.sinks.deadletter import DeadLetter, DeadLetterSink

log = get_logger(__name__)

# The checkpoint rows (upserts, deletes) that go with a batch, leaving out the keys
# whose last event was refused (indices into the batch).
SettledRows = Callable[[Collection[int]], tuple[list[Digest], list[str]]]


class TransactionalSend(Protocol):
    """Publishes events (then ``dead_letters``) together with their checkpoint rows,
    atomically; returns what was refused for good, as ``Sink.publish`` does (an
    index past the events is a dead letter's)."""

    def __call__(
        self,
        events: Sequence[Event],
        rows: SettledRows,
        dead_letters: Sequence[DeadLetter] = (),
    ) -> Awaitable[Mapping[int, str]]: ...


class Publisher:
    """Moves batches from the outbox through the write-ahead to the sink, and back as acks."""

    def __init__(
        self,
        *,
        sink: Sink,
        outbox: Outbox,
        settings: PipelineSettings,
        stats: PipelineStats,
        write_ahead: Callable[[Batch], Awaitable[None]],
        on_acknowledged: Callable[[], None],
        backoff: Callable[[], Backoff],
        label: str,
        clock: Callable[[], float] = time.monotonic,
        on_publish_latency: Callable[[float], None] | None = None,
        on_batch_size: Callable[[float], None] | None = None,
        transactional: TransactionalSend | None = None,
        exclusive: asyncio.Lock | None = None,
        tracer: BatchTracer | None = None,
    ) -> None:
        self._sink = sink
        # Tracing on: one span per batch, its context on the events (delivery/tracing.py).
        self._tracer = tracer
        self._transactional = transactional
        # Held by each transactional publish, which writes checkpoint rows: the
        # checkpointer's commits take it too (bridge/delivery/checkpointer.py).
        self._exclusive = exclusive or contextlib.nullcontext()
        self.outbox = outbox
        self.settings = settings
        self._stats = stats
        self._write_ahead = write_ahead
        self._on_acknowledged = on_acknowledged
        self._backoff = backoff
        self._label = label
        self._clock = clock
        self._on_publish_latency = on_publish_latency
        self._on_batch_size = on_batch_size
        self.healthy = True
        # When the bus last acknowledged a change (not an announcement), for heartbeats.
        self.last_change_at: float | None = None
        # Notified at each acknowledged batch: room, acknowledged sequence numbers, a drain.
        self.acknowledged = Notifier()
        # Events were decided: the writer's wake-up.
        self._decided = Notifier()
        # The batch being published; while there is one, the next leaves once it is
        # done or the next is full, and ``_batch_due`` says when either happened.
        self._in_flight: Batch | None = None
        self._batch_due = Notifier()
        self._to_send: asyncio.Queue[Batch] = asyncio.Queue(maxsize=1)
        # The mean gap between decisions (exponentially weighted), for the linger.
        self._last_decided_at: float | None = None
        self._mean_gap = float("inf")

    def decided(self) -> None:
        """Events were decided (or announced): the writer may take them."""
        now = self._clock()
        last, self._last_decided_at = self._last_decided_at, now
        if last is not None:
            gap = min(now - last, 1.0)
            mean = self._mean_gap
            self._mean_gap = gap if mean == float("inf") else mean + (gap - mean) / 8
        self._decided.notify()
        if self.outbox.queued >= self.settings.max_batch:
            self._batch_due.notify()

    async def wait_acknowledged(self, seq: int) -> None:
        """Until the bus has acknowledged every event up to ``seq``."""
        outbox = self.outbox
        await self.acknowledged.until(lambda: outbox.acked_seq >= seq)

    async def drained(self) -> None:
        """Until the bus has acknowledged every event decided."""
        outbox = self.outbox
        await self.acknowledged.until(lambda: not outbox.unacknowledged)

    async def run(self, *, prefix: str) -> None:
        await run_group({"writer": self._writer(), "sender": self._sender()}, prefix=prefix)

    # -- the writer ---------------------------------------------------------------

    async def _writer(self) -> None:
        s, outbox = self.settings, self.outbox
        while True:
            if not outbox.queued:
                await self._decided.until(lambda: outbox.queued)
                linger = self.linger()
                if linger and outbox.queued < s.max_batch:
                    await asyncio.sleep(linger)
            # While a batch is being published, the next leaves only when it is
            # done, so take it then, or once it is full: taken at once, it would hold
            # what was decided so far, however little, and behind a bus slower than
            # the watch, batches would alternate between full and nearly empty.
            if self._in_flight is not None and outbox.queued < s.max_batch:
                await self._batch_due.until(self._batch_may_leave)
            batch = outbox.take(s.max_batch)
            if batch is None:
                continue
            if batch.ahead and self._transactional is None:
                # Only announcements have nothing to write ahead; a transactional
                # bus takes the rows with the batch instead.
                await self._write_ahead(batch)
            await self._to_send.put(batch)

    def linger(self) -> float:
        """How long the writer waits for more events once some are decided: longer while
        changes come steadily, at least one per ``steady_linger``, so they share a batch."""
        s = self.settings
        if s.linger and s.steady_linger > s.linger and self._mean_gap <= s.steady_linger:
            return s.steady_linger
        return s.linger

    def _batch_may_leave(self) -> bool:
        return self._in_flight is None or self.outbox.queued >= self.settings.max_batch

    # -- the sender ---------------------------------------------------------------

    async def _sender(self) -> None:
        outbox = self.outbox
        while True:
            batch = await self._to_send.get()
            self._in_flight = batch
            try:
                await self._publish(batch)
            finally:
                self._in_flight = None
                self._batch_due.notify()
            outbox.acknowledged(batch)
            self._on_acknowledged()
            if batch.ahead:  # rows written ahead: some change, not only announcements
                self.last_change_at = self._clock()
            self.acknowledged.notify()

    async def _send(self, events: list[Event], batch: Batch | None = None) -> dict[int, str]:
        """Publish until the bus answers; only "bus unavailable" is retried. With a
        transactional bus, ``batch``'s settled rows go in the same transaction."""
        started = time.perf_counter()
        if self._on_batch_size is not None:
            self._on_batch_size(len(events))
        transactional = self._transactional
        if transactional is not None:
            rows: SettledRows = batch.settled_rows if batch is not None else _no_rows

            def publish() -> Awaitable[Mapping[int, str]]:
                assert transactional is not None
                return transactional(events, rows)
        else:

            def publish() -> Awaitable[Mapping[int, str]]:
                return self._sink.publish(events)

        async with self._exclusive:
            refused = await retrying(
                publish,
                retry_on=SinkUnavailableError,
                what="publish",
                health=self._health,
                backoff=self._backoff(),
                label=self._label,
            )
        if self._on_publish_latency is not None:
            self._on_publish_latency(time.perf_counter() - started)
        return dict(refused or {})

    async def _send_traced(
        self, tracer: BatchTracer, events: list[Event], batch: Batch
    ) -> dict[int, str]:
        """``_send`` inside the batch's span, its context on every event."""
        span = tracer.batch(self._label, len(events))
        try:
            refused = await self._send(traced(events, span.traceparent, span.tracestate), batch)
        except BaseException as e:
            span.failed(e)
            raise
        else:
            span.acknowledged(len(events) - len(refused), len(refused))
        finally:
            span.end()
        return refused

    def _health(self, ok: bool) -> None:
        self.healthy = ok

    async def _publish(self, batch: Batch) -> None:
        events = batch.events
        tracer = self._tracer
        if tracer is None:
            refused = await self._send(events, batch)
        else:
            refused = await self._send_traced(tracer, events, batch)
        stats = self._stats
        landed = [e for i, e in enumerate(events) if i not in refused] if refused else events
        stats.published += len(landed)
        stats.by_type.update(map(_change_of, landed))
        if refused:
            await self._settle_refused(batch, refused)

    # -- the poison policy ----------------------------------------------------------

    async def _settle_refused(self, batch: Batch, refused: dict[int, str]) -> None:
        """The poison policy for events the bus refused for good; nothing waits behind them."""
        entries = batch.entries
        for i in sorted(refused):
            entry, reason = entries[i], refused[i]
            event = entry.event
            policy = self.settings.poison_policy
            later = any(
                e.key == entry.key for j, e in enumerate(entries) if j > i and j not in refused
            )
            if policy == "fail":
                outcome = "failed"
            elif policy == "deadLetter":
                outcome, reason = await self._dead_letter(batch, i, reason, later)
            elif later:
                outcome = "superseded"  # a later event of the same object is on the bus
            elif policy == "truncate":
                again = await self._publish_copies(batch, i, [event.truncated()], [])
                if again:
                    outcome, reason = "skipped", f"{reason}; truncated: {again[0]}"
                else:
                    outcome = "truncated"
                    self._stats.published += 1
                    self._stats.by_type[_change_of(event)] += 1
            else:
                outcome = "skipped"
            self._stats.poison[outcome] += 1
            log.warning(
                "the bus refused an event for good",
                resource=self._label,
                subject=event.subject,
                id=event.id,
                reason=reason,
                outcome=outcome,
            )
            if outcome == "failed":
                raise PoisonEventError(
                    f"{self._label}: the bus refused {event.subject} (event {event.id}) for good:"
                    f" {reason}; poisonPolicy is fail, so this resource stopped"
                )

    async def _dead_letter(
        self, batch: Batch, i: int, reason: str, superseded: bool
    ) -> tuple[str, str]:
        """``poisonPolicy: deadLetter``: the refused event to the dead-letter destination,
        and its truncated copy to the main stream (none when a later event of the same
        object landed: it would arrive behind it), as ``_publish_copies`` says. Returns
        (outcome, reason)."""
        event = batch.entries[i].event
        letter = DeadLetter(event, reason)
        main = [] if superseded else [event.truncated()]
        outcome = await self._publish_copies(batch, i, main, [letter])
        letter_refused = outcome.get(len(main))
        main_refused = outcome.get(0) if main else None
        if main and main_refused is None:
            self._stats.published += 1
            self._stats.by_type[_change_of(event)] += 1
        if main_refused is not None:
            reason = f"{reason}; truncated: {main_refused}"
        if letter_refused is not None:
            reason = f"{reason}; dead letter: {letter_refused}"
            if superseded:
                return "superseded", reason
            return ("skipped" if main_refused is not None else "truncated"), reason
        return "dead_lettered", reason

    async def _publish_copies(
        self, batch: Batch, i: int, main: list[Event], letters: list[DeadLetter]
    ) -> Mapping[int, str]:
        """What the poison policy publishes for ``batch.entries[i]``: ``main`` (its
        truncated copy, or nothing) and ``letters``; returns what was refused (index
        into ``main`` then ``letters``). With a transactional bus they go in one
        transaction with the key's checkpoint row after that event: a later event of
        the key refused too has its own, so a crash between them leaves the row at the
        last one that landed, and a restart republishes none of them."""
        transactional = self._transactional
        if transactional is not None:
            row = batch.row_after(i) if main else None

            def key_rows(refused_now: Collection[int]) -> tuple[list[Digest], list[str]]:
                if row is None or refused_now:
                    return [], []  # the row stays as it was: nothing of the key landed
                return [row], []

            def publish() -> Awaitable[Mapping[int, str]]:
                assert transactional is not None
                return transactional(main, key_rows, letters)

            return await self._retrying(publish)
        refused: dict[int, str] = {}
        if letters:
            sink = self._sink
            if not isinstance(sink, DeadLetterSink):
                raise SinkError(f"{self._label}: poisonPolicy deadLetter, but the sink has none")

            def publish_letters() -> Awaitable[Mapping[int, str]]:
                assert isinstance(sink, DeadLetterSink)
                return sink.publish_dead_letters(letters)

            # Dead letters first: a crash before the truncated copy lands republishes
            # both (the key's row is still the one written ahead), never loses a letter.
            for j, why in (await self._retrying(publish_letters)).items():
                refused[len(main) + j] = why
        if main:
            refused.update(await self._send(main))
        return refused

    async def _retrying(
        self, publish: Callable[[], Awaitable[Mapping[int, str]]]
    ) -> Mapping[int, str]:
        async with self._exclusive:
            refused = await retrying(
                publish,
                retry_on=SinkUnavailableError,
                what="publish",
                health=self._health,
                backoff=self._backoff(),
                label=self._label,
            )
        return refused or {}


def _no_rows(refused: Collection[int]) -> tuple[list[Digest], list[str]]:
    return [], []


def _change_of(event: Event) -> str:
    return event.type.rpartition(".")[2]
