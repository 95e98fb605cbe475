"""Turns the pipelines' own counters into metrics and initial-sync progress lines.

The hot path only bumps plain integers (reflector counters, pipeline stats);
this runs once a second and carries them over to Prometheus, so the cost of
metrics does not grow with the event rate.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence

from bridge.delivery.heartbeat import Heartbeat
from bridge.delivery.pipeline import ResourcePipeline
from bridge.ground.prometheus import Counter as PromCounter
from bridge.logging import get_logger
from bridge.service.metrics import Metrics

log = get_logger(__name__)


class PipelineObserver:
    def __init__(
        self,
        pipelines: Sequence[ResourcePipeline],
        metrics: Metrics,
        *,
        progress_every: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        heartbeats: Sequence[Heartbeat] = (),
        sink: object = None,
    ) -> None:
        self.pipelines = pipelines
        self.heartbeats = heartbeats
        self.sink = sink
        self.metrics = metrics
        self.progress_every = progress_every
        self._clock = clock
        # What was already carried over, per pipeline label.
        self._restarts: dict[str, Counter[str]] = {}
        self._relists: dict[str, Counter[str]] = {}
        self._published: dict[str, Counter[str]] = {}
        self._poison: dict[str, Counter[str]] = {}
        self._suppressed: dict[str, Counter[str]] = {}
        self._filter_errors: dict[str, int] = {}
        self._read_aheads: dict[str, int] = {}
        self._client_filtered: dict[str, int] = {}
        self._synced: set[str] = set()
        self._heartbeats_sent: dict[str, int] = {}
        self._started = clock()
        self._last_progress = clock()

    def sync_metrics(self) -> None:
        for p in self.pipelines:
            informer = p.informer
            reflector = informer.reflector if informer is not None else None
            up = reflector is not None and reflector.connected
            self.metrics.watch_up.labels(resource=p.label).set(1 if up else 0)
            if reflector is not None:
                self._carry(
                    p.label, reflector.watch_restarts, self._restarts, self.metrics.watch_restarts
                )
                self._carry(p.label, reflector.relists, self._relists, self.metrics.relists)
                self._count(
                    p.label,
                    reflector.list_read_aheads,
                    self._read_aheads,
                    self.metrics.list_read_aheads,
                )
            self._sharding(p)
            if informer is not None:
                self.metrics.cache_objects.labels(resource=p.label).set(len(informer.store))
            stats = p.stats
            self._carry(p.label, stats.by_type, self._published, self.metrics.events_published)
            self._carry(p.label, stats.poison, self._poison, self.metrics.poison_events)
            self._carry(
                p.label,
                Counter(unchanged=stats.suppressed),
                self._suppressed,
                self.metrics.changes_suppressed,
            )
            self._count(p.label, p.filter_errors, self._filter_errors, self.metrics.filter_errors)
            self.metrics.checkpoint_lag.labels(resource=p.label).set(p.checkpoint_lag())
            self.metrics.oldest_unacked_age.labels(resource=p.label).set(p.oldest_unacked_age())
            self._monitoring(p)
        self._monitoring_bridge()

    def _monitoring(self, p: ResourcePipeline) -> None:
        """The per-resource gauges the chart's alerts and dashboard read."""
        m = self.metrics
        m.synced.labels(resource=p.label).set(1 if p.has_synced() else 0)
        m.unacknowledged.labels(resource=p.label).set(p.unacknowledged())
        reflector = p.informer.reflector if p.informer is not None else None
        if reflector is not None:
            try:
                seen = int(reflector.last_sync_resource_version)
            except ValueError:
                # Opaque (empty before the first list): the gauge keeps its last value.
                return
            m.watch_resource_version.labels(resource=p.label).set(seen)

    def _monitoring_bridge(self) -> None:
        """Heartbeats the bus took and producer fencings: counts kept by their owners."""
        for h in self.heartbeats:
            # At 0 from the start: a bus that never takes one still shows (and alerts).
            self.metrics.heartbeats_sent.labels(h.source.label)
            self._count(h.source.label, h.sent, self._heartbeats_sent, self.metrics.heartbeats_sent)
        fenced: int = getattr(self.sink, "fenced", 0)
        if fenced > self.metrics.fenced_counted:
            self.metrics.producer_fenced.inc(fenced - self.metrics.fenced_counted)
            self.metrics.fenced_counted = fenced

    def _sharding(self, p: ResourcePipeline) -> None:
        lw = p.lister
        if getattr(lw, "shard", None) is None:
            return
        honoured: bool | None = getattr(lw, "shard_honoured", None)
        if honoured is not None:
            self.metrics.shard_selector_honoured.labels(resource=p.label).set(int(honoured))
        filtered: int = getattr(lw, "client_filtered", 0)
        self._count(p.label, filtered, self._client_filtered, self.metrics.shard_client_filtered)

    @staticmethod
    def _count(label: str, current: int, seen: dict[str, int], family: PromCounter) -> None:
        """Carry a plain running count over to a counter labelled by resource only."""
        delta = current - seen.get(label, 0)
        if delta > 0:
            family.labels(label).inc(delta)
            seen[label] = current

    @staticmethod
    def _carry(
        label: str,
        current: Counter[str],
        seen: dict[str, Counter[str]],
        family: PromCounter,
    ) -> None:
        before = seen.setdefault(label, Counter())
        for reason, n in current.items():
            delta = n - before[reason]
            if delta > 0:
                family.labels(label, reason).inc(delta)
                before[reason] = n

    def report_progress(self) -> None:
        """Log initial-sync progress every ``progress_every`` s, and each resource once synced."""
        now = self._clock()
        due = now - self._last_progress >= self.progress_every
        for p in self.pipelines:
            if p.label in self._synced:
                continue
            if p.has_synced():
                self._synced.add(p.label)
                log.info(
                    "initial sync done",
                    resource=p.label,
                    listed=p.stats.listed,
                    published=p.stats.published,
                    seconds=round(now - self._started, 1),
                )
            elif due:
                log.info(
                    "initial sync in progress",
                    resource=p.label,
                    listed=p.stats.listed,
                    published=p.stats.published,
                )
        if due:
            self._last_progress = now

    async def run(self, interval: float = 1.0) -> None:
        while True:
            self.sync_metrics()
            self.report_progress()
            await asyncio.sleep(interval)
