"""Metrics from the pipelines' own counters: restarts and relists by reason, cache size, lag."""

from __future__ import annotations

import asyncio

import pytest

from bridge.emulator import Emulator
from bridge.ground.prometheus import Registry
from bridge.service.metrics import Metrics
from bridge.service.observer import PipelineObserver
from tests.fixtures.metrics import sample_value
from tests.fixtures.pipeline import Harness, pod
from tests.fixtures.waiting import until

pytestmark = pytest.mark.integration


def sample(registry: Registry, name: str, **labels: str) -> float:
    value = sample_value(registry, name, labels)
    return 0.0 if value is None else value


async def test_restarts_relists_and_cache_size_reach_prometheus(
    harness: Harness, emulator: Emulator
) -> None:
    for i in range(3):
        emulator.create(pod(f"m{i}"))
    registry = Registry()
    metrics = Metrics(registry)
    async with harness.running() as p:
        observer = PipelineObserver([p], metrics, progress_every=0)
        await harness.settled(p)
        observer.sync_metrics()
        observer.report_progress()
        assert p.label in observer._synced
        assert sample(registry, "k8s_bridge_cache_objects", resource=p.label) == 3
        assert sample(registry, "k8s_bridge_relists_total", resource=p.label, reason="expired") == 0
        assert sample(registry, "k8s_bridge_relists_total", resource=p.label, reason="initial") == 1
        # A dropped stream is a watch restart; a compaction makes the resumed watch
        # fail with 410, which is a relist.
        await asyncio.sleep(1.1)  # past the short-watch window (checklist 11)
        emulator.chaos.drop_watches()
        await until(lambda: sum(p.informer.reflector.watch_restarts.values()) >= 1)  # type: ignore[union-attr]
        emulator.create(pod("m3"))
        emulator.chaos.compact()
        emulator.chaos.drop_watches()
        # The initial list counts as one; the 410 (or the at-once-dead watch) as another.
        await until(lambda: sum(p.informer.reflector.relists.values()) >= 2)  # type: ignore[union-attr]
        await harness.settled(p)
        observer.sync_metrics()
        observer.sync_metrics()  # carrying over twice counts nothing twice
    reflector = p.informer.reflector  # type: ignore[union-attr]
    for reason, n in reflector.watch_restarts.items():
        assert (
            sample(registry, "k8s_bridge_watch_restarts_total", resource=p.label, reason=reason)
            == n
        )
    for reason, n in reflector.relists.items():
        assert sample(registry, "k8s_bridge_relists_total", resource=p.label, reason=reason) == n
    assert sample(registry, "k8s_bridge_cache_objects", resource=p.label) == 4
    assert sample(registry, "k8s_bridge_checkpoint_lag_seconds", resource=p.label) >= 0
    # LISTs that outlast their pacing deadline (tests/unit/kube/test_list_pacing.py): counted.
    assert sample(registry, "k8s_bridge_list_read_aheads_total", resource=p.label) == 0
    reflector.list_read_aheads += 2
    observer.sync_metrics()
    observer.sync_metrics()
    assert sample(registry, "k8s_bridge_list_read_aheads_total", resource=p.label) == 2


async def test_filter_evaluation_errors_reach_prometheus(
    harness: Harness, emulator: Emulator
) -> None:
    """A filter that cannot be evaluated on an object counts as no match, and the
    count is exported, so a wrong expression shows on a dashboard, not only in logs."""
    harness.filter = "object.status.phase == 'Running'"  # pods without status: an error
    bare = pod("no-status")
    del bare["status"]
    emulator.create(bare)
    running = pod("running")
    running["status"] = {"phase": "Running"}
    emulator.create(running)
    registry = Registry()
    metrics = Metrics(registry)
    async with harness.running() as p:
        observer = PipelineObserver([p], metrics, progress_every=0)
        await harness.settled(p)
        observer.sync_metrics()
        assert sample(registry, "k8s_bridge_filter_errors_total", resource=p.label) == 1
        bare = pod("no-status-2")
        del bare["status"]
        emulator.create(bare)
        await until(lambda: p.filter_errors == 2)
        observer.sync_metrics()
        observer.sync_metrics()  # carried over once
        assert sample(registry, "k8s_bridge_filter_errors_total", resource=p.label) == 2
    assert harness.kinds() == [("added", "default/running")]


def test_fencings_are_counted_once_across_leadership_terms() -> None:
    """The sink outlives each term's observer: a new observer adds only new fencings."""

    class Sink:
        fenced = 0

    sink, registry = Sink(), Registry()
    metrics = Metrics(registry)
    first = PipelineObserver([], metrics, sink=sink)
    sink.fenced = 1
    first.sync_metrics()
    first.sync_metrics()
    # The next term: a new observer over the same sink and metrics.
    PipelineObserver([], metrics, sink=sink).sync_metrics()
    assert sample(registry, "k8s_bridge_producer_fenced_total") == 1
    sink.fenced = 3
    PipelineObserver([], metrics, sink=sink).sync_metrics()
    assert sample(registry, "k8s_bridge_producer_fenced_total") == 3
