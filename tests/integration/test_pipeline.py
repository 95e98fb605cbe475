"""The pipeline end to end against the emulator over HTTP: exactly the real changes, once.

Sink and checkpoint store are the memory twins here; the real buses are
covered by tests/integration/test_delivery.py and the e2e tests.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from bridge.emulator import Emulator
from bridge.ground.digest import CERTAIN, UNCERTAIN
from tests.fixtures.pipeline import FAST, Harness, commit_cycles, pod
from tests.fixtures.waiting import until

pytestmark = pytest.mark.integration


async def test_initial_sync_publishes_each_object_once_marked_initial(
    harness: Harness, emulator: Emulator
) -> None:
    for i in range(3):
        emulator.create(pod(f"p{i}"))
    async with harness.running() as p:
        await harness.settled(p)
    assert sorted(harness.kinds()) == [("added", f"default/p{i}") for i in range(3)]
    assert all(e.initial for e in harness.sink.events)
    cp = await harness.checkpoints.load("core/v1/pods")
    assert cp is not None and set(cp.digests) == {f"default/p{i}" for i in range(3)}


async def test_live_changes_in_order_and_ignored_fields_publish_nothing(
    harness: Harness, emulator: Emulator
) -> None:
    async with harness.running() as p:
        emulator.create(pod("web"))
        emulator.patch("v1", "Pod", "web", {"status": {"phase": "Running"}}, namespace="default")
        # Only an ignored field: the API server bumps the RV, the bridge stays quiet.
        emulator.patch(
            "v1",
            "Pod",
            "web",
            {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
            namespace="default",
        )
        emulator.delete("v1", "Pod", "web", namespace="default")
        await harness.settled(p)
    assert harness.kinds() == [
        ("added", "default/web"),
        ("modified", "default/web"),
        ("deleted", "default/web"),
    ]
    ids = [e.id for e in harness.sink.events]
    assert len(set(ids)) == 3
    assert not any(e.initial for e in harness.sink.events)


async def test_graceful_restart_without_changes_publishes_nothing(
    harness: Harness, emulator: Emulator
) -> None:
    emulator.create(pod("a"))
    async with harness.running() as p:
        await harness.settled(p)
    before = len(harness.sink.events)
    async with harness.running() as p:
        await harness.settled(p)
        await harness.probe()
    assert before == 1
    assert harness.kinds(before) == [("added", "default/probe")]


async def test_restart_after_compaction_publishes_exactly_the_missed_changes(
    harness: Harness, emulator: Emulator
) -> None:
    for name in ("keep", "change", "gone"):
        emulator.create(pod(name))
    async with harness.running() as p:
        await harness.settled(p)
    first = len(harness.sink.events)
    # While the bridge is down: one update, one delete, one create, one no-op
    # (ignored field), then the history is compacted: resume must relist and diff.
    emulator.patch("v1", "Pod", "change", {"spec": {"nodeName": "n1"}}, namespace="default")
    emulator.delete("v1", "Pod", "gone", namespace="default")
    emulator.create(pod("new"))
    emulator.patch(
        "v1",
        "Pod",
        "keep",
        {"status": {"conditions": [{"type": "Ready", "status": "False"}]}},
        namespace="default",
    )
    emulator.chaos.compact()
    async with harness.running() as p:
        await harness.settled(p)
    missed = sorted(harness.kinds(first))
    assert missed == [
        ("added", "default/new"),
        ("deleted", "default/gone"),
        ("modified", "default/change"),
    ]
    gone = next(e for e in harness.sink.events[first:] if e.subject == "default/gone")
    assert gone.data.get("tombstone") is True


async def test_dropped_watch_loses_nothing_and_republishes_nothing(
    harness: Harness, emulator: Emulator
) -> None:
    async with harness.running() as p:
        emulator.create(pod("x"))
        await harness.settled(p)
        emulator.chaos.drop_watches()
        emulator.patch("v1", "Pod", "x", {"spec": {"nodeName": "n2"}}, namespace="default")
        emulator.create(pod("y"))
        await harness.settled(p)
    assert harness.kinds() == [
        ("added", "default/x"),
        ("modified", "default/x"),
        ("added", "default/y"),
    ]


async def test_sink_down_never_lets_the_checkpoint_pass_the_bus(
    harness: Harness, emulator: Emulator
) -> None:
    async with harness.running() as p:
        emulator.create(pod("one"))
        await harness.settled(p)
        committed = p.committed_resource_version
        harness.sink.available = False
        emulator.create(pod("two"))
        await until(lambda: not p.sink_healthy)  # "two" was written ahead and refused
        await commit_cycles(p)
        cp = await harness.checkpoints.load("core/v1/pods")
        assert cp is not None and cp.resource_version == committed
        # Written ahead (it may be on the bus), never certain before the ack.
        assert cp.digests["default/two"].state == UNCERTAIN
        harness.sink.available = True
        await harness.settled(p)
        assert p.sink_healthy
    assert harness.kinds() == [("added", "default/one"), ("added", "default/two")]


async def test_delete_and_recreate_while_down_is_delete_then_add(
    harness: Harness, emulator: Emulator
) -> None:
    """Checklist 28 downstream: same name, new UID → delete of the old UID, add of the new."""
    emulator.create(pod("same"))
    async with harness.running() as p:
        await harness.settled(p)
    old_uid = harness.sink.events[0].data["object"]["metadata"]["uid"]
    emulator.delete("v1", "Pod", "same", namespace="default")
    emulator.create(pod("same"))
    emulator.chaos.compact()
    async with harness.running() as p:
        await harness.settled(p)
    tail = harness.sink.events[1:]
    assert [e.type.rsplit(".", 1)[-1] for e in tail] == ["deleted", "added"]
    assert tail[0].id.startswith(old_uid + ":")
    assert not tail[1].id.startswith(old_uid + ":")


async def test_shutdown_with_the_bus_down_gives_up_in_time_and_keeps_the_checkpoint(
    harness: Harness, emulator: Emulator
) -> None:
    emulator.create(pod("first"))
    p = await harness.pipeline()
    task = asyncio.create_task(p.run())
    await until(lambda: p.has_synced())
    await harness.settled(p)
    committed = p.committed_resource_version
    harness.sink.available = False
    emulator.create(pod("second"))
    await until(lambda: not p.sink_healthy)  # "second" was written ahead and refused
    loop = asyncio.get_running_loop()
    started = loop.time()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert loop.time() - started < FAST.shutdown_timeout + 2
    cp = await harness.checkpoints.load("core/v1/pods")
    assert cp is not None and cp.resource_version == committed
    assert cp.digests["default/second"].state == UNCERTAIN
    assert cp.digests["default/first"].state == CERTAIN
