"""The Reflector against a scripted ListerWatcher (checklist 1-13, 15-18).

Time is fake (looptime): backoffs, watch timeouts and watchdogs run instantly
but are measured in loop seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from functools import partial

import pytest

from bridge.errors import (
    BadRequestError,
    ExpiredError,
    ForbiddenError,
    KubeConnectionError,
    ListRejectedError,
    ServerError,
    TooLargeResourceVersionError,
    TooManyRequestsError,
)
from bridge.kube.objects import RawObject
from bridge.kube.reflector import Reflector, ReflectorSettings
from bridge.logging import capture_logs
from tests.doubles.scripted import (
    HANG,
    Pause,
    RecordingStore,
    ScriptedListerWatcher,
    bookmark,
    error_event,
    event,
    list_response,
    pod,
)
from tests.fixtures.waiting import until as until_

pytestmark = pytest.mark.looptime

OFF = ReflectorSettings(watch_list="off")


def expired(msg: str = "too old resource version: 1 (5)") -> ExpiredError:
    return ExpiredError(msg, reason="Expired")


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


def now() -> float:
    return asyncio.get_running_loop().time()


# -- LIST -----------------------------------------------------------------


async def test_checklist_01_first_list_at_rv0_replaces_store_then_watches_from_its_rv() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(list_response([pod("a", 3), pod("b", 4)], 10))
    store = RecordingStore()
    r = Reflector(lw, store, settings=OFF)
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 1)
    first = lw.list_calls()[0]
    assert first.resource_version == "0"
    assert first.resource_version_match is None
    assert store.ops[0] == ("replace", (["a@3", "b@4"], "10"))
    assert r.last_sync_resource_version == "10"
    assert lw.watch_calls()[0].resource_version == "10"
    assert r.relists == {"initial": 1}


@pytest.mark.parametrize(
    "error",
    [expired(), TooLargeResourceVersionError("Too large resource version", reason="Timeout")],
)
async def test_checklist_02_list_410_or_504_retries_at_once_with_empty_rv(error: Exception) -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(error, list_response([pod("a", 7)], 20))
    store = RecordingStore()
    r = Reflector(lw, store, settings=OFF)
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 1)
    calls = [c for c in lw.calls if c.verb == "list"]
    assert [c.options.resource_version for c in calls] == ["0", ""]
    assert calls[1].at == calls[0].at  # at once, no backoff
    assert not r.is_last_sync_resource_version_unavailable
    assert store.ops == [("replace", (["a@7"], "20"))]


async def test_checklist_03_expired_continue_token_restarts_as_one_full_list() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(
        list_response([pod("a", 1), pod("b", 2)], 10, cont="c1"),
        expired("continue token expired"),
        list_response([pod("a", 1), pod("b", 2), pod("c", 3)], 12),
    )
    store = RecordingStore()
    r = Reflector(lw, store, settings=ReflectorSettings(watch_list="off", page_size=2))
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 1)
    first, second, full = lw.list_calls()
    assert (first.limit, first.resource_version, first.continue_token) == (2, "0", None)
    assert (second.limit, second.continue_token, second.resource_version) == (2, "c1", None)
    assert (full.limit, full.continue_token, full.resource_version) == (None, None, "0")
    assert store.ops == [("replace", (["a@1", "b@2", "c@3"], "12"))]
    assert r.last_sync_resource_version == "12"


async def test_pages_are_joined_and_take_the_first_pages_rv() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(
        list_response([pod("a", 1)], 10, cont="c1"),
        list_response([pod("b", 2)], 10, cont="c2"),
        list_response([pod("c", 3)], 10),
    )
    store = RecordingStore()
    r = Reflector(lw, store, settings=ReflectorSettings(watch_list="off", page_size=1))
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 1)
    assert [o.continue_token for o in lw.list_calls()] == [None, "c1", "c2"]
    assert store.ops == [("replace", (["a@1", "b@2", "c@3"], "10"))]


@pytest.mark.parametrize(("paginate", "limit"), [(False, None), (True, 500)])
async def test_checklist_04_relist_at_a_specific_rv_is_paginated_only_if_asked(
    paginate: bool, limit: int | None
) -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(list_response([pod("a", 1)], 10), list_response([pod("a", 1)], 15))
    lw.add_watch([event("MODIFIED", pod("a", 12)), error_event(410, "Expired")])
    settings = ReflectorSettings(watch_list="off", paginate_relists=paginate)
    r = Reflector(lw, RecordingStore(), settings=settings)
    async with running(r):
        await until(lambda: len(lw.list_calls()) == 2)
    first, relist = lw.list_calls()
    assert first.limit == 500
    assert (relist.resource_version, relist.limit) == ("12", limit)


# -- WATCH ----------------------------------------------------------------


async def test_checklist_05_watch_asks_bookmarks_last_rv_and_a_random_timeout() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(list_response([], 10))
    lw.add_watch(*([[event("ADDED", pod("x", 11))]] * 30))
    r = Reflector(lw, RecordingStore(), settings=OFF)
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 31)
    watches = lw.watch_calls()
    assert all(w.allow_watch_bookmarks for w in watches)
    assert watches[0].resource_version == "10"
    assert all(w.resource_version == "11" for w in watches[1:])
    timeouts = {w.timeout_seconds for w in watches}
    assert all(t is not None and 300 <= t < 600 for t in timeouts)
    assert len(timeouts) > 5  # random, not fixed


async def test_checklist_06_events_move_the_rv_and_a_bookmark_touches_no_store() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(list_response([], 10))
    seen: list[str] = []
    lw.add_watch(
        [
            event("ADDED", pod("a", 11)),
            event("MODIFIED", pod("a", 12)),
            event("DELETED", pod("a", 13)),
            bookmark(20),
            HANG,
        ]
    )
    store = RecordingStore()
    r = Reflector(lw, store, settings=OFF)
    async with running(r):
        await until(lambda: lw.delivered == 4)
        await asyncio.sleep(0.1)
        seen.append(r.last_sync_resource_version)
    assert seen == ["20"]
    assert store.ops[1:] == [("add", "a@11"), ("update", "a@12"), ("delete", "a@13")]


async def test_checklist_07_clean_close_rewatches_at_once_from_last_rv() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(list_response([], 10))
    lw.add_watch([event("ADDED", pod("a", 11)), Pause(100)], [bookmark(30), Pause(120)])
    r = Reflector(lw, RecordingStore(), settings=OFF)
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 3)
    w = [c for c in lw.calls if c.verb == "watch"]
    assert [c.options.resource_version for c in w] == ["10", "11", "30"]
    assert w[1].at - w[0].at == pytest.approx(100, abs=0.1)  # no backoff added
    assert w[2].at - w[1].at == pytest.approx(120, abs=0.1)
    assert r.relists == {"initial": 1}
    assert r.watch_restarts == {"closed": 2}


async def test_checklist_08_error_event_410_backs_off_then_relists_at_last_rv() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(list_response([], 10), expired(), list_response([pod("b", 40)], 41))
    lw.add_watch([event("ADDED", pod("a", 12)), error_event(410, "Expired")])
    store = RecordingStore()
    r = Reflector(lw, store, settings=OFF)
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 2)
    lists = [c for c in lw.calls if c.verb == "list"]
    assert [c.options.resource_version for c in lists] == ["0", "12", ""]
    assert lists[1].at - lists[0].at >= 0.8  # backed off first
    assert lists[2].at == lists[1].at  # only the 410 on that LIST falls back to ""
    assert store.ops[-1] == ("replace", (["b@40"], "41"))
    assert lw.watch_calls()[1].resource_version == "41"
    assert r.relists == {"initial": 1, "expired": 1}


async def test_checklist_09_http_410_when_opening_the_watch_relists_at_last_rv() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(list_response([], 10), list_response([], 50))
    lw.add_watch(expired())
    r = Reflector(lw, RecordingStore(), settings=OFF)
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 2)
    assert [o.resource_version for o in lw.list_calls()] == ["0", "10"]
    assert lw.watch_calls()[1].resource_version == "50"
    assert r.relists["expired"] == 1


async def test_checklist_10_429_honours_retry_after_and_rewatches_without_relist() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(list_response([], 10))
    lw.add_watch(TooManyRequestsError("slow down", retry_after=7.0), [HANG])
    r = Reflector(lw, RecordingStore(), settings=OFF)
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 2)
    w = [c for c in lw.calls if c.verb == "watch"]
    assert w[1].at - w[0].at >= 7.0
    assert w[1].options.resource_version == "10"
    assert len(lw.list_calls()) == 1
    assert r.watch_restarts == {"throttled": 1}


async def test_checklist_10_429_as_error_event_also_rewatches_after_retry_after() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(list_response([], 10))
    retry = error_event(429, "TooManyRequests")
    retry["object"]["details"] = {"retryAfterSeconds": 9}
    lw.add_watch([event("ADDED", pod("a", 11)), retry], [HANG])
    r = Reflector(lw, RecordingStore(), settings=OFF)
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 2)
    w = [c for c in lw.calls if c.verb == "watch"]
    assert w[1].at - w[0].at >= 9.0
    assert w[1].options.resource_version == "11"
    assert len(lw.list_calls()) == 1


async def test_checklist_10_connection_refused_backs_off_growing_and_rewatches() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(list_response([], 10))
    refused = [KubeConnectionError("connection refused") for _ in range(4)]
    lw.add_watch(*refused, [HANG])
    r = Reflector(lw, RecordingStore(), settings=OFF, rng=lambda: 0.0)
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 5)
    at = [c.at for c in lw.calls if c.verb == "watch"]
    gaps = [b - a for a, b in itertools.pairwise(at)]
    assert gaps == pytest.approx([0.8, 1.6, 3.2, 6.4], abs=0.01)
    assert all(o.resource_version == "10" for o in lw.watch_calls())
    assert len(lw.list_calls()) == 1
    assert r.watch_restarts == {"connection": 4}


async def test_checklist_11_a_watch_closing_at_once_empty_is_an_error_and_relists() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(list_response([], 10), list_response([], 10))
    lw.add_watch([])
    r = Reflector(lw, RecordingStore(), settings=OFF)
    async with running(r):
        await until(lambda: len(lw.list_calls()) == 2)
    lists = [c for c in lw.calls if c.verb == "list"]
    assert lists[1].at - lists[0].at >= 0.8
    assert r.relists == {"initial": 1, "short_watch": 1}


async def test_checklist_11_an_empty_watch_that_lasted_is_a_normal_close() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(list_response([], 10))
    lw.add_watch([Pause(2.0)], [HANG])
    r = Reflector(lw, RecordingStore(), settings=OFF)
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 2)
    assert len(lw.list_calls()) == 1
    assert r.watch_restarts == {"closed": 1}


async def test_other_watch_errors_back_off_and_relist() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(list_response([], 10), list_response([], 11))
    lw.add_watch(ServerError("etcd unhappy", code=500))
    r = Reflector(lw, RecordingStore(), settings=OFF)
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 2)
    assert [o.resource_version for o in lw.list_calls()] == ["0", "10"]
    assert r.relists == {"initial": 1, "error": 1}


async def test_list_failures_back_off_and_retry() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(
        ServerError("etcdserver: request timed out"),
        KubeConnectionError("refused"),
        list_response([], 5),
    )
    r = Reflector(lw, RecordingStore(), settings=OFF, rng=lambda: 0.0)
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 1)
    at = [c.at for c in lw.calls if c.verb == "list"]
    assert [round(b - a, 2) for a, b in itertools.pairwise(at)] == [0.8, 1.6]


async def test_checklist_13_a_silent_watch_is_dropped_and_resumed_without_relist() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(list_response([], 10))
    lw.add_watch([event("ADDED", pod("a", 11)), HANG], [HANG])
    settings = ReflectorSettings(watch_list="off", idle_timeout=150)
    r = Reflector(lw, RecordingStore(), settings=settings)
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 2)
        assert lw.open_streams == 1
    w = [c for c in lw.calls if c.verb == "watch"]
    assert w[1].at - w[0].at == pytest.approx(150, abs=0.5)
    assert w[1].options.resource_version == "11"
    assert r.watch_restarts == {"stalled": 1}
    assert len(lw.list_calls()) == 1


async def test_checklist_13_a_slow_store_is_not_a_silent_server() -> None:
    class SlowStore(RecordingStore):
        async def add(self, obj: RawObject) -> None:
            await asyncio.sleep(400)  # backpressure from downstream
            await super().add(obj)

    lw = ScriptedListerWatcher()
    lw.add_list(list_response([], 10))
    lw.add_watch([event("ADDED", pod("a", 11)), event("ADDED", pod("b", 12)), Pause(100)])
    store = SlowStore()
    r = Reflector(lw, store, settings=ReflectorSettings(watch_list="off", idle_timeout=150))
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 2, timeout=2000)
    assert r.watch_restarts == {"closed": 1}
    assert [op for op in store.ops if op[0] == "add"] == [("add", "a@11"), ("add", "b@12")]


async def test_checklist_15_cancel_mid_list_exits_promptly() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(HANG)
    r = Reflector(lw, RecordingStore(), settings=OFF)
    task = asyncio.create_task(r.run())
    await until(lambda: len(lw.list_calls()) == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 1)


async def test_checklist_15_cancel_mid_watch_closes_the_stream() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(list_response([], 10))
    lw.add_watch([event("ADDED", pod("a", 11)), HANG])
    r = Reflector(lw, RecordingStore(), settings=OFF, resync_period=30)
    task = asyncio.create_task(r.run())
    await until(lambda: lw.delivered == 1)
    assert lw.open_streams == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 1)
    assert lw.open_streams == 0


async def test_resume_from_a_given_rv_watches_first_and_relists_at_it_on_410() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(expired(), list_response([pod("a", 90)], 99))
    lw.add_watch(expired(), [HANG])
    store = RecordingStore()
    r = Reflector(lw, store, settings=OFF, resource_version="42")
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 2)
    assert lw.calls[0].verb == "watch"
    assert lw.watch_calls()[0].resource_version == "42"
    assert [o.resource_version for o in lw.list_calls()] == ["42", ""]
    assert store.ops == [("replace", (["a@90"], "99"))]
    assert lw.watch_calls()[1].resource_version == "99"


async def test_resume_from_a_given_rv_without_trouble_never_lists() -> None:
    lw = ScriptedListerWatcher()
    lw.add_watch([event("MODIFIED", pod("a", 43)), HANG])
    store = RecordingStore()
    r = Reflector(lw, store, settings=OFF, resource_version="42")
    async with running(r):
        await until(lambda: lw.delivered == 1)
        await asyncio.sleep(0.1)
    assert lw.list_calls() == []
    assert store.ops == [("update", "a@43")]
    assert r.last_sync_resource_version == "43"


async def test_resync_calls_the_store_periodically_after_sync() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(list_response([], 10))
    lw.add_watch([HANG])
    store = RecordingStore()
    r = Reflector(lw, store, settings=OFF, resync_period=30)
    async with running(r):
        await asyncio.sleep(95)
    assert [op for op, _ in store.ops].count("resync") == 3


async def test_watch_from_empty_rv_does_not_take_rv_from_synthetic_adds() -> None:
    """A list that reported no RV leads to a watch from "": its ADDED are synthetic."""
    lw = ScriptedListerWatcher()
    lw.add_list(list_response([], ""))
    lw.add_watch(
        [event("ADDED", pod("b", 30)), event("ADDED", pod("a", 20)), Pause(5), bookmark(31), HANG]
    )
    r = Reflector(lw, RecordingStore(), settings=OFF)
    async with running(r):
        await until(lambda: lw.delivered == 2)
        assert r.last_sync_resource_version == ""
        await until(lambda: lw.delivered == 3)
        await asyncio.sleep(0.1)
        assert r.last_sync_resource_version == "31"


# -- streaming lists --------------------------------------------------------


def initial_stream(*objs: RawObject, rv: int) -> list[object]:
    return [*(event("ADDED", o) for o in objs), bookmark(rv, initial_events_end=True)]


async def test_checklist_16_streaming_list_replaces_at_the_bookmark_and_keeps_the_stream() -> None:
    lw = ScriptedListerWatcher()
    lw.add_watch(
        [
            *initial_stream(pod("a", 5), pod("b", 7), rv=9),
            event("MODIFIED", pod("a", 10)),
            HANG,
        ]
    )
    store = RecordingStore()
    r = Reflector(lw, store)
    async with running(r):
        await until(lambda: lw.delivered == 4)
        await asyncio.sleep(0.1)
    (opts,) = lw.watch_calls()
    assert opts.send_initial_events is True
    assert opts.allow_watch_bookmarks is True
    assert opts.resource_version_match == "NotOlderThan"
    assert opts.resource_version == ""
    assert lw.list_calls() == []
    assert store.ops == [("replace", (["a@5", "b@7"], "9")), ("update", "a@10")]
    assert r.last_sync_resource_version == "10"
    assert r.uses_watch_list


async def test_checklist_17_synthetic_adds_do_not_move_the_rv_before_the_bookmark() -> None:
    lw = ScriptedListerWatcher()
    lw.add_watch(
        [
            event("ADDED", pod("b", 30)),
            event("ADDED", pod("a", 20)),
            Pause(3),
            bookmark(35, initial_events_end=True),
            HANG,
        ]
    )
    store = RecordingStore()
    r = Reflector(lw, store, settings=ReflectorSettings(watch_list="on"))
    async with running(r):
        await until(lambda: lw.delivered == 2)
        await asyncio.sleep(1)
        assert r.last_sync_resource_version == ""
        assert store.ops == []
        await until(lambda: lw.delivered == 3)
        await asyncio.sleep(0.1)
        assert r.last_sync_resource_version == "35"


async def test_checklist_16_streamed_relist_after_410_uses_last_rv_then_empty() -> None:
    lw = ScriptedListerWatcher()
    lw.add_watch(
        [
            *initial_stream(pod("a", 5), rv=9),
            event("MODIFIED", pod("a", 12)),
            error_event(410, "Expired"),
        ],
        expired(),
        [*initial_stream(pod("a", 20), rv=21), HANG],
    )
    store = RecordingStore()
    r = Reflector(lw, store, settings=ReflectorSettings(watch_list="on"))
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 3)
        await until(lambda: lw.delivered >= 6)
        await asyncio.sleep(0.1)
    assert [o.resource_version for o in lw.watch_calls()] == ["", "12", ""]
    assert store.ops[-1] == ("replace", (["a@20"], "21"))


@pytest.mark.parametrize(
    "script",
    [
        pytest.param(BadRequestError("resourceVersionMatch is forbidden for watch"), id="http-400"),
        pytest.param(
            [event("ADDED", pod("a", 5)), event("MODIFIED", pod("a", 6))], id="live-event"
        ),
        pytest.param([event("ADDED", pod("a", 5)), bookmark(6)], id="plain-bookmark"),
        pytest.param([event("ADDED", pod("a", 5)), Pause(2)], id="ends-without-bookmark"),
        pytest.param([event("ADDED", pod("a", 5)), HANG], id="silence"),
    ],
)
async def test_checklist_18_auto_falls_back_to_list_and_watch_for_good(script: object) -> None:
    lw = ScriptedListerWatcher()
    lw.add_watch(script)  # type: ignore[arg-type]
    lw.add_list(list_response([pod("a", 6)], 8), list_response([pod("a", 6)], 8))
    lw.add_watch([error_event(410, "Expired")], [HANG])
    store = RecordingStore()
    r = Reflector(lw, store, settings=ReflectorSettings(watch_list="auto"))
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 3)
    assert not r.uses_watch_list
    first, plain, again = lw.watch_calls()
    assert first.send_initial_events is True
    assert plain.send_initial_events is None and plain.resource_version == "8"
    assert again.send_initial_events is None  # the fallback is remembered
    assert store.ops[0] == ("replace", (["a@6"], "8"))  # nothing from the ignored stream
    assert len(lw.list_calls()) == 2
    assert lw.open_streams == 0 or lw.open_streams == 1


async def test_checklist_18_watch_list_off_never_streams() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(list_response([], 3))
    lw.add_watch([HANG])
    r = Reflector(lw, RecordingStore(), settings=OFF)
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 1)
    assert lw.watch_calls()[0].send_initial_events is None


# -- not failing silently ---------------------------------------------------


async def test_a_failing_list_watch_warns_at_once_then_every_30s_with_the_count() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(list_response([], 10))
    lw.add_watch(*[KubeConnectionError("connection refused")] * 7, [HANG])
    r = Reflector(lw, RecordingStore(), settings=OFF, rng=lambda: 0.0)
    with capture_logs() as logs:
        async with running(r):
            await until(lambda: len(lw.watch_calls()) == 1)
            assert r.connected is False  # the first watch is still opening
            await until(lambda: r.failures == 1)
            assert not r.connected and r.last_error == "connection refused"
            began = now()
            await until(lambda: lw.open_streams == 1)
            assert r.connected and r.down_for() == 0
            down = now() - began
    # Backoff 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30 s: failures at 0, 0.8, 2.4, 5.6, 12, 24.8,
    # 50.4; the watch opens at 80.4. Warnings at 0 (1 failure) and 50.4 (6 since).
    assert down == pytest.approx(80.4, abs=0.1)
    warnings = [e for e in logs if e["event"] == "list/watch failing"]
    assert [w["failures"] for w in warnings] == [1, 6]
    assert all(
        w["log_level"] == "warning" and w["reflector"] == "ScriptedListerWatcher" for w in warnings
    )
    back = [e for e in logs if e["event"] == "list/watch working again"]
    assert len(back) == 1 and back[0]["failures"] == 0


async def test_down_for_counts_from_when_the_stream_was_lost() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(list_response([], 10))
    lw.add_watch([Pause(5), KubeConnectionError("reset")], *[KubeConnectionError("refused")] * 3)
    r = Reflector(lw, RecordingStore(), settings=OFF, rng=lambda: 0.0)
    async with running(r):
        await until(lambda: lw.open_streams == 1)
        opened = now()
        assert r.connected and r.down_for() == 0
        await until(lambda: r.failures == 3)
        assert not r.connected
        assert r.down_for() == pytest.approx(now() - (opened + 5), abs=0.1)


async def test_a_list_the_server_rejects_as_malformed_is_raised_not_retried() -> None:
    """Not client-go: a 400 on LIST (a bad selector) can never succeed; retrying hangs silently."""
    lw = ScriptedListerWatcher()
    lw.add_list(BadRequestError("field label not supported: spec.bogus"), list_response([], 5))
    r = Reflector(lw, RecordingStore(), settings=OFF)
    with pytest.raises(ListRejectedError, match=r"field label not supported: spec\.bogus"):
        await asyncio.wait_for(r.run(), 60)
    assert len(lw.list_calls()) == 1
    assert not r.connected


async def test_a_forbidden_list_before_the_first_sync_is_raised_not_retried() -> None:
    """Not client-go: a 403 at start means missing RBAC rules; retrying looks alive, publishes nothing."""
    lw = ScriptedListerWatcher()
    lw.add_list(ForbiddenError('pods is forbidden: User "x" cannot list'), list_response([], 5))
    r = Reflector(lw, RecordingStore(), settings=OFF)
    with pytest.raises(ListRejectedError, match=r"forbids it: pods is forbidden.*RBAC"):
        await asyncio.wait_for(r.run(), 60)
    assert len(lw.list_calls()) == 1


async def test_a_forbidden_watch_after_a_sync_is_retried() -> None:
    """A rule revoked at run time heals when it is restored: retried, visible as not-ready."""
    lw = ScriptedListerWatcher()
    lw.add_list(list_response([], 5), ForbiddenError("pods is forbidden"), list_response([], 9))
    lw.add_watch([ForbiddenError("pods is forbidden")], [HANG])
    r = Reflector(lw, RecordingStore(), settings=OFF, rng=lambda: 0.0)
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 2)
    assert len(lw.list_calls()) == 3


async def test_a_server_error_on_list_is_still_retried() -> None:
    lw = ScriptedListerWatcher()
    lw.add_list(ServerError("etcdserver: request timed out"), list_response([], 5))
    r = Reflector(lw, RecordingStore(), settings=OFF)
    async with running(r):
        await until(lambda: len(lw.watch_calls()) == 1)
    assert len(lw.list_calls()) == 2
