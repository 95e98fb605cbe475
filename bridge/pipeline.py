"""One resource end to end: informer → change detection → events → sink → checkpoint.

The order of operations is the guarantee. Events are handed to the sink in
the order the informer saw them (per object, resourceVersion order); the
checkpoint (watermark + digests) is written only after the sink acknowledged
every event up to it; and the watermark moves only when the informer is idle,
i.e. every event up to the reflector's last resourceVersion was processed and
is in the batch being published. After a crash the bridge therefore resumes
at or before the last published change: anything replayed is recognised by
its digest (not republished) or, for deletes, carries the same event id.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal

from bridge.changes import (
    FINGERPRINT_FIELD,
    Change,
    ChangeDetector,
    ChangeKind,
    Digest,
    object_from_digest,
)
from bridge.checkpoints.base import Checkpoint, CheckpointStore
from bridge.errors import CheckpointError, SinkError
from bridge.events import Event, EventBuilder
from bridge.kube.informer import SharedInformer
from bridge.kube.objects import DeletedFinalStateUnknown, RawObject, namespace_key
from bridge.kube.protocols import ListerWatcher
from bridge.kube.reflector import ReflectorSettings
from bridge.logging import get_logger
from bridge.metrics import Metrics
from bridge.sinks.base import Sink

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class PipelineSettings:
    flush_interval: float = 1.0
    flush_events: int = 500
    retry_initial: float = 0.5
    retry_cap: float = 30.0
    # A checkpoint that has not advanced for this long while events wait makes
    # the bridge not-ready.
    stall_after: float = 120.0
    # On shutdown, how long to keep trying to publish what was processed. Giving
    # up loses nothing: the checkpoint stays behind and a restart replays it.
    shutdown_timeout: float = 10.0
    slim: bool = True
    fifo: Literal["real", "delta"] = "real"
    max_queued: int | None = 1000
    reflector: ReflectorSettings = field(default_factory=ReflectorSettings)


@dataclass
class PipelineStats:
    published: int = 0
    suppressed: int = 0
    listed: int = 0
    flushes: int = 0
    last_commit: float = field(default_factory=time.monotonic)


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
        metrics: Metrics | None = None,
        label: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.resource_id = resource_id
        self.label = label or resource_id
        self._lw = lw
        self._detector = detector
        self._builder = builder
        self._sink = sink
        self._checkpoints = checkpoints
        self.settings = settings or PipelineSettings()
        self._metrics = metrics
        self._clock = clock
        # The last published state per key: what the checkpoint will hold.
        self._published: dict[str, Digest] = {}
        self._pending: list[Event] = []
        self._upserts: dict[str, Digest] = {}
        self._deletes: set[str] = set()
        self._committed_rv = ""
        self._resumed = False
        self._handler_depth = 0
        self._flush_lock = asyncio.Lock()
        # The full batch whose acks are awaited while the next one is built.
        self._in_flight: asyncio.Task[None] | None = None
        self._full_old = builder.include_old or builder.patch
        self.informer: SharedInformer | None = None
        self.stats = PipelineStats(last_commit=clock())
        self.sink_healthy = True
        self.checkpoint_healthy = True

    # -- state ------------------------------------------------------------------

    @property
    def committed_resource_version(self) -> str:
        return self._committed_rv

    def has_synced(self) -> bool:
        return self.informer is not None and self.informer.has_synced()

    def stalled(self) -> bool:
        """Events wait and the checkpoint has not moved for ``stall_after`` seconds."""
        waiting = bool(self._pending or self._upserts or self._deletes)
        return waiting and self._clock() - self.stats.last_commit > self.settings.stall_after

    def _idle(self) -> bool:
        informer = self.informer
        return (
            informer is not None
            and self._handler_depth == 0
            and informer.fifo.is_idle()
            and informer.has_synced()
        )

    # -- running ----------------------------------------------------------------

    async def load(self) -> None:
        """Read the checkpoint and build the informer: resume where the last run stopped."""
        checkpoint = await self._checkpoints.load(self.resource_id)
        self.informer = self._build_informer(checkpoint)
        self.informer.add_event_handler(self)

    def _build_informer(self, checkpoint: Checkpoint | None) -> SharedInformer:
        initial_objects: list[RawObject] | None = None
        initial_rv: str | None = None
        if checkpoint is not None:
            self._resumed = True
            self._published = dict(checkpoint.digests)
            self._committed_rv = checkpoint.resource_version
            initial_objects = [self._record_of(d) for d in checkpoint.digests.values()]
            # No watermark yet (the first list never completed): relist and diff.
            initial_rv = checkpoint.resource_version or None
            log.info(
                "resuming from checkpoint",
                resource=self.label,
                resource_version=checkpoint.resource_version,
                objects=len(checkpoint.digests),
            )
        slim = self._detector.fingerprinter.fingerprint
        return SharedInformer(
            self._lw,
            name=self.label,
            fifo=self.settings.fifo,
            slim=slim if self.settings.slim and not self._full_old else None,
            reflector_settings=self.settings.reflector,
            initial_objects=initial_objects,
            initial_resource_version=initial_rv,
            max_queued=self.settings.max_queued,
        )

    def _record_of(self, digest: Digest) -> RawObject:
        record = object_from_digest(
            digest, api_version=self._builder.api_version, kind=self._builder.kind
        )
        record[FINGERPRINT_FIELD] = digest.fingerprint
        return record

    async def run(self) -> None:
        """Run until cancelled; on cancellation publish and checkpoint what was processed."""
        if self.informer is None:
            await self.load()
        assert self.informer is not None
        informer_task = asyncio.create_task(self.informer.run(), name=f"informer:{self.label}")
        flusher = asyncio.create_task(self._flush_loop(), name=f"flusher:{self.label}")
        try:
            done, _ = await asyncio.wait(
                {informer_task, flusher}, return_when=asyncio.FIRST_EXCEPTION
            )
            for task in done:
                task.result()
        finally:
            deadline = asyncio.get_running_loop().time() + self.settings.shutdown_timeout
            # Everything processed so far may still advance the watermark...
            if self._idle():
                await self._within(self._flush(), deadline)
            for task in (informer_task, flusher):
                task.cancel()
            await asyncio.gather(informer_task, flusher, return_exceptions=True)
            # ...but after the informer was interrupted nothing proves it idle:
            # publish the rest and keep the watermark where it was.
            if not await self._within(self._flush(advance=False), deadline):
                log.warning(
                    "gave up publishing at shutdown; the next start replays from the checkpoint",
                    resource=self.label,
                    pending=len(self._pending),
                )

    async def _within(self, flush: Coroutine[Any, Any, None], deadline: float) -> bool:
        """Run a shutdown flush until ``deadline``; on time-out abandon it (and the batch in flight)."""
        task = asyncio.ensure_future(flush)
        timeout = max(0.0, deadline - asyncio.get_running_loop().time())
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except TimeoutError:
            for pending in (task, self._in_flight):
                if pending is not None and not pending.done():
                    pending.cancel()
                    with contextlib.suppress(BaseException):
                        await pending
            return False
        except Exception as e:
            log.warning("flush failed at shutdown", resource=self.label, error=str(e))
            return False
        return True

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.flush_interval)
            await self._flush()

    # -- the informer's handler -----------------------------------------------

    async def on_add(self, obj: RawObject, is_in_initial_list: bool) -> None:
        key = namespace_key(obj)
        initial = is_in_initial_list and not self._resumed
        if is_in_initial_list:
            self.stats.listed += 1
        await self._emit(self._detector.on_add(obj, self._published.get(key), initial=initial))

    async def on_update(self, old: RawObject, new: RawObject) -> None:
        key = namespace_key(new)
        known = self._published.get(key)
        if known is None:
            changes = self._detector.on_add(new, None)
        elif self._full_old and FINGERPRINT_FIELD not in old:
            changes = self._detector.on_update(old, new)
        else:
            changes = self._detector.on_update(known, new)
        await self._emit(changes)

    async def on_delete(self, obj: RawObject | DeletedFinalStateUnknown) -> None:
        await self._emit(self._detector.on_delete(obj))

    async def _emit(self, changes: list[Change]) -> None:
        if not changes:
            self.stats.suppressed += 1
            if self._metrics is not None:
                self._metrics.changes_suppressed.labels(
                    resource=self.label, reason="unchanged"
                ).inc()
            return
        self._handler_depth += 1
        try:
            for change in changes:
                self._pending.append(self._builder.build(change))
                if change.kind is ChangeKind.DELETED:
                    self._published.pop(change.key, None)
                    self._upserts.pop(change.key, None)
                    self._deletes.add(change.key)
                elif change.digest is not None:
                    self._published[change.key] = change.digest
                    self._upserts[change.key] = change.digest
                    self._deletes.discard(change.key)
            if len(self._pending) >= self.settings.flush_events:
                await self._flush_in_background()
        finally:
            self._handler_depth -= 1

    # -- publishing and checkpointing ----------------------------------------

    async def _flush_in_background(self) -> None:
        """Hand a full batch to the sink and go on building the next one meanwhile.

        Backpressure: with a batch already awaiting its acks, the informer waits
        here for it, so at most two batches (one in flight, one being built) are
        held in memory. Flushes are serialised by the lock, so batches reach the
        bus in order.
        """
        previous = self._in_flight
        if previous is not None:
            await previous  # re-raises a failure other than an unreachable bus
        self._in_flight = asyncio.create_task(self._flush(), name=f"flush:{self.label}")

    async def _flush(self, *, advance: bool = True) -> None:
        async with self._flush_lock:
            informer = self.informer
            watermark = self._committed_rv
            if advance and informer is not None and self._idle():
                watermark = informer.last_sync_resource_version or watermark
            events, upserts, deletes = self._pending, self._upserts, self._deletes
            if not events and not upserts and not deletes and watermark == self._committed_rv:
                self.stats.last_commit = self._clock()
                return
            self._pending, self._upserts, self._deletes = [], {}, set()
            try:
                await self._publish(events)
                await self._commit(watermark, upserts, deletes)
            except BaseException:
                # Not acknowledged (or not stored): keep it for the next flush, in order.
                self._pending[:0] = events
                # Anything newer (already pending) for the same key wins.
                for k, d in upserts.items():
                    if k not in self._upserts and k not in self._deletes:
                        self._upserts[k] = d
                self._deletes |= {k for k in deletes if k not in self._upserts}
                raise
            self._committed_rv = watermark
            self.stats.flushes += 1
            self.stats.last_commit = self._clock()
            if self._metrics is not None:
                self._metrics.set_checkpoint(self.label, watermark)

    async def _publish(self, events: list[Event]) -> None:
        if not events:
            return
        delay = self.settings.retry_initial
        while True:
            started = time.perf_counter()
            if self._metrics is not None:
                self._metrics.sink_in_flight.inc(len(events))
            try:
                await self._sink.publish(events)
            except SinkError as e:
                self.sink_healthy = False
                log.warning(
                    "publish failed; will retry",
                    resource=self.label,
                    events=len(events),
                    error=str(e),
                    retry_in=round(delay, 2),
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.retry_cap)
                continue
            finally:
                if self._metrics is not None:
                    self._metrics.sink_in_flight.dec(len(events))
            break
        self.sink_healthy = True
        self.stats.published += len(events)
        if self._metrics is not None:
            self._metrics.publish_latency.labels(sink=type(self._sink).__name__).observe(
                time.perf_counter() - started
            )
            for event in events:
                self._metrics.events_published.labels(
                    resource=self.label, type=event.type.rsplit(".", 1)[-1]
                ).inc()

    async def _commit(self, watermark: str, upserts: dict[str, Digest], deletes: set[str]) -> None:
        delay = self.settings.retry_initial
        while True:
            try:
                await self._checkpoints.commit(
                    self.resource_id, watermark, upserts.values(), deletes
                )
            except CheckpointError as e:
                self.checkpoint_healthy = False
                log.warning("checkpoint failed; will retry", resource=self.label, error=str(e))
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.retry_cap)
                continue
            self.checkpoint_healthy = True
            return
