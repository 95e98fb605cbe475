"""The delivery core against the emulator over HTTP: publish at once, checkpoint behind,
restart from uncertain keys, poison events.

Sink and checkpoint store are the memory twins; the crash property against real
buses is tests/e2e/test_crash_property.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytest

from bridge.checkpoints.memory import MemoryCheckpointStore
from bridge.delivery.pipeline import ResourcePipeline
from bridge.emulator import Emulator
from bridge.errors import CheckpointError
from bridge.ground.digest import CERTAIN, DELETING, GONE, UNCERTAIN, Digest
from bridge.ground.envelope import Event
from tests.doubles.memory_sink import MemorySink
from tests.fixtures.pipeline import (
    FAST,
    Harness,
    commit_cycles,
    pod,
)
from tests.fixtures.waiting import until

pytestmark = pytest.mark.integration

RID = "core/v1/pods"


async def digest_of_live(harness: Harness, name: str, state: str = UNCERTAIN) -> Digest:
    """The digest the bridge would write for the live object ``name``."""
    obj = harness.emulator.get("v1", "Pod", name, namespace="default")
    p = await harness.pipeline()
    d = p.detector.digest_of(obj)
    return dataclasses.replace(d, state=state)


@contextlib.asynccontextmanager
async def running(p: ResourcePipeline) -> Any:
    task = asyncio.create_task(p.run())
    try:
        yield p
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# -- publish at once, checkpoint behind ----------------------------------------


async def test_an_event_is_published_without_waiting_for_the_checkpoint_cadence(
    harness: Harness, emulator: Emulator
) -> None:
    p = await harness.pipeline()
    p.settings = dataclasses.replace(FAST, flush_interval=30.0)
    async with running(p):
        await until(p.has_synced)
        emulator.create(pod("now"))
        await until(lambda: len(harness.sink.events) == 1, timeout=1.0)
    assert harness.sink.events[0].id.endswith(":" + harness.sink.events[0].resource_version)


async def test_the_watermark_advances_under_churn_that_never_pauses(
    harness: Harness, emulator: Emulator
) -> None:
    """Changes keep coming (the FIFO never idles), yet the checkpoint keeps up."""
    for i in range(20):
        emulator.create(pod(f"c{i}"))
    p = await harness.pipeline()
    p.settings = dataclasses.replace(FAST, flush_interval=0.2)
    stored: list[int] = []
    async with running(p):
        await until(p.has_synced)
        loop = asyncio.get_running_loop()
        end = loop.time() + 3.0
        i = 0
        while loop.time() < end:
            i += 1
            emulator.patch(
                "v1", "Pod", f"c{i % 20}", {"spec": {"nodeName": f"n{i}"}}, namespace="default"
            )
            if i % 50 == 0:
                cp = await harness.checkpoints.load(RID)
                stored.append(int(cp.resource_version or 0) if cp else 0)
                assert p.checkpoint_lag() < 2.0
            await asyncio.sleep(0.002)
    # The stored watermark moved again and again while changes never paused.
    assert len(set(stored)) >= 5, stored
    assert stored == sorted(stored)


class GatedSink(MemorySink):
    """Acknowledges the first ``open_batches`` publishes, then holds every later one."""

    def __init__(self, open_batches: int) -> None:
        super().__init__()
        self.open_batches = open_batches
        self.gate = asyncio.Event()

    async def publish(self, events: Sequence[Event]) -> Mapping[int, str]:
        if len(self.batches) >= self.open_batches:
            await self.gate.wait()
        return await super().publish(events)


async def test_many_keys_awaiting_their_rows_make_a_commit_due_early(
    harness: Harness, emulator: Emulator
) -> None:
    """The bus never drains (a batch is held) and the cadence is 30 s, yet the keys
    acknowledged so far are committed: a commit's size is bounded by keys, not time."""
    for i in range(60):
        emulator.create(pod(f"k{i}"))
    harness.sink = GatedSink(open_batches=3)
    p = await harness.pipeline()
    p.settings = dataclasses.replace(FAST, flush_interval=30.0, max_batch=10, commit_after_keys=20)

    async def committed() -> bool:
        cp = await harness.checkpoints.load(RID)
        return cp is not None and sum(d.state == CERTAIN for d in cp.digests.values()) >= 20

    async with running(p):
        await until(lambda: len(harness.sink.events) == 30)
        await until(committed, timeout=2.0)
        cp = await harness.checkpoints.load(RID)
        assert cp is not None
        acked = {e.data["object"]["metadata"]["name"] for e in harness.sink.events}
        certain = {k.rpartition("/")[2] for k, d in cp.digests.items() if d.state == CERTAIN}
        # Only what the bus acknowledged became certain; the rest stays written ahead.
        assert certain <= acked
        assert p.outbox.unacknowledged > 0  # never drained: the keys made it due
        harness.sink.gate.set()


class RecordingStore(MemoryCheckpointStore):
    """The memory store, recording each commit call: (watermark, upserts, deletes)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str | None, list[Digest], list[str]]] = []

    async def commit(
        self,
        resource_id: str,
        resource_version: str | None,
        upserts: Iterable[Digest],
        deletes: Iterable[str],
    ) -> None:
        up, down = list(upserts), list(deletes)
        self.calls.append((resource_version, up, down))
        await super().commit(resource_id, resource_version, up, down)


async def test_a_commit_of_many_keys_goes_in_steps_with_the_watermark_last(
    harness: Harness, emulator: Emulator
) -> None:
    """A write-ahead waits for one step of a commit, not for all of it; the watermark
    is stored only once every row before it is."""
    for i in range(45):
        emulator.create(pod(f"s{i}"))
    store = harness.checkpoints = RecordingStore()
    p = await harness.pipeline()
    # On the cadence only: the first commit covers the whole list.
    p.settings = dataclasses.replace(
        FAST, flush_interval=0.5, drained_commit_after=None, commit_step_keys=10
    )
    async with running(p):
        await harness.settled(p)
    steps = [
        (watermark, len(up) + len(down))
        for watermark, up, down in store.calls
        if watermark is not None or down or any(d.state == CERTAIN for d in up)
    ]
    # The first commit: 45 keys in five steps, the watermark with the last.
    assert steps[:5] == [(None, 10)] * 4 + [(str(emulator.resource_version), 5)], steps
    cp = await store.load(RID)
    assert cp is not None and cp.resource_version == str(emulator.resource_version)
    assert len(cp.digests) == 45 and all(d.state == CERTAIN for d in cp.digests.values())


class SlowSink(MemorySink):
    """A bus that takes ``delay`` seconds to acknowledge each batch."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    async def publish(self, events: Sequence[Event]) -> Mapping[int, str]:
        await asyncio.sleep(self.delay)
        return await super().publish(events)


async def test_behind_a_slow_bus_batches_are_full_with_two_pending(
    harness: Harness, emulator: Emulator
) -> None:
    """The bus is slower than the watch: the next batch is taken when it is full or
    when the sender is done, so two batches pending (one published, one filling)
    keep every batch full."""
    for i in range(100):
        emulator.create(pod(f"b{i}"))
    harness.sink = SlowSink(delay=0.03)
    p = await harness.pipeline()
    p.settings = dataclasses.replace(FAST, max_batch=10, linger=0.0)
    assert p.settings.pending_limit == 20
    most = 0
    async with running(p):
        while len(harness.sink.events) < 100:
            most = max(most, p.outbox.unacknowledged)
            await asyncio.sleep(0.002)
    sizes = [len(b) for b in harness.sink.batches]
    assert most <= 20
    # The first batch leaves with what was decided by then, the last with what was
    # left; every other one is full.
    assert sum(sizes) == 100 and sizes[1:-1] == [10] * (len(sizes) - 2), sizes


# -- restart from a checkpoint that was written ahead --------------------------


async def test_an_uncertain_unchanged_object_is_republished_with_the_same_id(
    harness: Harness, emulator: Emulator
) -> None:
    obj = emulator.create(pod("maybe"))
    emulator.create(pod("sure"))
    uncertain = await digest_of_live(harness, "maybe")
    certain = await digest_of_live(harness, "sure", CERTAIN)
    await harness.checkpoints.commit(RID, str(emulator.resource_version), [uncertain, certain], [])
    async with harness.running() as p:
        await harness.settled(p)
    md = obj["metadata"]
    # Only the uncertain one, with the id it was written ahead with; "sure" is not repeated.
    assert [e.id for e in harness.sink.events] == [f"{md['uid']}:{md['resourceVersion']}"]
    cp = await harness.checkpoints.load(RID)
    assert cp is not None and cp.digests["default/maybe"].state == CERTAIN


@pytest.mark.parametrize("history", ["kept", "compacted"])
async def test_an_uncertain_object_gone_meanwhile_is_published_as_deleted(
    harness: Harness, emulator: Emulator, history: str
) -> None:
    obj = emulator.create(pod("short"))
    uncertain = await digest_of_live(harness, "short")
    emulator.delete("v1", "Pod", "short", namespace="default")
    if history == "compacted":
        emulator.chaos.compact()
    await harness.checkpoints.commit(RID, "1", [uncertain], [])
    async with harness.running() as p:
        await harness.settled(p)
    md = obj["metadata"]
    ids = [e.id for e in harness.sink.events]
    if history == "kept":
        # The resumed watch replays the uncertain change (same id), then the delete.
        assert ids == [f"{md['uid']}:{md['resourceVersion']}", f"{md['uid']}:deleted"]
    else:
        # A relist: the object is gone, its delete is all there is to say.
        assert ids == [f"{md['uid']}:deleted"]
    cp = await harness.checkpoints.load(RID)
    assert cp is not None and "default/short" not in cp.digests


@pytest.mark.parametrize("history", ["kept", "compacted"])
async def test_an_uncertain_object_changed_meanwhile_is_published_as_modified(
    harness: Harness, emulator: Emulator, history: str
) -> None:
    was = emulator.create(pod("moved"))
    uncertain = await digest_of_live(harness, "moved")
    now = emulator.patch("v1", "Pod", "moved", {"spec": {"nodeName": "n9"}}, namespace="default")
    if history == "compacted":
        emulator.chaos.compact()
    await harness.checkpoints.commit(RID, "1", [uncertain], [])
    async with harness.running() as p:
        await harness.settled(p)
    uid, before, after = (
        now["metadata"]["uid"],
        was["metadata"]["resourceVersion"],
        now["metadata"]["resourceVersion"],
    )
    ids = [e.id for e in harness.sink.events]
    if history == "kept":
        assert ids == [f"{uid}:{before}", f"{uid}:{after}"]
    else:
        assert ids == [f"{uid}:{after}"]
    assert harness.sink.events[-1].type.endswith(".modified")


async def test_a_replayed_older_object_of_the_same_name_changes_nothing(
    harness: Harness, emulator: Emulator
) -> None:
    """Resumed from a lagging watermark: the delete and re-create of a name were acked
    (the checkpoint holds the new uid); replaying the old uid's events publishes nothing."""
    old = emulator.create(pod("same"))
    watermark = str(emulator.resource_version)
    emulator.patch("v1", "Pod", "same", {"spec": {"nodeName": "n1"}}, namespace="default")
    emulator.delete("v1", "Pod", "same", namespace="default")
    emulator.create(pod("same"))
    new = await digest_of_live(harness, "same", CERTAIN)
    await harness.checkpoints.commit(RID, watermark, [new], [])
    async with harness.running() as p:
        await harness.settled(p)
    assert old["metadata"]["uid"] != new.uid
    assert harness.sink.events == []


@pytest.mark.parametrize("history", ["kept", "compacted"])
async def test_deletes_on_the_bus_past_the_watermark_resume_the_watch_and_repeat_nothing(
    harness: Harness, emulator: Emulator, history: str
) -> None:
    """Exactly-once puts a delete on the bus with its GONE row while the watermark lags.
    The restart watches from the watermark (no relist: the changes made meanwhile are
    published one by one, none collapsed) and knows the replayed states and delete of
    the gone object by its row: nothing of it is published again."""
    emulator.create(pod("gone"))
    emulator.create(pod("kept"))
    watermark = str(emulator.resource_version)
    kept = await digest_of_live(harness, "kept", CERTAIN)
    emulator.patch("v1", "Pod", "gone", {"spec": {"nodeName": "n1"}}, namespace="default")
    last = emulator.delete("v1", "Pod", "gone", namespace="default")
    rv = last["metadata"]["resourceVersion"]
    gone = Digest("default/gone", last["metadata"]["uid"], rv, "", GONE)
    # Changed while down, twice: both states are news.
    one = emulator.patch("v1", "Pod", "kept", {"spec": {"nodeName": "n2"}}, namespace="default")
    two = emulator.patch("v1", "Pod", "kept", {"spec": {"nodeName": "n3"}}, namespace="default")
    if history == "compacted":
        emulator.chaos.compact()
    await harness.checkpoints.commit(RID, watermark, [kept, gone], [])
    async with harness.running() as p:
        await harness.settled(p)
    uid = kept.uid
    ids = [e.id for e in harness.sink.events]
    if history == "kept":
        assert ids == [
            f"{uid}:{one['metadata']['resourceVersion']}",
            f"{uid}:{two['metadata']['resourceVersion']}",
        ]
    else:
        # The history is gone (410): the relist has only the latest state to give.
        assert ids == [f"{uid}:{two['metadata']['resourceVersion']}"]
    cp = await harness.checkpoints.load(RID)
    assert cp is not None and "default/gone" not in cp.digests  # the watermark passed it


async def test_a_delete_written_ahead_is_published_again_with_its_id(
    harness: Harness, emulator: Emulator
) -> None:
    emulator.create(pod("other"))
    other = await digest_of_live(harness, "other", CERTAIN)
    gone = Digest("default/gone", "uid-gone", "3", "", DELETING)
    await harness.checkpoints.commit(RID, str(emulator.resource_version), [other, gone], [])
    async with harness.running() as p:
        await harness.settled(p)
    assert [e.id for e in harness.sink.events] == ["uid-gone:deleted"]
    assert harness.sink.events[0].data["tombstone"] is True


async def test_a_prior_uid_in_flight_is_deleted_and_the_new_one_confirmed(
    harness: Harness, emulator: Emulator
) -> None:
    """Delete + re-create were in flight: the old uid's delete, the new uid's state."""
    obj = emulator.create(pod("again"))
    uncertain = dataclasses.replace(await digest_of_live(harness, "again"), prior="uid-old")
    await harness.checkpoints.commit(RID, "1", [uncertain], [])
    async with harness.running() as p:
        await harness.settled(p)
    md = obj["metadata"]
    assert [e.id for e in harness.sink.events] == [
        "uid-old:deleted",
        f"{md['uid']}:{md['resourceVersion']}",
    ]


# -- poison events ---------------------------------------------------------------


def big_pod(name: str) -> dict[str, Any]:
    obj = pod(name)
    obj["metadata"]["annotations"] = {"blob": "x" * 20_000}
    return obj


async def poisoned(harness: Harness, emulator: Emulator, policy: str) -> ResourcePipeline:
    harness.sink.max_payload = 10_000
    emulator.create(pod("before"))
    emulator.create(big_pod("huge"))
    emulator.create(pod("after"))
    p = await harness.pipeline()
    p.settings = dataclasses.replace(FAST, poison_policy=policy)  # type: ignore[arg-type]
    return p


async def test_truncate_publishes_the_same_id_cut_to_metadata_and_goes_on(
    harness: Harness, emulator: Emulator
) -> None:
    p = await poisoned(harness, emulator, "truncate")
    async with running(p):
        await harness.settled(p)
    by_subject = {e.subject: e for e in harness.sink.events}
    assert set(by_subject) == {"default/before", "default/huge", "default/after"}
    huge = by_subject["default/huge"]
    assert huge.data["truncated"] is True
    assert "annotations" not in huge.data["object"]["metadata"]
    md = emulator.get("v1", "Pod", "huge", namespace="default")["metadata"]
    assert huge.id == f"{md['uid']}:{md['resourceVersion']}"
    assert p.stats.poison == {"truncated": 1}
    assert p.sink_healthy


async def test_skip_publishes_nothing_for_it_and_goes_on(
    harness: Harness, emulator: Emulator
) -> None:
    p = await poisoned(harness, emulator, "skip")
    async with running(p):
        await harness.settled(p)
    assert sorted(e.subject for e in harness.sink.events) == ["default/after", "default/before"]
    assert p.stats.poison == {"skipped": 1}
    cp = await harness.checkpoints.load(RID)
    assert cp is not None and cp.digests["default/huge"].state == CERTAIN


async def test_dead_letter_takes_the_whole_event_and_the_stream_its_truncated_copy(
    harness: Harness, emulator: Emulator
) -> None:
    p = await poisoned(harness, emulator, "deadLetter")
    async with running(p):
        await harness.settled(p)
    by_subject = {e.subject: e for e in harness.sink.events}
    assert set(by_subject) == {"default/before", "default/huge", "default/after"}
    assert by_subject["default/huge"].data["truncated"] is True
    [letter] = harness.sink.dead_letters
    assert letter.event.id == by_subject["default/huge"].id
    assert len(letter.event.data["object"]["metadata"]["annotations"]["blob"]) == 20_000
    assert "the bus takes at most 10000" in letter.reason
    assert p.stats.poison == {"dead_lettered": 1}
    cp = await harness.checkpoints.load(RID)
    assert cp is not None and cp.digests["default/huge"].state == CERTAIN


async def test_fail_stops_the_resource_naming_the_object(
    harness: Harness, emulator: Emulator
) -> None:
    p = await poisoned(harness, emulator, "fail")
    async with running(p):
        await until(lambda: p.failed is not None)
        emulator.create(pod("later"))
        # Stopped means its watch is gone from the API server: nothing can bring
        # "later" in any more (a pipeline that went on would publish it first).
        await until(
            lambda: (
                not emulator.store.all_watchers()
                or any(e.subject == "default/later" for e in harness.sink.events)
            )
        )
    assert p.failed is not None and "default/huge" in p.failed
    subjects = [e.subject for e in harness.sink.events]
    assert "default/later" not in subjects and "default/huge" not in subjects
    # Never checkpointed as published: the next start meets it again.
    cp = await harness.checkpoints.load(RID)
    assert cp is not None and cp.digests["default/huge"].state == UNCERTAIN


async def test_a_refused_event_superseded_in_its_batch_is_not_republished_out_of_order(
    harness: Harness, emulator: Emulator
) -> None:
    """Truncating the older event after the newer one landed would reorder them."""
    harness.sink.refuse = lambda e: "refused" if e.resource_version == first_rv[0] else None
    first_rv: list[str] = []
    p = await harness.pipeline()
    p.settings = dataclasses.replace(FAST, linger=0.2)  # both changes in one batch
    async with running(p):
        await until(p.has_synced)
        first_rv.append(emulator.create(pod("x"))["metadata"]["resourceVersion"])
        emulator.patch("v1", "Pod", "x", {"spec": {"nodeName": "n1"}}, namespace="default")
        await harness.settled(p)
    events: list[Event] = harness.sink.events
    assert [e.type.rsplit(".", 1)[-1] for e in events] == ["modified"]
    assert p.stats.poison == {"superseded": 1}


async def test_the_checkpoint_waits_while_the_bus_is_down(
    harness: Harness, emulator: Emulator
) -> None:
    async with harness.running() as p:
        emulator.create(pod("one"))
        await harness.settled(p)
        harness.sink.available = False
        before = p.committed_resource_version
        emulator.create(pod("two"))
        await until(lambda: not p.sink_healthy)  # "two" was decided and refused
        await commit_cycles(p)
        assert p.committed_resource_version == before
        harness.sink.available = True

        async def caught_up() -> bool:
            return p.committed_resource_version == str(emulator.resource_version)

        await until(caught_up)


async def test_shutdown_publishes_what_was_decided_and_commits_it(
    harness: Harness, emulator: Emulator
) -> None:
    """Stopping while the bus is slow: everything decided still goes out, then the commit."""
    harness.sink.delay = 0.2
    p = await harness.pipeline()
    task = asyncio.create_task(p.run())
    await until(p.has_synced)
    for name in ("a", "b", "c"):
        emulator.create(pod(name))
    await until(lambda: p.outbox.last_seq == 3)
    assert p.outbox.unacknowledged > 0
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert sorted(e.subject for e in harness.sink.events) == ["default/a", "default/b", "default/c"]
    cp = await harness.checkpoints.load(RID)
    assert cp is not None and cp.resource_version == str(emulator.resource_version)
    assert {d.state for d in cp.digests.values()} == {CERTAIN}


async def test_a_resync_of_an_uncertain_key_is_not_news(
    harness: Harness, emulator: Emulator
) -> None:
    """A periodic resync re-delivers the cached record itself: it neither publishes
    nor settles the key (only news from the API server does)."""
    emulator.create(pod("waiting"))
    uncertain = await digest_of_live(harness, "waiting")
    await harness.checkpoints.commit(RID, "1", [uncertain], [])
    p = await harness.pipeline()
    await p.load()
    assert p.informer is not None
    record = p.informer.store.get_by_key("default/waiting")
    assert record is not None
    await p.handler.on_update(record, record)
    assert p.outbox.last_seq == 0 and p.outbox.is_open("default/waiting")


async def test_events_waiting_for_the_bus_are_bounded_by_their_bytes(
    harness: Harness, emulator: Emulator
) -> None:
    """A bus that acknowledges nothing: the informer stops deciding once the events
    waiting for it add up to ``max_pending_bytes``, far below ``max_pending``."""
    for i in range(20):
        emulator.create(pod(f"b{i:02d}"))
    harness.sink = GatedSink(open_batches=0)
    p = await harness.pipeline()
    p.settings = dataclasses.replace(FAST, max_pending=1000, max_pending_bytes=4000)
    # What was waiting when each event was decided: once the bound is reached, the
    # next decision waits for an acknowledgement (none comes until the gate opens).
    before_each: list[int] = []
    decide = p.outbox.decide

    def recording(*args: Any) -> Any:
        before_each.append(p.outbox.unacknowledged_bytes)
        return decide(*args)

    p.outbox.decide = recording  # type: ignore[method-assign]
    async with running(p):
        # Every listed object queued: a handler that did not wait would decide them now.
        await until(
            lambda: (
                p.outbox.unacknowledged_bytes >= 4000
                and p.informer is not None
                and p.informer.fifo.queued_total == 20
            )
        )
        assert len(before_each) == p.outbox.last_seq  # every decision was seen
        assert all(b < 4000 for b in before_each), before_each
        waiting = p.outbox.unacknowledged
        size = p.outbox.unacknowledged_bytes / waiting
        assert p.outbox.unacknowledged_bytes < 4000 + size
        assert waiting < 20
        harness.sink.gate.set()
        await until(lambda: len(harness.sink.events) == 20)
    assert all(b < 4000 for b in before_each), before_each
    assert [e.data["object"]["metadata"]["name"] for e in harness.sink.events] == [
        f"b{i:02d}" for i in range(20)
    ]


async def test_an_event_larger_than_the_byte_bound_still_goes_alone(
    harness: Harness, emulator: Emulator
) -> None:
    for i in range(5):
        emulator.create(pod(f"big{i}"))
    p = await harness.pipeline()
    p.settings = dataclasses.replace(FAST, max_pending_bytes=1)
    async with running(p):
        await until(lambda: len(harness.sink.events) == 5)
    # One event at a time: never two waiting for the bus together.
    assert all(len(batch) == 1 for batch in harness.sink.batches)


class GatedStore(MemoryCheckpointStore):
    """Holds a commit carrying a watermark (a commit behind the bus) at ``gate`` once
    ``armed``; ``holding`` is set while one waits there. Once it is stored, later
    commits behind the bus fail (as if the bridge died then): what the store holds
    is what a restart would read."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.gate = asyncio.Event()
        self.holding = asyncio.Event()
        self.held_stored = False

    async def commit(
        self,
        resource_id: str,
        resource_version: str | None,
        upserts: Iterable[Digest],
        deletes: Iterable[str],
    ) -> None:
        upserts = list(upserts)
        if resource_version is not None and self.held_stored:
            raise CheckpointError("the bridge died here")
        held = self.armed and resource_version is not None and bool(upserts)
        if held:
            self.armed = False
            self.holding.set()
            await self.gate.wait()
        await super().commit(resource_id, resource_version, upserts, deletes)
        if held:
            self.held_stored = True


async def test_a_commit_never_puts_an_older_row_over_a_transactions_newer_one(
    harness: Harness, emulator: Emulator
) -> None:
    """Exactly-once: each batch's rows go in its own transaction, and commits behind the
    bus write rows too. A commit that read a key's digest, then waited for the store
    while the key's next change went out in a transaction, would store the older
    digest over the newer: a restart would publish that change again. The commit
    reads and stores with no transaction in between."""
    store = harness.checkpoints = GatedStore()
    sink = harness.sink

    async def transactional(events: Sequence[Event], rows: Any) -> Mapping[int, str]:
        refused = await sink.publish(events)  # the batch and its rows, together
        await store.commit(RID, None, *rows(refused))
        return refused

    built = harness.pipeline

    async def pipeline() -> ResourcePipeline:
        p = await built()
        return ResourcePipeline(
            resource_id=RID,
            lw=p.lister,
            detector=p.detector,
            builder=p.builder,
            sink=sink,
            checkpoints=store,
            settings=FAST,
            transactional=transactional,
        )

    harness.pipeline = pipeline  # type: ignore[method-assign]
    first = emulator.create(pod("k"))
    async with harness.running():
        await until(
            lambda: any(e.id.endswith(first["metadata"]["resourceVersion"]) for e in sink.events)
        )
        store.armed = True
        await asyncio.wait_for(store.holding.wait(), 5)  # a commit read k's row, and waits
        now = emulator.patch("v1", "Pod", "k", {"spec": {"nodeName": "n1"}}, namespace="default")
        rv = now["metadata"]["resourceVersion"]
        with contextlib.suppress(AssertionError):  # the transaction waits for the commit
            await until(lambda: any(e.id.endswith(f":{rv}") for e in sink.events), timeout=0.5)
        store.gate.set()
        await until(lambda: any(e.id.endswith(f":{rv}") for e in sink.events))
        await until(lambda: store.held_stored)
        await asyncio.sleep(0.1)
    cp = await store.load(RID)
    assert cp is not None and cp.digests["default/k"].resource_version == rv
