"""One kind split across three ``k8s-bridge run`` processes (``sharding.by``: uid,
namespace) against the emulator, beside one unsharded bridge: under churn (creates,
updates, deletes, a compaction) the shards' streams together equal the unsharded
one event for event, no object in two shards, none missing; with the emulator
ignoring ``shardSelector`` (the gate off) the same, filtered on the client with one
warning per resource scope (tests/real/test_sharded_bridges_real.py runs the same
against kube-apiserver)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import orjson
import pytest

from bridge.emulator import Emulator
from bridge.kube.sharding import ShardField, shard_range
from tests.e2e.bridge_process import BridgeProcess, cli
from tests.e2e.sharding_world import (
    World,
    bridge_config,
    check_union,
    per_object,
    shard_bridges,
    stream,
    until_published,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

NAMESPACES = [f"team-{i}" for i in range(6)]


@pytest.mark.parametrize(("by", "gate"), [("uid", "on"), ("namespace", "on"), ("uid", "off")])
async def test_three_shards_together_publish_what_one_bridge_does(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, by: ShardField, gate: str
) -> None:
    # Gate off: the emulator ignores shardSelector as kube-apiserver does without
    # ShardedListAndWatch; the shards filter on the client.
    emulator.sharded_list_watch = gate == "on"
    world = World(emulator, NAMESPACES, random.Random(26))
    for _ in range(30):
        world.create()
    reference = BridgeProcess(
        bridge_config(tmp_path / "unsharded", kubeconfig, NAMESPACES), keep_stdout=True
    )
    shards = shard_bridges(tmp_path, kubeconfig, NAMESPACES, by, 3)
    everyone = [reference, *shards]
    try:
        await asyncio.gather(*(b.start() for b in everyone))
        await asyncio.gather(*(b.wait_ready(60) for b in everyone))
        world.churn(60)
        emulator.store.compact()
        world.churn(60)
        await until_published([reference], world.final(), 60)
        await until_published(shards, world.final(), 60)
        for b in shards:
            warned = b.log.read_text().count("the API server ignores shardSelector")
            assert warned == (0 if gate == "on" else len(NAMESPACES)), b.tail_log()
    finally:
        await asyncio.gather(*(b.stop() for b in everyone if b.proc is not None))
    # One pipeline per namespace: order holds per object, not across namespaces.
    assert per_object(stream(reference)) == per_object(world.ids), (
        "the unsharded bridge missed or added a change"
    )
    check_union(shards, stream(reference), by)


async def test_replay_of_one_shard_after_compaction_diffs_its_slice_against_its_checkpoint(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator
) -> None:
    world = World(emulator, ["team-0"], random.Random(7))
    for _ in range(20):
        world.create()
    shards = shard_bridges(tmp_path, kubeconfig, ["team-0"], "uid", 2)
    try:
        await asyncio.gather(*(b.start() for b in shards))
        await asyncio.gather(*(b.wait_ready(60) for b in shards))
        await until_published(shards, world.final(), 30)
        mid = emulator.resource_version
    finally:
        await asyncio.gather(*(b.stop() for b in shards if b.proc is not None))
    # While nothing runs: deletes in both slices, then the history is gone.
    mine = shard_range(2, 1, "uid")
    doomed = sorted(world.live)[:8]
    gone = {world.live[k]["metadata"]["uid"] for k in doomed}
    for key in doomed:
        world.delete(key)
    emulator.chaos.compact()
    rc, out, err = await cli(
        "replay", "--config", str(shards[1].config), "--resource", "Pod",
        "--from-resource-version", str(mid),
    )  # fmt: skip
    assert rc == 0, err
    assert "checkpoint of core/v1/pods@team-0~uid-1of2" in err, err
    events = [orjson.loads(line) for line in out.splitlines() if line.strip()]
    # Its slice's deletes, and nothing of the other slice or of what did not change.
    assert sorted(e["id"] for e in events) == sorted(
        f"{u}:deleted" for u in gone if mine.contains(u)
    )
    assert any(not mine.contains(u) for u in gone), "the other slice lost objects too"
