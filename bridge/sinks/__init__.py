"""Sinks: where events go. ``Sink`` is the seam; nats, kafka and stdout implement it (a memory twin for tests is in tests/doubles)."""

from bridge.sinks.base import Sink

__all__ = ["Sink"]
