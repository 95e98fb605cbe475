"""An in-memory sink: the twin of a bus for unit tests. It can be told to fail."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from bridge.errors import SinkError, SinkUnavailableError
from bridge.events import Event


class MemorySink:
    """Keeps published events in ``events``; ``batches`` records each publish call.

    ``available = False`` makes every publish raise ``SinkUnavailableError``;
    ``fail_next(n)`` fails only the next ``n`` publishes. A failed publish
    keeps nothing, as a real bus gives no guarantee about a failed batch.
    """

    def __init__(self, *, delay: float = 0.0) -> None:
        self.events: list[Event] = []
        self.batches: list[list[Event]] = []
        self.available = True
        self.started = False
        self.closed = False
        self.delay = delay
        self._failures = 0
        self._error: type[SinkError] = SinkUnavailableError

    def fail_next(self, n: int = 1, error: type[SinkError] = SinkUnavailableError) -> None:
        self._failures = n
        self._error = error

    async def start(self) -> None:
        self.started = True
        self.closed = False

    async def publish(self, events: Sequence[Event]) -> None:
        if self.closed:
            raise SinkError("memory sink is closed")
        if self.delay:
            await asyncio.sleep(self.delay)
        if not self.available:
            raise SinkUnavailableError("memory sink is unavailable")
        if self._failures > 0:
            self._failures -= 1
            raise self._error("memory sink told to fail")
        batch = list(events)
        self.batches.append(batch)
        self.events.extend(batch)

    async def ping(self) -> bool:
        return self.available and not self.closed

    async def close(self) -> None:
        self.closed = True

    def by_subject(self, subject: str) -> list[Event]:
        return [e for e in self.events if e.subject == subject]
