"""Prometheus metrics of one bridge instance.

Each app builds its own ``Registry`` (bridge/ground/prometheus.py) and hands it
in, so two bridges in one process (tests, the demo) never share or collide on
counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from bridge.ground.prometheus import (
    Counter,
    Family,
    Gauge,
    Histogram,
    ProcessCollector,
    Registry,
    gauge_family,
)

# Publishing spans sub-millisecond stdout writes to multi-second broker stalls.
_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

# Events per publish call: one event (a quiet cluster) up to the largest batch a sink takes.
_BATCH_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)

# The memory limit of the container, as cgroup v2 and then v1 publish it.
_CGROUP_MEMORY_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)
_MEMORY_LIMIT_HELP = "The container's memory limit (cgroup); no sample when it has none"
# cgroup v1 says "no limit" with a huge number near 2**63 rounded to the page size.
_NO_LIMIT_ABOVE = 2**62


def cgroup_memory_limit(paths: tuple[Path, ...] = _CGROUP_MEMORY_LIMITS) -> int | None:
    """The container's memory limit in bytes, None when there is none or no cgroup says."""
    for path in paths:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text == "max":
            return None
        try:
            limit = int(text)
        except ValueError:
            continue
        return limit if limit < _NO_LIMIT_ABOVE else None
    return None


class MemoryLimitCollector:
    """The container's memory limit, read from the cgroup at each scrape (an in-place
    resize shows at once); the family is declared without a sample when there is none."""

    def __init__(self, name: str, paths: tuple[Path, ...] = _CGROUP_MEMORY_LIMITS) -> None:
        self.name = name
        self.paths = paths

    def collect(self) -> Iterable[Family]:
        family = gauge_family(self.name, _MEMORY_LIMIT_HELP)
        limit = cgroup_memory_limit(self.paths)
        if limit is not None:
            family.add(limit)
        return [family]


class Metrics:
    """The metric families of k8s-bridge, registered on ``registry``."""

    def __init__(self, registry: Registry, namespace: str = "k8s_bridge") -> None:
        self.registry = registry
        ns = namespace
        self.events_published = Counter(
            "events_published",
            "Events acknowledged by the sink",
            ["resource", "type"],
            namespace=ns,
            registry=registry,
        )
        self.changes_suppressed = Counter(
            "changes_suppressed",
            "Deltas that produced no event (resync, relist echo, ignored fields only, ...)",
            ["resource", "reason"],
            namespace=ns,
            registry=registry,
        )
        self.poison_events = Counter(
            "poison_events",
            "Events the bus refused for good, by what the poison policy did with them"
            " (truncated, skipped, superseded, failed)",
            ["resource", "outcome"],
            namespace=ns,
            registry=registry,
        )
        self.filter_errors = Counter(
            "filter_errors",
            "Filter evaluations that failed (a missing field, a non-bool result);"
            " each counts as no match",
            ["resource"],
            namespace=ns,
            registry=registry,
        )
        self.publish_latency = Histogram(
            "publish_latency_seconds",
            "Time from handing an event to the sink until its ack",
            ["sink"],
            namespace=ns,
            registry=registry,
            buckets=_LATENCY_BUCKETS,
        )
        self.watch_restarts = Counter(
            "watch_restarts",
            "Watches restarted (timeout, stream broke, stalled, error)",
            ["resource", "reason"],
            namespace=ns,
            registry=registry,
        )
        self.relists = Counter(
            "relists",
            "Full lists after the first (410 Expired, errors)",
            ["resource", "reason"],
            namespace=ns,
            registry=registry,
        )
        self.list_read_aheads = Counter(
            "list_read_aheads",
            "LIST answers (pages) that outlasted informer.listPaceSeconds: their rest was"
            " read at once and held as bytes",
            ["resource"],
            namespace=ns,
            registry=registry,
        )
        self.checkpoint_resource_version = Gauge(
            "checkpoint_resource_version",
            "resourceVersion (numeric) of the last stored checkpoint",
            ["resource"],
            namespace=ns,
            registry=registry,
        )
        self.checkpoint_lag = Gauge(
            "checkpoint_lag_seconds",
            "Seconds since the checkpoint of a resource last advanced",
            ["resource"],
            namespace=ns,
            registry=registry,
        )
        self.watch_up = Gauge(
            "watch_up",
            "1 while a list/watch stream of the resource is established, else 0",
            ["resource"],
            namespace=ns,
            registry=registry,
        )
        self.cache_objects = Gauge(
            "cache_objects",
            "Objects held in the informer cache",
            ["resource"],
            namespace=ns,
            registry=registry,
        )
        self.sink_in_flight = Gauge(
            "sink_in_flight",
            "Events handed to the sink and not yet acknowledged",
            namespace=ns,
            registry=registry,
        )
        # The name and label are what the alert rules use (charts/, docs/operations.md).
        self.oldest_unacked_age = Gauge(
            "oldest_unacked_age_seconds",
            "Age of the oldest event taken for delivery (written ahead, handed to the"
            " sink) and not yet acknowledged; 0 when none waits",
            ["resource"],
            namespace=ns,
            registry=registry,
        )
        self.ready = Gauge(
            "ready",
            "1 when the bridge is ready (synced, sink reachable)",
            namespace=ns,
            registry=registry,
        )
        self.leader = Gauge(
            "leader",
            "1 while this replica holds the leader lease (or leader election is off)",
            namespace=ns,
            registry=registry,
        )

        # One shard per replica: its number goes on one info series (joined on the
        # instance), not as a label on every per-resource series, which would carry
        # the same single value on each of them.
        self.shard_info = Gauge(
            "shard_info",
            "1, labelled with this replica's slice: sharding.by, shard (index) and shards",
            ["by", "shard", "shards"],
            namespace=ns,
            registry=registry,
        )
        self.shard_selector_honoured = Gauge(
            "shard_selector_honoured",
            "1 when the API server applies shardSelector for the resource, 0 when the"
            " bridge filters on the client (gate ShardedListAndWatch off, older server);"
            " absent until a LIST answer says",
            ["resource"],
            namespace=ns,
            registry=registry,
        )
        self.shard_client_filtered = Counter(
            "shard_client_filtered",
            "Objects the API server sent although outside this replica's slice, dropped"
            " here (client-side shard filtering)",
            ["resource"],
            namespace=ns,
            registry=registry,
        )
        self.kinds_skipped = Gauge(
            "kinds_skipped",
            "1 for a kind a group/allKinds entry selects but the bridge leaves out: forbidden"
            " (a LIST is a 403) or unavailable (its aggregated API does not answer)",
            ["resource", "reason"],
            namespace=ns,
            registry=registry,
        )
        self._monitoring(registry, ns)

    def _monitoring(self, registry: Registry, ns: str) -> None:
        """What the chart's alerts and dashboard (charts/k8s-bridge/files/) read beyond
        the families above; docs/operations.md, "Alerts", says which alert reads which."""
        # process_resident_memory_bytes, process_start_time_seconds, ...: a custom
        # registry has no process collector of its own. It reads /proc at scrape time.
        registry.register(ProcessCollector())
        limit = f"{ns}_memory_limit_bytes"
        registry.register(MemoryLimitCollector(limit), limit)
        self.synced = Gauge(
            "synced",
            "1 once the resource's first list is handled (informer synced), else 0",
            ["resource"],
            namespace=ns,
            registry=registry,
        )
        self.watch_resource_version = Gauge(
            "watch_resource_version",
            "resourceVersion (numeric) the reflector last saw from the API server;"
            " minus checkpoint_resource_version, how far the checkpoint is behind",
            ["resource"],
            namespace=ns,
            registry=registry,
        )
        self.unacknowledged = Gauge(
            "unacknowledged",
            "Events of the resource decided and not yet acknowledged by the sink",
            ["resource"],
            namespace=ns,
            registry=registry,
        )
        self.producer_fenced = Counter(
            "producer_fenced",
            "Times a Kafka transactional producer of this replica was fenced (a newer"
            " leader took its transactional id)",
            namespace=ns,
            registry=registry,
        )
        # The sink's fencings already counted: the sink outlives each leadership term's
        # observer, so what was carried over is kept here, beside the counter.
        self.fenced_counted = 0
        self.heartbeats_sent = Counter(
            "heartbeats_sent",
            "Heartbeat events the bus took",
            ["resource"],
            namespace=ns,
            registry=registry,
        )
        self.publish_batch_size = Histogram(
            "publish_batch_size",
            "Events per publish call to the sink",
            ["resource"],
            namespace=ns,
            registry=registry,
            buckets=_BATCH_BUCKETS,
        )
        self.checkpoint_commit = Histogram(
            "checkpoint_commit_seconds",
            "Time to store one checkpoint commit (watermark and digests, all its steps)",
            ["resource"],
            namespace=ns,
            registry=registry,
            buckets=_LATENCY_BUCKETS,
        )

    def publish_latency_of(self, sink: str) -> Callable[[float], None]:
        """Records one publish's latency for ``sink`` (bound once per pipeline)."""
        return self.publish_latency.labels(sink=sink).observe

    def commit_seconds_of(self, resource: str) -> Callable[[float], None]:
        """Records how long one checkpoint commit of ``resource`` took."""
        return self.checkpoint_commit.labels(resource=resource).observe

    def batch_size_of(self, resource: str) -> Callable[[float], None]:
        """Records the size of one published batch of ``resource``."""
        return self.publish_batch_size.labels(resource=resource).observe

    def set_checkpoint(self, resource: str, resource_version: str) -> None:
        """Record a stored checkpoint; non-numeric resourceVersions leave the gauge unchanged
        (they are opaque by contract, numeric in every real API server)."""
        try:
            numeric = int(resource_version)
        except (TypeError, ValueError):
            return
        self.checkpoint_resource_version.labels(resource=resource).set(numeric)
