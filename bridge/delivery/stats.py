"""What a resource's pipeline counts: plain counters on the hot path, read by the observer."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field


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
