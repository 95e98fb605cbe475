"""LISTs read as they arrive, and streaming lists that fail, over real HTTP.

The incremental read is proven against a tiny server that holds the rest of a
LIST body back until the informer's side of the FIFO has taken the first item:
a client that read the body whole would wait forever. The fallbacks of a
failed streaming list (checklist 18) are driven with the emulator's chaos
controls.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from bridge.emulator import Emulator, write_kubeconfig
from bridge.errors import ForbiddenError, KubeConnectionError
from bridge.kube.client import KubeClient
from bridge.kube.fifo import Delta, RealFIFO
from bridge.kube.listwatch import ListWatch
from bridge.kube.protocols import ListOptions, WatchOptions
from bridge.kube.reflector import Reflector, ReflectorSettings
from bridge.kube.store import Indexer
from tests.doubles.scripted import RecordingStore
from tests.fixtures.waiting import until
from tests.integration.kube.conftest import PODS, pod_body, running

pytestmark = pytest.mark.integration


def item(i: int) -> bytes:
    return orjson.dumps(
        {
            "metadata": {
                "name": f"p{i:04d}",
                "namespace": "default",
                "uid": f"u{i}",
                "resourceVersion": str(100 + i),
                "annotations": {"note": 'braces } { and "quotes"'},
            },
            "spec": {"containers": [{"name": "c", "image": "nginx"}]},
        }
    )


class HeldBackList:
    """Serves /api/v1/pods: a LIST whose tail waits for ``release``; watches that hang."""

    def __init__(self, n: int, head_items: int) -> None:
        self.n = n
        self.head_items = head_items
        self.release = asyncio.Event()
        self.tail_sent = False
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        if "watch" in request.query:
            await asyncio.Event().wait()  # a quiet watch until the client hangs up
        items = [item(i) for i in range(self.n)]
        await resp.write(b'{"kind":"PodList","apiVersion":"v1","items":[')
        await resp.write(b",".join(items[: self.head_items]))
        await self.release.wait()
        # The metadata comes after the items here: the reader must not need it first.
        tail = b"," + b",".join(items[self.head_items :])
        await resp.write(tail + b'],"metadata":{"resourceVersion":"999"}}')
        self.tail_sent = True
        await resp.write_eof()
        return resp

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[HeldBackList]:
        app = web.Application()
        app.router.add_get("/api/v1/pods", self.handle)
        runner = web.AppRunner(app, handle_signals=False, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        try:
            yield self
        finally:
            self.release.set()
            await runner.cleanup()


@contextlib.asynccontextmanager
async def client_for(url: str, tmp_path: Path) -> AsyncIterator[KubeClient]:
    client = await KubeClient.from_kubeconfig(str(write_kubeconfig(tmp_path / "kc", url)))
    try:
        yield client
    finally:
        await client.close()


async def test_list_stream_yields_items_before_the_body_is_complete(tmp_path: Path) -> None:
    server = HeldBackList(n=50, head_items=3)
    async with server.serving(), client_for(server.url, tmp_path) as client:
        lw = ListWatch(client, PODS)
        names: list[str] = []
        async with lw.list_stream(ListOptions(resource_version="0")) as page:
            async for batch in page:
                names.extend(i["metadata"]["name"] for i in batch)
                if len(names) >= 2 and not server.release.is_set():
                    assert not server.tail_sent
                    server.release.set()
            meta: dict[str, Any] = page.metadata
    assert names == [f"p{i:04d}" for i in range(50)]
    assert meta == {"resourceVersion": "999"}


async def test_the_informer_side_takes_list_items_while_the_list_arrives(tmp_path: Path) -> None:
    """Item 1 of the list reaches the FIFO's consumer before the server sends the rest."""
    server = HeldBackList(n=400, head_items=50)
    fifo = RealFIFO(known_objects=Indexer())
    popped: list[tuple[str, bool]] = []
    first_pop_before_tail: list[bool] = []

    async def consume() -> None:
        async def process(deltas: list[Delta], initial: bool) -> None:
            for d in deltas:
                assert isinstance(d.object, dict)
                popped.append((d.object["metadata"]["name"], initial))
            if not first_pop_before_tail:
                first_pop_before_tail.append(not server.tail_sent)
                server.release.set()

        while True:
            await fifo.pop(process)

    async with server.serving(), client_for(server.url, tmp_path) as client:
        settings = ReflectorSettings(watch_list="off")
        r = Reflector(ListWatch(client, PODS), fifo, settings=settings)
        consumer = asyncio.create_task(consume())
        try:
            async with running(r):
                await asyncio.wait_for(fifo.wait_for_sync(), 10)
        finally:
            consumer.cancel()
    assert first_pop_before_tail == [True]
    assert [n for n, _ in popped] == [f"p{i:04d}" for i in range(400)]
    assert all(initial for _, initial in popped)
    assert r.last_sync_resource_version == "999"


def watch_queries(emu: Emulator) -> list[dict[str, str]]:
    return [r.query for r in emu.requests if r.path.endswith("pods") and "watch" in r.query]


def list_queries(emu: Emulator) -> list[dict[str, str]]:
    return [r.query for r in emu.requests if r.path.endswith("pods") and "watch" not in r.query]


def streaming(queries: list[dict[str, str]]) -> list[dict[str, str]]:
    return [q for q in queries if q.get("sendInitialEvents") == "true"]


STREAMING = ReflectorSettings(
    watch_list="auto", backoff_initial=0.05, backoff_cap=0.5, short_watch=0.05
)


async def force_relist(emu: Emulator) -> None:
    """The watch is cut and its RV compacted away: the reflector must list again (checklist 8)."""
    emu.create(pod_body("c"))
    emu.chaos.compact()
    emu.chaos.drop_watches()


async def test_checklist_18_a_500_on_a_streaming_list_falls_back_for_that_attempt_only(
    emulator: Emulator, client: KubeClient
) -> None:
    emulator.create(pod_body("a"))
    emulator.create(pod_body("b"))
    emulator.chaos.fail_next(1, 500)
    store = RecordingStore()
    r = Reflector(ListWatch(client, PODS), store, settings=STREAMING)
    async with running(r):
        await until(lambda: len(watch_queries(emulator)) == 2)
        assert len(list_queries(emulator)) == 1  # this attempt listed...
        assert r.uses_watch_list  # ...but streaming is not given up
        await asyncio.sleep(0.2)  # past the short-watch window
        await force_relist(emulator)
        await until(lambda: len(store.ops) == 2)
    streamed = streaming(watch_queries(emulator))
    assert len(streamed) == 2  # the failed one and the next list attempt
    assert streamed[1]["resourceVersion"] == store.ops[0][1][1]  # NotOlderThan the last RV
    assert len(list_queries(emulator)) == 1
    assert sorted(i.split("@")[0] for i in store.ops[1][1][0]) == ["a", "b", "c"]
    assert r.relists == {"initial": 1, "expired": 1}


async def test_checklist_18_a_streaming_list_cut_midway_lists_once_then_streams_again(
    emulator: Emulator, client: KubeClient
) -> None:
    emulator.create(pod_body("a"))
    emulator.chaos.stall_watches()  # the streaming list opens but sends nothing yet
    store = RecordingStore()
    r = Reflector(ListWatch(client, PODS), store, settings=STREAMING)
    async with running(r):
        await until(lambda: len(watch_queries(emulator)) == 1)
        emulator.chaos.drop_watches()
        emulator.chaos.resume_watches()
        await until(lambda: len(watch_queries(emulator)) == 2 and bool(store.ops))
        assert len(list_queries(emulator)) == 1 and r.uses_watch_list
        await asyncio.sleep(0.2)
        await force_relist(emulator)
        await until(lambda: len(store.ops) == 2)
    assert len(streaming(watch_queries(emulator))) == 2
    assert len(list_queries(emulator)) == 1


async def test_checklist_18_a_server_rejecting_the_option_is_not_asked_again(
    tmp_path: Path,
) -> None:
    async with Emulator(watch_list=False) as emu:
        emu.reject_watch_list = True  # 422, like a server with the WatchList gate off
        emu.create(pod_body("a"))
        async with client_for(emu.url, tmp_path) as client:
            store = RecordingStore()
            r = Reflector(ListWatch(client, PODS), store, settings=STREAMING)
            async with running(r):
                await until(lambda: len(watch_queries(emu)) == 2)
                await asyncio.sleep(0.2)
                await force_relist(emu)
                await until(lambda: len(store.ops) == 2)
    assert len(streaming(watch_queries(emu))) == 1
    assert len(list_queries(emu)) == 2
    assert not r.uses_watch_list


async def test_list_stream_errors_are_translated(tmp_path: Path, emulator: Emulator) -> None:
    """Opening: the Status as ``ApiStatusError``; a body cut mid-way: ``KubeConnectionError``."""

    async def cut(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(b'{"kind":"PodList","items":[' + item(0) + b"," + item(1)[:40])
        assert request.transport is not None
        request.transport.abort()
        return resp

    emulator.forbid(verb="list", resource="pods")
    async with client_for(emulator.url, tmp_path) as client:
        with pytest.raises(ForbiddenError, match="pods"):
            async with ListWatch(client, PODS).list_stream(ListOptions()):
                pass

    app = web.Application()
    app.router.add_get("/api/v1/pods", cut)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with client_for(f"http://127.0.0.1:{port}", tmp_path / "cut") as client:
            got: list[str] = []
            with pytest.raises(KubeConnectionError, match="GET /api/v1/pods"):
                async with ListWatch(client, PODS).list_stream(ListOptions()) as page:
                    async for batch in page:
                        got.extend(i["metadata"]["name"] for i in batch)
            assert got == ["p0000"]  # what arrived whole was handed over
    finally:
        await runner.cleanup()


async def test_decoded_lazily_a_listed_and_a_watched_object_fingerprint_alike(
    emulator: Emulator, client: KubeClient
) -> None:
    """The same objects from a LIST (paged and streamed, items without kind/apiVersion)
    and from a watch hash the same with their spec and status kept as the server's bytes."""
    from bridge.delivery.changes import Fingerprinter
    from bridge.kube.rawjson import ObjectDecoder

    for i in range(3):
        body = pod_body(f"odd-{i}", app="a<b&c")
        body["spec"] = {"containers": [{"name": "c", "image": "nginx", "args": ["é", "<&>"]}]}
        body["status"] = {"phase": "Pending", "conditions": [{"type": "Ready", "n": i}]}
        emulator.create(body)
    lw = ListWatch(client, PODS, decoder=ObjectDecoder(Fingerprinter().reads() or ()))

    def prints(objects: list[Any]) -> dict[str, str]:
        return {o["metadata"]["name"]: Fingerprinter().fingerprint(o) for o in objects}

    listed = await lw.list(ListOptions())
    streamed: list[Any] = []
    async with lw.list_stream(ListOptions(resource_version="0")) as page:
        async for batch in page:
            streamed.extend(batch)
    watched: list[Any] = []
    async with lw.watch(WatchOptions(resource_version="1")) as events:
        async for event in events:
            watched.append(event["object"])
            if len(watched) == 3:
                break
    assert all(isinstance(o["spec"], orjson.Fragment) for o in listed["items"] + watched)
    assert prints(listed["items"]) == prints(streamed) == prints(watched)
    assert len(set(prints(watched).values())) == 3
