"""SharedInformer: HandleDeltas, resync, relists, slim mode, backpressure.

Most tests feed the informer's FIFO directly and run only its processing loop
(``run_processing``), which is exactly what the reflector would write; the last
ones run the whole chain over the scripted ListerWatcher twin.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any

import pytest

from bridge.kube.informer import SharedInformer, slim_record
from bridge.kube.objects import (
    CachedObject,
    DeletedFinalStateUnknown,
    ListResponse,
    RawObject,
    WatchEvent,
    resource_version,
)
from bridge.kube.protocols import ListOptions, WatchOptions
from tests.fixtures.waiting import until


class UntouchedListerWatcher:
    """For tests that feed the FIFO themselves: any call to it is a failure."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def list(self, options: ListOptions) -> ListResponse:
        self.calls.append("list")
        raise AssertionError("the informer listed")

    def watch(
        self, options: WatchOptions
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        self.calls.append("watch")
        raise AssertionError("the informer watched")


NO_LW = UntouchedListerWatcher()


def pod(name: str, rv: int, *, uid: str | None = None, ns: str = "ns1", **extra: Any) -> RawObject:
    obj: RawObject = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": uid or f"uid-{name}",
            "resourceVersion": str(rv),
        },
    }
    obj.update(extra)
    return obj


def rv(obj: CachedObject | None) -> str | None:
    return None if obj is None else resource_version(obj)


class Recorder:
    """A handler that records what it got; ``gate`` lets a test hold it inside a call."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.received: list[tuple[str, Any, Any]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.hold_only: str | None = None  # gate only calls about this name
        self.entered = 0

    async def _enter(self, name: str) -> None:
        self.entered += 1
        if self.hold_only is None or self.hold_only == name:
            await self.gate.wait()

    async def on_add(self, obj: RawObject, is_in_initial_list: bool) -> None:
        await self._enter(obj["metadata"]["name"])
        self.received.append(("add", None, obj))
        self.events.append(("add", obj["metadata"]["name"], rv(obj), is_in_initial_list))

    async def on_update(self, old: RawObject, new: RawObject) -> None:
        await self._enter(new["metadata"]["name"])
        self.received.append(("update", old, new))
        self.events.append(("update", new["metadata"]["name"], rv(old), rv(new)))

    async def on_delete(self, obj: RawObject | DeletedFinalStateUnknown) -> None:
        await self._enter(obj.key if isinstance(obj, DeletedFinalStateUnknown) else "")
        self.received.append(("delete", None, obj))
        if isinstance(obj, DeletedFinalStateUnknown):
            self.events.append(("delete", obj.key, rv(obj.obj), "tombstone"))
        else:
            self.events.append(("delete", obj["metadata"]["name"], rv(obj), "object"))


eventually = partial(until, timeout=2.0, interval=0.005)


@asynccontextmanager
async def processing(informer: SharedInformer) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(informer.run_processing())
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def idle(informer: SharedInformer) -> None:
    """Wait until the FIFO is drained and the last pop has been handled."""
    await eventually(lambda: len(informer.fifo) == 0)
    for _ in range(5):
        await asyncio.sleep(0)


# -- HandleDeltas ---------------------------------------------------------------


async def test_adds_updates_deletes_reach_the_handler_in_arrival_order() -> None:
    h = Recorder()
    informer = SharedInformer(NO_LW, h)
    await informer.fifo.replace([pod("a", 1), pod("b", 1)], "1")
    await informer.fifo.update(pod("a", 2))
    await informer.fifo.delete(pod("b", 1))
    await informer.fifo.add(pod("c", 3))

    async with processing(informer):
        await eventually(lambda: len(h.events) == 5)

    assert h.events == [
        ("add", "a", "1", True),
        ("add", "b", "1", True),
        ("update", "a", "1", "2"),
        ("delete", "b", "1", "object"),
        ("add", "c", "3", False),
    ]
    assert informer.store.list_keys() == ["ns1/a", "ns1/c"]
    assert rv(informer.store.get_by_key("ns1/a")) == "2"
    assert informer.has_synced()


async def test_checklist_27_cluster_scoped_objects_are_keyed_by_name() -> None:
    informer = SharedInformer(NO_LW, Recorder())
    node: RawObject = {"kind": "Node", "metadata": {"name": "n1", "resourceVersion": "1"}}
    await informer.fifo.replace([node], "1")
    async with processing(informer):
        await idle(informer)
    assert informer.store.list_keys() == ["n1"]


# -- resync and relist echoes ---------------------------------------------------


async def test_checklist_21_relist_echo_with_unchanged_rv_reaches_the_handler_once_a_resync_is_due() -> (
    None
):
    plain, resyncing = Recorder(), Recorder()
    informers = [SharedInformer(NO_LW, plain), SharedInformer(NO_LW, resyncing, resync_period=0.05)]
    for informer in informers:
        await informer.fifo.replace([pod("a", 1), pod("b", 1)], "1")

    def echoed(h: Recorder) -> bool:
        """A relist's unchanged item reached ``h``: a fresh object at the cached version
        (a periodic resync hands over the cached object itself)."""
        return any(k == "update" and rv(o) == rv(n) and o is not n for k, o, n in h.received)

    async with processing(informers[0]), processing(informers[1]):
        await eventually(lambda: len(plain.events) == 2)
        # A relist: "a" unchanged, "b" changed. No resync is ever due for "plain".
        await informers[0].fifo.replace([pod("a", 1), pod("b", 2)], "2")
        await eventually(lambda: ("update", "b", "1", "2") in plain.events)
        # The periodic resync reaches the handler of the informer that asked for it...
        await eventually(lambda: ("update", "a", "1", "1") in resyncing.events)
        sync = next(r for r in resyncing.received if r[0] == "update" and rv(r[1]) == rv(r[2]))
        assert sync[1] is sync[2]  # old == new by resourceVersion, from the cache
        # ... and from then on so does a relist's unchanged item.
        await informers[1].fifo.replace([pod("a", 1), pod("b", 2)], "2")
        await eventually(lambda: echoed(resyncing))

    assert plain.events == [
        ("add", "a", "1", True),
        ("add", "b", "1", True),
        ("update", "b", "1", "2"),
    ]
    assert not echoed(plain)


async def test_checklist_23_resync_never_touches_the_lister_watcher() -> None:
    lw = UntouchedListerWatcher()
    h = Recorder()
    informer = SharedInformer(lw, h, resync_period=0.02)
    await informer.fifo.replace([pod("a", 1)], "1")
    async with processing(informer):
        await eventually(lambda: sum(e[0] == "update" for e in h.events) >= 2)
    assert lw.calls == []


# -- relists: tombstones and re-creations ----------------------------------------


async def test_checklist_20_relist_missing_a_cached_key_delivers_a_tombstone() -> None:
    h = Recorder()
    informer = SharedInformer(NO_LW, h)
    await informer.fifo.replace([pod("a", 1), pod("b", 1)], "1")
    async with processing(informer):
        await eventually(lambda: len(h.events) == 2)
        await informer.fifo.replace([pod("a", 1)], "5")
        await eventually(lambda: len(h.events) == 3)
        # A tombstone with nothing known about the object must pass as well.
        await informer.fifo.delete(DeletedFinalStateUnknown("ns1/a", None))
        await eventually(lambda: len(h.events) == 4)

    assert h.events[2:] == [
        ("delete", "ns1/b", "1", "tombstone"),
        ("delete", "ns1/a", None, "tombstone"),
    ]
    assert h.received[2][2] == DeletedFinalStateUnknown("ns1/b", pod("b", 1))
    assert len(informer.store) == 0


async def test_checklist_28_recreation_while_disconnected_is_an_update_with_another_uid() -> None:
    h = Recorder()
    informer = SharedInformer(NO_LW, h)
    await informer.fifo.replace([pod("p", 1, uid="uid-old")], "1")
    async with processing(informer):
        await eventually(lambda: len(h.events) == 1)
        # Deleted and created again under the same name while the watch was down.
        await informer.fifo.replace([pod("p", 9, uid="uid-new")], "9")
        await eventually(lambda: len(h.events) == 2)

    kind, old, new = h.received[1]
    assert kind == "update"
    assert old["metadata"]["uid"] == "uid-old"
    assert new["metadata"]["uid"] == "uid-new"


# -- sync tracking ----------------------------------------------------------------


async def test_checklist_22_not_synced_until_the_last_initial_item_was_handled() -> None:
    h = Recorder()
    informer = SharedInformer(NO_LW, h)
    await informer.fifo.replace([pod("a", 1), pod("b", 1)], "1")
    assert not informer.has_synced()

    h.hold_only = "b"
    h.gate.clear()
    async with processing(informer):
        await eventually(lambda: h.entered == 2)  # inside on_add of the last item
        assert len(h.events) == 1
        assert not informer.has_synced()
        assert await informer.wait_for_sync(timeout=0.05) is False
        h.gate.set()
        assert await informer.wait_for_sync(timeout=1) is True


async def test_checklist_22_an_empty_first_list_is_synced() -> None:
    informer = SharedInformer(NO_LW, Recorder())
    await informer.fifo.replace([], "1")
    async with processing(informer):
        assert await informer.wait_for_sync(timeout=1)


# -- slim mode and resuming from a checkpoint -----------------------------------------


def fingerprint(obj: RawObject) -> str:
    return repr(sorted((obj.get("spec") or {}).items()))


async def test_slim_mode_caches_records_and_hands_handlers_full_new_objects() -> None:
    h = Recorder()
    informer = SharedInformer(NO_LW, h, slim=fingerprint)
    full = pod("a", 1, spec={"image": "v1"}, status={"phase": "Running"})
    await informer.fifo.replace([full, pod("b", 1, spec={"x": 1})], "1")
    async with processing(informer):
        await eventually(lambda: len(h.events) == 2)
        cached = informer.store.get_by_key("ns1/a")
        assert not isinstance(cached, dict)
        assert (cached.key, cached.uid, cached.resource_version, cached.fingerprint) == (
            "ns1/a",
            "uid-a",
            "1",
            fingerprint(full),
        )
        assert not cached.unconfirmed
        full2 = pod("a", 2, spec={"image": "v2"})
        await informer.fifo.update(full2)
        await informer.fifo.replace([full2], "3")  # "b" vanished
        await eventually(lambda: len(h.events) == 4)

    assert h.received[0][2] is full
    _, old, new = h.received[2]
    assert new is full2
    assert old == slim_record(full, fingerprint)
    assert h.received[3][2] == DeletedFinalStateUnknown(
        "ns1/b", slim_record(pod("b", 1, spec={"x": 1}), fingerprint)
    )


async def test_resumed_informer_is_synced_at_once_and_a_relist_diffs_against_the_checkpoint() -> (
    None
):
    a, b = pod("a", 5, spec={"v": 1}), pod("b", 6, spec={"v": 2})
    h = Recorder()
    informer = SharedInformer(
        NO_LW,
        h,
        slim=fingerprint,
        initial_objects=[slim_record(a, fingerprint), b],  # slim or full records both load
        initial_resource_version="100",
    )
    assert informer.has_synced()
    assert await informer.wait_for_sync(timeout=0)
    assert informer.store.get_by_key("ns1/b") == slim_record(b, fingerprint)

    async with processing(informer):
        # The watch position was compacted: a relist while "b" was deleted and "c" created.
        await informer.fifo.replace([a, pod("c", 110)], "120")
        await eventually(lambda: len(h.events) == 2)
        await idle(informer)

    # "a" is unchanged (same resourceVersion): nothing. A relist after a resume is
    # not a first list, so "c" is not marked initial.
    assert h.events == [("delete", "ns1/b", "6", "tombstone"), ("add", "c", "110", False)]


# -- backpressure, failure, lifecycle ------------------------------------------------


async def test_backpressure_a_blocked_handler_makes_the_reflector_side_add_wait() -> None:
    h = Recorder()
    h.gate.clear()
    informer = SharedInformer(NO_LW, h, max_queued=2)
    async with processing(informer):
        await informer.fifo.add(pod("a", 1))
        await eventually(lambda: h.entered == 1)  # the handler holds "a"
        await asyncio.wait_for(informer.fifo.add(pod("b", 1)), 1)
        await asyncio.wait_for(informer.fifo.add(pod("c", 1)), 1)
        blocked = asyncio.create_task(informer.fifo.add(pod("d", 1)))
        await asyncio.sleep(0.05)
        assert not blocked.done()
        h.gate.set()
        await asyncio.wait_for(blocked, 1)
        await eventually(lambda: len(h.events) == 4)
    assert [e[1] for e in h.events] == ["a", "b", "c", "d"]


async def test_a_failing_handler_stops_the_informer_with_its_error() -> None:
    class Broken(Recorder):
        async def on_add(self, obj: RawObject, is_in_initial_list: bool) -> None:
            raise ValueError("sink exploded")

    informer = SharedInformer(NO_LW, Broken())
    await informer.fifo.add(pod("a", 1))
    with pytest.raises(ValueError, match="sink exploded"):
        await asyncio.wait_for(informer.run_processing(), 1)


async def test_an_informer_runs_once() -> None:
    informer = SharedInformer(NO_LW, Recorder())
    async with processing(informer):
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="already started"):
            await informer.run_processing()


# -- the whole chain over the scripted ListerWatcher -----------------------------------


def settings() -> Any:
    reflector = pytest.importorskip("bridge.kube.reflector")
    return reflector.ReflectorSettings(watch_list="off")


def scripted() -> Any:
    return pytest.importorskip("tests.doubles.scripted")


@asynccontextmanager
async def running(informer: SharedInformer) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(informer.run())
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_list_then_watch_through_the_reflector() -> None:
    twin = scripted()
    lw = twin.ScriptedListerWatcher()
    lw.add_list(twin.list_response([pod("a", 1), pod("b", 2)], 10))
    lw.add_watch([twin.event("MODIFIED", pod("a", 11)), twin.event("DELETED", pod("b", 12))])
    h = Recorder()
    informer = SharedInformer(lw, h, reflector_settings=settings())

    async with running(informer):
        assert await informer.wait_for_sync(timeout=2)
        await eventually(lambda: len(h.events) == 4)
        reflector = informer.reflector
        assert reflector is not None
        await eventually(lambda: reflector.last_sync_resource_version == "12")

    assert h.events == [
        ("add", "a", "1", True),
        ("add", "b", "2", True),
        ("update", "a", "1", "11"),
        ("delete", "b", "12", "object"),
    ]
    assert lw.open_streams == 0


async def test_resume_from_a_checkpoint_watches_without_listing() -> None:
    twin = scripted()
    lw = twin.ScriptedListerWatcher()
    lw.add_watch([twin.event("MODIFIED", pod("a", 21, spec={"v": 2}))])
    a = pod("a", 20, spec={"v": 1})
    h = Recorder()
    informer = SharedInformer(
        lw,
        h,
        slim=fingerprint,
        initial_objects=[slim_record(a, fingerprint)],
        initial_resource_version="20",
        reflector_settings=settings(),
    )
    async with running(informer):
        await eventually(lambda: len(h.events) == 1)

    assert lw.list_calls() == []
    assert lw.watch_calls()[0].resource_version == "20"
    _, old, new = h.received[0]
    assert old == slim_record(a, fingerprint)
    assert new["spec"] == {"v": 2}
