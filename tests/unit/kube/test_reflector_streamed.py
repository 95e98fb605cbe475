"""The Reflector hands lists to the store as they arrive, and falls back from a failed
streaming list for that attempt only (checklist 3, 16, 18), against a scripted twin.

Time is fake (looptime).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from functools import partial

import pytest

from bridge.errors import ApiStatusError, BadRequestError, KubeConnectionError, ServerError
from bridge.kube.fifo import RealFIFO
from bridge.kube.objects import RawObject
from bridge.kube.reflector import Reflector, ReflectorSettings
from bridge.kube.store import Indexer
from tests.doubles.scripted import (
    HANG,
    BrokenList,
    RecordingStore,
    ScriptedListerWatcher,
    WatchScript,
    bookmark,
    error_event,
    event,
    list_response,
    pod,
)
from tests.fixtures.waiting import until as until_

pytestmark = pytest.mark.looptime

OFF = ReflectorSettings(watch_list="off")


@contextlib.asynccontextmanager
async def running(reflector: Reflector) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(reflector.run(), name="reflector")
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# Fake time: backoffs and watch timeouts pass in an instant, so the deadline is long.
until = partial(until_, timeout=700.0, interval=0.05)


def initial_stream(*objs: RawObject, rv: int) -> list[object]:
    return [*(event("ADDED", o) for o in objs), bookmark(rv, initial_events_end=True)]


# -- LIST fed as it arrives ---------------------------------------------------


async def test_list_items_reach_the_consumer_before_the_list_ends() -> None:
    """The informer's side of the FIFO pops items while the LIST is still being read."""
    known = Indexer()
    fifo = RealFIFO(known_objects=known)
    popped: list[tuple[str, bool]] = []

    async def consume() -> None:
        async def process(deltas: list[object], initial: bool) -> None:
            for d in deltas:
                popped.append((d.object["metadata"]["name"], initial))  # type: ignore[attr-defined]

        while True:
            await fifo.pop(process)

    lw = ScriptedListerWatcher()
    lw.add_list(list_response([pod(f"p{i}", i) for i in range(300)], 400))
    lw.add_watch([HANG])
    r = Reflector(lw, fifo, settings=OFF)
    consumer = asyncio.create_task(consume())
    seen_mid_list: list[int] = []

    async def watch_progress() -> None:
        while not r.has_synced_once:
            if popped:
                seen_mid_list.append(len(popped))
            await asyncio.sleep(0)

    async with running(r):
        await watch_progress()
        await until(lambda: len(popped) == 300)
    consumer.cancel()
    assert seen_mid_list and min(seen_mid_list) < 300
    assert all(initial for _, initial in popped)
    assert fifo.has_synced()


async def test_a_list_that_breaks_midway_keeps_what_it_fed_and_relists_consistently() -> None:
    """Items fed before the break came from a snapshot newer than our RV: the next
    list is a consistent read (RV ""), never the watch cache's "0" that may be older."""
    lw = ScriptedListerWatcher()
    lw.add_list(
        BrokenList([pod("a", 5), pod("b", 6)], KubeConnectionError("GET pods: body broke")),
        list_response([pod("a", 5), pod("c", 8)], 9),
    )
    lw.add_watch([HANG])
    store = RecordingStore()
    r = Reflector(lw, store, settings=OFF)
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 1)
    assert [o.resource_version for o in lw.list_calls()] == ["0", ""]
    assert store.aborted == [["a@5", "b@6"]]
    assert store.ops == [("replace", (["a@5", "c@8"], "9"))]
    assert r.last_sync_resource_version == "9"
    assert r.relists == {"initial": 1, "connection": 1}


async def test_a_list_that_fails_before_any_item_relists_as_usual() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(ServerError("etcd leader changed", code=500), list_response([pod("a", 5)], 9))
    lw.add_watch([HANG])
    r = Reflector(lw, RecordingStore(), settings=OFF)
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 1)
    assert [o.resource_version for o in lw.list_calls()] == ["0", "0"]


# -- streaming lists fed as they arrive ----------------------------------------


async def test_checklist_16_initial_events_are_fed_before_the_bookmark() -> None:
    known = Indexer()
    fifo = RealFIFO(known_objects=known)
    lw = ScriptedListerWatcher()
    lw.add_watch([*(event("ADDED", pod(f"p{i}", i)) for i in range(200)), HANG])
    r = Reflector(lw, fifo, settings=ReflectorSettings(watch_list="on"))
    async with running(r):
        await until(lambda: lw.delivered == 200)
        # No bookmark yet: the items are queued, the replace is not done.
        assert len(fifo) == 200 and not fifo.is_idle() and not fifo.has_synced()
        assert r.last_sync_resource_version == ""


# -- checklist 18: falling back for one attempt, or for good --------------------


def relist_after_the_watch(lw: ScriptedListerWatcher) -> None:
    """The watch that follows the fallback LIST ends in 410, forcing the next list attempt."""
    lw.add_watch([error_event(410, "Expired")])


@pytest.mark.parametrize(
    "failed",
    [
        pytest.param(ServerError("Internal error occurred", code=500), id="http-500"),
        pytest.param(ApiStatusError("Service Unavailable", code=503), id="http-503"),
        pytest.param(
            [event("ADDED", pod("a", 5)), error_event(500, "InternalError")], id="error-500"
        ),
        pytest.param(
            [event("ADDED", pod("a", 5)), KubeConnectionError("stream broke")], id="broken-stream"
        ),
    ],
)
async def test_checklist_18_a_failed_streaming_list_lists_that_attempt_only(
    failed: WatchScript,
) -> None:
    lw = ScriptedListerWatcher()
    lw.add_watch(failed)
    lw.add_list(list_response([pod("a", 6)], 8))
    relist_after_the_watch(lw)
    lw.add_watch([*initial_stream(pod("a", 9), rv=10), HANG])
    store = RecordingStore()
    r = Reflector(lw, store, settings=ReflectorSettings(watch_list="auto", backoff_initial=0.1))
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 3)
        await until(lambda: len(store.ops) == 2)
    streamed, plain, again = lw.watch_calls()
    assert streamed.send_initial_events is True
    assert plain.send_initial_events is None and plain.resource_version == "8"
    assert again.send_initial_events is True  # streaming is tried again on the next relist
    assert len(lw.list_calls()) == 1
    assert [op for op, _ in store.ops] == ["replace", "replace"]
    assert store.ops[1] == ("replace", (["a@9"], "10"))
    assert r.uses_watch_list


@pytest.mark.parametrize(
    "unsupported",
    [
        pytest.param(BadRequestError("resourceVersionMatch is forbidden", code=400), id="400"),
        pytest.param(
            ApiStatusError("sendInitialEvents is forbidden for watch", code=422, reason="Invalid"),
            id="422",
        ),
        pytest.param([event("ADDED", pod("a", 5)), bookmark(6)], id="ignored"),
    ],
)
async def test_checklist_18_a_server_without_streaming_lists_is_not_asked_again(
    unsupported: WatchScript,
) -> None:
    lw = ScriptedListerWatcher()
    lw.add_watch(unsupported)
    lw.add_list(list_response([pod("a", 6)], 8), list_response([pod("a", 6)], 8))
    relist_after_the_watch(lw)
    lw.add_watch([HANG])
    r = Reflector(lw, RecordingStore(), settings=ReflectorSettings(watch_list="auto"))
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 3)
    assert [w.send_initial_events for w in lw.watch_calls()] == [True, None, None]
    assert not r.uses_watch_list


async def test_a_refused_connection_waits_and_streams_again_without_listing() -> None:
    lw = ScriptedListerWatcher()
    lw.add_watch(KubeConnectionError("GET pods: ClientConnectorError: refused"))
    lw.add_watch([*initial_stream(pod("a", 5), rv=6), HANG])
    store = RecordingStore()
    r = Reflector(lw, store, settings=ReflectorSettings(watch_list="auto"))
    async with running(r):
        await until(lambda: bool(store.ops))
    assert [w.send_initial_events for w in lw.watch_calls()] == [True, True]
    assert lw.list_calls() == []
    assert r.watch_restarts["watch_list_connection"] == 1


async def test_a_streaming_list_broken_after_items_relists_consistently() -> None:
    lw = ScriptedListerWatcher()
    lw.add_watch([event("ADDED", pod("a", 5)), KubeConnectionError("stream broke")])
    lw.add_list(list_response([pod("a", 6)], 8))
    lw.add_watch([HANG])
    store = RecordingStore()
    r = Reflector(lw, store, settings=ReflectorSettings(watch_list="auto"))
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 2)
    assert store.aborted == [["a@5"]]
    assert [o.resource_version for o in lw.list_calls()] == [""]
