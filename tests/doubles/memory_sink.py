"""An in-memory sink: the twin of a bus for unit tests. It can be told to fail."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

import orjson

from bridge.errors import SinkError, SinkUnavailableError
from bridge.ground.envelope import Event
from bridge.sinks.deadletter import DeadLetter
from tests.doubles.contract import assert_valid


class MemorySink:
    """Keeps published events in ``events``; ``batches`` records each publish call.

    ``available = False`` makes every publish raise ``SinkUnavailableError``;
    ``fail_next(n)`` fails only the next ``n`` publishes. A failed publish
    keeps nothing, as a real bus gives no guarantee about a failed batch.
    ``max_payload`` (bytes) or ``refuse`` (event → reason or None) make it
    refuse single events for good, as a real bus refuses an oversized one.
    ``hold()`` makes publishes wait, answering nothing, until ``release()``: a bus
    electing a leader, whose client waits rather than fails.
    """

    def __init__(
        self,
        *,
        delay: float = 0.0,
        max_payload: int | None = None,
        refuse: Callable[[Event], str | None] | None = None,
    ) -> None:
        self.max_payload = max_payload
        self.refuse = refuse
        self.events: list[Event] = []
        self.batches: list[list[Event]] = []
        # Every event taken is checked against the published schema (docs/contract/):
        # the events of every scenario that publishes through this twin keep to it.
        self.check_contract = True
        # poisonPolicy deadLetter: the dead letters taken, in order.
        self.dead_letters: list[DeadLetter] = []
        self.available = True
        self.started = False
        self.closed = False
        self.delay = delay
        self._failures = 0
        self._error: type[SinkError] = SinkUnavailableError
        # As on KafkaSink: the app takes a sink with transactions for exactly-once.
        self.transactions: MemoryTransactions | None = None
        self._released = asyncio.Event()
        self._released.set()

    def hold(self) -> None:
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def fail_next(self, n: int = 1, error: type[SinkError] = SinkUnavailableError) -> None:
        self._failures = n
        self._error = error

    async def start(self) -> None:
        self.started = True
        self.closed = False

    async def publish(self, events: Sequence[Event]) -> Mapping[int, str]:
        if self.closed:
            raise SinkError("memory sink is closed")
        if self.delay:
            await asyncio.sleep(self.delay)
        await self._released.wait()
        if not self.available:
            raise SinkUnavailableError("memory sink is unavailable")
        if self._failures > 0:
            self._failures -= 1
            raise self._error("memory sink told to fail")
        refused: dict[int, str] = {}
        batch = []
        if self.check_contract:
            for event in events:
                assert_valid(orjson.loads(event.to_json()))
        for i, event in enumerate(events):
            reason = self.refuse(event) if self.refuse is not None else None
            size = len(event.to_json()) if self.max_payload is not None else 0
            if reason is None and self.max_payload is not None and size > self.max_payload:
                reason = f"{size} bytes; the bus takes at most {self.max_payload}"
            if reason is None:
                batch.append(event)
            else:
                refused[i] = reason
        self.batches.append(batch)
        self.events.extend(batch)
        return refused

    async def publish_dead_letters(self, letters: Sequence[DeadLetter]) -> Mapping[int, str]:
        if not self.available:
            raise SinkUnavailableError("memory sink is unavailable")
        self.dead_letters.extend(letters)
        return {}

    async def ping(self) -> bool:
        return self.available and not self.closed

    async def close(self) -> None:
        self.closed = True

    def by_subject(self, subject: str) -> list[Event]:
        return [e for e in self.events if e.subject == subject]


class MemoryTransactions:
    """The twin of Kafka's transactional producers (``sink.kafka.exactlyOnce``); set
    as ``MemorySink.transactions``, each resource's channel publishes to that sink.

    ``available = False`` makes ``start`` raise ``SinkUnavailableError``, as
    starting the producers does while the broker cannot be reached; ``attempts``
    counts the calls, ``started`` keeps the resource ids of those that got through.
    """

    def __init__(self, sink: MemorySink) -> None:
        self.sink = sink
        self.available = True
        self.attempts = 0
        self.started: list[list[str]] = []

    async def start(self, resource_ids: Sequence[str]) -> None:
        self.attempts += 1
        if not self.available:
            raise SinkUnavailableError("memory transactions are unavailable")
        self.started.append(list(resource_ids))

    def channel(self, resource_id: str) -> _MemoryChannel:
        return _MemoryChannel(self.sink)


class _MemoryChannel:
    def __init__(self, sink: MemorySink) -> None:
        self._sink = sink

    async def publish(self, events: Sequence[Event], records: object) -> Mapping[int, str]:
        # The checkpoint rows would go in the same transaction; the twin has no log
        # to write them to, so only the events land.
        return await self._sink.publish(events)
