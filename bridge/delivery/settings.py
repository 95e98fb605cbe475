"""What a resource's pipeline is told: batches, bounds on what waits, commits, retries, the poison policy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from bridge.kube.reflector import ReflectorSettings

PoisonPolicy = Literal["truncate", "skip", "fail", "deadLetter"]


@dataclass(frozen=True, slots=True)
class PipelineSettings:
    # How often the checkpoint (watermark + certain digests) is committed.
    flush_interval: float = 1.0
    # Once everything decided is acknowledged (a list or a burst drained), commit
    # then rather than at the next tick, so the checkpoint does not trail an idle
    # bus by up to ``flush_interval``; but not sooner than this after the previous
    # commit, so a trickle of events does not commit once per event. None: ticks only.
    drained_commit_after: float | None = 0.1
    # Once this many keys await their checkpoint rows, commit then too (after the
    # same minimum): what waits for a commit grows with its keys (each key's name
    # in the dirty set, ~120 B, then its row). 4,096 keeps a first sync's peak
    # memory per object ~10% below 16,384's (``python -m bench slowbus``) at the
    # same events/s (``python -m bench e2e``).
    commit_after_keys: int = 4_096
    # A commit goes to the store in steps of at most this many keys, each read
    # from the cache when its turn comes (``Commit.steps``), so a write-ahead
    # waits for one step, not for the whole commit.
    commit_step_keys: int = 1_000
    # At most this many events per publish; a batch is whatever was decided
    # while the previous one was being written ahead and published.
    max_batch: int = 500
    # How long the writer waits for more events before taking a batch.
    linger: float = 0.001
    # While changes come steadily, on average at most this far apart (100/s and
    # more with the default), the writer waits this long instead: a batch then
    # carries several changes, which share its write-ahead commit and its publish
    # (most of what a change costs at such rates: python -m bench steady). A
    # trickle keeps ``linger``, as nothing would join its batch. Off when
    # ``linger`` is 0.
    steady_linger: float = 0.01
    # Decided but unacknowledged events beyond this make the informer wait; None:
    # two batches (``pending_limit``), one being published while the next fills
    # and is written ahead. That keeps batches full behind a slow bus; more
    # batches add to the peak memory, not to the rate (``python -m bench slowbus``).
    max_pending: int | None = None
    # ... and so do decided events whose encoded size adds up to this many bytes:
    # what they hold grows with the objects, not their number (1000 ConfigMaps of
    # 500 KB would be 500 MB). One event larger than this still goes, alone.
    # Above two batches of pods' events (~3 MB), so that for pods the count
    # decides: below it, batches are cut short, and a slow bus carries less than
    # half the events/s (``python -m bench slowbus``).
    max_pending_bytes: int = 8 << 20
    retry_initial: float = 0.5
    retry_cap: float = 30.0
    # A batch waiting this long for its ack makes the resource not ready
    # (``health.stallSeconds``); 0: never.
    stall_after: float = 60.0
    # On shutdown, how long to keep trying to publish what was decided. Giving
    # up loses nothing: those events were written ahead, a restart resolves them.
    shutdown_timeout: float = 10.0
    poison_policy: PoisonPolicy = "truncate"
    slim: bool = True
    # Decoded items waiting for the handlers (~12 KB each for a 3 KB pod). Few
    # enough to be handled while still in the CPU's caches: a first sync peaks
    # lower than with ten times as many, at the same or a higher rate
    # (``python -m bench slowbus``).
    max_queued: int | None = 100
    resync_period: float | None = None
    reflector: ReflectorSettings = field(default_factory=ReflectorSettings)

    @property
    def pending_limit(self) -> int:
        """``max_pending``, or two batches when it is None."""
        return self.max_pending if self.max_pending is not None else 2 * self.max_batch
