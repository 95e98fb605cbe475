"""Checklist 35: the faults real clusters and networks inflict, on demand."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from bridge.emulator import Emulator
from tests.integration.emulator.helpers import cm, next_event

CMS = "/api/v1/namespaces/default/configmaps"


def _params(emulator: Emulator, **extra: str) -> dict[str, str]:
    return {"watch": "1", "resourceVersion": str(emulator.resource_version), **extra}


async def test_checklist_35_drop_watches_breaks_the_stream(emulator: Emulator) -> None:
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get(CMS, params=_params(emulator)) as r:
            emulator.create(cm("a"))
            assert (await next_event(r))["type"] == "ADDED"
            assert emulator.chaos.drop_watches() == 1
            with pytest.raises(aiohttp.ClientPayloadError):
                await asyncio.wait_for(r.content.read(), 5)


async def test_checklist_35_truncate_writes_half_a_line_then_cuts(emulator: Emulator) -> None:
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get(CMS, params=_params(emulator)) as r:
            emulator.chaos.truncate_watches()
            received = b""
            with pytest.raises(aiohttp.ClientPayloadError):
                while chunk := await asyncio.wait_for(r.content.readany(), 5):
                    received += chunk
    # aiohttp may drop the partial chunk when the connection breaks; whatever came is not a line.
    assert not received.endswith(b"\n")


async def test_checklist_35_stall_sends_no_bytes_until_resumed(emulator: Emulator) -> None:
    emulator.bookmark_interval = 0.1
    emulator.chaos.stall_watches()
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get(CMS, params=_params(emulator, allowWatchBookmarks="true")) as r:
            emulator.create(cm("a"))
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(r.content.readline(), 0.5)
            emulator.chaos.resume_watches()
            event = await next_event(r)
    assert event["type"] == "ADDED" and event["object"]["metadata"]["name"] == "a"


async def test_checklist_35_fail_next_n_requests(emulator: Emulator) -> None:
    emulator.chaos.fail_next(3, status=500)
    async with aiohttp.ClientSession(emulator.url) as http:
        codes = []
        for _ in range(4):
            async with http.get(CMS) as r:
                codes.append(r.status)
    assert codes == [500, 500, 500, 200]


async def test_checklist_35_compact_now_expires_older_watches(emulator: Emulator) -> None:
    emulator.create(cm("a"))
    old = emulator.resource_version
    emulator.create(cm("b"))
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get(CMS, params={"watch": "1", "resourceVersion": str(old)}) as r:
            assert (await next_event(r))["object"]["metadata"]["name"] == "b"
        emulator.chaos.compact()
        async with http.get(CMS, params={"watch": "1", "resourceVersion": str(old)}) as r:
            err = await next_event(r)
        async with http.get(CMS, params=_params(emulator)) as r:
            emulator.create(cm("c"))
            fresh = await next_event(r)
    assert err["type"] == "ERROR" and err["object"]["code"] == 410
    assert fresh["object"]["metadata"]["name"] == "c"


async def test_history_limit_compacts_old_events() -> None:
    async with Emulator(history_limit=2) as emu:
        first = emu.resource_version
        for i in range(4):
            emu.create(cm(f"c{i}"))
        async with aiohttp.ClientSession(emu.url) as http:
            async with http.get(CMS, params={"watch": "1", "resourceVersion": str(first)}) as r:
                err = await next_event(r)
            ok_from = emu.resource_version - 2
            async with http.get(CMS, params={"watch": "1", "resourceVersion": str(ok_from)}) as r:
                replayed = [await next_event(r), await next_event(r)]
    assert err["type"] == "ERROR" and err["object"]["reason"] == "Expired"
    assert [e["object"]["metadata"]["name"] for e in replayed] == ["c2", "c3"]


async def test_checklist_35_huge_objects_served_intact(emulator: Emulator) -> None:
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get(CMS, params=_params(emulator)) as r:
            emulator.chaos.huge_object("big", size=2 * 1024 * 1024)
            # aiohttp's readline() refuses lines over 512 KiB: clients must split lines themselves.
            line = b""
            while not line.endswith(b"\n"):
                line += await asyncio.wait_for(r.content.readany(), 10)
        async with http.get(f"{CMS}/big") as r:
            got = orjson.loads(await r.read())
    assert 1.5 * 1024 * 1024 < len(line) <= 2 * 1024 * 1024 + 1024
    event = orjson.loads(line)
    assert event["object"]["data"]["blob"] == got["data"]["blob"]


async def test_control_endpoints_drive_chaos_over_http(emulator: Emulator) -> None:
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.post("/_emulator/fail_next", json={"n": 1, "status": 429}) as r:
            assert r.status == 200
        async with http.get(CMS) as r:
            assert r.status == 429
        async with http.post(
            "/_emulator/register_resource",
            json={"group": "x.io", "version": "v1", "kind": "Thing", "plural": "things"},
        ) as r:
            assert r.status == 200
        async with http.get("/apis/x.io/v1/namespaces/default/things") as r:
            assert r.status == 200
        emulator.create(cm("a"))
        emulator.create(cm("b"))
        async with http.post("/_emulator/compact") as r:
            compacted = (await r.json())["result"]
        async with http.get("/_emulator/state") as r:
            state = (await r.json())["result"]
    assert compacted == emulator.resource_version == state["compactedResourceVersion"]


async def test_stop_ends_open_and_stalled_watches_promptly() -> None:
    emu = Emulator()
    await emu.start()
    async with aiohttp.ClientSession(emu.url) as http:
        async with http.get(CMS, params={"watch": "1"}) as open_watch:
            emu.chaos.stall_watches()
            async with http.get(CMS, params={"watch": "1"}) as stalled:
                loop = asyncio.get_running_loop()
                began = loop.time()
                await asyncio.wait_for(emu.stop(), 5)
                assert loop.time() - began < 3
                assert await asyncio.wait_for(open_watch.content.read(), 5) == b""
                assert await asyncio.wait_for(stalled.content.read(), 5) == b""
