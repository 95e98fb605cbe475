"""The ``Sink`` seam between the pipeline and a message bus."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from bridge.ground.envelope import Event


@runtime_checkable
class Sink(Protocol):
    """A message bus as the pipeline sees it.

    ``publish`` returns once the bus has answered for every event, keeps the
    order of events of one subject, and returns the events the bus refused
    *for good* (index → reason: too large, not permitted); those were not
    published and retrying them cannot help. Everything else was acknowledged.
    It raises ``SinkUnavailableError`` when the bus cannot be reached (then
    nothing of the batch may be assumed published: the caller retries the
    whole batch, and event ids make the redelivery recognisable), and plain
    ``SinkError`` when the bus refuses everything for good (authentication, a
    missing stream it may not create): a person must act.
    """

    async def start(self) -> None: ...

    async def publish(self, events: Sequence[Event]) -> Mapping[int, str]: ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...
