"""Sharded LIST and WATCH (KEP-5866) through ``ListWatch``, on four servers.

kube-apiserver 1.37 with the ShardedListAndWatch gate on filters by
``shardSelector`` and echoes it; a second kube-apiserver on the same etcd with
the gate off ignores it, as an older server does; the emulator does either.
Whichever it is, each shard of a ListWatch must come out as exactly the objects
whose hash our ``ShardRange.contains`` puts in it: the three shards' lists and
watches are a partition of the unsharded ones. A server that honours the
selector is trusted (nothing filtered on the client); one that does not is
filtered on the client, with one warning per ListWatch.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bridge.emulator import Emulator
from bridge.kube.client import KubeClient
from bridge.kube.discovery import ResourceInfo
from bridge.kube.listwatch import ListWatch
from bridge.kube.objects import INITIAL_EVENTS_END_ANNOTATION, WatchEvent
from bridge.kube.protocols import ListOptions, WatchOptions
from bridge.kube.rawjson import ObjectDecoder
from bridge.kube.sharding import ShardField, ShardRange, shard_ranges
from bridge.logging import capture_logs
from tests.e2e.crash_world import Objects
from tests.fixtures.kube import KubeCluster

CONFIGMAPS = ResourceInfo("", "v1", "ConfigMap", "configmaps", True, ("list", "watch"))
IGNORED = "the API server ignores shardSelector"
Body = dict[str, Any]


@dataclass
class Server:
    """One API server: where the ListWatch reads, where the test writes, and whether
    it applies ``shardSelector``."""

    name: str
    kubeconfig: Path
    writer: Objects
    honours: bool
    namespaces: list[str] = field(default_factory=list)
    new_namespace: Callable[[], str] = lambda: ""


@pytest.fixture(params=["emulator", "emulator-gate-off", "real", "real-gate-off"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    kubeconfig = tmp_path / "kubeconfig"
    if request.param.startswith("emulator"):
        emu: Emulator = request.getfixturevalue("emulator")
        emu.sharded_list_watch = request.param == "emulator"

        def emu_namespace() -> str:
            name = f"shard-{uuid.uuid4().hex[:8]}"
            emu.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
            return name

        emu.write_kubeconfig(kubeconfig)
        yield Server(request.param, kubeconfig, emu, emu.sharded_list_watch, [], emu_namespace)
        return
    cluster: KubeCluster = request.getfixturevalue("kube_cluster")
    reads = cluster
    if request.param == "real-gate-off":
        reads = request.getfixturevalue("kube_cluster_unsharded")
    reads.write_kubeconfig(kubeconfig)
    made = Server(
        request.param, kubeconfig, cluster, reads is cluster, [], lambda: cluster.namespace("shard")
    )
    try:
        yield made
    finally:
        for ns in made.namespaces:
            cluster.raw("DELETE", f"/api/v1/namespaces/{ns}")


@pytest.fixture
async def client(server: Server) -> AsyncIterator[KubeClient]:
    made = await KubeClient.from_kubeconfig(str(server.kubeconfig))
    try:
        yield made
    finally:
        await made.close()


def cm(name: str, namespace: str, run: str) -> Body:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": {"shard-test": run}},
        "data": {"v": "0"},
    }


def key(obj: Body) -> tuple[str, str]:
    md = obj["metadata"]
    return md["namespace"], md["name"]


async def list_all(lw: ListWatch, limit: int = 5) -> tuple[list[Body], str]:
    """Every page of a paginated LIST: the items, and the list's resourceVersion."""
    items: list[Body] = []
    token: str | None = None
    while True:
        page = await lw.list(ListOptions(limit=limit, continue_token=token))
        items.extend(page["items"])
        token = page["metadata"].get("continue")
        if not token:
            return items, page["metadata"]["resourceVersion"]


async def collect(lw: ListWatch, options: WatchOptions, into: list[WatchEvent]) -> None:
    async with lw.watch(options) as events:
        async for event in events:
            into.append(event)


def objects_of(events: list[WatchEvent]) -> list[tuple[str, str, str]]:
    return [(e["type"], *key(e["object"])) for e in events if e["type"] != "BOOKMARK"]


@pytest.mark.parametrize("by", ["uid", "namespace"])
async def test_three_shards_partition_lists_watches_and_streaming_lists(
    server: Server, client: KubeClient, by: ShardField
) -> None:
    run = uuid.uuid4().hex[:8]
    selector = f"shard-test={run}"
    w = server.writer
    for _ in range(6):
        server.namespaces.append(server.new_namespace())
    made: dict[tuple[str, str], Body] = {}
    for ns, i in itertools.product(server.namespaces, range(4)):
        obj = w.create(cm(f"cm-{i}", ns, run))
        made[key(obj)] = obj

    def field_of(obj: Body) -> str:
        return str(obj["metadata"].get(by) or "")

    def lw(shard: ShardRange | None) -> ListWatch:
        return ListWatch(
            client, CONFIGMAPS, label_selector=selector, shard=shard, decoder=ObjectDecoder()
        )

    ranges = shard_ranges(3, by)
    with capture_logs() as logs:
        whole, rv = await list_all(lw(None))
        assert {key(o) for o in whole} == set(made)
        shards = [lw(r) for r in ranges]

        # LIST, paginated: each shard is exactly what our hash puts in it.
        listed = [await list_all(s) for s in shards]
        for r, s, (items, _) in zip(ranges, shards, listed, strict=True):
            assert {key(o) for o in items} == {
                k for k, o in made.items() if r.contains(field_of(o))
            }
            assert s.shard_honoured is server.honours
            if server.honours:
                assert s.client_filtered == 0
            else:
                assert s.client_filtered == len(made) - len(items)
        keys = [{key(o) for o in items} for items, _ in listed]
        assert set().union(*keys) == set(made)
        assert sum(len(k) for k in keys) == len(made)  # no object in two shards

        # WATCH from the list's version: creates, updates and deletes, each in its shard.
        before = [s.client_filtered for s in shards]
        seen: list[list[WatchEvent]] = [[] for _ in shards]
        options = WatchOptions(resource_version=rv, timeout_seconds=60)
        tasks = [
            asyncio.create_task(collect(s, options, into))
            for s, into in zip(shards, seen, strict=True)
        ]
        alive = {k: field_of(o) for k, o in made.items()}
        try:
            changes: list[tuple[str, str, str, str]] = []  # type, ns, name, hashed field
            for ns in server.namespaces:
                obj = w.create(cm("late", ns, run))
                alive[key(obj)] = field_of(obj)
                changes.append(("ADDED", ns, "late", field_of(obj)))
                obj = w.patch("v1", "ConfigMap", "cm-0", {"data": {"v": "1"}}, ns)
                changes.append(("MODIFIED", ns, "cm-0", field_of(obj)))
                w.delete("v1", "ConfigMap", "cm-1", ns)
                changes.append(("DELETED", ns, "cm-1", alive.pop((ns, "cm-1"))))
            async with asyncio.timeout(30):
                while sum(len(objects_of(e)) for e in seen) < len(changes):
                    await asyncio.sleep(0.05)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for r, events in zip(ranges, seen, strict=True):
            expected = [(t, ns, name) for t, ns, name, value in changes if r.contains(value)]
            assert objects_of(events) == expected
        filtered = [s.client_filtered - b for s, b in zip(shards, before, strict=True)]
        # Each change reached the two shards it is not in, when the server ignored the selector.
        assert sum(filtered) == (0 if server.honours else 2 * len(changes))

        # A streaming list from a ListWatch that has not listed yet: no echo in it, so a
        # one-object LIST asks first; the initial events are the shard's objects.
        fresh = [lw(r) for r in ranges]
        for r, s in zip(ranges, fresh, strict=True):
            initial: list[WatchEvent] = []
            streaming = WatchOptions(
                send_initial_events=True, resource_version_match="NotOlderThan", timeout_seconds=30
            )
            async with asyncio.timeout(30), s.watch(streaming) as events:
                async for event in events:
                    if event["type"] == "BOOKMARK":
                        annotations = event["object"]["metadata"].get("annotations") or {}
                        if annotations.get(INITIAL_EVENTS_END_ANNOTATION) == "true":
                            break
                        continue
                    initial.append(event)
            assert s.shard_honoured is server.honours
            assert {key(e["object"]) for e in initial} == {
                k for k, v in alive.items() if r.contains(v)
            }
            assert {e["type"] for e in initial} <= {"ADDED"}

    warnings = [e for e in logs if e["event"].startswith(IGNORED)]
    if server.honours:
        assert warnings == []
    else:
        # One line per ListWatch, however many pages and watches it served.
        assert len(warnings) == len(shards) + len(fresh)
        assert {w["log_level"] for w in warnings} == {"warning"}
        assert {w["resource"] for w in warnings} == {"v1/configmaps"}
        assert sorted(w["shard"] for w in warnings) == sorted(r.label() for r in ranges + ranges)
