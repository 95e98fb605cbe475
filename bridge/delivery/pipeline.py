"""One resource end to end: informer → change detection → outbox → sink, checkpoint behind.

The synchronous ``Outbox`` (bridge/delivery/outbox.py) owns what was decided and how
far the bus has taken it; this module is its async driver, four tasks:

- the **informer** calls the handlers below, which decide events at once (no
  await between the cache update and the decision) and then wait for room
  when too much is unacknowledged, which is how a slow bus slows the watch;
- the **writer** takes a batch as soon as events are decided (a linger of a
  millisecond at most), or, while the sender publishes, once the batch is full
  or the sender is done; it writes the batch's rows ahead to the checkpoint
  store and hands it on;
- the **sender** publishes batches in order, one at a time, retrying only
  while the bus is unavailable; events the bus refuses for good go through the
  poison policy and never block the events behind them;
- the **checkpointer** commits the watermark and the digests that became
  certain, on its own cadence, in steps of keys (``Commit.steps``): the
  digests first, the watermark with the last step, so a crash between steps
  leaves digests ahead of the watermark, never behind it.

After a crash the checkpoint knows every key whose event may have reached the
bus (``load``). Those keys are *uncertain*: cached as unconfirmed, so the next
news of each (the resumed watch replays it, or a relist settles it) reaches the
handler, which republishes an unchanged object with the id it was written
ahead with, publishes a change as modified and a vanished object as deleted.
The informer drops replayed states older than its cache (``drop_stale``), so
resuming from a watermark that lags the digests republishes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Literal, TypeVar

from bridge.aiotasks import cancel_and_wait, run_group
from bridge.checkpoints.base import CheckpointStore, load_bulk
from bridge.delivery.changes import (
    CERTAIN,
    FINGERPRINT_FIELD,
    Change,
    ChangeDetector,
    ChangeKind,
    Digest,
    object_from_digest,
)
from bridge.delivery.events import Event, EventBuilder
from bridge.delivery.filters import Filter
from bridge.delivery.outbox import Batch, Outbox
from bridge.errors import CheckpointError, PoisonEventError, SinkUnavailableError
from bridge.kube.backoff import Backoff
from bridge.kube.informer import SharedInformer
from bridge.kube.objects import (
    CachedObject,
    DeletedFinalStateUnknown,
    RawObject,
    meta,
    namespace_key,
)
from bridge.kube.protocols import ListerWatcher
from bridge.kube.records import LooseRecord, PackedRecord, make_record, records_of_rows
from bridge.kube.reflector import ReflectorSettings
from bridge.logging import get_logger
from bridge.service.gctune import gc_paused
from bridge.service.metrics import Metrics
from bridge.sinks.base import Sink

log = get_logger(__name__)

T = TypeVar("T")

PoisonPolicy = Literal["truncate", "skip", "fail"]


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
    # in the dirty set, ~120 B, then its row). A 100k-pod first sync peaked at
    # 271-283 B per object with 4,096 against 305-320 B with 16,384 (bench
    # slowbus, same emulator, same hour), at the same events/s; a burst of 10k
    # updates ran at 7.1-8.9k events/s against 8.0-9.8k (bench e2e, alternating),
    # within the machine's noise. Before commits went in steps (below), every
    # write-ahead waited behind whole commits, and 4,096 cost a burst 10-15%.
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
    # Decided but unacknowledged events beyond this make the informer wait; None:
    # two batches (``pending_limit``), one being published while the next fills
    # and is written ahead. That keeps batches full behind a slow bus: at a
    # 100k-pod first sync with a bus taking 100 ms per batch, 4.6k events/s and
    # a peak of 26 MiB, against 4.75k/s and 31 MiB with four batches (2048).
    max_pending: int | None = None
    # ... and so do decided events whose encoded size adds up to this many bytes:
    # what they hold grows with the objects, not their number (1000 ConfigMaps of
    # 500 KB would be 500 MB). One event larger than this still goes, alone.
    # Above two batches of pods' events (~3 MB), so that for pods the count
    # decides; at 2 MiB, batches of pods were cut short, and a bus taking 100 ms
    # per batch carried 1.9k events/s instead of 4.7k (bench slowbus).
    max_pending_bytes: int = 8 << 20
    retry_initial: float = 0.5
    retry_cap: float = 30.0
    # Events waiting while nothing is acknowledged for this long: not-ready.
    stall_after: float = 120.0
    # On shutdown, how long to keep trying to publish what was decided. Giving
    # up loses nothing: those events were written ahead, a restart resolves them.
    shutdown_timeout: float = 10.0
    poison_policy: PoisonPolicy = "truncate"
    slim: bool = True
    # Decoded items waiting for the handlers (~12 KB each for a 3 KB pod). At 100,
    # against 1000, a 100k-pod first sync peaked 5-25 MiB lower at the same or a
    # higher rate (bench slowbus): they are handled while still in the CPU's caches.
    max_queued: int | None = 100
    resync_period: float | None = None
    reflector: ReflectorSettings = field(default_factory=ReflectorSettings)

    @property
    def pending_limit(self) -> int:
        """``max_pending``, or two batches when it is None."""
        return self.max_pending if self.max_pending is not None else 2 * self.max_batch


@dataclass
class PipelineStats:
    published: int = 0
    suppressed: int = 0
    listed: int = 0
    flushes: int = 0
    last_commit: float = field(default_factory=time.monotonic)
    # Published events by type (added/modified/deleted), and poison outcomes:
    # plain counters on the hot path, carried over to Prometheus by the observer.
    by_type: Counter[str] = field(default_factory=Counter)
    poison: Counter[str] = field(default_factory=Counter)


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
        backoff: Callable[[], Backoff] | None = None,
        filter: Filter | None = None,
    ) -> None:
        self.resource_id = resource_id
        self.label = label or resource_id
        self._lw = lw
        self._detector = detector
        self._builder = builder
        self._sink = sink
        self._checkpoints = checkpoints
        self.settings = s = settings or PipelineSettings()
        self._metrics = metrics
        self._clock = clock
        self._backoff = backoff or (
            lambda: Backoff(initial=s.retry_initial, cap=s.retry_cap, jitter=0.2)
        )
        self._full_old = builder.include_old or builder.patch
        self._filter = filter
        # Keys of cached objects outside the filter: never published (or taken out
        # with a filtered event), so no digest, no delete. Only these keys cost
        # memory; the checkpoint holds the objects in view.
        self._out: set[str] = set()
        self._resumed = False
        self.informer: SharedInformer | None = None
        self.outbox = Outbox(self._digest_of, clock=clock)
        self.stats = PipelineStats(last_commit=clock())
        self.sink_healthy = True
        self.checkpoint_healthy = True
        # Why the pipeline stopped for good (poison policy "fail"), for readiness.
        self.failed: str | None = None
        self._decided = asyncio.Event()
        # A batch is being published, and what wakes the writer waiting for it.
        self._publishing = False
        self._batch_due = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._acked = asyncio.Event()
        # Set when the bus has acknowledged everything decided, or many keys await
        # their checkpoint rows: a commit is due early.
        self._commit_early = asyncio.Event()
        # When the bus last acknowledged a change (not an announcement), for heartbeats.
        self.last_change_at: float | None = None
        self._to_send: asyncio.Queue[Batch] = asyncio.Queue(maxsize=1)
        # Deletes a previous run wrote ahead without an ack: (key, uid, event).
        self._restart_deletes: list[tuple[str, str, Event]] = []

    # -- state ------------------------------------------------------------------

    @property
    def committed_resource_version(self) -> str:
        return self.outbox.committed_watermark

    def has_synced(self) -> bool:
        return self.informer is not None and self.informer.has_synced()

    def stalled(self) -> bool:
        """Events wait and the bus has acknowledged nothing for ``stall_after`` seconds."""
        return self.outbox.stalled_for() > self.settings.stall_after

    def checkpoint_lag(self) -> float:
        return self.outbox.lag()

    # What heartbeats (bridge/delivery/heartbeat.py) and snapshots (bridge/delivery/snapshot.py) read.

    def watch_up(self) -> bool:
        reflector = self.informer.reflector if self.informer is not None else None
        return reflector is not None and reflector.connected

    def object_count(self) -> int:
        """Objects in view: cached and not outside the filter."""
        return len(self.informer.store) - len(self._out) if self.informer is not None else 0

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
        return self._detector

    @property
    def builder(self) -> EventBuilder:
        return self._builder

    def cached_digest(self, key: str) -> Digest | None:
        """The cached state of ``key``: what its last decision (or the checkpoint) holds."""
        return self._digest_of(key)

    def is_filtered_out(self, key: str) -> bool:
        """The cached object ``key`` is outside the resource's filter (not published)."""
        return key in self._out

    def is_uncertain(self, key: str) -> bool:
        """A restart left ``key`` uncertain and no news of it has settled it yet."""
        return key in self.outbox.uncertain

    def announce(self, key: str, uid: str, event: Event) -> int:
        """Queue a re-announcement of ``key``'s current state behind everything decided
        (``Outbox.announce``); returns its sequence number."""
        entry = self.outbox.announce(key, uid, event)
        self._decided.set()
        return entry.seq

    async def wait_for_room(self) -> None:
        await self._wait_for_room()

    async def wait_acknowledged(self, seq: int) -> None:
        """Until the bus has acknowledged every event up to ``seq``."""
        while self.outbox.acked_seq < seq:
            self._acked.clear()
            await self._acked.wait()

    def _digest_of(self, key: str) -> Digest | None:
        """The cached state of ``key`` as a checkpoint digest (the cache is the one store)."""
        if key in self._out:
            return None  # outside the filter: not published, not checkpointed
        informer = self.informer
        obj = informer.store.get_by_key(key) if informer is not None else None
        if obj is None:
            return None
        if not isinstance(obj, dict):
            return Digest(key, *obj.values())
        fp = obj.get(FINGERPRINT_FIELD)
        if not isinstance(fp, str):
            return self._detector.digest_of(obj)
        m = meta(obj)
        return Digest(key, str(m.get("uid", "")), str(m.get("resourceVersion", "")), fp)

    # -- start: resume from the checkpoint ---------------------------------------

    async def load(self) -> None:
        """Read the checkpoint and build the informer: resume where the last run stopped."""
        with gc_paused():
            await self._load()

    async def _load(self) -> None:
        # Nearly every row is certain with no earlier incarnation: straight to a record.
        checkpoint = await load_bulk(self._checkpoints, self.resource_id, records_of_rows)
        records: list[CachedObject] | None = None
        watermark: str | None = None
        reflector = self.settings.reflector
        if checkpoint is not None:
            self._resumed = True
            watermark = checkpoint.resource_version or None
            records = list(checkpoint.plain)
            checkpoint.plain = []
            uncertain: list[Digest] = []
            for d in checkpoint.others:
                for gone in filter(None, d.prior.split(",")):
                    # An earlier object of this name whose delete was in flight: its
                    # own events are older than this key's, so no replay brings it.
                    self._republish_delete(d, gone)
                if d.state == CERTAIN:
                    records.append(self._record_of(d))
                    continue
                # Written ahead, never acknowledged: cached as unconfirmed, so the
                # next news of the key (the replayed change itself, a later one, its
                # delete, or its absence from a relist) reaches the handler.
                uncertain.append(d)
                records.append(self._record_of(d, unconfirmed=True))
            self.outbox = Outbox(
                self._digest_of,
                watermark=checkpoint.resource_version,
                clock=self._clock,
            )
            self.outbox.restore_uncertain(uncertain)
            for key, uid, event in self._restart_deletes:
                self.outbox.decide(key, uid, event, None)
            if self._restart_deletes:
                self._decided.set()
            if watermark is not None and not all(
                _after(d.resource_version, watermark) for d in uncertain
            ):
                # A watch from the watermark would not bring news of every uncertain
                # key: relist the latest state instead.
                watermark = None
            if watermark is None:
                # A relist diffed against the digests reads the latest state (a
                # consistent read), never a lagging watch cache, whose missing
                # objects would look like deletes.
                reflector = replace(reflector, consistent_first_list=True)
            log.info(
                "resuming from checkpoint",
                resource=self.label,
                resource_version=checkpoint.resource_version,
                objects=len(records),
                uncertain=len(uncertain),
                prior_deletes=len(self._restart_deletes),
                relist=watermark is None,
            )
        s = self.settings
        self.informer = SharedInformer(
            self._lw,
            self,
            name=self.label,
            slim=self._detector.fingerprinter.fingerprint
            if s.slim and not self._full_old
            else None,
            reflector_settings=reflector,
            initial_objects=records,
            initial_resource_version=watermark,
            max_queued=s.max_queued,
            drop_stale=True,
            # With a filter, a delete of an object never cached was never published.
            notify_unknown_deletes=self._filter is None,
            resync_period=s.resync_period,
        )

    def _republish_delete(self, d: Digest, uid: str) -> None:
        """A delete that was written ahead and may not have reached the bus: again, same id."""
        gone = object_from_digest(
            Digest(d.key, uid, d.resource_version if uid == d.uid else "", ""),
            api_version=self._builder.api_version,
            kind=self._builder.kind,
        )
        event = self._builder.build(Change(ChangeKind.DELETED, gone, d.key, tombstone=True))
        self._restart_deletes.append((d.key, uid, event))

    def _record_of(
        self, digest: Digest, *, unconfirmed: bool = False
    ) -> PackedRecord | LooseRecord:
        return make_record(
            digest.key, digest.uid, digest.resource_version, digest.fingerprint, unconfirmed
        )

    # -- running ----------------------------------------------------------------

    async def run(self) -> None:
        """Run until cancelled; then publish what was decided and commit what was acknowledged."""
        if self.informer is None:
            await self.load()
        assert self.informer is not None
        informer = self.informer
        delivery = asyncio.create_task(
            run_group({"writer": self._writer(), "sender": self._sender()}, prefix=f"{self.label}:")
        )
        try:
            await run_group(
                {
                    "informer": informer.run(),
                    "checkpointer": self._checkpointer(),
                    "delivery": _watch(delivery),
                },
                prefix=f"{self.label}:",
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
            while self.outbox.unacknowledged and not delivery.done() and self.failed is None:
                if loop.time() >= deadline:
                    log.warning(
                        "gave up publishing at shutdown; the next start resolves it",
                        resource=self.label,
                        unacknowledged=self.outbox.unacknowledged,
                    )
                    break
                await asyncio.sleep(0.005)
        finally:
            await cancel_and_wait([delivery])
            with contextlib.suppress(Exception):
                async with asyncio.timeout(max(0.1, deadline - loop.time())):
                    await self._commit_once()

    # -- the informer's handler -----------------------------------------------

    async def on_add(self, obj: CachedObject, is_in_initial_list: bool) -> None:
        self._observe()
        if not isinstance(obj, dict):
            # A cached record is what a handler added late catches up on; this one
            # is attached before the informer starts, so it never gets one.
            return
        if is_in_initial_list:
            self.stats.listed += 1
        key = namespace_key(obj)
        if self._filter is not None and not self._filter.matches(obj, None, "added"):
            # First seen in this run (not cached): in view only if a previous run
            # may have published it, which the uncertain check in _leave_view knows.
            self._leave_view(key, obj, was_in=False)
        else:
            uncertain = self.outbox.resolve(key)
            if uncertain is not None:
                self._decide(*self._confirm(uncertain, obj))
            else:
                initial = is_in_initial_list and not self._resumed
                self._decide(self._detector.on_add(obj, None, initial=initial))
        await self._wait_for_room()

    async def on_update(self, old: CachedObject, new: CachedObject) -> None:
        self._observe()
        if not isinstance(new, dict) or FINGERPRINT_FIELD in new:
            return  # a resync of a cached (slim) record: never news, never a confirmation
        key = namespace_key(new)
        if self._filter is not None:
            full_old = old if isinstance(old, dict) and FINGERPRINT_FIELD not in old else None
            if not self._filter.matches(new, full_old, "modified"):
                self._leave_view(key, new, was_in=key not in self._out)
                await self._wait_for_room()
                return
            if key in self._out:
                # Entering the view: for consumers it appears now.
                self._out.discard(key)
                self.outbox.resolve(key)
                self._decide(self._detector.on_add(new, None))
                await self._wait_for_room()
                return
        uncertain = self.outbox.resolve(key)
        if uncertain is not None:
            self._decide(*self._confirm(uncertain, new))
        else:
            self._decide(self._detector.on_update(old, new))
        await self._wait_for_room()

    async def on_delete(self, obj: CachedObject | DeletedFinalStateUnknown) -> None:
        self._observe()
        key = namespace_key(obj)
        if key in self._out:
            self._out.discard(key)  # never published (or already taken out): nothing to say
            return
        self.outbox.resolve(key)
        self._decide(self._detector.on_delete(obj))
        await self._wait_for_room()

    def _leave_view(self, key: str, obj: RawObject, *, was_in: bool) -> None:
        """``obj`` does not match the filter. If consumers may hold it (it was in view,
        or a previous run may have published it), it leaves with a filtered event."""
        if key in self._out:
            self.stats.suppressed += 1
            return
        self._out.add(key)
        uncertain = self.outbox.resolve(key)
        if was_in or uncertain is not None:
            self._decide([Change(ChangeKind.FILTERED, obj, key)])
        else:
            self.stats.suppressed += 1

    def _confirm(self, uncertain: Digest, obj: RawObject) -> tuple[list[Change], str | None]:
        """The first news of a key a previous run left uncertain (its event may be on the
        bus): the changes to publish, and the resourceVersion their id keeps, if any."""
        d = self._detector.digest_of(obj)
        if d.uid == uncertain.uid and d.fingerprint == uncertain.fingerprint:
            # Unchanged: republish with the id it was written ahead with.
            rv = uncertain.resource_version
            digest = Digest(d.key, d.uid, rv, d.fingerprint)
            return [Change(ChangeKind.MODIFIED, obj, d.key, digest=digest)], rv
        # Changed, or another object of the same name: as any update against a digest.
        return self._detector.on_update(uncertain, obj), None

    def _decide(self, changes: list[Change], resource_version: str | None = None) -> None:
        if not changes:
            self.stats.suppressed += 1
            return
        outbox, build = self.outbox, self._builder.build
        for change in changes:
            # Sealed: encoded now, so the parsed object dies here, not at the ack.
            event = build(change, resource_version=resource_version, sealed=True)
            uid = str(meta(change.object).get("uid", ""))
            outbox.decide(change.key, uid, event, change.digest)
        self._decided.set()
        if outbox.queued >= self.settings.max_batch:
            self._batch_due.set()

    async def _wait_for_room(self) -> None:
        s, outbox = self.settings, self.outbox
        while (
            outbox.unacknowledged >= s.pending_limit
            or outbox.unacknowledged_bytes >= s.max_pending_bytes
        ):
            self._room.clear()
            await self._room.wait()

    def _observe(self) -> None:
        """Tie the reflector's position to the informer's progress (watermark candidates)."""
        informer = self.informer
        reflector = informer.reflector if informer is not None else None
        if informer is None or reflector is None:
            return
        fifo = informer.fifo
        self.outbox.observe(fifo.queued_total, reflector.last_sync_resource_version)
        self.outbox.progress(fifo.processed_total)

    # -- writing ahead and publishing -------------------------------------------

    async def _writer(self) -> None:
        s = self.settings
        while True:
            if not self.outbox.queued:
                self._decided.clear()
                await self._decided.wait()
                if s.linger and self.outbox.queued < s.max_batch:
                    await asyncio.sleep(s.linger)
            # While a batch is being published, the next leaves only when it is
            # done, so take it then, or once it is full: taken at once, it held what
            # was decided so far, however little. Behind a bus slower than the
            # watch, batches alternated between full and nearly empty, and only a
            # bound of four batches pending kept them full.
            while self._publishing and self.outbox.queued < s.max_batch:
                self._batch_due.clear()
                await self._batch_due.wait()
            batch = self.outbox.take(s.max_batch)
            if batch is None:
                continue
            if not batch.ahead:  # only announcements: nothing to write ahead
                await self._to_send.put(batch)
                continue
            await self._retrying(
                functools.partial(
                    self._checkpoints.commit, self.resource_id, None, batch.ahead, ()
                ),
                CheckpointError,
                "write-ahead",
                self._checkpoint_health,
            )
            await self._to_send.put(batch)

    async def _sender(self) -> None:
        while True:
            batch = await self._to_send.get()
            self._publishing = True
            try:
                await self._publish(batch)
            finally:
                self._publishing = False
                self._batch_due.set()
            self.outbox.acknowledged(batch)
            if (
                not self.outbox.unacknowledged
                or self.outbox.dirty >= self.settings.commit_after_keys
            ):
                self._commit_early.set()
            if batch.ahead:  # rows written ahead: some change, not only announcements
                self.last_change_at = self._clock()
            self._room.set()
            self._acked.set()

    async def _send(self, events: list[Event]) -> dict[int, str]:
        """Publish until the bus answers; only "bus unavailable" is retried."""
        started = time.perf_counter()
        refused = await self._retrying(
            lambda: self._sink.publish(events), SinkUnavailableError, "publish", self._sink_health
        )
        if self._metrics is not None:
            self._metrics.publish_latency.labels(sink=type(self._sink).__name__).observe(
                time.perf_counter() - started
            )
        return dict(refused or {})

    async def _retrying(
        self,
        attempt: Callable[[], Awaitable[T]],
        retry_on: type[Exception],
        what: str,
        health: Callable[[bool], None],
    ) -> T:
        """``attempt`` until it succeeds, backing off while it raises ``retry_on``."""
        backoff = self._backoff()
        while True:
            try:
                result = await attempt()
            except retry_on as e:
                health(False)
                delay = backoff.next_delay()
                log.warning(
                    f"{what} failed; will retry",
                    resource=self.label,
                    error=str(e),
                    retry_in=round(delay, 2),
                )
                await asyncio.sleep(delay)
                continue
            health(True)
            return result

    def _sink_health(self, ok: bool) -> None:
        self.sink_healthy = ok

    def _checkpoint_health(self, ok: bool) -> None:
        self.checkpoint_healthy = ok

    async def _publish(self, batch: Batch) -> None:
        events = batch.events
        refused = await self._send(events)
        stats = self.stats
        landed = [e for i, e in enumerate(events) if i not in refused] if refused else events
        stats.published += len(landed)
        stats.by_type.update(map(_change_of, landed))
        if refused:
            await self._settle_refused(batch, refused)

    async def _settle_refused(self, batch: Batch, refused: dict[int, str]) -> None:
        """The poison policy for events the bus refused for good; nothing waits behind them."""
        entries = batch.entries
        for i in sorted(refused):
            entry, reason = entries[i], refused[i]
            event = entry.event
            policy = self.settings.poison_policy
            later = any(
                e.key == entry.key for j, e in enumerate(entries) if j > i and j not in refused
            )
            if policy == "fail":
                outcome = "failed"
            elif later:
                outcome = "superseded"  # a later event of the same object is on the bus
            elif policy == "truncate":
                again = await self._send([event.truncated()])
                if again:
                    outcome, reason = "skipped", f"{reason}; truncated: {again[0]}"
                else:
                    outcome = "truncated"
                    self.stats.published += 1
                    self.stats.by_type[_change_of(event)] += 1
            else:
                outcome = "skipped"
            self.stats.poison[outcome] += 1
            log.warning(
                "the bus refused an event for good",
                resource=self.label,
                subject=event.subject,
                id=event.id,
                reason=reason,
                outcome=outcome,
            )
            if outcome == "failed":
                raise PoisonEventError(
                    f"{self.label}: the bus refused {event.subject} (event {event.id}) for good:"
                    f" {reason}; poisonPolicy is fail, so this resource stopped"
                )

    # -- checkpointing ------------------------------------------------------------

    async def _checkpointer(self) -> None:
        backoff = self._backoff()
        while True:
            await self._commit_due()
            try:
                await self._commit_once()
            except CheckpointError as e:
                self.checkpoint_healthy = False
                delay = backoff.next_delay()
                log.warning("checkpoint failed; will retry", resource=self.label, error=str(e))
                await asyncio.sleep(delay)
                continue
            self.checkpoint_healthy = True
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
        await asyncio.sleep(early)
        if not self._commit_early.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(deadline):
                    await self._commit_early.wait()
        # Cleared before the commit: a drain during it makes the next one due early.
        self._commit_early.clear()

    async def _commit_once(self) -> None:
        self._observe()
        commit = self.outbox.checkpoint()
        if commit is None:
            self.stats.last_commit = self._clock()
            return
        try:
            # Step by step: the writer's write-aheads take their turn between steps.
            for step in commit.steps(self.settings.commit_step_keys):
                await self._checkpoints.commit(self.resource_id, *step)
        except BaseException:
            self.outbox.commit_failed(commit)
            raise
        self.outbox.committed(commit)
        self.stats.flushes += 1
        self.stats.last_commit = self._clock()
        if self._metrics is not None:
            self._metrics.set_checkpoint(self.label, commit.watermark)


def _change_of(event: Event) -> str:
    return event.type.rpartition(".")[2]


def _after(resource_version: str, watermark: str) -> bool:
    try:
        return int(resource_version) > int(watermark)
    except ValueError:
        return False


async def _watch(task: asyncio.Task[None]) -> None:
    """Await a task started elsewhere (its failure ends the group; cancelling leaves it be)."""
    await asyncio.shield(task)
