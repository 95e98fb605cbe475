"""Large answers as the API server gives them: streamed, in pieces, from a consistent snapshot.

Checklist 30 and 32 at scale: a streaming list (``sendInitialEvents=true``) and a
large LIST are encoded as they are written, never as one buffer, and changes
made meanwhile come after the snapshot, never inside it.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from bridge.emulator import Emulator
from bridge.emulator.server import STREAM_LIST_ITEMS, WRITE_CHUNK
from bridge.kube.objects import INITIAL_EVENTS_END_ANNOTATION
from tests.integration.emulator.helpers import cm, next_event

CMS = "/api/v1/namespaces/default/configmaps"
WATCH_LIST = {
    "watch": "1",
    "sendInitialEvents": "true",
    "allowWatchBookmarks": "true",
    "resourceVersionMatch": "NotOlderThan",
    "resourceVersion": "",
}


def fill(emu: Emulator, n: int, size: int = 300) -> None:
    for i in range(n):
        emu.create({**cm(f"cm-{i:05d}"), "data": {"v": "x" * size}})


async def http_chunks(resp: aiohttp.ClientResponse) -> list[int]:
    """Sizes of the HTTP chunks of a chunked body, as the server wrote them."""
    sizes: list[int] = []
    current = 0
    async for data, end_of_chunk in resp.content.iter_chunks():
        current += len(data)
        if end_of_chunk:
            sizes.append(current)
            current = 0
    return sizes


async def test_checklist_30_streaming_list_is_a_snapshot_even_while_it_is_written(
    emulator: Emulator,
) -> None:
    n = 3000
    fill(emulator, n)
    snapshot_rv = emulator.resource_version
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get(CMS, params=WATCH_LIST) as r:
            first = await next_event(r)
            # The stream has begun and most of it is still to be written: change things.
            emulator.patch("v1", "ConfigMap", f"cm-{n - 1:05d}", {"data": {"v": "new"}}, "default")
            emulator.delete("v1", "ConfigMap", f"cm-{n - 2:05d}", "default")
            emulator.create(cm("late"))
            events = [first] + [await next_event(r) for _ in range(n + 3)]
    initial, end, live = events[:n], events[n], events[n + 1 :]
    assert [e["type"] for e in initial] == ["ADDED"] * n
    assert [e["object"]["metadata"]["name"] for e in initial] == [f"cm-{i:05d}" for i in range(n)]
    assert initial[-1]["object"]["data"] == {"v": "x" * 300}  # as it was at the snapshot
    assert end["type"] == "BOOKMARK"
    assert end["object"]["metadata"] == {
        "resourceVersion": str(snapshot_rv),
        "annotations": {INITIAL_EVENTS_END_ANNOTATION: "true"},
    }
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in live] == [
        ("MODIFIED", f"cm-{n - 1:05d}"),
        ("DELETED", f"cm-{n - 2:05d}"),
        ("ADDED", "late"),
    ]
    assert all(int(e["object"]["metadata"]["resourceVersion"]) > snapshot_rv for e in live)


async def test_streaming_list_goes_out_in_bounded_pieces(emulator: Emulator) -> None:
    fill(emulator, 2000)
    params = {**WATCH_LIST, "timeoutSeconds": "1"}
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get(CMS, params=params) as r:
            sizes = await http_chunks(r)
    line = 600  # one encoded event of these objects is well under this
    assert sum(sizes) > 2000 * 300
    assert len(sizes) > 2 and max(sizes) <= WRITE_CHUNK + line


async def test_send_initial_events_false_starts_from_now(emulator: Emulator) -> None:
    emulator.create(cm("old"))
    params = {**WATCH_LIST, "sendInitialEvents": "false"}
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get(CMS, params=params) as r:
            emulator.create(cm("new"))
            event = await next_event(r)
    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "new")


async def test_checklist_32_a_large_list_is_streamed_with_the_same_bytes(
    emulator: Emulator,
) -> None:
    n = STREAM_LIST_ITEMS * 4
    fill(emulator, n, size=200)
    expected_rv = str(emulator.resource_version)
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get(CMS, params={"resourceVersion": "0"}) as r:
            assert r.headers.get("Transfer-Encoding") == "chunked"
            raw = b"".join([chunk async for chunk in r.content.iter_any()])
        async with http.get(CMS, params={"limit": "10"}) as r:
            assert "Transfer-Encoding" not in r.headers  # a small page is one body
            page = await r.json()
    body: dict[str, Any] = orjson.loads(raw)
    assert list(body) == ["kind", "apiVersion", "metadata", "items"]
    assert body["kind"] == "ConfigMapList"
    assert body["metadata"] == {"resourceVersion": expected_rv}
    assert [i["metadata"]["name"] for i in body["items"]] == [f"cm-{i:05d}" for i in range(n)]
    assert "kind" not in body["items"][0]
    assert raw == orjson.dumps(body)  # compact, like the API server
    assert len(page["items"]) == 10
