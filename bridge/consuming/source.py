"""The seam between ``consume()`` and one bus's group reading (Kafka group, JetStream durable)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from bridge.consuming.positions import PositionStore


@dataclass(slots=True)
class Incoming:
    """One message as read: its bytes (None: a Kafka tombstone), the partition its
    key is on (0 on NATS), and what the source needs to acknowledge it."""

    raw: bytes | None
    partition: int
    token: Any


class GroupSource(Protocol):
    """Messages of a group, acknowledged only after ``done``.

    The caller calls ``done(m)`` for every message it was given, in order,
    after recording its position (or deciding to skip it), and before asking
    for the next message. The source acknowledges (commits offsets, acks) only
    what is done, and only after ``positions.flush()`` returned.
    """

    @property
    def positions(self) -> PositionStore:
        """The group's positions (opened by ``start``)."""

    async def start(self) -> None: ...

    def messages(self) -> AsyncIterator[Incoming]: ...

    async def done(self, message: Incoming) -> None: ...

    async def close(self) -> None:
        """Acknowledge what is done (positions flushed first), then leave the group."""
