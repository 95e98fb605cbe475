"""Builds the pipelines from settings and runs them with the health/metrics server.

Start-up problems that a person must fix (a bad kind, a forbidden resource,
an unreadable kubeconfig) raise at once with one line; so does a LIST the API
server rejects as malformed (a selector it does not support), whenever it comes. Problems that may heal
(the bus or the API server unreachable) make the bridge not-ready and retry:
the checkpoint never moves past what the bus acknowledged.
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from bridge.aiotasks import cancel_and_wait
from bridge.checkpoints.base import CheckpointStore
from bridge.delivery.changes import ChangeDetector, Fingerprinter
from bridge.delivery.filters import Filter
from bridge.delivery.heartbeat import Heartbeat, HeartbeatBuilder, HeartbeatTarget
from bridge.delivery.pipeline import PipelineSettings, ResourcePipeline
from bridge.delivery.snapshot import SnapshotError, SnapshotResult, new_signal_id, take_snapshot
from bridge.delivery.tracing import BatchTracer
from bridge.errors import (
    BridgeError,
    CheckpointError,
    KubeConnectionError,
    ResourceFailedError,
    ServerError,
    SinkUnavailableError,
    TooManyRequestsError,
)
from bridge.ground.prometheus import Registry
from bridge.kube.backoff import Backoff
from bridge.kube.client import KubeClient
from bridge.kube.discovery import ResourceInfo
from bridge.kube.kinds import KindCatalog, read_catalog
from bridge.kube.listwatch import ListWatch
from bridge.kube.reflector import ReflectorSettings
from bridge.logging import get_logger
from bridge.service.control import control_auth
from bridge.service.dynamic import KindFollower, Skipped, label_of, probe_access
from bridge.service.health import HealthServer
from bridge.service.kinds import ResolvedResource, resolve_entries
from bridge.service.leftovers import (
    adopt_version,
    gone_kinds,
    known_kinds,
    publish_gone,
    record_kinds,
)
from bridge.service.metrics import Metrics
from bridge.service.observer import PipelineObserver
from bridge.service.settings import (
    ResourceSettings,
    Settings,
    lease_name,
    resources_for_shard,
)
from bridge.service.tracing import build_tracer
from bridge.service.wiring import (
    build_checkpoints,
    build_sink,
    checkpoint_id,
    event_builder,
    list_watch,
    object_decoder,
    resource_fingerprinter,
    transactional_send,
)
from bridge.sinks.base import Sink

log = get_logger(__name__)

# After the first sync, how long to wait for its events and commits to land before
# the after-sync step (bridge/service/tuning.py).
_SETTLE_AFTER_SYNC = 30.0


def default_identity() -> str:
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


async def until_reachable(
    attempt: Callable[[], Awaitable[object]],
    *,
    retry_on: type[Exception] | tuple[type[Exception], ...],
    until: Sequence[asyncio.Event],
    backoff: Backoff,
    warning: str,
    unreachable: Callable[[str], None] | None = None,
    repeat_warning: bool = True,
    **fields: object,
) -> bool:
    """``attempt`` until it gets through (True) or one of ``until`` is set (False).

    ``retry_on`` is what heals by itself (a server restarting, a lock its old
    holder is about to let go of); anything else needs a person and propagates
    at once. While it fails, ``unreachable`` hears why, for readiness, and
    ``warning`` is logged with the error and ``fields``: at every attempt, or
    with ``repeat_warning`` False once per distinct error.
    """
    warned: str | None = None
    while not any(e.is_set() for e in until):
        try:
            await attempt()
        except retry_on as e:
            reason = str(e) or type(e).__name__
            if unreachable is not None:
                unreachable(reason)
            if repeat_warning or reason != warned:
                warned = reason
                log.warning(warning, **fields, error=reason)
            await _any_set(until, backoff.next_delay())
            continue
        return True
    return False


async def _any_set(events: Sequence[asyncio.Event], timeout: float) -> None:
    """Sleep ``timeout`` seconds, cut short by any of ``events``: a stopping bridge
    or a lost Lease must not wait out a backoff of up to 30 s."""
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(waiters)


class BridgeApp:
    """The running service: pipelines, sink, checkpoint store, health server, leadership."""

    def __init__(
        self,
        settings: Settings,
        *,
        sink: Sink | None = None,
        checkpoints: CheckpointStore | None = None,
        registry: Registry | None = None,
        on_ready: Callable[[], Awaitable[None]] | None = None,
        backoff: Callable[[], Backoff] | None = None,
        after_first_sync: Callable[[], None] | None = None,
        tracer: BatchTracer | None = None,
    ) -> None:
        self.settings = settings
        # What ``k8s-bridge run`` does once the first sync has landed (free heap pages
        # handed back, bridge/service/tuning.py); the app itself leaves the process alone.
        self._after_first_sync = after_first_sync
        self.sink = sink or build_sink(settings)
        self.checkpoints = checkpoints or build_checkpoints(settings, self.sink)
        # Tracing (tracing.otlpEndpoint): None when off, and OpenTelemetry never imported.
        self.tracer = tracer or build_tracer(settings.tracing, settings.sink.kind)
        self.registry = registry or Registry()
        self.metrics = Metrics(self.registry)
        sh = settings.sharding
        self.metrics.shard_info.labels(
            by=sh.by, shard=str(sh.shard_index), shards=str(sh.shards)
        ).set(1)
        self.pipelines: list[ResourcePipeline] = []
        # The configured resource each pipeline serves, for snapshot signals.
        self.served: list[tuple[ResourceSettings, ResourcePipeline]] = []
        self.heartbeats: list[Heartbeat] = []
        # The resolved resource each pipeline serves: which kind, which entry.
        self.origin: dict[ResourcePipeline, ResolvedResource] = {}
        # Selected kinds left out (label → forbidden | unavailable), said once each.
        self._skipped: dict[str, str] = {}
        # Group versions whose aggregated APIService does not answer, said once each.
        self._stale: set[str] = set()
        # Running pipeline tasks (and their heartbeats'), so kinds can come and go.
        self._tasks: dict[ResourcePipeline, list[asyncio.Task[Any]]] = {}
        self._kinds_changed = asyncio.Event()
        self._kinds_lock = asyncio.Lock()
        # The catalog read at start; the Kind of every kind ever selected (from the
        # store, read once); checkpoints of gone kinds whose deletes were published.
        self._catalog: KindCatalog | None = None
        self._known_kinds: dict[str, str] | None = None
        self._gone_done: set[str] = set()
        self._leftovers_due = False
        # How each selected kind's pipeline lists and fingerprints (adopt_version).
        self._listers: dict[ResourcePipeline, tuple[ListWatch, Fingerprinter]] = {}
        # How often the catalog is re-read without a CRD/APIService change noticed.
        self.kinds_refresh_every = 30.0
        # How long a kind that went away may take to publish what it decided.
        self.retire_timeout = 15.0
        # Pipelines listing at once at start (bridge/service/app.py, _start_gradually).
        self.start_concurrency = 16
        self.start_slot_seconds = 30.0
        # Snapshot signals in progress, per pipeline label; cancelled with the pipelines.
        self._snapshots: dict[str, asyncio.Task[SnapshotResult]] = {}
        self.client: KubeClient | None = None
        self.health: HealthServer | None = None
        # The current leadership term's (or the only run's) observer; None before it.
        self._observer: PipelineObserver | None = None
        self.leading = not settings.leader_election.enabled
        # As its help says: 1 without leader election (this replica is the one that
        # publishes), so "no leader" and the leader-only alerts hold either way.
        self.metrics.leader.set(1 if self.leading else 0)
        self._sink_started = False
        self._api_error: str | None = None
        self._on_ready = on_ready
        # Why the bus looks unreachable (a failed probe), for readiness; None: fine.
        self._sink_unreachable: str | None = None
        # Why a new leader cannot open the checkpoint store yet, for readiness; None: fine.
        self._checkpoint_unavailable: str | None = None
        self.sink_probe_interval = 2.0
        # One retry policy for every loop that waits for something to come back.
        self._backoff: Callable[[], Backoff] = backoff or (
            lambda: Backoff(initial=0.5, cap=30.0, jitter=0.2)
        )

    # -- readiness --------------------------------------------------------------

    def readiness(self) -> tuple[bool, list[str]]:
        reasons: list[str] = []
        if self._api_error is not None:
            reasons.append(f"api: {self._api_error}")
        if not self._sink_started:
            reasons.append(f"sink {self.settings.sink.kind}: not connected")
        elif self._sink_unreachable is not None:
            reasons.append(f"sink {self.settings.sink.kind}: {self._sink_unreachable}")
        if self.leading and self._checkpoint_unavailable is not None:
            reasons.append(
                f"checkpoint {self.settings.checkpoint.kind}: {self._checkpoint_unavailable}"
            )
        # A standby replica (not leading) runs no pipelines and is ready to take over.
        if self.leading and not self.pipelines:
            reasons.append("pipelines: not started")
        unhealthy_after = self.settings.informer.unhealthy_after
        for p in self.pipelines:
            reflector = p.informer.reflector if p.informer is not None else None
            down = reflector.down_for() if reflector is not None else 0.0
            if reflector is not None and down >= unhealthy_after:
                why = f": {reflector.last_error}" if reflector.last_error else ""
                reasons.append(f"{p.label}: no working list/watch for {down:.0f}s{why}")
            if not p.has_synced():
                reasons.append(f"{p.label}: not synced")
            if not p.sink_healthy:
                reasons.append(f"{p.label}: sink unreachable, publishing paused")
            if not p.checkpoint_healthy:
                reasons.append(f"{p.label}: checkpoint store failing")
            if p.failed is not None:
                reasons.append(f"{p.label}: stopped: {p.failed}")
            stalled = p.stalled()
            if stalled is not None:
                reasons.append(
                    f"{p.label}: the bus has not acknowledged an event for {stalled:.0f}s"
                    f" (health.stallSeconds {self.settings.health.stall_seconds:g})"
                )
        ok = not reasons
        self.metrics.ready.set(1 if ok else 0)
        return ok, reasons

    # -- building ---------------------------------------------------------------

    async def resolve(self, client: KubeClient) -> list[ResolvedResource]:
        """Discover every configured resource, one per kind a group or allKinds entry
        selects (bridge/service/kinds.py); an unknown kind fails start-up in one line."""
        stale: set[str] = set()
        entries = self._entries()
        # Kept for the checkpoints kinds left behind (bridge/service/leftovers.py).
        catalog = await read_catalog(client) if any(r.selects_kinds for _, r in entries) else None
        self._catalog = catalog
        resolved = await resolve_entries(
            self.settings, client, entries, catalog=catalog, stale=stale
        )
        self._report_stale(stale)
        # A selected kind the bridge may not list (403) or whose APIService does not
        # answer (503) is one warning and a metric; the other kinds go on.
        selected = [r for r in resolved if self._selected(r)]
        if not selected:
            return resolved
        ok, skipped = await probe_access(client, selected)
        self._report_skipped(skipped)
        keep = {id(r) for r in ok}
        return [r for r in resolved if not self._selected(r) or id(r) in keep]

    def _entries(self) -> list[tuple[int, ResourceSettings]]:
        mine = {id(r) for r in resources_for_shard(self.settings)}
        return [(i, r) for i, r in enumerate(self.settings.resources) if id(r) in mine]

    def _selected(self, r: ResolvedResource) -> bool:
        """Whether ``r`` came from an entry that selects kinds (group, kinds, allKinds)."""
        return self.settings.resources[r.entry].selects_kinds

    def _report_stale(self, stale: set[str]) -> None:
        """One warning per group version an unavailable aggregated APIService serves
        (its kinds are unknown or stale meanwhile); the gauge back to 0 once it answers."""
        for gv in sorted(stale - self._stale):
            log.warning("API not answering: its kinds left out until it does", api=gv)
        for gv in sorted(self._stale - stale):
            log.info("API answers again", api=gv)
            self.metrics.kinds_skipped.labels(resource=gv, reason="unavailable").set(0)
        for gv in stale:
            self.metrics.kinds_skipped.labels(resource=gv, reason="unavailable").set(1)
        self._stale = set(stale)

    def _report_skipped(self, skipped: list[Skipped]) -> None:
        for s in skipped:
            label = label_of(s.resource.info)
            if self._skipped.get(label) != s.reason:
                self._skipped[label] = s.reason
                what = "may not list it" if s.reason == "forbidden" else "its API does not answer"
                log.warning(
                    f"selected kind left out: {what}",
                    resource=label,
                    entry=f"resources[{s.resource.entry}]",
                    error=s.error,
                )
            self.metrics.kinds_skipped.labels(resource=label, reason=s.reason).set(1)

    async def resolve_retrying(
        self, client: KubeClient, stop: asyncio.Event
    ) -> list[ResolvedResource] | None:
        """``resolve``, retried while the API server is unreachable or answers 429/5xx.

        Those heal by themselves (an API server restarting, a control plane
        upgrade); a crash loop would only delay the bridge. An unknown kind or
        a 403 needs a person and still raises at once. None when stopped first.
        """
        resolved: list[ResolvedResource] = []

        async def attempt() -> None:
            resolved[:] = await self.resolve(client)

        def unreachable(reason: str) -> None:
            self._api_error = reason

        if not await until_reachable(
            attempt,
            retry_on=(KubeConnectionError, ServerError, TooManyRequestsError),
            until=[stop],
            backoff=self._backoff(),
            warning="API server unavailable for discovery; retrying",
            unreachable=unreachable,
        ):
            return None
        self._api_error = None
        return resolved

    def build_pipelines(
        self, client: KubeClient, resolved: list[ResolvedResource]
    ) -> list[ResourcePipeline]:
        s = self.settings
        reflector = ReflectorSettings(
            page_size=s.informer.page_size,
            watch_list=s.informer.watch_list,
            list_pace_seconds=s.informer.list_pace_seconds,
        )
        pipeline_settings = PipelineSettings(
            flush_interval=s.checkpoint.commit_interval,
            max_batch=s.sink.max_batch,
            linger=s.sink.linger,
            steady_linger=s.sink.steady_linger,
            poison_policy=s.sink.poison_policy,
            slim=s.informer.slim,
            max_queued=s.informer.max_queued,
            resync_period=s.informer.resync_period,
            stall_after=s.health.stall_seconds,
            reflector=reflector,
        )
        self._pipeline_settings = pipeline_settings
        pipelines = []
        self.served, self.heartbeats, self.origin = [], [], {}
        self._listers = {}
        for r in resolved:
            pipelines.extend(self._build(client, r))
        return pipelines

    def _build(self, client: KubeClient, r: ResolvedResource) -> list[ResourcePipeline]:
        """The pipelines of one resolved resource (one per namespace scope), recorded in
        ``served``, ``origin`` and ``heartbeats``."""
        s = self.settings
        pipeline_settings = self._pipeline_settings
        shard = s.sharding.range()
        res, info = r.settings, r.info
        fingerprinter = resource_fingerprinter(res)
        scopes: list[str | None] = list(res.namespaces) if res.namespaces else [None]
        pipelines = []
        for ns in scopes:
            builder = event_builder(s, res, info)
            label = f"{info.api_version}/{info.plural}" + (f"@{ns}" if ns else "")
            filter = Filter(res.filter, label=label) if res.filter else None
            lw = list_watch(
                client,
                info,
                ns,
                res,
                decoder=object_decoder(fingerprinter, builder, filter),
                shard=shard,
            )
            rid = checkpoint_id(s, info, ns, res)
            pipeline = ResourcePipeline(
                resource_id=rid,
                lw=lw,
                detector=ChangeDetector(fingerprinter),
                builder=builder,
                sink=self.sink,
                checkpoints=self.checkpoints,
                settings=replace(
                    pipeline_settings,
                    poison_policy=res.poison_policy or s.sink.poison_policy,
                ),
                metrics=self.metrics,
                label=label,
                backoff=self._backoff,
                filter=filter,
                transactional=transactional_send(self.sink, rid),
                tracer=self.tracer,
            )
            pipelines.append(pipeline)
            self._listers[pipeline] = (lw, fingerprinter)
            self.served.append((res, pipeline))
            self.origin[pipeline] = r
            if res.heartbeat_interval:
                target = HeartbeatTarget(
                    s.cluster.name, info.group, info.version, info.kind, info.plural, ns
                )
                self.heartbeats.append(
                    Heartbeat(pipeline, HeartbeatBuilder(target, res.heartbeat_interval), self.sink)
                )
        return pipelines

    # -- running ----------------------------------------------------------------

    async def start_sink(self, stop: asyncio.Event) -> bool:
        """Connect to the bus, retrying while it is unreachable (not-ready meanwhile:
        "not connected" until it is)."""
        # Readiness does not say why the bus is unreachable: a warning at every attempt
        # keeps the reason, and that the bridge is still trying, in the log.
        started = await until_reachable(
            self.sink.start,
            retry_on=SinkUnavailableError,
            until=[stop],
            backoff=self._backoff(),
            warning="sink unreachable; retrying",
            sink=self.settings.sink.kind,
        )
        if started:
            self._sink_started = True
        return started

    def _sync_metrics(self) -> None:
        if self._observer is not None:
            self._observer.sync_metrics()

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set; then flush, checkpoint and close everything."""
        s = self.settings
        # The reviews of controlAuth kubernetes go through the bridge's own client,
        # once it exists (until then a control request gets 503).
        control = control_auth(s.server, lambda: self.client)
        self.health = HealthServer(
            s.server.host,
            s.server.port,
            self.registry,
            self.readiness,
            snapshot=self.snapshot,
            control_auth=control,
            before_scrape=self._sync_metrics,
        )
        await self.health.start()
        log.info("health server listening", port=self.health.port, control_auth=control.mode)
        if control.mode == "none":
            log.warning(
                "server.controlAuth is none: anyone who reaches port "
                f"{self.health.port} can make the bridge snapshot (POST /snapshot)"
            )
        try:
            self.client = await KubeClient.from_kubeconfig(
                s.cluster.kubeconfig, s.cluster.context, compression=s.cluster.compression
            )
            resolved = await self.resolve_retrying(self.client, stop)
            if resolved is None:
                return
            exactly_once = getattr(self.sink, "transactions", None) is not None
            if not s.leader_election.enabled and not exactly_once:
                if not await self._open_store(stop):
                    return
            if not await self.start_sink(stop):
                return
            if s.leader_election.enabled:
                await self._run_with_leadership(stop, resolved)
            else:
                await self._run_pipelines(stop, resolved)
        finally:
            await self._close()

    async def _run_pipelines(
        self,
        stop: asyncio.Event,
        resolved: list[ResolvedResource],
        lost: asyncio.Event | None = None,
    ) -> None:
        assert self.client is not None
        self.pipelines = self.build_pipelines(self.client, resolved)
        # Built, not yet run: no pipeline has read its checkpoint.
        if not await self._start_transactions(stop, lost):
            return
        if lost is not None:
            # A leadership term: the store opens now (a standby never touches it),
            # after the transactional producers fenced the previous leader's.
            if not await self._open_checkpoints(stop, lost):
                return
        elif getattr(self.sink, "transactions", None) is not None:
            if not await self._open_store(stop):
                return
        if self._catalog is not None:
            await self._tend_leftovers(self._catalog, self.pipelines)
        self._tasks = {}
        waiters: list[asyncio.Task[Any]] = [asyncio.create_task(stop.wait(), name="stop")]
        waiters.append(asyncio.create_task(self._start_gradually(), name="starter"))
        if lost is not None:
            waiters.append(asyncio.create_task(lost.wait(), name="lost-lease"))
        self._observer = PipelineObserver(
            self.pipelines, self.metrics, heartbeats=self.heartbeats, sink=self.sink
        )
        waiters.append(asyncio.create_task(self._observer.run(), name="observer"))
        waiters.append(asyncio.create_task(self._probe_sink(), name="sink-probe"))
        follower = KindFollower(
            self.settings,
            self.client,
            self._entries(),
            self.apply_kinds,
            refresh_every=self.kinds_refresh_every,
        )
        if follower.follows:
            waiters.append(asyncio.create_task(follower.run(), name="kinds"))
        if self._after_first_sync is not None:
            waiters.append(asyncio.create_task(self._settle_first_sync(), name="after-sync"))
        log.info("pipelines started", pipelines=[p.label for p in self.pipelines])
        if self._on_ready is not None:
            waiters.append(asyncio.create_task(self._notify_ready(), name="on-ready"))
        try:
            while True:
                self._kinds_changed.clear()
                changed = asyncio.create_task(self._kinds_changed.wait())
                running = {t: p for p, ts in self._tasks.items() for t in ts}
                try:
                    done, _ = await asyncio.wait(
                        [*running, *waiters, changed], return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    changed.cancel()
                # A retired kind's tasks end cancelled: not a reason to stop.
                ended = [
                    t
                    for t in done
                    if t is not changed and (t not in running or running[t] in self._tasks)
                ]
                for t in ended:
                    owner = running.get(t)
                    if owner is None:
                        continue
                    error = t.exception() if not t.cancelled() else None
                    if isinstance(error, BridgeError):
                        # One line for the operator: which resource, and the server's reason.
                        raise ResourceFailedError(f"resource {owner.label}: {error}") from error
                    if error is not None:
                        raise error
                if ended:
                    return
        finally:
            snapshots = list(self._snapshots.values())
            tasks = [t for ts in self._tasks.values() for t in ts]
            owners = [p for p, ts in self._tasks.items() for _ in ts]
            for t in [*snapshots, *tasks, *waiters]:
                t.cancel()
            await asyncio.gather(*snapshots, return_exceptions=True)
            # Each pipeline publishes and checkpoints what it processed; a bus that
            # stays down must not keep the process from exiting.
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for p, r in zip(owners, results, strict=True):
                if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
                    log.error("pipeline failed", resource=p.label, error=str(r))
            await asyncio.gather(*waiters, return_exceptions=True)
            for p in self.pipelines:
                # Nothing of a stopped pipeline waits any more: a replica that lost the
                # lease must not keep a stall alert firing with the age it last had.
                self.metrics.oldest_unacked_age.labels(resource=p.label).set(0)
            self._tasks = {}

    async def _start_gradually(self) -> None:
        """Start the pipelines, at most ``start_concurrency`` of them listing at once: a
        bridge of hundreds of kinds must not open hundreds of lists in one instant. A
        pipeline that has not synced after ``start_slot_seconds`` lets the next one go."""
        loop = asyncio.get_running_loop()
        started: dict[ResourcePipeline, float] = {}
        for p in list(self.pipelines):
            while True:
                now = loop.time()
                listing = [
                    q
                    for q, at in started.items()
                    if now - at < self.start_slot_seconds and not q.has_synced()
                ]
                if len(listing) < self.start_concurrency:
                    break
                await asyncio.sleep(0.02)
            if p in self.pipelines and p not in self._tasks:
                self._start(p)
                started[p] = loop.time()
                self._kinds_changed.set()  # the run loop waits on the new tasks too
        await asyncio.Event().wait()

    def _start(self, p: ResourcePipeline) -> None:
        """Run ``p`` and its heartbeat, if any."""
        tasks = [asyncio.create_task(p.run(), name=f"pipeline:{p.label}")]
        tasks.extend(
            asyncio.create_task(h.run(), name=f"heartbeat:{h.source.label}")
            for h in self.heartbeats
            if h.source is p
        )
        self._tasks[p] = tasks

    # -- kinds that come and go (bridge/service/dynamic.py) ---------------------------

    async def apply_kinds(
        self, resolved: list[ResolvedResource], catalog: KindCatalog, stale: set[str]
    ) -> None:
        """Start the pipelines of selected kinds that appeared, stop those of kinds that
        went away. A kind whose running version is still served keeps it (a new
        preferred version republishes nothing); one the bridge may not list is left
        out with one warning, and asked about again at the next refresh."""
        if self.client is None:
            return
        async with self._kinds_lock:
            self._report_stale(stale)
            running: dict[tuple[int, str, str], list[ResourcePipeline]] = {}
            for p, r in self.origin.items():
                # Built is enough: at start some wait their turn to list (_start_gradually).
                if p in self.pipelines and self._selected(r):
                    running.setdefault(_kind_key(r), []).append(p)
            wanted: dict[tuple[int, str, str], ResolvedResource] = {}
            for r in resolved:
                if self._selected(r):
                    wanted[_kind_key(r)] = r
            new = [r for k, r in wanted.items() if k not in running]
            gone = [k for k, ps in running.items() if k not in wanted]
            for k, ps in running.items():
                now = wanted.get(k)
                was = self.origin[ps[0]].info
                if now is not None and now.info.version != was.version:
                    if not await _still_served(catalog, was):
                        gone.append(k)
                        new.append(now)
            ok, skipped = await probe_access(self.client, new)
            self._report_skipped(skipped)
            for k in gone:
                for p in running[k]:
                    await self._retire(p)
            added = []
            built: list[ResourcePipeline] = []
            for r in ok:
                label = label_of(r.info)
                reason = self._skipped.pop(label, None)
                if reason is not None:
                    self.metrics.kinds_skipped.labels(resource=label, reason=reason).set(0)
                ps = self._build(self.client, r)
                transactions = getattr(self.sink, "transactions", None)
                if transactions is not None:
                    await transactions.start([p.resource_id for p in ps])
                built.extend(ps)
            try:
                # Only when kinds came or went (or deletes are still due): a refresh
                # that changed nothing reads no checkpoint.
                if built or gone or self._leftovers_due:
                    await self._tend_leftovers(catalog, built)
            except BridgeError as e:
                # Not started: the next refresh finds them new again and tries anew.
                log.warning("kinds appeared but their checkpoints cannot be read", error=str(e))
                for p in built:
                    self.origin.pop(p, None)
                    self._listers.pop(p, None)
                    self.served = [(res, q) for res, q in self.served if q is not p]
                    self.heartbeats = [h for h in self.heartbeats if h.source is not p]
                built = []
            for p in built:
                self.pipelines.append(p)
                self._start(p)
                added.append(p.label)
            if added:
                log.info("kinds appeared: pipelines started", pipelines=added)
                self._kinds_changed.set()

    async def _tend_leftovers(
        self, catalog: KindCatalog, pipelines: Sequence[ResourcePipeline]
    ) -> None:
        """Before ``pipelines`` (selected kinds) start: remember their Kinds, give each
        whose preferred version changed the checkpoint of its old version, and publish
        the deletes of kinds gone while no pipeline watched them
        (bridge/service/leftovers.py)."""
        store = self.checkpoints
        if self._known_kinds is None:
            self._known_kinds = await known_kinds(store)
        mine = [p for p in pipelines if p in self.origin and self._selected(self.origin[p])]
        # A kind back again: should it go once more, its deletes are due once more.
        self._gone_done -= {p.resource_id for p in mine}
        await record_kinds(store, self._known_kinds, [self.origin[p].info for p in mine])
        for p in mine:
            r = self.origin[p]
            if self.settings.resources[r.entry].api_version:
                continue  # a pinned version: its key never moves
            lw, fingerprinter = self._listers[p]
            await adopt_version(
                store,
                p.resource_id,
                lw,
                fingerprinter,
                r.info,
                label=p.label,
                page_size=self.settings.informer.page_size,
            )
        running = {p.resource_id for p in [*self.pipelines, *pipelines]}
        unnamed: list[str] = []
        gone = await gone_kinds(
            self.settings, store, catalog, self._entries(), self._known_kinds, running, unnamed
        )
        for rid in unnamed:
            if rid not in self._gone_done:
                self._gone_done.add(rid)
                log.warning(
                    "checkpoint of a kind no longer served, its Kind never recorded (written"
                    " by an older bridge): the deletes of its objects are not published",
                    resource=rid,
                )
        self._leftovers_due = False
        for g in gone:
            if g.resource_id in self._gone_done:
                continue
            try:
                await publish_gone(self.settings, store, self.sink, g)
            except BridgeError as e:
                log.warning(
                    "kind no longer served: its deletes not published yet; retried at the"
                    " next refresh",
                    resource=g.resource_id,
                    error=str(e),
                )
                self._leftovers_due = True
                continue
            self._gone_done.add(g.resource_id)

    async def _retire(self, p: ResourcePipeline) -> None:
        """Stop the pipeline of a kind that went away, once it has published what its
        watch delivered (the deletes the API server made before removing the kind);
        its checkpoint stays."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.retire_timeout
        quiet_since = loop.time()
        seen = p.stats.published
        while loop.time() < deadline:
            if p.stats.published != seen or p.unacknowledged() or _queued(p):
                seen, quiet_since = p.stats.published, loop.time()
            elif loop.time() - quiet_since >= 1.0:
                break
            await asyncio.sleep(0.1)
        tasks = self._tasks.pop(p, [])
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.pipelines.remove(p)
        self.served = [(res, q) for res, q in self.served if q is not p]
        self.heartbeats = [h for h in self.heartbeats if h.source is not p]
        self.origin.pop(p, None)
        self._listers.pop(p, None)
        self._kinds_changed.set()
        log.warning(
            "kind no longer served: pipeline stopped, checkpoint kept",
            resource=p.label,
            published=p.stats.published,
        )

    async def _start_transactions(
        self, stop: asyncio.Event, lost: asyncio.Event | None = None
    ) -> bool:
        """With exactly-once, start every resource's transactional producer before any
        pipeline reads its checkpoint: that fences a previous leader and aborts what
        it left open. Retried while Kafka is unreachable; False when stopped first."""
        transactions = getattr(self.sink, "transactions", None)
        if transactions is None:
            return True
        ids = [p.resource_id for p in self.pipelines]

        def unreachable(reason: str) -> None:
            self._sink_unreachable = reason

        started = await until_reachable(
            lambda: transactions.start(ids),
            retry_on=SinkUnavailableError,
            until=[e for e in (stop, lost) if e is not None],
            backoff=self._backoff(),
            warning="cannot start the transactional producers; retrying",
            unreachable=unreachable,
        )
        if started:
            self._sink_unreachable = None
        return started

    # -- snapshot signals (POST /snapshot) ---------------------------------------

    async def snapshot(self, wanted: str) -> dict[str, Any]:
        """Re-announce every current object of the configured resource ``wanted`` (``Kind``
        or ``apiVersion/Kind``) in every scope this replica serves; the counts as JSON."""
        api_version, _, kind = wanted.rpartition("/")
        # Named entries, and the kinds group/allKinds entries selected (served ones).
        candidates = [*self.settings.resources, *(res for res, _ in self.served)]
        configured = [
            r
            for r in candidates
            if r.kind.lower() == kind.lower() and api_version in ("", r.api_version)
        ]
        if not configured:
            raise SnapshotError(f"resource {wanted!r} is not configured", status=404)
        if not self.leading:
            raise SnapshotError("this replica is a standby (not leading): ask the leader")
        targets = [p for res, p in self.served if res in configured and p in self.pipelines]
        if not targets:
            if self.pipelines:
                raise SnapshotError(
                    f"resource {wanted!r} is not served by this replica (sharding)", status=404
                )
            raise SnapshotError("pipelines not started yet; try again once /readyz is 200")
        for p in targets:
            if p.failed is not None:
                raise SnapshotError(f"{p.label}: stopped: {p.failed}")
            running = self._snapshots.get(p.label)
            if running is not None and not running.done():
                raise SnapshotError(f"{p.label}: a snapshot is already running", status=409)
        signal_id = new_signal_id()
        page_size = self.settings.informer.page_size
        tasks = []
        for p in targets:
            task = asyncio.create_task(
                take_snapshot(p, signal_id, page_size=page_size), name=f"snapshot:{p.label}"
            )
            self._snapshots[p.label] = task
            task.add_done_callback(functools.partial(self._snapshot_done, p.label))
            tasks.append(task)
        log.info("snapshot signal", signal=signal_id, resources=[p.label for p in targets])
        # Shielded: a client that hangs up does not stop the snapshot half way.
        results = await asyncio.shield(asyncio.gather(*tasks, return_exceptions=True))
        total = SnapshotResult(signal_id)
        for p, r in zip(targets, results, strict=True):
            if isinstance(r, asyncio.CancelledError):
                raise SnapshotError(f"{p.label}: the bridge is stopping")
            if isinstance(r, SnapshotError):
                raise r
            if isinstance(r, BridgeError):
                raise SnapshotError(f"{p.label}: {r}") from r
            if isinstance(r, BaseException):
                raise r
            total.add(r)
        return total.to_dict()

    def _snapshot_done(self, label: str, task: asyncio.Task[SnapshotResult]) -> None:
        if self._snapshots.get(label) is task:
            del self._snapshots[label]

    async def _probe_sink(self) -> None:
        """Ask the bus now and then whether it answers: with no events flowing, a bus
        that went away would otherwise go unnoticed until the next publish."""
        every = self.sink_probe_interval
        failed = 0
        while True:
            await asyncio.sleep(every)
            try:
                async with asyncio.timeout(every):
                    ok = await self.sink.ping()
            except Exception:  # a probe that fails in any way is an unreachable bus
                ok = False
            # Two misses in a row: one slow answer under load is not an outage.
            failed = 0 if ok else failed + 1
            self._sink_unreachable = "does not answer a ping" if failed >= 2 else None

    async def _settle_first_sync(self) -> None:
        """Once every pipeline has synced and what it sent has landed: the after-sync step, once."""
        assert self._after_first_sync is not None
        while not all(p.has_synced() for p in self.pipelines):
            await asyncio.sleep(0.1)
        # The sync's last events and commits are still on their way; what they hold
        # is garbage once they land, and neither frozen nor kept in the heap.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _SETTLE_AFTER_SYNC
        while loop.time() < deadline and any(
            p.unacknowledged() or p.outbox.dirty for p in self.pipelines
        ):
            await asyncio.sleep(0.1)
        self._after_first_sync()
        await asyncio.Event().wait()

    async def _notify_ready(self) -> None:
        while not self.readiness()[0]:
            await asyncio.sleep(0.05)
        assert self._on_ready is not None
        await self._on_ready()
        await asyncio.Event().wait()

    async def _run_with_leadership(
        self, stop: asyncio.Event, resolved: list[ResolvedResource]
    ) -> None:
        from bridge.kube.lease import KubeLeaseClient, LeaderElector

        assert self.client is not None
        le = self.settings.leader_election
        elector = LeaderElector(
            KubeLeaseClient(self.client),
            namespace=le.namespace,
            name=lease_name(self.settings),
            identity=le.identity or os.environ.get("POD_NAME") or default_identity(),
            lease_duration=le.lease_duration,
            renew_deadline=le.renew_deadline,
            retry_period=le.retry_period,
        )
        lost = asyncio.Event()
        leading = asyncio.Event()

        async def started() -> None:
            lost.clear()
            self.leading = True
            self.metrics.leader.set(1)
            leading.set()

        async def stopped() -> None:
            self.leading = False
            self.metrics.leader.set(0)
            leading.clear()
            lost.set()

        election = asyncio.create_task(elector.run(started, stopped), name="leader-election")
        try:
            while not stop.is_set():
                waiter = asyncio.create_task(leading.wait())
                stopper = asyncio.create_task(stop.wait())
                await asyncio.wait([waiter, stopper, election], return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                stopper.cancel()
                if election.done():
                    election.result()
                    return
                if stop.is_set():
                    return
                log.info("leading: starting pipelines")
                try:
                    await self._run_pipelines(stop, resolved, lost)
                finally:
                    self.pipelines = []
                    self._observer = None  # a scrape must not carry a past term's counters
                    # Let go of the store with the Lease: the next leader (on this host,
                    # SQLite's flock) must be able to open it.
                    await self._close_checkpoints()
                log.info("stopped leading: pipelines stopped, checkpoint store closed")
        finally:
            election.cancel()
            await asyncio.gather(election, return_exceptions=True)

    async def _open_store(self, stop: asyncio.Event) -> bool:
        """Open the checkpoint store of a bridge without leader election. A store on a
        server (nats-kv, kafka) that cannot be reached yet is waited for, not-ready;
        a local file that cannot be opened (in use, unwritable) stops the bridge: a
        person must act."""
        if self.settings.checkpoint.kind in ("sqlite", "memory"):
            await self.checkpoints.open()
            return True
        return await self._open_checkpoints(stop)

    async def _open_checkpoints(
        self, stop: asyncio.Event, lost: asyncio.Event | None = None
    ) -> bool:
        """Open the checkpoint store, retrying (not-ready) while it cannot be opened: one
        that is unreachable or, for a leadership term (``lost`` given), one still held
        by the old leader (SQLite's lock, until that process has flushed and let go).
        False: the term ended, or the bridge is stopping, before it opened."""

        def unreachable(reason: str) -> None:
            self._checkpoint_unavailable = reason

        waiting = "the checkpoint store cannot be opened yet; retrying"
        opened = await until_reachable(
            self.checkpoints.open,
            retry_on=CheckpointError,
            until=[e for e in (stop, lost) if e is not None],
            backoff=self._backoff(),
            # A bridge without leader election leads nothing; saying so would send an
            # operator looking for a Lease.
            warning=waiting if lost is None else f"leading, but {waiting}",
            unreachable=unreachable,
            # An old leader may hold SQLite's lock for its whole last flush: one warning
            # per reason, not one per attempt; readiness names the reason meanwhile.
            repeat_warning=False,
        )
        self._checkpoint_unavailable = None
        return opened

    async def _close_checkpoints(self) -> None:
        try:
            await self.checkpoints.close()
        except Exception as e:  # the next term opens it anew; closing must not end this one
            log.warning("checkpoint store close failed", error=str(e))

    async def _close(self) -> None:
        for closer in (self.sink.close, self.checkpoints.close):
            try:
                await closer()
            except Exception as e:  # closing must not hide the reason we stop
                log.warning("close failed", error=str(e))
        if self.client is not None:
            await self.client.close()
        shutdown = getattr(self.tracer, "shutdown", None)
        if shutdown is not None:  # the spans still queued are exported now
            await asyncio.to_thread(shutdown)
        if self.health is not None:
            await self.health.stop()


def _kind_key(r: ResolvedResource) -> tuple[int, str, str]:
    return (r.entry, r.info.group, r.info.kind)


def _queued(p: ResourcePipeline) -> int:
    informer = p.informer
    return len(informer.fifo) if informer is not None else 0


async def _still_served(catalog: KindCatalog, info: ResourceInfo) -> bool:
    """Whether the catalog still serves ``info``'s kind at ``info``'s version."""
    group = catalog.groups.get(info.group)
    if group is None or info.version not in group.versions:
        return False
    return any(i.kind == info.kind for i in await catalog.resources(info.group, info.version))
