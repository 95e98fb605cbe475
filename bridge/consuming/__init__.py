"""Consuming the bus as a group: positions, Kafka consumer groups, JetStream durables.

``bridge.consumer.consume(settings, group=...)`` is the entry point; this
package holds its parts (docs/consuming.md).
"""

from bridge.consuming.positions import (
    MemoryPositions,
    Position,
    PositionStore,
    SqlitePositions,
    is_new,
)

__all__ = ["MemoryPositions", "Position", "PositionStore", "SqlitePositions", "is_new"]
