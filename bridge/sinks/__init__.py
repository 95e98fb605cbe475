"""Sinks: where events go. ``Sink`` is the seam; nats, kafka, stdout and memory implement it."""

from bridge.sinks.base import Sink

__all__ = ["Sink"]
