"""The reflector's transition table (``step``): where each outcome sends it next.

The behaviour each row stands for is proven end to end by test_reflector*.py
(scripted ListerWatcher, fake time) and the real-tier conformance test; this
file pins the table itself, so a changed rule is a visible, reviewed change.
"""

from __future__ import annotations

import pytest

from bridge.errors import ExpiredError, ListRejectedError
from bridge.kube.reflector import Happened, Move, Outcome, Phase, step


@pytest.mark.parametrize(
    ("phase", "happened", "streaming", "move"),
    [
        # A list of any kind, or a resumed checkpoint, goes on to watch at once.
        (Phase.RESUME, Happened.RESUMED, True, Move(Phase.WATCH)),
        (Phase.LIST, Happened.LISTED, True, Move(Phase.WATCH)),
        (Phase.STREAM, Happened.STREAMED, True, Move(Phase.WATCH)),
        # Streaming lists: 429/refused wait and stream again, a 410 streams at once
        # from "", an unsupported or failed stream lists this round (no new round).
        (Phase.STREAM, Happened.STREAM_RETRY, True, Move(Phase.STREAM, wait=True)),
        (Phase.STREAM, Happened.STREAM_EXPIRED, True, Move(Phase.STREAM)),
        (Phase.STREAM, Happened.STREAM_UNSUPPORTED, True, Move(Phase.LIST)),
        (Phase.STREAM, Happened.STREAM_FAILED, True, Move(Phase.LIST)),
        # Watching: a watch that ends is re-opened from the last RV; busy or away at
        # open waits first, as does a throttled watch.
        (Phase.WATCH, Happened.WATCH_UNOPENED, False, Move(Phase.WATCH, wait=True)),
        (Phase.WATCH, Happened.WATCH_ENDED, False, Move(Phase.WATCH)),
        # A failed round backs off and relists, streaming when it may.
        (Phase.WATCH, Happened.FAILED, True, Move(Phase.STREAM, wait=True, new_round=True)),
        (Phase.WATCH, Happened.FAILED, False, Move(Phase.LIST, wait=True, new_round=True)),
        (Phase.LIST, Happened.FAILED, False, Move(Phase.LIST, wait=True, new_round=True)),
    ],
)
def test_each_outcome_has_its_next_phase(
    phase: Phase, happened: Happened, streaming: bool, move: Move
) -> None:
    assert step(phase, Outcome(happened), streaming=streaming) == move


def test_a_throttled_watch_waits_as_long_as_the_server_asked() -> None:
    outcome = Outcome(Happened.WATCH_ENDED, reason="throttled", retry_after=7.0)
    assert step(Phase.WATCH, outcome, streaming=False) == Move(
        Phase.WATCH, wait=True, retry_after=7.0
    )


def test_a_failed_round_honours_retry_after() -> None:
    outcome = Outcome(Happened.FAILED, ExpiredError("gone"), retry_after=3.0)
    move = step(Phase.WATCH, outcome, streaming=False)
    assert move.wait and move.retry_after == 3.0 and move.new_round


def test_a_rejected_list_stops() -> None:
    outcome = Outcome(Happened.REJECTED, ListRejectedError("bad selector"))
    assert step(Phase.LIST, outcome, streaming=False).stop
