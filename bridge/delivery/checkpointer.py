"""The checkpoint of one resource: rows written ahead of each send, commits behind the bus.

- **Write-ahead**: a batch's rows (``Batch.ahead``) are stored before the batch
  is handed to the sender, retried while the store is unavailable, so a crash
  never leaves an event on the bus whose object the checkpoint does not know.
- **Commits**: the watermark and the digests that became certain, on their
  own cadence, in steps of keys (``Commit.steps``): the digests first, the
  watermark with the last step, so a crash between steps leaves digests ahead
  of the watermark, never behind it.
- **The watermark's candidates**: the reflector's resourceVersion, observed
  together with the FIFO's counters at each notification (``observe``); the
  outbox turns them into marks and never lets the watermark pass an
  unacknowledged event.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable

from bridge.checkpoints.base import CheckpointStore
from bridge.delivery.outbox import Batch, Outbox
from bridge.delivery.retry import RetryDelays, retrying
from bridge.delivery.settings import PipelineSettings
from bridge.delivery.stats import PipelineStats
from bridge.errors import CheckpointError
from bridge.kube.backoff import Backoff
from bridge.kube.informer import SharedInformer
from bridge.logging import get_logger

log = get_logger(__name__)


class Checkpointer:
    """Writes ahead, commits, and feeds the outbox the watermark's candidates."""

    def __init__(
        self,
        *,
        resource_id: str,
        store: CheckpointStore,
        outbox: Outbox,
        settings: PipelineSettings,
        stats: PipelineStats,
        backoff: Callable[[], Backoff],
        label: str,
        clock: Callable[[], float] = time.monotonic,
        on_commit: Callable[[str], None] | None = None,
        on_commit_seconds: Callable[[float], None] | None = None,
        exclusive: asyncio.Lock | None = None,
    ) -> None:
        self.resource_id = resource_id
        self._store = store
        self.outbox = outbox
        self.settings = settings
        self._stats = stats
        self._backoff = backoff
        self._label = label
        self._clock = clock
        # Hears each committed watermark (the checkpoint gauge).
        self._on_commit = on_commit
        self._on_commit_seconds = on_commit_seconds
        # Held while a commit reads its rows and stores them, when the sender's
        # transactions write rows too (sink.kafka.exactlyOnce): see commit_once.
        self._exclusive = exclusive
        self.healthy = True
        # Whose reflector and FIFO say where the watermark may go (set once it exists).
        self.informer: SharedInformer | None = None
        # Set when the bus has acknowledged everything decided, or many keys await
        # their checkpoint rows: a commit is due early.
        self._commit_early = asyncio.Event()

    def _health(self, ok: bool) -> None:
        self.healthy = ok

    # -- the watermark's candidates ---------------------------------------------

    def observe(self) -> None:
        """Tie the reflector's position to the informer's progress (watermark candidates)."""
        informer = self.informer
        reflector = informer.reflector if informer is not None else None
        if informer is None or reflector is None:
            return
        fifo = informer.fifo
        self.outbox.observe(fifo.queued_total, reflector.last_sync_resource_version)
        self.outbox.progress(fifo.processed_total)

    # -- write-ahead --------------------------------------------------------------

    async def write_ahead(self, batch: Batch) -> None:
        """Store ``batch``'s rows, retrying while the store is unavailable; only then may
        the batch be sent. The certain rows of keys acknowledged since their commit go
        with them (``Outbox.acknowledged_rows``): a kill then leaves uncertain only
        what is not yet acknowledged and the batch acknowledged last."""
        outbox = self.outbox
        rows, keys, generation = outbox.acknowledged_rows(self.settings.commit_step_keys)
        await retrying(
            functools.partial(
                self._store.commit, self.resource_id, None, [*batch.ahead, *rows], ()
            ),
            retry_on=CheckpointError,
            what="write-ahead",
            health=self._health,
            backoff=self._backoff(),
            label=self._label,
        )
        if keys:
            outbox.settled(keys, generation)

    # -- commits ------------------------------------------------------------------

    def acknowledged(self) -> None:
        """The bus acknowledged a batch: a commit is due early if everything decided is
        acknowledged, or ``commit_after_keys`` keys await their rows."""
        outbox = self.outbox
        if not outbox.unacknowledged or outbox.dirty >= self.settings.commit_after_keys:
            self._commit_early.set()

    async def run(self) -> None:
        backoff = self._backoff()
        delays = RetryDelays(backoff)
        while True:
            await self._commit_due()
            try:
                await self.commit_once()
            except CheckpointError as e:
                self.healthy = False
                delay, again = delays.after(e)
                if not again:
                    log.warning("checkpoint failed; will retry", resource=self._label, error=str(e))
                await asyncio.sleep(delay)
                continue
            self.healthy = True
            delays.succeeded()
            backoff.reset()

    async def _commit_due(self) -> None:
        """Until the next commit: ``flush_interval`` passed, or the outbox drained, or
        ``commit_after_keys`` keys await their rows."""
        s = self.settings
        early = s.drained_commit_after
        if early is None or early >= s.flush_interval:
            await asyncio.sleep(s.flush_interval)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + s.flush_interval
        # Not sooner than ``early`` after the previous commit, however soon it is due.
        await asyncio.sleep(early)
        if not self._commit_early.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(deadline):
                    await self._commit_early.wait()
        # Cleared before the commit: a drain during it makes the next one due early.
        self._commit_early.clear()

    async def commit_once(self) -> None:
        """Commit the watermark and the digests that became certain, step by step."""
        self.observe()
        commit = self.outbox.checkpoint()
        if commit is None:
            self._stats.last_commit = self._clock()
            return
        started = time.perf_counter()
        try:
            # A transactional sender writes each batch's rows in its own transaction.
            # Rows read here and stored after a batch that a key's later decision
            # went out in would put the key's older digest over the newer one (a
            # restart then publishes the change again): no transaction comes between.
            async with self._exclusive or contextlib.nullcontext():
                # Step by step: the writer's write-aheads take their turn between steps.
                for step in commit.steps(self.settings.commit_step_keys):
                    await self._store.commit(self.resource_id, *step)
        except BaseException:
            self.outbox.commit_failed(commit)
            raise
        if self._on_commit_seconds is not None:
            self._on_commit_seconds(time.perf_counter() - started)
        self.outbox.committed(commit)
        self._stats.flushes += 1
        self._stats.last_commit = self._clock()
        if self._on_commit is not None:
            self._on_commit(commit.watermark)
