"""The mirror's ``/metrics`` and ``/readyz``: read from its counters at scrape time.

A collector over ``DatabaseMirrorStats`` rather than counters the loop increments: the
loop stays free of Prometheus, and a scrape always sees the numbers the exit
line prints.
"""

from __future__ import annotations

from collections.abc import Iterator

from bridge.ground.prometheus import Family, Registry, counter_family, gauge_family
from bridge.mirror.runner import DatabaseMirror


class MirrorCollector:
    def __init__(self, mirror: DatabaseMirror) -> None:
        self.mirror = mirror

    def collect(self) -> Iterator[Family]:
        st = self.mirror.stats
        yield counter_family("k8s_bridge_mirror_changes", "Changes written to PostgreSQL").add(
            st.changes
        )
        yield counter_family("k8s_bridge_mirror_transactions", "Batches committed").add(st.batches)
        yield counter_family(
            "k8s_bridge_mirror_skipped",
            "Messages that are not change events of k8s-bridge, skipped",
        ).add(st.skipped)
        outages = counter_family("k8s_bridge_mirror_outages", "Times the mirror paused")
        outages.add(st.database_outages, [("dependency", "database")])
        outages.add(st.bus_outages, [("dependency", "bus")])
        yield outages
        yield gauge_family(
            "k8s_bridge_mirror_paused", "1 while the database or the bus is unavailable"
        ).add(1.0 if self.mirror.paused else 0.0)
        yield gauge_family(
            "k8s_bridge_mirror_last_commit_timestamp_seconds",
            "Unix time of the last committed batch (0: none yet)",
        ).add(st.last_commit)


def mirror_registry(mirror: DatabaseMirror) -> Registry:
    registry = Registry()
    registry.register(MirrorCollector(mirror))
    return registry


def readiness(mirror: DatabaseMirror) -> tuple[bool, list[str]]:
    if mirror.paused:
        return False, [f"{mirror.paused} unavailable: paused, retrying"]
    if not mirror.positioned:
        return False, ["not reading yet: connecting to PostgreSQL and the bus"]
    return True, []
