"""One kind split across replicas on a real kube-apiserver with ShardedListAndWatch on.

- three shards under churn (creates, updates, deletes, an etcd compaction) together
  publish what one unsharded bridge does, event for event; the server applies the
  selector (``shard_selector_honoured`` 1) and nothing is filtered on the client;
  with the gate off (a second kube-apiserver on the same etcd) the same union,
  filtered on the client, with one warning per resource scope;
- ``kill -9`` of one shard with deletes while it is down: its deletes come after
  the restart, the other shards publish their own changes once and nothing else;
- re-sharding 2 → 3 with a NATS KV checkpoint: nothing unchanged republished,
  every change and delete made during the change published once; then back to 2
  (whose own checkpoints are stale by then): again only what changed meanwhile.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter
from pathlib import Path

import pytest

from bridge.kube.sharding import ShardField, shard_range
from tests.e2e.bridge_process import BridgeProcess, kill9
from tests.e2e.sharding_world import (
    World,
    bridge_config,
    check_union,
    in_slice,
    per_object,
    shard_bridges,
    stream,
    until_published,
)
from tests.fixtures.kube import KubeCluster
from tests.fixtures.nats import NatsServer
from tests.fixtures.waiting import until

pytestmark = [pytest.mark.real, pytest.mark.timeout(240)]


def metric(text: str, name: str) -> list[float]:
    return [float(v) for v in re.findall(rf"^k8s_bridge_{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)]


@pytest.mark.parametrize("gate", ["on", "off"])
async def test_three_shards_on_kube_apiserver_publish_what_one_bridge_does(
    tmp_path: Path, kube_cluster: KubeCluster, request: pytest.FixtureRequest, gate: str
) -> None:
    namespaces = [kube_cluster.namespace("shard") for _ in range(2)]
    # Gate off: a kube-apiserver on the same etcd that ignores shardSelector.
    server: KubeCluster = (
        kube_cluster if gate == "on" else request.getfixturevalue("kube_cluster_unsharded")
    )
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    world = World(kube_cluster, namespaces, random.Random(2605))
    for _ in range(20):
        world.create()
    reference = BridgeProcess(
        bridge_config(tmp_path / "unsharded", kubeconfig, namespaces), keep_stdout=True
    )
    by: ShardField = "uid"
    shards = shard_bridges(tmp_path, kubeconfig, namespaces, by, 3)
    everyone = [reference, *shards]
    try:
        await asyncio.gather(*(b.start() for b in everyone))
        await asyncio.gather(*(b.wait_ready(90) for b in everyone))
        world.churn(40)
        kube_cluster.compact()
        world.churn(40)
        await until_published([reference], world.final(), 90)
        await until_published(shards, world.final(), 90)
        for b in shards:
            # The metrics follow the pipelines once a second.
            async def said(b: BridgeProcess = b) -> bool:
                return len(metric(await b.metrics(), "shard_selector_honoured")) == 2

            await until(said, 10, b.tail_log)
            text = await b.metrics()
            if gate == "on":
                # Server-side: the selector echoed for every namespace's pipeline,
                # nothing dropped here, so each replica received only its slice.
                assert metric(text, "shard_selector_honoured") == [1.0, 1.0], text
                assert set(metric(text, "shard_client_filtered_total")) <= {0.0}
            else:
                # Client-side: everything received, the rest dropped here, counted,
                # and said once per resource scope.
                assert metric(text, "shard_selector_honoured") == [0.0, 0.0], text
                assert sum(metric(text, "shard_client_filtered_total")) > 0, text
                warnings = b.log.read_text().count("the API server ignores shardSelector")
                assert warnings == len(namespaces), b.tail_log()
    finally:
        await asyncio.gather(*(b.stop() for b in everyone if b.proc is not None))
    # The real server adds changes of its own (a deleted Pod's deletionTimestamp
    # first): the unsharded bridge's stream is the reference, not the script.
    assert world.final() <= {i for i, _ in stream(reference)}
    check_union(shards, stream(reference), by)


async def test_kill9_of_one_shard_publishes_its_deletes_after_restart_others_unaffected(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    ns = kube_namespace
    kubeconfig = kube_cluster.write_kubeconfig(tmp_path / "kubeconfig")
    world = World(kube_cluster, [ns], random.Random(9))
    for _ in range(30):
        world.create()
    by: ShardField = "uid"
    shards = shard_bridges(tmp_path, kubeconfig, [ns], by, 3)
    # Never killed: what the shards together must publish.
    reference = BridgeProcess(
        bridge_config(tmp_path / "unsharded", kubeconfig, [ns]), keep_stdout=True
    )
    everyone = [reference, *shards]
    victim = shards[1]
    mine = shard_range(3, 1, by)
    try:
        await asyncio.gather(*(b.start() for b in everyone))
        await asyncio.gather(*(b.wait_ready(90) for b in everyone))
        world.churn(20)
        await until_published(shards, world.final(), 60)
        kill9(victim)
        assert victim.proc is not None
        await victim.proc.wait()
        before = len(stream(victim))
        # While it is down: deletes in every slice (its own among them), and more.
        theirs = [k for k in world.live if mine.contains(world.live[k]["metadata"]["uid"])]
        others = [k for k in world.live if k not in theirs]
        doomed = theirs[:4] + others[:4]
        assert len(theirs) >= 4 and len(others) >= 4
        deletes = {f"{world.live[k]['metadata']['uid']}:deleted" for k in doomed}
        for key in doomed:
            world.delete(key)
        world.churn(10)
        theirs_now = {i for i in world.final() if not mine.contains(i.split(":", 1)[0])}
        await until_published([shards[0], shards[2]], theirs_now, 60)
        await victim.start()
        await victim.wait_ready(90)
        await until_published(shards, world.final(), 60)
        await until_published([reference], world.final(), 60)
    finally:
        await asyncio.gather(*(b.stop() for b in everyone if b.proc is not None))
    after = {i for i, _ in stream(victim)[before:]}
    own = {i for i in deletes if mine.contains(i.split(":", 1)[0])}
    assert own and own <= after, "its deletes after restart"
    want = per_object(stream(reference))
    for index, bridge in enumerate(shards):
        for e in bridge.stdout_events():
            assert in_slice(e, by, 3, index)
        got = per_object(stream(bridge))
        if bridge is victim:
            # A restart may publish again what it had not committed, with the same id
            # (and, for an object it had announced as added, as modified): consumers
            # drop a redelivery by its id.
            for uid, events in got.items():
                ids = list(dict.fromkeys(i for i, _ in events))
                assert ids == [i for i, _ in want[uid]], f"object {uid}"
        else:
            assert got == {uid: want[uid] for uid in got}, f"shard {index} changed by the crash"
            expected = {u for u in want if shard_range(3, index, by).contains(u)}
            assert set(got) == expected


async def test_resharding_two_to_three_and_back_with_nats_kv_publishes_only_the_changes(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, nats_control: NatsServer
) -> None:
    ns = kube_namespace
    kubeconfig = kube_cluster.write_kubeconfig(tmp_path / "kubeconfig")
    world = World(kube_cluster, [ns], random.Random(23))
    for _ in range(40):
        world.create()
    checkpoint = {"kind": "nats-kv", "bucket": "reshard", "commitInterval": 0.1}
    by: ShardField = "uid"

    def layout(shards: int, round: str) -> list[BridgeProcess]:
        return shard_bridges(
            tmp_path / round,
            kubeconfig,
            [ns],
            by,
            shards,
            checkpoint=checkpoint,
            sink_nats=nats_control.url,
        )

    async def run_until_published(bridges: list[BridgeProcess], ids: set[str]) -> None:
        try:
            await asyncio.gather(*(b.start() for b in bridges))
            await asyncio.gather(*(b.wait_ready(90) for b in bridges))
            await until_published(bridges, ids, 60)
            # Every shard has committed past what it published (a positive signal:
            # its checkpoint gauge), so a clean stop leaves nothing to settle.
            await asyncio.gather(*(committed(b) for b in bridges))
        finally:
            await asyncio.gather(*(b.stop() for b in bridges if b.proc is not None))

    async def change_meanwhile() -> list[tuple[str, str]]:
        start = len(world.ids)
        for key in sorted(world.live)[:6]:
            world.delete(key)
        for key in sorted(world.live)[:5]:
            world.update(key)
        for _ in range(5):
            world.create()
        return world.ids[start:]

    async def reshard(shards: int, round: str, step: str) -> list[BridgeProcess]:
        """Change objects while no bridge runs, then start ``shards`` shards: they
        publish exactly those changes, nothing unchanged."""
        during = await change_meanwhile()
        bridges = layout(shards, round)
        await run_until_published(bridges, {i for i, _ in during})
        published = Counter(ev for b in bridges for ev in stream(b))
        assert published == Counter(during), (
            f"{step} published {sorted(published - Counter(during))[:5]} beyond the changes, "
            f"missed {sorted(Counter(during) - published)[:5]}"
        )
        return bridges

    two = layout(2, "two")
    await run_until_published(two, world.final())
    three = await reshard(3, "three", "2 -> 3")
    for index, b in enumerate(three):
        assert all(in_slice(e, by, 3, index) for e in b.stdout_events())
    # Back to two shards: their own checkpoints are older than the three's.
    await reshard(2, "again", "3 -> 2")


async def committed(bridge: BridgeProcess) -> None:
    """Until the bridge's checkpoint gauge is at least the last resourceVersion it printed."""
    events = bridge.stdout_events()
    last = max((int(e["data"]["object"]["metadata"]["resourceVersion"]) for e in events), default=0)

    async def reached() -> bool:
        values = metric(await bridge.metrics(), "checkpoint_resource_version")
        return bool(values) and min(values) >= last

    await until(reached, 30, bridge.tail_log)
