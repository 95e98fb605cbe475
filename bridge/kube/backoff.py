"""Exponential backoff with jitter, as client-go's reflector uses it.

The delay starts at ``initial`` and doubles up to ``cap``; jitter adds up to
``jitter`` times the delay on top (client-go's ``wait.Jitter``), so many
reflectors failing together do not come back together. A failure that comes
more than ``reset_after`` seconds after the previous one starts over from
``initial``: a watch that ran fine for two minutes is not punished for an old
outage.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable


class Backoff:
    def __init__(
        self,
        initial: float = 0.8,
        cap: float = 30.0,
        factor: float = 2.0,
        jitter: float = 1.0,
        reset_after: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if initial <= 0 or cap < initial or factor < 1 or jitter < 0 or reset_after <= 0:
            raise ValueError("backoff needs 0 < initial <= cap, factor >= 1, jitter >= 0")
        self.initial = initial
        self.cap = cap
        self.factor = factor
        self.jitter = jitter
        self.reset_after = reset_after
        self._clock = clock
        self._rng = rng
        self._base = initial
        self._last_failure: float | None = None

    def next_delay(self) -> float:
        """Record a failure and return how long to wait before the next attempt."""
        now = self._clock()
        if self._last_failure is not None and now - self._last_failure > self.reset_after:
            self._base = self.initial
        self._last_failure = now
        base = self._base
        self._base = min(self._base * self.factor, self.cap)
        return base + base * self.jitter * self._rng()

    async def wait(self, minimum: float | None = None) -> float:
        """Sleep for the next delay, at least ``minimum`` (a server's Retry-After)."""
        delay = self.next_delay()
        if minimum is not None and minimum > delay:
            delay = minimum
        await asyncio.sleep(delay)
        return delay

    def reset(self) -> None:
        self._base = self.initial
        self._last_failure = None
