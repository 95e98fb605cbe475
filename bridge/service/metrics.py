"""Prometheus metrics of one bridge instance.

Each app builds its own ``CollectorRegistry`` and hands it in, so two bridges
in one process (tests, the demo) never share or collide on counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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


class Metrics:
    """The metric families of k8s-bridge, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry, namespace: str = "k8s_bridge") -> None:
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

    def set_checkpoint(self, resource: str, resource_version: str) -> None:
        """Record a stored checkpoint; non-numeric resourceVersions leave the gauge unchanged
        (they are opaque by contract, numeric in every real API server)."""
        try:
            numeric = int(resource_version)
        except (TypeError, ValueError):
            return
        self.checkpoint_resource_version.labels(resource=resource).set(numeric)
