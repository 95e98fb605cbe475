"""Filters through the pipeline, against the emulator over HTTP.

Only objects the filter holds for are published; one leaving the filter is
published as ``filtered`` (delete-like for consumers), one entering it as
added; the delete of an object that was never published publishes nothing.
The checkpoint holds the objects in view, so a restart gives the same outcome.
"""

from __future__ import annotations

from typing import Any

import pytest

from bridge.delivery.snapshot import take_snapshot
from bridge.emulator import Emulator
from bridge.ground.digest import UNCERTAIN, Digest
from tests.fixtures.pipeline import Harness, pod
from tests.fixtures.waiting import until
from tests.integration.test_delivery import running

pytestmark = pytest.mark.integration

RID = "core/v1/pods"
DB = "object.metadata.labels['tier'] == 'db'"


def label(emulator: Emulator, name: str, tier: str | None) -> dict[str, Any]:
    return emulator.patch(
        "v1", "Pod", name, {"metadata": {"labels": {"tier": tier}}}, namespace="default"
    )


def seen(harness: Harness, start: int = 0) -> list[tuple[str, str]]:
    return harness.kinds(start)


async def test_only_matching_objects_are_published_and_leaving_or_entering_is_published(
    harness: Harness, emulator: Emulator
) -> None:
    harness.filter = DB
    emulator.create(pod("db-1", tier="db"))
    emulator.create(pod("web-1", tier="web"))
    p = await harness.pipeline()
    async with running(p):
        await harness.settled(p)
        assert seen(harness) == [("added", "default/db-1")]
        # Leaves the filter: a filtered event with a deterministic id, no digest kept.
        left = label(emulator, "db-1", "web")
        await harness.settled(p)
        event = harness.sink.events[-1]
        assert seen(harness, 1) == [("filtered", "default/db-1")]
        assert event.type == "io.k8s.core.v1.Pod.filtered"
        uid, rv = left["metadata"]["uid"], left["metadata"]["resourceVersion"]
        assert event.id == f"{uid}:filtered:{rv}"
        cp = await harness.checkpoints.load(RID)
        assert cp is not None and cp.digests == {}
        # Changes and the delete of objects outside: nothing.
        emulator.patch("v1", "Pod", "web-1", {"spec": {"x": 1}}, namespace="default")
        emulator.delete("v1", "Pod", "db-1", namespace="default")
        # Enters the filter: added.
        label(emulator, "web-1", "db")
        await harness.settled(p)
        assert seen(harness, 2) == [("added", "default/web-1")]
        emulator.delete("v1", "Pod", "web-1", namespace="default")
        await harness.settled(p)
    assert seen(harness, 3) == [("deleted", "default/web-1")]


async def test_a_restart_publishes_what_changed_in_view_while_down_and_nothing_else(
    harness: Harness, emulator: Emulator
) -> None:
    harness.filter = DB
    for name, tier in [("in-stays", "db"), ("in-leaves", "db"), ("in-gone", "db")]:
        emulator.create(pod(name, tier=tier))
    for name in ["out-stays", "out-enters", "out-gone", "out-changes"]:
        emulator.create(pod(name, tier="web"))
    async with running(await harness.pipeline()) as p:
        await harness.settled(p)
    assert sorted(s for _, s in seen(harness)) == [
        "default/in-gone",
        "default/in-leaves",
        "default/in-stays",
    ]
    cp = await harness.checkpoints.load(RID)
    assert cp is not None and sorted(cp.digests) == [
        "default/in-gone",
        "default/in-leaves",
        "default/in-stays",
    ]
    start = len(harness.sink.events)
    # While the bridge is down:
    label(emulator, "in-leaves", "web")
    emulator.delete("v1", "Pod", "in-gone", namespace="default")
    label(emulator, "out-enters", "db")
    emulator.delete("v1", "Pod", "out-gone", namespace="default")
    emulator.patch("v1", "Pod", "out-changes", {"spec": {"x": 1}}, namespace="default")
    async with running(await harness.pipeline()) as p:
        await harness.settled(p)
    assert sorted(seen(harness, start)) == [
        ("added", "default/out-enters"),
        ("deleted", "default/in-gone"),
        ("filtered", "default/in-leaves"),
    ]


async def test_a_restart_after_a_compaction_relists_with_the_same_outcome(
    harness: Harness, emulator: Emulator
) -> None:
    harness.filter = DB
    emulator.create(pod("in-leaves", tier="db"))
    emulator.create(pod("out-gone", tier="web"))
    async with running(await harness.pipeline()) as p:
        await harness.settled(p)
    start = len(harness.sink.events)
    label(emulator, "in-leaves", "web")
    emulator.delete("v1", "Pod", "out-gone", namespace="default")
    emulator.create(pod("new-out", tier="web"))
    emulator.chaos.compact()  # the watermark is gone: the restart relists
    async with running(await harness.pipeline()) as p:
        await harness.settled(p)
    assert seen(harness, start) == [("filtered", "default/in-leaves")]


async def test_an_uncertain_key_that_no_longer_matches_leaves_with_a_filtered_event(
    harness: Harness, emulator: Emulator
) -> None:
    """A previous run wrote it ahead (its event may be on the bus): consumers may hold it."""
    harness.filter = DB
    live = emulator.create(pod("maybe", tier="web"))
    m = live["metadata"]
    await harness.checkpoints.commit(
        RID,
        str(emulator.resource_version),
        [Digest("default/maybe", m["uid"], m["resourceVersion"], "f" * 32, UNCERTAIN)],
        (),
    )
    async with running(await harness.pipeline()) as p:
        await until(lambda: len(harness.sink.events) == 1)
        await harness.settled(p)
    assert seen(harness) == [("filtered", "default/maybe")]
    cp = await harness.checkpoints.load(RID)
    assert cp is not None and cp.digests == {}


async def test_a_snapshot_announces_only_objects_in_view(
    harness: Harness, emulator: Emulator
) -> None:
    harness.filter = DB
    emulator.create(pod("db-1", tier="db"))
    emulator.create(pod("web-1", tier="web"))
    p = await harness.pipeline()
    async with running(p):
        await harness.settled(p)
        start = len(harness.sink.events)
        result = await take_snapshot(p, "sig")
    assert result.announced == 1
    assert result.skipped == {"filtered": 1}
    assert seen(harness, start) == [("snapshot", "default/db-1")]
