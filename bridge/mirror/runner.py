"""The mirror's loop: read a batch from the bus, write it and its positions in one transaction.

Nothing is lost and nothing stops it:

- a message that is not ours is counted and skipped with one log line; its
  position still moves with the batch (it is read, not lost);
- a database that goes away pauses reading: the batch in hand is dropped
  (its transaction never committed, so the stored positions did not move)
  and, once the database answers again, reading restarts from the stored
  positions — no gap, no double;
- a position that moved under the batch (a commit whose answer was lost, or a
  second mirror of the same source) is the same: read again from the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from bridge.logging import get_logger
from bridge.mirror.rows import Change, NotOurs, decode, mark_winners
from bridge.mirror.sources import Message, Source, SourceUnavailable
from bridge.mirror.store import Batch, DatabaseUnavailable, MirrorStore, PositionMoved

log = get_logger(__name__)


@dataclass
class DatabaseMirrorStats:
    changes: int = 0  # changes written (each event once)
    batches: int = 0
    skipped: int = 0  # messages that are not ours
    heartbeats: int = 0
    database_outages: int = 0
    bus_outages: int = 0
    rereads: int = 0  # positions that moved under a batch
    last_commit: float = 0.0  # Unix time of the last committed batch

    def line(self) -> str:
        return (
            f"{self.changes} changes in {self.batches} transactions, {self.skipped} messages"
            f" skipped (not ours), {self.database_outages} database outages,"
            f" {self.bus_outages} bus outages"
        )


class DatabaseMirror:
    def __init__(
        self,
        source: Source,
        store: MirrorStore,
        *,
        max_events: int = 5000,
        max_wait: float = 0.05,
        prune_every: float = 60.0,
        backoff: tuple[float, float] = (0.2, 5.0),
        on_batch: Callable[[Batch], None] | None = None,
    ) -> None:
        self.source = source
        self.store = store
        self.max_events = max_events
        self.max_wait = max_wait
        self.prune_every = prune_every
        self.backoff = backoff
        self.on_batch = on_batch
        self.stats = DatabaseMirrorStats()
        # partition → next position as stored (None: nothing stored yet)
        self._stored: dict[int, int | None] = {}
        # What is unavailable while the mirror waits for it ("PostgreSQL", "the bus").
        self.paused: str | None = None
        self.positioned = False  # read the stored positions and sought the bus once

    async def run(self, stop: asyncio.Event) -> None:
        need_open, need_seek = True, True
        delay = self.backoff[0]
        last_prune = time.monotonic()
        try:
            while not stop.is_set():
                try:
                    if need_open:
                        await self.store.open()
                        need_open, need_seek = False, True
                    if need_seek:
                        stored = await self.store.positions(self.source.identity)
                        await self.source.seek(stored)
                        self._stored = dict(stored)
                        need_seek, self.positioned = False, True
                    if self.paused is not None:
                        log.info(f"{self.paused} is back: reading again from the stored positions")
                        self.paused, delay = None, self.backoff[0]
                    messages = await self.source.fetch(self.max_events, self.max_wait)
                    if messages:
                        batch = self._batch(messages)
                        await self.store.apply(batch)
                        for part, (_, after) in batch.positions.items():
                            self._stored[part] = after
                        self.stats.batches += 1
                        self.stats.changes += len(batch.changes)
                        self.stats.last_commit = time.time()
                        if self.on_batch is not None:
                            self.on_batch(batch)
                    if time.monotonic() - last_prune > self.prune_every:
                        last_prune = time.monotonic()
                        await self.store.prune()
                except DatabaseUnavailable as e:
                    need_open = True
                    if self.paused != "PostgreSQL":
                        self.stats.database_outages += 1
                        log.warning(f"database unavailable, pausing ({e}); retrying")
                    self.paused = "PostgreSQL"
                except SourceUnavailable as e:
                    need_seek = True
                    if self.paused != "the bus":
                        self.stats.bus_outages += 1
                        log.warning(f"bus unavailable, pausing ({e}); retrying")
                    self.paused = "the bus"
                except PositionMoved as e:
                    self.stats.rereads += 1
                    log.info(f"position moved: {e}")
                    need_seek = True
                    continue
                else:
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await stop.wait()
                delay = min(delay * 2, self.backoff[1])
        finally:
            await self.source.close()
            await self.store.close()

    def _batch(self, messages: list[Message]) -> Batch:
        changes: list[Change] = []
        ends: dict[int, int] = {}
        for m in messages:
            ends[m.partition] = max(ends.get(m.partition, -1), m.position + 1)
            try:
                change = decode(m.value, m.partition, m.position)
            except NotOurs as e:
                self.stats.skipped += 1
                log.warning(
                    f"skipping message {self.source.identity}[{m.partition}]@{m.position}:"
                    f" not a change event of k8s-bridge ({e})"
                )
                continue
            if change is None:
                self.stats.heartbeats += 1
                continue
            changes.append(change)
        mark_winners(changes)
        positions = {p: (self._stored.get(p), after) for p, after in ends.items()}
        return Batch(self.source.identity, changes, positions)
