"""The pipeline's parts wait for a named state (``Notifier.until``), woken by whoever changes it."""

from __future__ import annotations

import asyncio

from bridge.delivery.notify import Notifier


async def test_a_waiter_returns_only_once_its_state_holds() -> None:
    changed = Notifier()
    state = {"acked": 0}
    waiter = asyncio.create_task(changed.until(lambda: state["acked"] >= 2))
    for acked in (1, 2):
        await asyncio.sleep(0)
        assert not waiter.done()  # woken for a state that does not hold yet: waits again
        state["acked"] = acked
        changed.notify()
    await asyncio.wait_for(waiter, timeout=1.0)


async def test_a_state_that_already_holds_costs_no_wait() -> None:
    changed = Notifier()
    await asyncio.wait_for(changed.until(lambda: True), timeout=1.0)


async def test_a_cancelled_waiter_leaves_nothing_behind() -> None:
    changed = Notifier()
    waiter = asyncio.create_task(changed.until(lambda: False))
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert waiter.cancelled()
    assert not changed._futures
