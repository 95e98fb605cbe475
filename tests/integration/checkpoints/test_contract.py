"""The CheckpointStore contract, run against every store: memory, SQLite, NATS KV and
a Kafka topic (on a real Apache Kafka broker).

What the outbox relies on: an empty watermark is a checkpoint (not "none"),
write-ahead rows (``resource_version=None``) keep their state and prior uids
and leave the watermark alone, deletes apply before upserts, and a reopened
store reads back exactly what was committed.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from bridge.checkpoints import CheckpointStore
from bridge.checkpoints.base import load_bulk
from bridge.checkpoints.kafka import KafkaCheckpointStore
from bridge.checkpoints.memory import MemoryCheckpointStore
from bridge.checkpoints.nats_kv import NatsKvCheckpointStore
from bridge.checkpoints.sqlite import SqliteCheckpointStore
from bridge.ground.digest import CERTAIN, DELETING, UNCERTAIN, Digest
from bridge.ground.records import LooseRecord, pack_state, unpack_state

pytestmark = pytest.mark.integration

Factory = Callable[[], CheckpointStore]


@pytest.fixture(
    params=["memory", "sqlite", "nats-kv", pytest.param("kafka", marks=pytest.mark.real)]
)
async def make(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Factory]:
    """A factory of stores that all see the same data (a "reopen" is a new instance)."""
    memory = MemoryCheckpointStore()
    bucket = "cp-" + uuid.uuid4().hex[:8]
    opened: list[CheckpointStore] = []
    # Only the server the store needs (a test of one store starts no other).
    if request.param == "nats-kv":
        nats_server: str = request.getfixturevalue("nats_server")
    elif request.param == "kafka":
        bootstrap: str = request.getfixturevalue("real_kafka").bootstrap

    def factory() -> CheckpointStore:
        store: CheckpointStore
        if request.param == "memory":
            store = memory
        elif request.param == "sqlite":
            store = SqliteCheckpointStore(tmp_path / "state.db")
        elif request.param == "kafka":
            store = KafkaCheckpointStore({"bootstrap_servers": [bootstrap]}, "cp-" + bucket)
        else:
            store = NatsKvCheckpointStore([nats_server], bucket=bucket)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        await store.close()


async def reopen(make: Factory, old: CheckpointStore) -> CheckpointStore:
    await old.close()
    store = make()
    await store.open()
    return store


async def test_nothing_committed_loads_none(make: Factory) -> None:
    store = make()
    await store.open()
    assert await store.load("core/v1/pods") is None


async def test_an_empty_watermark_is_a_checkpoint(make: Factory) -> None:
    """A crash before the first list completed: the digests must survive."""
    store = make()
    await store.open()
    await store.commit("r", "", [Digest("ns/a", "ua", "5", "f")], [])
    store = await reopen(make, store)
    cp = await store.load("r")
    assert cp is not None
    assert cp.resource_version == ""
    assert cp.digests == {"ns/a": Digest("ns/a", "ua", "5", "f")}


async def test_write_ahead_rows_keep_their_state_and_leave_the_watermark(make: Factory) -> None:
    store = make()
    await store.open()
    await store.commit("r", "10", [Digest("ns/a", "ua", "9", "f")], [])
    ahead = [
        Digest("ns/a", "ua2", "11", "g", UNCERTAIN, prior="ua"),
        Digest("ns/b", "ub", "12", "", DELETING),
    ]
    await store.commit("r", None, ahead, [])
    store = await reopen(make, store)
    cp = await store.load("r")
    assert cp is not None and cp.resource_version == "10"
    assert cp.digests == {d.key: d for d in ahead}


async def test_write_ahead_before_any_watermark_is_loaded(make: Factory) -> None:
    """The very first write of a new resource is a write-ahead row."""
    store = make()
    await store.open()
    await store.commit("r", None, [Digest("a", "ua", "3", "f", UNCERTAIN)], [])
    cp = await store.load("r")
    assert cp is not None and cp.resource_version == ""
    assert cp.digests["a"].state == UNCERTAIN


async def test_certain_after_the_ack_and_deletes_before_upserts(make: Factory) -> None:
    store = make()
    await store.open()
    await store.commit("r", None, [Digest("a", "ua", "3", "f", UNCERTAIN)], [])
    await store.commit("r", "3", [Digest("a", "ua", "3", "f", CERTAIN)], [])
    await store.commit("r", "4", [Digest("a", "ua2", "4", "g")], ["a"])  # delete + re-create
    cp = await store.load("r")
    assert cp is not None and cp.resource_version == "4"
    assert cp.digests == {"a": Digest("a", "ua2", "4", "g")}
    await store.commit("r", "5", [], ["a"])
    cp = await store.load("r")
    assert cp is not None and cp.digests == {} and cp.resource_version == "5"


async def test_resources_are_separate(make: Factory) -> None:
    store = make()
    await store.open()
    await store.commit("core/v1/pods", "7", [Digest("a", "u", "7", "f")], [])
    await store.commit("apps/v1/deployments@ns", "8", [Digest("a", "v", "8", "g")], [])
    pods = await store.load("core/v1/pods")
    deployments = await store.load("apps/v1/deployments@ns")
    assert pods is not None and deployments is not None
    assert pods.digests["a"].uid == "u" and deployments.digests["a"].uid == "v"


async def test_keys_and_values_come_back_byte_for_byte(make: Factory) -> None:
    """Rows may travel as JSON text (SQLite): quotes, backslashes, non-ASCII and
    number-like strings must come back as the same strings."""
    odd = ['ns/a"b', "ns/back\\slash", "ns/ünïcödé-名前", "ns/1e3", "ns/ lead", "cluster-scoped"]
    rows = [
        Digest(k, f"uid-{i}", "007", '{"x": 1}', UNCERTAIN, prior="") for i, k in enumerate(odd)
    ]
    store = make()
    await store.open()
    await store.commit("r", None, rows, [])
    await store.commit("r", "9", [], [odd[0]])
    store = await reopen(make, store)
    cp = await store.load("r")
    assert cp is not None and cp.resource_version == "9"
    assert cp.digests == {d.key: d for d in rows[1:]}


async def test_the_last_row_of_a_key_in_one_commit_wins(make: Factory) -> None:
    store = make()
    await store.open()
    await store.commit(
        "r", None, [Digest("a", "ua", "3", "f", UNCERTAIN), Digest("a", "ua", "4", "g")], []
    )
    cp = await store.load("r")
    assert cp is not None and cp.digests == {"a": Digest("a", "ua", "4", "g")}


async def test_a_commit_of_many_keys_is_written_whole_in_order(make: Factory) -> None:
    """More rows than one SQLite statement takes: every row lands, in order (a key's
    later row wins across statements), with the watermark, in one transaction."""
    rows = [Digest(f"ns/p{i}", f"u{i}", str(100 + i), "f") for i in range(2_500)]
    rows[1_500] = Digest("ns/p10", "u10", "9999", "g")  # a later row of p10, another statement
    store = make()
    await store.open()
    await store.commit("r", None, [Digest("ns/gone", "ug", "1", "f", UNCERTAIN)], [])
    await store.commit("r", "9999", rows, ["ns/gone"])
    store = await reopen(make, store)
    cp = await store.load("r")
    assert cp is not None and cp.resource_version == "9999"
    assert len(cp.digests) == 2_499 and "ns/gone" not in cp.digests
    assert cp.digests["ns/p10"] == Digest("ns/p10", "u10", "9999", "g")
    assert cp.digests["ns/p2499"] == Digest("ns/p2499", "u2499", "2599", "f")


async def test_resource_ids_and_watermarks_of_every_committed_resource(make: Factory) -> None:
    # What re-sharding lists to find the checkpoints an earlier layout left.
    from bridge.checkpoints.base import ListableStore

    store = make()
    await store.open()
    assert isinstance(store, ListableStore)
    assert await store.resource_ids() == []
    await store.commit("core/v1/pods~uid-1of3", "100", [Digest("ns/a", "u", "1", "f")], [])
    await store.commit("apps/v1/deployments@ns", "", [], [])
    await store.commit("apps/v1/deployments@ns", "7", [], [])
    store = await reopen(make, store)
    assert await store.resource_ids() == ["apps/v1/deployments@ns", "core/v1/pods~uid-1of3"]
    # And each one's watermark alone, without its digests.
    from bridge.checkpoints.base import WatermarkReader

    assert isinstance(store, WatermarkReader)
    assert await store.watermark("core/v1/pods~uid-1of3") == "100"
    assert await store.watermark("apps/v1/deployments@ns") == "7"
    assert await store.watermark("core/v1/pods") is None


def _canonical(i: int) -> Digest:
    """A digest as a real API server's object gives it: it packs (bridge/ground/records.py)."""
    uid = str(uuid.UUID(int=(i + 1) * 0x9E3779B97F4A7C15_9E3779B97F4A7C15 % 2**128))
    return Digest(f"ns/p{i:05d}", uid, str(10**12 + i), f"{i * 0xFACE:032x}")


async def test_a_bulk_load_is_the_load_with_plain_rows_packed(make: Factory) -> None:
    """``load_bulk`` (a restart) gives what ``load`` gives: certain rows with no earlier
    incarnation packed in the cache's layout when they pack, loose when they do not,
    every other row as its digest; across several of SQLite's read chunks, with one
    chunk holding a row that does not pack."""
    from bridge.checkpoints import sqlite

    canonical = [_canonical(i) for i in range(2_500)]
    odd = [
        Digest("ns/p00100x", "not-a-uuid", "5", "f"),  # sorts inside the second chunk
        Digest("ns/p00200x", canonical[0].uid.upper(), "5", canonical[0].fingerprint),
        Digest("ns/p00300x", canonical[0].uid, "007", canonical[0].fingerprint),
    ]
    others = [
        Digest("ns/q1", canonical[1].uid, "7", canonical[1].fingerprint, UNCERTAIN),
        Digest("ns/q2", "u", "8", "f", DELETING),
        Digest("ns/q3", canonical[2].uid, "9", canonical[2].fingerprint, prior="old-uid"),
    ]
    store = make()
    await store.open()
    await store.commit("r", "42", [*canonical, *odd, *others], [])
    await store.commit("s", "43", canonical, [])  # all packed: the whole read in columns
    store = await reopen(make, store)
    cp = await store.load("r")
    cp_s = await store.load("s")
    store = await reopen(make, store)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sqlite, "_CHUNK", 1_000)
        bulk = await load_bulk(store, "r")
        bulk_s = await load_bulk(store, "s")
    assert cp_s is not None and bulk_s is not None and len(bulk_s) == len(canonical)
    assert not bulk_s.loose and not bulk_s.others
    assert {
        k: Digest(k, *unpack_state(v)[:3])
        for k, v in zip(bulk_s.packed.keys, bulk_s.packed.packed, strict=True)
    } == cp_s.digests
    assert cp is not None and bulk is not None and bulk.resource_version == "42"
    assert len(bulk) == len(cp.digests) == 2_506
    packed = dict(zip(bulk.packed.keys, bulk.packed.packed, strict=True))
    assert packed == {
        d.key: pack_state(d.uid, d.resource_version, d.fingerprint) for d in canonical
    }
    assert sorted(bulk.loose, key=lambda r: r.key) == [
        LooseRecord(d.key, d.uid, d.resource_version, d.fingerprint, False) for d in odd
    ]
    assert sorted(bulk.others, key=lambda d: d.key) == others
    for key, state in packed.items():
        uid, rv, fp, _ = unpack_state(state)
        assert cp.digests[key] == Digest(key, uid, rv, fp)
    assert await load_bulk(store, "nothing") is None
