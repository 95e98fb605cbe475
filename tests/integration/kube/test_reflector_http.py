"""The Reflector over real HTTP against the emulator (checklist 1-18 end to end)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bridge.emulator import Emulator
from bridge.kube.client import KubeClient
from bridge.kube.listwatch import ListWatch
from bridge.kube.reflector import Reflector, ReflectorSettings
from tests.doubles.scripted import RecordingStore
from tests.fixtures.waiting import until
from tests.integration.kube.conftest import CONFIGMAPS, FAST, PODS, pod_body, running

pytestmark = pytest.mark.integration


def watch_requests(emu: Emulator, plural: str = "pods") -> list[dict[str, str]]:
    return [r.query for r in emu.requests if r.path.endswith(plural) and "watch" in r.query]


def list_requests(emu: Emulator, plural: str = "pods") -> list[dict[str, str]]:
    return [r.query for r in emu.requests if r.path.endswith(plural) and "watch" not in r.query]


def names(store: RecordingStore, op: str) -> list[str]:
    return [str(v).split("@")[0] for o, v in store.ops if o == op]


async def test_first_list_at_rv0_is_served_whole_then_watches(
    emulator: Emulator, client: KubeClient
) -> None:
    """Checklist 1, 5: RV=0 is answered from the watch cache, which ignores limit."""
    for i in range(25):
        emulator.create(pod_body(f"p{i:02d}"))
    store = RecordingStore()
    settings = ReflectorSettings(watch_list="off", page_size=10)
    r = Reflector(ListWatch(client, PODS), store, settings=settings)
    async with running(r):
        await until(lambda: bool(watch_requests(emulator)))
    lists = list_requests(emulator)
    assert [(q.get("limit"), q["resourceVersion"]) for q in lists] == [("10", "0")]
    (op, (items, rv)) = store.ops[0]
    assert op == "replace" and len(items) == 25 and rv == str(emulator.resource_version)
    w = watch_requests(emulator)[0]
    assert w["resourceVersion"] == rv and w["allowWatchBookmarks"] == "true"
    assert 300 <= int(w["timeoutSeconds"]) < 600


async def test_paginated_relist_joins_pages(emulator: Emulator, client: KubeClient) -> None:
    """Checklist 4, 8: a relist at the last RV, paginated when asked, joins every page."""
    for i in range(25):
        emulator.create(pod_body(f"p{i:02d}"))
    store = RecordingStore()
    settings = ReflectorSettings(watch_list="off", page_size=10, paginate_relists=True)
    r = Reflector(ListWatch(client, PODS), store, settings=settings)
    async with running(r):
        await until(lambda: bool(watch_requests(emulator)))
        await asyncio.sleep(1.1)  # past the short-watch window (checklist 11)
        emulator.create(pod_body("p25"))
        emulator.chaos.compact()
        emulator.chaos.drop_watches()
        await until(lambda: len([o for o, _ in store.ops if o == "replace"]) >= 2)
    relists = [q for q in list_requests(emulator) if q.get("resourceVersion") != "0"]
    # A paginated LIST at a resourceVersion is an exact read (the API server's legacy
    # rule): the compacted one gets 410 and the relist lists the latest state instead.
    assert [q.get("limit") for q in relists] == ["10", "10", "10", "10"]
    assert relists[0]["resourceVersion"] == store.ops[0][1][1]
    assert not relists[1].get("resourceVersion") and "continue" not in relists[1]
    assert all("continue" in q for q in relists[2:])
    (_, (items, _)) = [o for o in store.ops if o[0] == "replace"][-1]
    assert len(items) == 26


async def test_selectors_and_namespaces_go_to_the_server(
    emulator: Emulator, client: KubeClient
) -> None:
    emulator.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns2"}})
    emulator.create(pod_body("a", app="x"))
    emulator.create(pod_body("b", app="y"))
    emulator.create(pod_body("c", "ns2", app="x"))
    stores = []
    lws = [
        ListWatch(client, PODS, namespace=ns, label_selector="app=x") for ns in ("default", "ns2")
    ]
    assert [lw.namespace for lw in lws] == ["default", "ns2"]
    reflectors = []
    for lw in lws:
        stores.append(RecordingStore())
        reflectors.append(Reflector(lw, stores[-1], settings=FAST))
    async with running(reflectors[0]), running(reflectors[1]):
        await until(lambda: len(watch_requests(emulator)) == 2)
    assert stores[0].ops[0][1][0] == [
        f"a@{emulator.get('v1', 'Pod', 'a', 'default')['metadata']['resourceVersion']}"
    ]
    assert len(stores[1].ops[0][1][0]) == 1
    assert all(q.get("labelSelector") == "app=x" for q in list_requests(emulator))


async def test_watch_resumes_after_a_dropped_connection_without_relist_or_duplicates(
    emulator: Emulator, client: KubeClient
) -> None:
    store = RecordingStore()
    r = Reflector(ListWatch(client, PODS), store, settings=FAST)
    async with running(r):
        await until(lambda: len(watch_requests(emulator)) == 1)
        emulator.create(pod_body("x"))
        await until(lambda: names(store, "add") == ["x"])
        rv_x = r.last_sync_resource_version
        assert emulator.chaos.drop_watches() == 1
        emulator.create(pod_body("y"))
        await until(lambda: names(store, "add") == ["x", "y"])
        await asyncio.sleep(0.2)
    assert names(store, "add") == ["x", "y"]
    assert [o for o, _ in store.ops].count("replace") == 1
    assert len(list_requests(emulator)) == 1
    assert watch_requests(emulator)[1]["resourceVersion"] == rv_x
    assert r.watch_restarts["broken"] == 1


async def test_a_truncated_line_is_a_broken_stream_and_resumes(
    emulator: Emulator, client: KubeClient
) -> None:
    store = RecordingStore()
    r = Reflector(ListWatch(client, PODS), store, settings=FAST)
    async with running(r):
        await until(lambda: len(watch_requests(emulator)) == 1)
        await asyncio.sleep(0.2)  # past the short-watch window (checklist 11)
        emulator.chaos.stall_watches()
        emulator.create(pod_body("x"))
        emulator.chaos.truncate_watches()
        emulator.chaos.resume_watches()
        await until(lambda: names(store, "add") == ["x"])
    assert r.watch_restarts["broken"] == 1
    assert len(list_requests(emulator)) == 1


@pytest.mark.parametrize("mode", ["event", "http"])
async def test_checklist_8_9_expired_watch_relists_at_last_rv(
    emulator: Emulator, client: KubeClient, mode: str
) -> None:
    emulator.chaos.set_expired_mode(mode)  # type: ignore[arg-type]
    emulator.create(pod_body("a"))
    store = RecordingStore()
    r = Reflector(ListWatch(client, PODS), store, settings=FAST)
    async with running(r):
        await until(lambda: len(watch_requests(emulator)) == 1)
        await asyncio.sleep(0.2)  # past the short-watch window (checklist 11)
        last = r.last_sync_resource_version
        emulator.chaos.stall_watches()
        emulator.create(pod_body("b"))
        emulator.delete("v1", "Pod", "a", "default")
        emulator.chaos.compact()
        emulator.chaos.drop_watches()
        emulator.chaos.resume_watches()
        await until(lambda: [o for o, _ in store.ops].count("replace") == 2)
    relist = list_requests(emulator)[1]
    assert relist["resourceVersion"] == last  # not "": the last seen RV first
    assert "limit" not in relist  # checklist 4
    replaced = [[i.split("@")[0] for i in v[0]] for o, v in store.ops if o == "replace"]
    assert replaced == [["a"], ["b"]]
    assert r.relists == {"initial": 1, "expired": 1}


async def test_checklist_10_429_with_retry_after_rewatches_without_relist(
    emulator: Emulator, client: KubeClient
) -> None:
    store = RecordingStore()
    r = Reflector(ListWatch(client, PODS), store, settings=FAST)
    loop = asyncio.get_running_loop()
    async with running(r):
        await until(lambda: len(watch_requests(emulator)) == 1)
        await asyncio.sleep(0.2)
        emulator.chaos.fail_next(1, 429, retry_after=1.0)
        t0 = loop.time()
        emulator.chaos.drop_watches()
        await until(lambda: len(watch_requests(emulator)) == 3)
        elapsed = loop.time() - t0
        emulator.create(pod_body("x"))
        await until(lambda: names(store, "add") == ["x"])
    assert elapsed >= 1.0
    assert r.watch_restarts["throttled"] == 1
    assert len(list_requests(emulator)) == 1


async def test_checklist_13_stalled_watch_is_detected_and_resumed(
    emulator: Emulator, client: KubeClient
) -> None:
    store = RecordingStore()
    settings = ReflectorSettings(
        watch_list="off", idle_timeout=1.5, backoff_initial=0.05, short_watch=0.05
    )
    r = Reflector(ListWatch(client, PODS), store, settings=settings)
    async with running(r):
        await until(lambda: len(watch_requests(emulator)) == 1)
        emulator.chaos.stall_watches()
        emulator.create(pod_body("x"))
        await until(lambda: r.watch_restarts["stalled"] >= 1, timeout=5)
        emulator.chaos.resume_watches()
        await until(lambda: names(store, "add") == ["x"])
    assert len(list_requests(emulator)) == 1


async def test_checklist_14_two_mib_objects_list_and_watch(
    emulator: Emulator, client: KubeClient
) -> None:
    emulator.chaos.huge_object("before")
    seen: list[int] = []

    class SizeStore(RecordingStore):
        async def add(self, obj: dict[str, object]) -> None:
            seen.append(len(obj["data"]["blob"]))  # type: ignore[index]
            await super().add(obj)

    store = SizeStore()
    r = Reflector(ListWatch(client, CONFIGMAPS), store, settings=FAST)
    async with running(r):
        await until(lambda: len(watch_requests(emulator, "configmaps")) == 1)
        emulator.chaos.huge_object("after")
        await until(lambda: len(seen) == 1)
    assert seen[0] > 2 * 1024 * 1024 - 1024
    assert "before@" in str(store.ops[0])


async def test_checklist_16_streaming_list_against_a_server_that_supports_it(
    emulator: Emulator, client: KubeClient
) -> None:
    emulator.create(pod_body("a"))
    emulator.create(pod_body("b"))
    snapshot_rv = str(emulator.resource_version)
    store = RecordingStore()
    settings = ReflectorSettings(backoff_initial=0.05)
    r = Reflector(ListWatch(client, PODS), store, settings=settings)
    async with running(r):
        await until(lambda: bool(store.ops))
        emulator.create(pod_body("c"))
        await until(lambda: names(store, "add") == ["c"])
    assert list_requests(emulator) == []
    (w,) = watch_requests(emulator)
    assert w["sendInitialEvents"] == "true" and w["resourceVersionMatch"] == "NotOlderThan"
    op, (items, rv) = store.ops[0]
    assert op == "replace" and sorted(i.split("@")[0] for i in items) == ["a", "b"]
    assert rv == snapshot_rv  # the store was replaced at the initial-events-end bookmark
    assert r.uses_watch_list


async def test_checklist_18_streaming_list_falls_back_when_the_server_ignores_it(
    tmp_path: Path,
) -> None:
    async with Emulator(watch_list=False, bookmark_interval=0.5) as emu:
        emu.create(pod_body("a"))
        client = await KubeClient.from_kubeconfig(str(emu.write_kubeconfig(tmp_path / "kc")))
        try:
            store = RecordingStore()
            settings = ReflectorSettings(backoff_initial=0.05, initial_events_quiet=3)
            r = Reflector(ListWatch(client, PODS), store, settings=settings)
            async with running(r):
                await until(lambda: len(watch_requests(emu)) == 2)
                emu.create(pod_body("b"))
                await until(lambda: names(store, "add") == ["b"])
        finally:
            await client.close()
    assert not r.uses_watch_list
    assert len(list_requests(emu)) == 1
    assert "sendInitialEvents" not in watch_requests(emu)[1]
    assert store.ops[0][0] == "replace"
