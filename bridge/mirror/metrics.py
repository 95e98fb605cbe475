"""The mirror's ``/metrics`` and ``/readyz``: read from its counters at scrape time.

A collector over ``DatabaseMirrorStats`` rather than counters the loop increments: the
loop stays free of Prometheus, and a scrape always sees the numbers the exit
line prints.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from bridge.mirror.runner import DatabaseMirror


class MirrorCollector(Collector):
    def __init__(self, mirror: DatabaseMirror) -> None:
        self.mirror = mirror

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        st = self.mirror.stats
        yield CounterMetricFamily(
            "k8s_bridge_mirror_changes", "Changes written to PostgreSQL", value=st.changes
        )
        yield CounterMetricFamily(
            "k8s_bridge_mirror_transactions", "Batches committed", value=st.batches
        )
        yield CounterMetricFamily(
            "k8s_bridge_mirror_skipped",
            "Messages that are not change events of k8s-bridge, skipped",
            value=st.skipped,
        )
        outages = CounterMetricFamily(
            "k8s_bridge_mirror_outages", "Times the mirror paused", labels=["dependency"]
        )
        outages.add_metric(["database"], st.database_outages)
        outages.add_metric(["bus"], st.bus_outages)
        yield outages
        yield GaugeMetricFamily(
            "k8s_bridge_mirror_paused",
            "1 while the database or the bus is unavailable",
            value=1.0 if self.mirror.paused else 0.0,
        )
        yield GaugeMetricFamily(
            "k8s_bridge_mirror_last_commit_timestamp_seconds",
            "Unix time of the last committed batch (0: none yet)",
            value=st.last_commit,
        )


def mirror_registry(mirror: DatabaseMirror) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(MirrorCollector(mirror))
    return registry


def readiness(mirror: DatabaseMirror) -> tuple[bool, list[str]]:
    if mirror.paused:
        return False, [f"{mirror.paused} unavailable: paused, retrying"]
    if not mirror.positioned:
        return False, ["not reading yet: connecting to PostgreSQL and the bus"]
    return True, []
