"""Checkpoints across sharding layouts (bridge/delivery/reshard.py): each object's digest
comes from the newest checkpoint whose slice holds it; a per-replica store refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.checkpoints.memory import MemoryCheckpointStore
from bridge.checkpoints.sqlite import SqliteCheckpointStore
from bridge.delivery.reshard import adopt_layout, holds, parse_id, sharded_id
from bridge.errors import ConfigError
from bridge.ground.digest import Digest
from bridge.kube.sharding import ShardField, shard_range

BASE = "core/v1/pods"


def digests(n: int, ns: str = "ns") -> list[Digest]:
    return [Digest(f"{ns}{i % 7}/p{i}", f"uid-{i}", str(10 + i), f"f{i}") for i in range(n)]


async def write_layout(
    store: MemoryCheckpointStore,
    objects: list[Digest],
    shards: int,
    field: ShardField,
    watermark: str,
) -> None:
    for index in range(shards):
        rng = shard_range(shards, index, field)
        mine = [d for d in objects if holds(rng, d)]
        await store.commit(sharded_id(BASE, field, index, shards), watermark, mine, [])


def test_ids_name_their_slice_and_the_unsharded_id_covers_everything() -> None:
    rid = sharded_id(BASE, "uid", 1, 3)
    assert rid == "core/v1/pods~uid-1of3"
    assert parse_id(rid) == (BASE, shard_range(3, 1, "uid"))
    assert parse_id(BASE) == (BASE, None)
    assert parse_id("core/v1/pods@ns#abc~namespace-0of2")[0] == "core/v1/pods@ns#abc"


@pytest.mark.parametrize("field", ["uid", "namespace"])
async def test_two_to_three_takes_each_object_of_the_slice_from_the_old_layout(
    field: ShardField,
) -> None:
    store = MemoryCheckpointStore()
    objects = digests(300)
    await write_layout(store, objects, 2, field, "500")
    union: dict[str, Digest] = {}
    for index in range(3):
        rid = sharded_id(BASE, field, index, 3)
        assert await adopt_layout(store, rid, label="pods")
        cp = await store.load(rid)
        assert cp is not None
        assert cp.resource_version == "", "no watch resume from another slice's watermark"
        rng = shard_range(3, index, field)
        assert all(holds(rng, d) for d in cp.digests.values())
        assert not union.keys() & cp.digests.keys(), "an object in two shards"
        union |= cp.digests
    assert union == {d.key: d for d in objects}, "every object in exactly one new shard"


async def test_own_checkpoint_newer_than_every_other_layout_resumes_as_always() -> None:
    store = MemoryCheckpointStore()
    objects = digests(50)
    await write_layout(store, objects, 2, "uid", "500")
    await write_layout(store, objects[:10], 3, "uid", "900")
    rid = sharded_id(BASE, "uid", 0, 3)
    before = await store.load(rid)
    assert not await adopt_layout(store, rid, label="pods")
    assert await store.load(rid) == before


async def test_back_to_an_earlier_layout_takes_the_newer_one_deletes_included() -> None:
    store = MemoryCheckpointStore()
    objects = digests(200)
    await write_layout(store, objects, 2, "uid", "500")  # layout A
    # Layout B ran later: 40 objects were deleted and one changed meanwhile.
    changed = Digest(objects[60].key, objects[60].uid, "950", "changed")
    later = [changed if d.key == changed.key else d for d in objects[40:]]
    await write_layout(store, later, 3, "namespace", "1000")
    # Back to A: its own checkpoints are stale (500 < 1000).
    union: dict[str, Digest] = {}
    for index in range(2):
        rid = sharded_id(BASE, "uid", index, 2)
        assert await adopt_layout(store, rid, label="pods")
        cp = await store.load(rid)
        assert cp is not None
        union |= cp.digests
    assert union == {d.key: d for d in later}, "stale digests would republish B's deletes"


async def test_unsharded_checkpoint_feeds_the_first_sharded_layout_and_back() -> None:
    store = MemoryCheckpointStore()
    objects = digests(100)
    await store.commit(BASE, "300", objects, [])
    rid = sharded_id(BASE, "namespace", 1, 2)
    assert await adopt_layout(store, rid, label="pods")
    cp = await store.load(rid)
    assert cp is not None
    rng = shard_range(2, 1, "namespace")
    assert cp.digests == {d.key: d for d in objects if holds(rng, d)}
    # Shard 1 runs on (watermark 400), shard 0 never started: back to unsharded,
    # the shard's newer digests win its slice, the old unsharded ones the rest.
    newer = Digest(objects[0].key, objects[0].uid, "399", "newer")
    in_one = holds(rng, newer)
    await store.commit(rid, "400", [newer] if in_one else [], [])
    assert await adopt_layout(store, BASE, label="pods")
    back = await store.load(BASE)
    assert back is not None and back.resource_version == ""
    assert back.digests[newer.key].fingerprint == ("newer" if in_one else objects[0].fingerprint)
    assert back.digests.keys() == {d.key for d in objects}


async def test_a_per_replica_store_refuses_a_layout_change_in_one_line(tmp_path: Path) -> None:
    store = SqliteCheckpointStore(tmp_path / "state.db")
    await store.open()
    try:
        await store.commit(sharded_id(BASE, "uid", 0, 2), "500", digests(5), [])
        with pytest.raises(ConfigError) as e:
            await adopt_layout(store, sharded_id(BASE, "uid", 0, 3), label="v1/pods")
        message = str(e.value)
        assert "\n" not in message
        assert "v1/pods" in message and "core/v1/pods~uid-0of2" in message
        assert "nats-kv" in message and str(tmp_path / "state.db") in message
        # Its own layout, newest on this disk: resumes.
        assert not await adopt_layout(store, sharded_id(BASE, "uid", 0, 2), label="v1/pods")
    finally:
        await store.close()
