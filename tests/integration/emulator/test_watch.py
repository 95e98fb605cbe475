"""WATCH streams: replay, synthetic initial state, streaming lists, bookmarks, selectors."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from bridge.emulator import Emulator
from bridge.kube.objects import INITIAL_EVENTS_END_ANNOTATION
from tests.integration.emulator.helpers import cm, events_until_close, names, next_event

CMS = "/api/v1/namespaces/default/configmaps"


async def test_checklist_29_watch_from_rv_streams_only_later_events(emulator: Emulator) -> None:
    """Checklist 29: WATCH at RV=N replays what happened after N, then goes live."""
    emulator.create(cm("before"))
    rv = emulator.resource_version
    emulator.create(cm("after"))
    async with aiohttp.ClientSession(emulator.url) as http:
        params = {"watch": "1", "resourceVersion": str(rv)}
        async with http.get(CMS, params=params) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("application/json")
            first = await next_event(r)
            emulator.patch("v1", "ConfigMap", "before", {"data": {"k": "x"}}, "default")
            second = await next_event(r)
            emulator.delete("v1", "ConfigMap", "after", "default")
            third = await next_event(r)
    assert names([first, second, third]) == [
        ("ADDED", "after"),
        ("MODIFIED", "before"),
        ("DELETED", "after"),
    ]
    assert first["object"]["kind"] == "ConfigMap"
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in (first, second, third)]
    assert rvs == sorted(rvs) and rvs[0] > rv


async def test_checklist_29_too_old_rv_gives_error_event_then_close(emulator: Emulator) -> None:
    """Checklist 29: a compacted RV → HTTP 200, one ERROR event with a 410 Status, close."""
    emulator.create(cm("a"))
    old = emulator.resource_version
    emulator.create(cm("b"))
    compacted = emulator.chaos.compact()
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get(CMS, params={"watch": "1", "resourceVersion": str(old - 1)}) as r:
            assert r.status == 200
            events = await events_until_close(r)
        emulator.chaos.set_expired_mode("http")
        async with http.get(CMS, params={"watch": "1", "resourceVersion": str(old - 1)}) as r:
            http_status = r.status
            body = await r.json()
    assert events == [
        {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"too old resource version: {old - 1} ({compacted})",
                "reason": "Expired",
                "code": 410,
            },
        }
    ]
    assert http_status == 410 and body["reason"] == "Expired"


async def test_checklist_30_watch_without_rv_starts_with_synthetic_added(
    emulator: Emulator,
) -> None:
    """Checklist 30: RV unset or "0" → ADDED for every current object, then live events."""
    emulator.create(cm("a"))
    emulator.create(cm("b"))
    async with aiohttp.ClientSession(emulator.url) as http:
        for rv in (None, "0"):
            params = {"watch": "true"} | ({"resourceVersion": rv} if rv else {})
            async with http.get(CMS, params=params) as r:
                initial = [await next_event(r), await next_event(r)]
                emulator.create(cm(f"c{rv}"))
                live = await next_event(r)
            emulator.delete("v1", "ConfigMap", f"c{rv}", "default")
            assert names(initial) == [("ADDED", "a"), ("ADDED", "b")]
            assert live["type"] == "ADDED" and live["object"]["metadata"]["name"] == f"c{rv}"


async def test_checklist_30_send_initial_events_ends_with_annotated_bookmark(
    emulator: Emulator,
) -> None:
    """Checklist 30: sendInitialEvents=true → ADDEDs, then the initial-events-end BOOKMARK."""
    emulator.create(cm("a"))
    emulator.create(cm("b"))
    snapshot_rv = emulator.resource_version
    params = {
        "watch": "1",
        "sendInitialEvents": "true",
        "allowWatchBookmarks": "true",
        "resourceVersionMatch": "NotOlderThan",
        "resourceVersion": "",
    }
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get(CMS, params=params) as r:
            events = [await next_event(r) for _ in range(3)]
            emulator.create(cm("c"))
            live = await next_event(r)
        params["resourceVersionMatch"] = "Exact"
        async with http.get(CMS, params=params) as r:
            assert r.status == 422
    assert names(events[:2]) == [("ADDED", "a"), ("ADDED", "b")]
    bookmark = events[2]
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["object"]["metadata"] == {
        "resourceVersion": str(snapshot_rv),
        "annotations": {INITIAL_EVENTS_END_ANNOTATION: "true"},
    }
    assert bookmark["object"]["kind"] == "ConfigMap"
    assert live["type"] == "ADDED" and live["object"]["metadata"]["name"] == "c"


async def test_watch_list_disabled_ignores_send_initial_events() -> None:
    async with Emulator(watch_list=False) as emu:
        emu.create(cm("a"))
        params = {
            "watch": "1",
            "sendInitialEvents": "true",
            "allowWatchBookmarks": "true",
            "resourceVersionMatch": "NotOlderThan",
            "timeoutSeconds": "1",
        }
        async with aiohttp.ClientSession(emu.url) as http:
            async with http.get(CMS, params=params) as r:
                events = await events_until_close(r)
    annotated = [
        e
        for e in events
        if (e["object"]["metadata"].get("annotations") or {}).get(INITIAL_EVENTS_END_ANNOTATION)
    ]
    assert names(events)[0] == ("ADDED", "a")
    assert annotated == []


async def test_watch_list_rejected_by_a_server_with_the_gate_off() -> None:
    """Checklist 18's other case: the server errors instead of ignoring the parameter."""
    async with Emulator(watch_list=False) as emu:
        emu.reject_watch_list = True
        params = {
            "watch": "1",
            "sendInitialEvents": "true",
            "allowWatchBookmarks": "true",
            "resourceVersionMatch": "NotOlderThan",
        }
        async with aiohttp.ClientSession(emu.url) as http:
            async with http.get(CMS, params=params) as r:
                assert r.status == 422
                body = await r.json()
    assert body["reason"] == "Invalid" and "WatchList" in body["message"]


async def test_resource_version_match_on_plain_watch_is_invalid(emulator: Emulator) -> None:
    params = {"watch": "1", "resourceVersion": "1", "resourceVersionMatch": "NotOlderThan"}
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get(CMS, params=params) as r:
            assert r.status == 422


async def test_checklist_31_periodic_bookmarks_and_one_before_timeout(emulator: Emulator) -> None:
    """Checklist 31: bookmarks every interval until 2 s before timeoutSeconds (as the
    watch cache schedules them), none at the close; RVs never go back."""
    emulator.bookmark_interval = 0.3
    start = emulator.resource_version
    params = {
        "watch": "1",
        "resourceVersion": str(start),
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "3",
    }

    async def churn() -> None:
        for i in range(3):
            await asyncio.sleep(0.2)
            emulator.create(cm(f"x{i}"))

    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(emulator.url) as http:
        began = loop.time()
        async with http.get(CMS, params=params) as r:
            task = asyncio.create_task(churn())
            timed = []
            async for line in r.content:
                timed.append((loop.time() - began, orjson.loads(line)))
            await task
        params.pop("allowWatchBookmarks")
        params["timeoutSeconds"] = "1"
        async with http.get(CMS, params=params) as r:
            no_bookmarks = await events_until_close(r, timeout=5)
    events = [e for _, e in timed]
    bookmarks = [(t, e) for t, e in timed if e["type"] == "BOOKMARK"]
    assert len(bookmarks) >= 3  # at 0.3, 0.6, 0.9 and the last one at 1.0 (3 s - 2 s)
    assert all(t < 1.5 for t, _ in bookmarks)
    assert events[-1]["type"] == "BOOKMARK"
    assert events[-1]["object"]["metadata"]["resourceVersion"] == str(emulator.resource_version)
    assert set(bookmarks[0][1]["object"]) == {"kind", "apiVersion", "metadata"}
    assert set(bookmarks[0][1]["object"]["metadata"]) == {"resourceVersion"}
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs)
    assert [e["type"] for e in events].count("ADDED") == 3
    assert all(e["type"] != "BOOKMARK" for e in no_bookmarks)


async def test_no_bookmark_before_anything_changed_since_the_watch_began(
    emulator: Emulator,
) -> None:
    """The watch cache sends no bookmark at the version a watch started from."""
    emulator.bookmark_interval = 0.1
    params = {
        "watch": "1",
        "resourceVersion": str(emulator.resource_version),
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "3",
    }
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get(CMS, params=params) as r:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(r.content.readline(), 0.5)
            emulator.create(cm("elsewhere", namespace="other"))
            bookmark = await next_event(r)
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["object"]["metadata"]["resourceVersion"] == str(emulator.resource_version)


async def test_watch_timeout_closes_stream_cleanly(emulator: Emulator) -> None:
    async with aiohttp.ClientSession(emulator.url) as http:
        loop = asyncio.get_running_loop()
        began = loop.time()
        params = {
            "watch": "1",
            "resourceVersion": str(emulator.resource_version),
            "timeoutSeconds": "1",
        }
        async with http.get(CMS, params=params) as r:
            events = await events_until_close(r, timeout=5)
        took = loop.time() - began
    assert events == []
    assert 0.9 <= took < 3


async def test_label_selector_watch_shows_leaving_as_deleted_and_entering_as_added(
    emulator: Emulator,
) -> None:
    emulator.create(cm("a", app="web"))
    params = {
        "watch": "1",
        "resourceVersion": str(emulator.resource_version),
        "labelSelector": "app=web",
    }
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get(CMS, params=params) as r:
            emulator.patch(
                "v1", "ConfigMap", "a", {"metadata": {"labels": {"app": "db"}}}, "default"
            )
            left = await next_event(r)
            emulator.create(cm("other", app="db"))
            emulator.patch(
                "v1", "ConfigMap", "a", {"metadata": {"labels": {"app": "web"}}}, "default"
            )
            entered = await next_event(r)
            emulator.patch("v1", "ConfigMap", "a", {"data": {"k": "2"}}, "default")
            modified = await next_event(r)
    assert left["type"] == "DELETED"
    assert left["object"]["metadata"]["labels"] == {"app": "web"}  # last matching content
    assert int(left["object"]["metadata"]["resourceVersion"]) > 0
    assert entered["type"] == "ADDED" and entered["object"]["metadata"]["name"] == "a"
    assert modified["type"] == "MODIFIED"


async def test_watch_ahead_of_server_waits_for_that_version(emulator: Emulator) -> None:
    """Like the watch cache: accepted, and only events after the asked version come."""
    ahead = emulator.resource_version + 2
    params = {"watch": "1", "resourceVersion": str(ahead)}
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get(CMS, params=params) as r:
            assert r.status == 200
            for name in ("a", "b", "c"):
                emulator.create(cm(name))
            event = await next_event(r)
    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "c")


async def test_streaming_list_ahead_of_server_is_an_error_event(emulator: Emulator) -> None:
    ahead = emulator.resource_version + 100
    params = {
        "watch": "1",
        "sendInitialEvents": "true",
        "allowWatchBookmarks": "true",
        "resourceVersionMatch": "NotOlderThan",
        "resourceVersion": str(ahead),
    }
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get(CMS, params=params) as r:
            assert r.status == 200
            events = await events_until_close(r)
    assert [e["type"] for e in events] == ["ERROR"]
    status = events[0]["object"]
    assert status["code"] == 504
    assert status["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"
