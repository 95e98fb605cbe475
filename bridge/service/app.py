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
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client import CollectorRegistry

from bridge.aiotasks import cancel_and_wait
from bridge.checkpoints.base import CheckpointStore
from bridge.delivery.changes import ChangeDetector
from bridge.delivery.filters import Filter
from bridge.delivery.heartbeat import Heartbeat, HeartbeatBuilder, HeartbeatTarget
from bridge.delivery.pipeline import PipelineSettings, ResourcePipeline
from bridge.delivery.snapshot import SnapshotError, SnapshotResult, new_signal_id, take_snapshot
from bridge.errors import (
    BridgeError,
    CheckpointError,
    ConfigError,
    KubeConnectionError,
    ResourceFailedError,
    ServerError,
    SinkUnavailableError,
    TooManyRequestsError,
)
from bridge.kube.backoff import Backoff
from bridge.kube.client import KubeClient
from bridge.kube.discovery import Discovery, ResourceInfo
from bridge.kube.reflector import ReflectorSettings
from bridge.logging import get_logger
from bridge.service.control import control_auth
from bridge.service.health import HealthServer
from bridge.service.metrics import Metrics
from bridge.service.observer import PipelineObserver
from bridge.service.settings import (
    ResourceSettings,
    Settings,
    lease_name,
    resources_for_shard,
)
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


@dataclass(frozen=True, slots=True)
class ResolvedResource:
    settings: ResourceSettings
    info: ResourceInfo


class BridgeApp:
    """The running service: pipelines, sink, checkpoint store, health server, leadership."""

    def __init__(
        self,
        settings: Settings,
        *,
        sink: Sink | None = None,
        checkpoints: CheckpointStore | None = None,
        registry: CollectorRegistry | None = None,
        on_ready: Callable[[], Awaitable[None]] | None = None,
        backoff: Callable[[], Backoff] | None = None,
        after_first_sync: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        # What ``k8s-bridge run`` does once the first sync has landed (free heap pages
        # handed back, bridge/service/tuning.py); the app itself leaves the process alone.
        self._after_first_sync = after_first_sync
        self.sink = sink or build_sink(settings)
        self.checkpoints = checkpoints or build_checkpoints(settings, self.sink)
        self.registry = registry or CollectorRegistry()
        self.metrics = Metrics(self.registry)
        sh = settings.sharding
        self.metrics.shard_info.labels(
            by=sh.by, shard=str(sh.shard_index), shards=str(sh.shards)
        ).set(1)
        self.pipelines: list[ResourcePipeline] = []
        # The configured resource each pipeline serves, for snapshot signals.
        self.served: list[tuple[ResourceSettings, ResourcePipeline]] = []
        self.heartbeats: list[Heartbeat] = []
        # Snapshot signals in progress, per pipeline label; cancelled with the pipelines.
        self._snapshots: dict[str, asyncio.Task[SnapshotResult]] = {}
        self.client: KubeClient | None = None
        self.health: HealthServer | None = None
        self.leading = not settings.leader_election.enabled
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
        """Discover every configured resource; an unknown kind fails start-up in one line."""
        discovery = Discovery(client)
        resolved = []
        for res in resources_for_shard(self.settings):
            info = await discovery.resolve(res.api_version, res.kind)
            if res.namespaces and not info.namespaced:
                raise ConfigError(
                    f"config error: resources[{res.api_version}/{res.kind}].namespaces: "
                    f"{res.kind} is cluster-scoped; remove namespaces"
                )
            resolved.append(ResolvedResource(res, info))
        return resolved

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
            flush_interval=s.checkpoint.flush_interval,
            max_batch=s.sink.max_batch,
            linger=s.sink.linger,
            poison_policy=s.sink.poison_policy,
            slim=s.informer.slim,
            max_queued=s.informer.max_queued,
            resync_period=s.informer.resync_period,
            stall_after=s.health.stall_seconds,
            reflector=reflector,
        )
        pipelines = []
        self.served, self.heartbeats = [], []
        shard = s.sharding.range()
        for r in resolved:
            res, info = r.settings, r.info
            fingerprinter = resource_fingerprinter(res)
            scopes: list[str | None] = list(res.namespaces) if res.namespaces else [None]
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
                )
                pipelines.append(pipeline)
                self.served.append((res, pipeline))
                if res.heartbeat_interval:
                    target = HeartbeatTarget(
                        s.cluster.name, info.group, info.version, info.kind, info.plural, ns
                    )
                    self.heartbeats.append(
                        Heartbeat(
                            pipeline, HeartbeatBuilder(target, res.heartbeat_interval), self.sink
                        )
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
        )
        await self.health.start()
        log.info("health server listening", port=self.health.port, control_auth=control.mode)
        if control.mode == "none":
            log.warning(
                "server.controlAuth is none: anyone who reaches port "
                f"{self.health.port} can make the bridge snapshot (POST /snapshot)"
            )
        try:
            self.client = await KubeClient.from_kubeconfig(s.cluster.kubeconfig, s.cluster.context)
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
        tasks = [asyncio.create_task(p.run(), name=f"pipeline:{p.label}") for p in self.pipelines]
        waiters: list[asyncio.Task[Any]] = [asyncio.create_task(stop.wait(), name="stop")]
        if lost is not None:
            waiters.append(asyncio.create_task(lost.wait(), name="lost-lease"))
        waiters.append(
            asyncio.create_task(
                PipelineObserver(self.pipelines, self.metrics).run(), name="observer"
            )
        )
        waiters.append(asyncio.create_task(self._probe_sink(), name="sink-probe"))
        waiters.extend(
            asyncio.create_task(h.run(), name=f"heartbeat:{h.source.label}")
            for h in self.heartbeats
        )
        if self._after_first_sync is not None:
            waiters.append(asyncio.create_task(self._settle_first_sync(), name="after-sync"))
        log.info("pipelines started", pipelines=[p.label for p in self.pipelines])
        if self._on_ready is not None:
            waiters.append(asyncio.create_task(self._notify_ready(), name="on-ready"))
        try:
            done, _ = await asyncio.wait([*tasks, *waiters], return_when=asyncio.FIRST_COMPLETED)
            for p, t in zip(self.pipelines, tasks, strict=True):
                error = t.exception() if t in done and not t.cancelled() else None
                if isinstance(error, BridgeError):
                    # One line for the operator: which resource, and the server's reason.
                    raise ResourceFailedError(f"resource {p.label}: {error}") from error
                if error is not None:
                    raise error
        finally:
            snapshots = list(self._snapshots.values())
            for t in [*snapshots, *tasks, *waiters]:
                t.cancel()
            await asyncio.gather(*snapshots, return_exceptions=True)
            # Each pipeline publishes and checkpoints what it processed; a bus that
            # stays down must not keep the process from exiting.
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for p, r in zip(self.pipelines, results, strict=True):
                if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
                    log.error("pipeline failed", resource=p.label, error=str(r))
            await asyncio.gather(*waiters, return_exceptions=True)
            for p in self.pipelines:
                # Nothing of a stopped pipeline waits any more: a replica that lost the
                # lease must not keep a stall alert firing with the age it last had.
                self.metrics.oldest_unacked_age.labels(resource=p.label).set(0)

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
        configured = [
            r
            for r in self.settings.resources
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
        if self.health is not None:
            await self.health.stop()
