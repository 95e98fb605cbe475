"""Retrying a step of delivery while what it needs is unavailable (the bus, the checkpoint store)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from bridge.kube.backoff import Backoff
from bridge.logging import get_logger

log = get_logger(__name__)

T = TypeVar("T")


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
    ``health`` hears whether the last attempt got through."""
    while True:
        try:
            result = await attempt()
        except retry_on as e:
            health(False)
            delay = backoff.next_delay()
            log.warning(
                f"{what} failed; will retry",
                resource=label,
                error=str(e),
                retry_in=round(delay, 2),
            )
            await asyncio.sleep(delay)
            continue
        health(True)
        return result
