"""Checklist 12: backoff 0.8 s doubling to a 30 s cap with jitter, reset after 2 min calm."""

from __future__ import annotations

import asyncio

import pytest

from bridge.kube.backoff import Backoff


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_checklist_12_doubles_from_initial_to_cap_without_jitter() -> None:
    b = Backoff(clock=FakeClock(), rng=lambda: 0.0)
    delays = [b.next_delay() for _ in range(9)]
    assert delays == pytest.approx([0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0, 30.0])


def test_checklist_12_jitter_adds_up_to_the_delay_itself() -> None:
    b = Backoff(clock=FakeClock(), rng=lambda: 1.0)
    assert [b.next_delay() for _ in range(3)] == pytest.approx([1.6, 3.2, 6.4])
    half = Backoff(clock=FakeClock(), rng=lambda: 0.5)
    assert half.next_delay() == pytest.approx(1.2)


def test_checklist_12_jitter_spreads_real_random_delays() -> None:
    delays = {Backoff().next_delay() for _ in range(50)}
    assert all(0.8 <= d < 1.6 for d in delays)
    assert len(delays) > 40


def test_checklist_12_resets_after_two_minutes_without_failure() -> None:
    clock = FakeClock()
    b = Backoff(clock=clock, rng=lambda: 0.0)
    for _ in range(5):
        clock.now += 1
        b.next_delay()
    clock.now += 119.0
    assert b.next_delay() == pytest.approx(25.6)  # within 2 min: keeps growing
    clock.now += 120.5
    assert b.next_delay() == pytest.approx(0.8)


def test_reset_starts_over() -> None:
    b = Backoff(clock=FakeClock(), rng=lambda: 0.0)
    b.next_delay()
    b.next_delay()
    b.reset()
    assert b.next_delay() == pytest.approx(0.8)


@pytest.mark.looptime
async def test_wait_sleeps_the_delay_and_honours_a_larger_minimum() -> None:
    loop = asyncio.get_running_loop()
    b = Backoff(clock=loop.time, rng=lambda: 0.0)
    t0 = loop.time()
    assert await b.wait() == pytest.approx(0.8)
    assert await b.wait(minimum=7.0) == pytest.approx(7.0)
    assert await b.wait(minimum=1.0) == pytest.approx(3.2)
    assert loop.time() - t0 == pytest.approx(0.8 + 7.0 + 3.2)


def test_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        Backoff(initial=0)
    with pytest.raises(ValueError):
        Backoff(initial=5, cap=1)
