"""The ``Sink`` seam between the pipeline and a message bus."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from bridge.events import Event


@runtime_checkable
class Sink(Protocol):
    """A message bus as the pipeline sees it.

    ``publish`` returns only once the bus has acknowledged every event, keeps
    the order of events of one subject, and raises ``SinkUnavailableError`` when
    the bus cannot be reached (then nothing of the batch may be assumed
    published: the caller retries the whole batch, and event ids make the
    redelivery recognisable).
    """

    async def start(self) -> None: ...

    async def publish(self, events: Sequence[Event]) -> None: ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...
