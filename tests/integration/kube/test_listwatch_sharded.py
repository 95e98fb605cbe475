"""ListWatch with a shard on the emulator, the server honouring ``shardSelector`` and
ignoring it: the parsed-whole LIST (as ``check`` reads), the probe, and three sharded
reflectors through churn, paginated relists, streaming lists and a 410."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest

from bridge.emulator import Emulator
from bridge.kube.client import KubeClient
from bridge.kube.listwatch import ListWatch
from bridge.kube.protocols import ListOptions
from bridge.kube.rawjson import ObjectDecoder
from bridge.kube.reflector import Reflector
from bridge.kube.sharding import ShardRange, shard_ranges
from bridge.logging import capture_logs
from tests.doubles.scripted import RecordingStore
from tests.fixtures.waiting import until
from tests.integration.kube.conftest import CONFIGMAPS, FAST, PODS, pod_body, running


@pytest.mark.parametrize("honours", [True, False])
async def test_whole_lists_and_the_probe_of_a_shard(
    client: KubeClient, emulator: Emulator, honours: bool
) -> None:
    emulator.sharded_list_watch = honours
    made = [
        emulator.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"c{i}", "namespace": "default"},
            }
        )
        for i in range(12)
    ]
    ranges = shard_ranges(2, "uid")
    with capture_logs() as logs:
        probed = ListWatch(client, CONFIGMAPS, namespace="default", shard=ranges[0])
        assert probed.shard_honoured is None
        assert await probed.probe_shard() is honours
        assert await ListWatch(client, CONFIGMAPS, namespace="default").probe_shard() is None
        got: list[set[str]] = []
        for r in ranges:
            lw = ListWatch(client, CONFIGMAPS, namespace="default", shard=r)  # no decoder
            items = (await lw.list(ListOptions()))["items"]
            names = {o["metadata"]["name"] for o in items}
            assert names == {
                o["metadata"]["name"] for o in made if r.contains(o["metadata"]["uid"])
            }
            assert all(o["kind"] == "ConfigMap" for o in items)
            assert lw.shard_honoured is honours
            assert lw.client_filtered == (0 if honours else len(made) - len(names))
            got.append(names)
    assert got[0] | got[1] == {o["metadata"]["name"] for o in made} and not got[0] & got[1]
    warned = [e for e in logs if e["event"].startswith("the API server ignores shardSelector")]
    assert len(warned) == (0 if honours else 3)


def state(store: RecordingStore) -> set[str]:
    """The names a store holds after the reflector's calls (the last replace onwards)."""
    held: set[str] = set()
    for op, value in store.ops:
        if op == "replace":
            held = {i.split("@")[0] for i in value[0]}
        elif op in ("add", "update"):
            held.add(value.split("@")[0])
        elif op == "delete":
            held.discard(value.split("@")[0])
    return held


def every_name(store: RecordingStore) -> set[str]:
    out: set[str] = set()
    for op, value in store.ops:
        if op == "replace":
            out |= {i.split("@")[0] for i in value[0]}
        elif op != "resync":
            out.add(value.split("@")[0])
    return out


@pytest.mark.parametrize("watch_list", ["off", "auto"])
@pytest.mark.parametrize("honours", [True, False])
async def test_three_sharded_reflectors_hold_the_partition_through_churn_and_a_410(
    client: KubeClient, emulator: Emulator, honours: bool, watch_list: str
) -> None:
    emulator.sharded_list_watch = honours
    uids: dict[str, str] = {}

    def create(name: str) -> None:
        uids[name] = emulator.create(pod_body(name))["metadata"]["uid"]

    for i in range(30):
        create(f"p{i:02d}")
    ranges = shard_ranges(3, "uid")
    stores = [RecordingStore() for _ in ranges]
    settings = replace(FAST, watch_list=watch_list, page_size=7, paginate_relists=True)
    lws = [
        ListWatch(client, PODS, namespace="default", shard=r, decoder=ObjectDecoder())
        for r in ranges
    ]
    reflectors = [Reflector(lw, s, settings=settings) for lw, s in zip(lws, stores, strict=True)]

    def expected(r: ShardRange) -> set[str]:
        alive = {p["metadata"]["name"] for p in emulator.list("v1", "Pod", "default")}
        return {n for n in alive if r.contains(uids[n])}

    def settled() -> bool:
        return all(state(s) == expected(r) for s, r in zip(stores, ranges, strict=True))

    async with contextlib.AsyncExitStack() as stack:
        for r in reflectors:
            await stack.enter_async_context(running(r))
        await until(settled)
        for i in range(10):
            create(f"q{i}")
            emulator.patch(
                "v1", "Pod", f"p{i:02d}", {"metadata": {"labels": {"v": "2"}}}, "default"
            )
            emulator.delete("v1", "Pod", f"p{i + 10:02d}", "default")
        await until(settled)
        # Deletes while the watches are cut and the history compacted: each shard's
        # relist must turn exactly its own vanished objects into deletes.
        emulator.chaos.stall_watches()
        for i in range(20, 25):
            emulator.delete("v1", "Pod", f"p{i:02d}", "default")
        create("late")
        emulator.chaos.compact()
        emulator.chaos.drop_watches()
        emulator.chaos.resume_watches()
        await until(lambda: all(r.relists.get("expired") for r in reflectors))
        await until(settled)
    for r, s, lw in zip(ranges, stores, lws, strict=True):
        assert {n for n in every_name(s)} <= {n for n, u in uids.items() if r.contains(u)}
        assert lw.shard_honoured is honours
        assert (lw.client_filtered == 0) is honours
