"""Running a few cooperating tasks as one: the first to fail (or finish) stops the rest.

One helper instead of a hand-written "wait first → cancel → gather" block in
every component, so the rules are the same everywhere: the others are
cancelled and awaited (no task outlives its group), and the first failure is
raised as itself, not wrapped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import Any


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait until each has finished, whatever it raised."""
    pending = [t for t in tasks if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)


async def run_group(coros: dict[str, Coroutine[Any, Any, Any]], *, prefix: str = "") -> None:
    """Run ``coros`` (name → coroutine) until the first one ends.

    A failure is re-raised after the others were cancelled and awaited; a
    coroutine that returns normally ends the group quietly. Cancelling the
    caller cancels every task of the group.
    """
    tasks = [asyncio.create_task(coro, name=f"{prefix}{name}") for name, coro in coros.items()]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task in done and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        await cancel_and_wait(tasks)
