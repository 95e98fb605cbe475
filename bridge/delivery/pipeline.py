"""One resource end to end: informer → change detection → outbox → sink, checkpoint behind.

The synchronous ``Outbox`` (bridge/delivery/outbox.py) owns what was decided and how
far the bus has taken it; around it, one part per concern, wired here:

- **resume** (bridge/delivery/resume.py): the checkpoint read back, where the
  watch starts, which keys a previous run left uncertain;
- **decide** (bridge/delivery/handler.py): the informer's handler, which turns
  each notification into events in the outbox at once and then waits for room
  while too much is unacknowledged;
- **deliver** (bridge/delivery/publisher.py): the writer and the sender, batches
  in order to the sink, the poison policy;
- **checkpoint** (bridge/delivery/checkpointer.py): rows written ahead of every
  send, commits of the watermark and the certain digests behind the bus.

The pipeline builds them, runs their tasks (informer, checkpointer, writer and
sender) and, on the way out, publishes what was decided and commits what was
acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable

from bridge.aiotasks import cancel_and_wait, run_group
from bridge.checkpoints.base import CheckpointStore
from bridge.delivery.changes import ChangeDetector
from bridge.delivery.checkpointer import Checkpointer
from bridge.delivery.events import EventBuilder
from bridge.delivery.filters import Filter
from bridge.delivery.handler import ChangeHandler
from bridge.delivery.outbox import Outbox
from bridge.delivery.publisher import Publisher, TransactionalSend
from bridge.delivery.resume import resume
from bridge.delivery.settings import PipelineSettings, PoisonPolicy
from bridge.delivery.stats import PipelineMetrics, PipelineStats
from bridge.delivery.tracing import BatchTracer
from bridge.errors import PoisonEventError
from bridge.ground.digest import Digest
from bridge.ground.envelope import Event
from bridge.kube.backoff import Backoff
from bridge.kube.informer import SharedInformer
from bridge.kube.protocols import ListerWatcher
from bridge.logging import get_logger
from bridge.sinks.base import Sink

__all__ = ["PipelineSettings", "PipelineStats", "PoisonPolicy", "ResourcePipeline"]

log = get_logger(__name__)


class ResourcePipeline:
    """Runs one informer and publishes its real changes."""

    def __init__(
        self,
        *,
        resource_id: str,
        lw: ListerWatcher,
        detector: ChangeDetector,
        builder: EventBuilder,
        sink: Sink,
        checkpoints: CheckpointStore,
        settings: PipelineSettings | None = None,
        metrics: PipelineMetrics | None = None,
        label: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        backoff: Callable[[], Backoff] | None = None,
        filter: Filter | None = None,
        transactional: TransactionalSend | None = None,
        tracer: BatchTracer | None = None,
    ) -> None:
        self.resource_id = resource_id
        self.label = label = label or resource_id
        self._lw = lw
        self._builder = builder
        self._checkpoints = checkpoints
        self._settings = s = settings or PipelineSettings()
        self._clock = clock
        backoff = backoff or (lambda: Backoff(initial=s.retry_initial, cap=s.retry_cap, jitter=0.2))
        self._filter = filter
        self.informer: SharedInformer | None = None
        self.stats = stats = PipelineStats(last_commit=clock())
        # Why the pipeline stopped for good (poison policy "fail"), for readiness.
        self.failed: str | None = None
        # The outbox until ``load`` finds a checkpoint to start from.
        outbox = Outbox(self._digest_of, clock=clock)
        # Commits and transactions that carry rows never interleave (checkpointer.py).
        exclusive = asyncio.Lock() if transactional is not None else None
        self.checkpointer = Checkpointer(
            resource_id=resource_id,
            store=checkpoints,
            outbox=outbox,
            settings=s,
            stats=stats,
            backoff=backoff,
            label=label,
            clock=clock,
            on_commit=functools.partial(metrics.set_checkpoint, label)
            if metrics is not None
            else None,
            on_commit_seconds=metrics.commit_seconds_of(label) if metrics is not None else None,
            exclusive=exclusive,
        )
        self.publisher = Publisher(
            sink=sink,
            outbox=outbox,
            settings=s,
            stats=stats,
            write_ahead=self.checkpointer.write_ahead,
            on_acknowledged=self.checkpointer.acknowledged,
            backoff=backoff,
            label=label,
            clock=clock,
            on_publish_latency=metrics.publish_latency_of(type(sink).__name__)
            if metrics is not None
            else None,
            on_batch_size=metrics.batch_size_of(label) if metrics is not None else None,
            transactional=transactional,
            exclusive=exclusive,
            tracer=tracer,
        )
        self.handler = ChangeHandler(
            detector=detector,
            builder=builder,
            filter=filter,
            outbox=outbox,
            settings=s,
            stats=stats,
            observe=self.checkpointer.observe,
            decided=self.publisher.decided,
            acknowledged=self.publisher.acknowledged,
        )
        self.outbox = outbox

    def _use(self, outbox: Outbox) -> None:
        """Every part works on ``outbox`` from now on (before any of them runs)."""
        self.outbox = self.handler.outbox = self.publisher.outbox = self.checkpointer.outbox = (
            outbox
        )

    @property
    def settings(self) -> PipelineSettings:
        return self._settings

    @settings.setter
    def settings(self, settings: PipelineSettings) -> None:
        self._settings = settings
        for part in (self.handler, self.publisher, self.checkpointer):
            part.settings = settings

    def _digest_of(self, key: str) -> Digest | None:
        return self.handler.digest_of(key)

    # -- state ------------------------------------------------------------------

    @property
    def committed_resource_version(self) -> str:
        return self.outbox.committed_watermark

    @property
    def sink_healthy(self) -> bool:
        return self.publisher.healthy

    @sink_healthy.setter
    def sink_healthy(self, ok: bool) -> None:
        self.publisher.healthy = ok

    @property
    def checkpoint_healthy(self) -> bool:
        return self.checkpointer.healthy

    @property
    def last_change_at(self) -> float | None:
        """When the bus last acknowledged a change (not an announcement), for heartbeats."""
        return self.publisher.last_change_at

    def has_synced(self) -> bool:
        return self.informer is not None and self.informer.has_synced()

    def oldest_unacked_age(self) -> float:
        """Seconds the oldest batch taken for delivery has waited for its ack (0: none waits)."""
        return self.outbox.oldest_unacked_age()

    def stalled(self) -> float | None:
        """How long the oldest batch has waited for its ack, once past ``stall_after``
        (None: not stalled, or ``stall_after`` is 0, off)."""
        after = self.settings.stall_after
        age = self.outbox.oldest_unacked_age()
        return age if after and age >= after else None

    def checkpoint_lag(self) -> float:
        return self.outbox.lag()

    # What heartbeats (bridge/delivery/heartbeat.py) and snapshots (bridge/delivery/snapshot.py) read.

    def watch_up(self) -> bool:
        reflector = self.informer.reflector if self.informer is not None else None
        return reflector is not None and reflector.connected

    def object_count(self) -> int:
        """Objects in view: cached and not outside the filter."""
        informer = self.informer
        return len(informer.store) - len(self.handler.out) if informer is not None else 0

    def unacknowledged(self) -> int:
        return self.outbox.unacknowledged

    @property
    def filter_errors(self) -> int:
        """Filter evaluations that failed (each counted as "no match") since start."""
        return self._filter.errors if self._filter is not None else 0

    def seconds_since_last_change(self) -> float | None:
        at = self.last_change_at
        return None if at is None else max(0.0, self._clock() - at)

    @property
    def lister(self) -> ListerWatcher:
        return self._lw

    @property
    def detector(self) -> ChangeDetector:
        return self.handler.detector

    @property
    def builder(self) -> EventBuilder:
        return self._builder

    def cached_digest(self, key: str) -> Digest | None:
        """The cached state of ``key``: what its last decision (or the checkpoint) holds."""
        return self.handler.digest_of(key)

    def is_filtered_out(self, key: str) -> bool:
        """The cached object ``key`` is outside the resource's filter (not published)."""
        return key in self.handler.out

    def is_uncertain(self, key: str) -> bool:
        """A restart left ``key`` uncertain and no news of it has settled it yet."""
        return key in self.outbox.uncertain

    def announce(self, key: str, uid: str, event: Event) -> int:
        """Queue a re-announcement of ``key``'s current state behind everything decided
        (``Outbox.announce``); returns its sequence number."""
        entry = self.outbox.announce(key, uid, event)
        self.publisher.decided()
        return entry.seq

    async def wait_for_room(self) -> None:
        await self.handler.wait_for_room()

    async def wait_acknowledged(self, seq: int) -> None:
        """Until the bus has acknowledged every event up to ``seq``."""
        await self.publisher.wait_acknowledged(seq)

    # -- start: resume from the checkpoint ---------------------------------------

    async def load(self) -> None:
        """Read the checkpoint and build the informer: resume where the last run stopped."""
        await self._load()

    async def _load(self) -> None:
        s = self.settings
        start = await resume(
            self._checkpoints, self.resource_id, self._builder, s.reflector, label=self.label
        )
        if start.resumed:
            self._use(start.outbox(self._digest_of, self._clock))
            self.handler.resumed = True
            self.handler.replayed_deletes = dict(start.replayed_deletes)
            if start.deletes:
                self.publisher.decided()
        full_old = self._builder.include_old or self._builder.patch
        self.informer = informer = SharedInformer(
            self._lw,
            self.handler,
            name=self.label,
            slim=self.handler.detector.fingerprinter.fingerprint
            if s.slim and not full_old
            else None,
            reflector_settings=start.reflector,
            initial_objects=start.records,
            initial_packed=start.packed,
            initial_resource_version=start.start_at,
            max_queued=s.max_queued,
            drop_stale=True,
            # With a filter, a delete of an object never cached was never published.
            notify_unknown_deletes=self._filter is None,
            resync_period=s.resync_period,
        )
        self.handler.store = informer.store
        self.checkpointer.informer = informer

    # -- running ----------------------------------------------------------------

    async def run(self) -> None:
        """Run until cancelled; then publish what was decided and commit what was acknowledged."""
        if self.informer is None:
            await self.load()
        assert self.informer is not None
        prefix = f"{self.label}:"
        delivery = asyncio.create_task(self.publisher.run(prefix=prefix))
        try:
            await run_group(
                {
                    "informer": self.informer.run(),
                    "checkpointer": self.checkpointer.run(),
                    "delivery": _watch(delivery),
                },
                prefix=prefix,
            )
        except PoisonEventError as e:
            self.failed = str(e)
            log.error("resource stopped", resource=self.label, error=str(e))
            await asyncio.Event().wait()  # stay stopped (not-ready) until cancelled
        finally:
            await self._shutdown(delivery)

    async def _shutdown(self, delivery: asyncio.Task[None]) -> None:
        """Publish what was decided, within ``shutdown_timeout``; commit what was acknowledged."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.shutdown_timeout
        try:
            if self.outbox.unacknowledged and not delivery.done() and self.failed is None:
                # Until the bus has taken everything, or delivery ended (it failed).
                drained = asyncio.create_task(self.publisher.drained())
                try:
                    await asyncio.wait(
                        (drained, delivery),
                        timeout=max(0.0, deadline - loop.time()),
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    await cancel_and_wait([drained])
                if self.outbox.unacknowledged and not delivery.done():
                    log.warning(
                        "gave up publishing at shutdown; the next start resolves it",
                        resource=self.label,
                        unacknowledged=self.outbox.unacknowledged,
                    )
        finally:
            await cancel_and_wait([delivery])
            with contextlib.suppress(Exception):
                async with asyncio.timeout(max(0.1, deadline - loop.time())):
                    await self.checkpointer.commit_once()


async def _watch(task: asyncio.Task[None]) -> None:
    """Await a task started elsewhere (its failure ends the group; cancelling leaves it be)."""
    await asyncio.shield(task)
