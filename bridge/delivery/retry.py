"""Retrying a step of delivery while what it needs is unavailable (the bus, the checkpoint store)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from bridge.kube.backoff import Backoff
from bridge.logging import get_logger

log = get_logger(__name__)

T = TypeVar("T")

# After an error marked ``soon`` (the server answered "no responders": a stream
# electing its leader), the next attempt comes after this long, not after a
# delay doubling up to the cap: an election ends within seconds, and the old
# doubling (0.5, 1, 2, 4, 8 s) left the bridge idle up to twice as long as the
# election itself (docs/operations.md, "A JetStream node restarts"). For at
# most ``SOON_FOR`` seconds of such errors in a row; then the backoff as usual,
# so a subject that no stream will serve again is not asked four times a second.
SOON_DELAY = 0.25
SOON_FOR = 30.0


class RetryDelays:
    """How long to wait after each failure of a streak: ``SOON_DELAY`` while the errors
    are marked ``soon`` (for their first ``SOON_FOR`` seconds), else ``backoff``'s."""

    def __init__(self, backoff: Backoff) -> None:
        self.backoff = backoff
        self._soon_since: float | None = None

    def after(self, error: BaseException) -> tuple[float, bool]:
        """(the delay, whether it is a quick retry after an earlier quick one)."""
        now = asyncio.get_running_loop().time()
        if not getattr(error, "soon", False):
            self._soon_since = None
            return self.backoff.next_delay(), False
        again = self._soon_since is not None
        if self._soon_since is None:
            self._soon_since = now
        if now - self._soon_since < SOON_FOR:
            return SOON_DELAY, again
        return self.backoff.next_delay(), False

    def succeeded(self) -> None:
        self._soon_since = None


async def retrying(
    attempt: Callable[[], Awaitable[T]],
    *,
    retry_on: type[Exception],
    what: str,
    health: Callable[[bool], None],
    backoff: Backoff,
    label: str,
) -> T:
    """``attempt`` until it succeeds, backing off while it raises ``retry_on``;
    ``health`` hears whether the last attempt got through. An error marked ``soon``
    is retried after ``SOON_DELAY`` for its first ``SOON_FOR`` seconds in a row,
    with one warning for the streak (four a second would bury the log), and one
    line when it ends."""
    delays = RetryDelays(backoff)
    loop = asyncio.get_running_loop()
    quiet_since: float | None = None
    quiet = 0
    while True:
        try:
            result = await attempt()
        except retry_on as e:
            health(False)
            delay, again = delays.after(e)
            if again:
                quiet += 1
            else:
                log.warning(
                    f"{what} failed; will retry",
                    resource=label,
                    error=str(e),
                    retry_in=round(delay, 2),
                )
                if getattr(e, "soon", False):
                    quiet_since, quiet = loop.time(), 0
            await asyncio.sleep(delay)
            continue
        health(True)
        if quiet_since is not None:
            log.info(
                f"{what} working again",
                resource=label,
                seconds=round(loop.time() - quiet_since, 2),
                retries=quiet + 1,
            )
        return result
