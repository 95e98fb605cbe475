"""What a resource's pipeline counts: plain counters on the hot path, read by the observer."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class PipelineStats:
    published: int = 0
    suppressed: int = 0
    listed: int = 0
    flushes: int = 0
    last_commit: float = field(default_factory=time.monotonic)
    # Published events by type (added/modified/deleted), and poison outcomes:
    # plain counters on the hot path, carried over to Prometheus by the observer.
    by_type: Counter[str] = field(default_factory=Counter)
    poison: Counter[str] = field(default_factory=Counter)


class PipelineMetrics(Protocol):
    """What a pipeline reports as it goes, besides its counters: the service's
    Prometheus metrics implement it (bridge/service/metrics.py)."""

    def set_checkpoint(self, resource: str, resource_version: str) -> None: ...

    def publish_latency_of(self, sink: str) -> Callable[[float], None]: ...

    def commit_seconds_of(self, resource: str) -> Callable[[float], None]: ...

    def batch_size_of(self, resource: str) -> Callable[[float], None]: ...
