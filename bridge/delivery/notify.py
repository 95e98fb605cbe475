"""A wake-up for tasks that wait until some state holds.

The pipeline's parts wait on each other's state (room in the outbox, an event
acknowledged, a batch due): each waiter names what it waits for as a
predicate, and whoever changes that state calls ``notify``. Nothing polls, and
a waiter woken for a state that no longer holds simply waits again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Notifier:
    """Futures woken together by ``notify`` (a plain method, callable from sync code)."""

    __slots__ = ("_futures",)

    def __init__(self) -> None:
        self._futures: list[asyncio.Future[None]] = []

    async def until(self, ready: Callable[[], object]) -> None:
        """Return once ``ready()`` is true, checking it again at each ``notify``."""
        while not ready():
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._futures.append(fut)
            try:
                await fut
            except BaseException:
                # Cancelled: no notify took it out of the list.
                if fut in self._futures:
                    self._futures.remove(fut)
                raise

    def notify(self) -> None:
        if not self._futures:
            return
        futures, self._futures = self._futures, []
        for fut in futures:
            if not fut.done():
                fut.set_result(None)
