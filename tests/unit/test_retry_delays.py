"""RetryDelays: "no responders" (a stream electing its leader) is retried soon, for a while."""

from __future__ import annotations

import pytest

from bridge.delivery import retry
from bridge.delivery.retry import SOON_DELAY, RetryDelays
from bridge.errors import CheckpointError, SinkUnavailableError
from bridge.kube.backoff import Backoff


def backoff() -> Backoff:
    return Backoff(initial=0.5, cap=30.0, jitter=0.0)


async def test_soon_errors_wait_a_short_fixed_delay_others_back_off() -> None:
    delays = RetryDelays(backoff())
    soon = CheckpointError("no responders", soon=True)
    got = [delays.after(soon) for _ in range(30)]
    # An election of seconds: every retry a quarter second later, one warning for all.
    assert [d for d, _ in got] == [SOON_DELAY] * 30
    assert [again for _, again in got] == [False] + [True] * 29
    plain = SinkUnavailableError("connection refused")
    assert [delays.after(plain)[0] for _ in range(4)] == [0.5, 1.0, 2.0, 4.0]


async def test_soon_errors_back_off_once_they_outlast_soon_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(retry, "SOON_FOR", 0.0)  # a subject no stream will serve again
    delays = RetryDelays(backoff())
    soon = SinkUnavailableError("no responders", soon=True)
    assert [delays.after(soon)[0] for _ in range(3)] == [0.5, 1.0, 2.0]
