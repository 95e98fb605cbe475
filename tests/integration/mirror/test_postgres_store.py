"""The mirror's database side against a real PostgreSQL: newer wins, deletes stay deleted,
names are reused by new uids, bad input is skipped, a database that goes away (or kills
our connection at random instants) costs no change and doubles none, and a schema the
mirror did not make is refused."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import asyncpg
import pytest

from bridge.errors import ConfigError
from bridge.mirror.runner import DatabaseMirror
from bridge.mirror.store import PostgresStore
from tests.doubles.memory_source import MemorySource, event
from tests.fixtures.postgres import PostgresServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def store(dsn: str, **kw: Any) -> PostgresStore:
    options: dict[str, Any] = {"history": True, "keep_deleted": True, "tombstone_retention": 3600}
    return PostgresStore(dsn, "k8s", **(options | kw))


async def mirror_all(
    source: MemorySource, dsn: str, max_events: int = 3, **kw: Any
) -> DatabaseMirror:
    """Run a mirror until it read everything in ``source``."""
    mirror = DatabaseMirror(source, store(dsn, **kw), max_events=max_events, max_wait=0)
    stop = asyncio.Event()
    task = asyncio.create_task(mirror.run(stop))
    for _ in range(500):
        if source.drained() and mirror.stats.batches:
            break
        await asyncio.sleep(0.01)
    stop.set()
    await task
    return mirror


async def rows(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    conn = await asyncpg.connect(dsn)
    try:
        return [tuple(r) for r in await conn.fetch(sql)]
    finally:
        await conn.close()


async def test_an_older_state_never_overwrites_a_newer_one(postgres_dsn: str) -> None:
    src = MemorySource()
    for value in (
        event("a", "u1", 10),
        event("a", "u1", 5),  # a late copy of an older state (a replay, a second publisher)
        event("b", "u2", 7),
        event("b", "u2", 3),
        event("c", "u3", 4),
        event("c", "u3", 9, "deleted"),
        event("c", "u3", 8),  # an older state of a deleted object: it stays deleted
    ):
        src.append(value)
    await mirror_all(src, postgres_dsn, max_events=1)  # one event per transaction
    got = await rows(postgres_dsn, "SELECT name, uid, resource_version FROM k8s.objects ORDER BY 1")
    assert got == [("a", "u1", 10), ("b", "u2", 7)]
    gone = await rows(postgres_dsn, "SELECT name, uid, reason FROM k8s.deleted_objects")
    assert gone == [("c", "u3", "deleted")]


async def test_a_name_reused_by_a_new_uid_and_a_filtered_object_coming_back(
    postgres_dsn: str,
) -> None:
    src = MemorySource()
    for value in (
        event("a", "old", 10),
        event("a", "old", 11, "deleted"),
        event("a", "new", 12),
        event("a", "old", 10),  # late copy of the old uid: a newer object holds the name
        event("x", "ux", 20),
        event("x", "ux", 21, "filtered"),
        event("y", "uy", 30),
        event("y", "uy", 31, "filtered"),
        event("y", "uy", 32),  # back in view, newer
        event("z", "z1", 40),
        event("z", "z2", 45),  # z1's delete never came: z2 proves it gone
    ):
        src.append(value)
    mirror = await mirror_all(src, postgres_dsn, max_events=2)
    live = await rows(
        postgres_dsn, "SELECT name, uid, resource_version FROM k8s.objects ORDER BY 1"
    )
    assert live == [("a", "new", 12), ("y", "uy", 32), ("z", "z2", 45)]
    gone = await rows(postgres_dsn, "SELECT name, uid, reason FROM k8s.deleted_objects ORDER BY 1")
    assert gone == [("a", "old", "deleted"), ("x", "ux", "filtered"), ("z", "z1", "replaced")]
    history = await rows(postgres_dsn, "SELECT count(*) FROM k8s.changes")
    # Every event once, but the late copy of old:10 (the same id as the first).
    assert history == [(10,)]
    assert mirror.stats.changes == 11


async def test_messages_that_are_not_ours_are_counted_and_skipped(postgres_dsn: str) -> None:
    src = MemorySource()
    src.append(b"not json at all")
    src.append(b'{"id": "x", "type": "com.example.order.created", "source": "shop"}')
    src.append(event("a", "u1", 1))
    src.append(None)  # a Kafka tombstone record
    src.append(b'{"id": "y", "type": "io.k8s.core.v1.Pod.modified", "source": "k8s://c1/v1/pods"}')
    src.append(b'{"specversion": "1.0", "id": "hb:1:1", "type": "io.k8s.bridge.heartbeat", "source": "k8s://c1/v1/pods", "data": {}}')  # fmt: skip
    src.append(event("a", "u1", 2))
    mirror = await mirror_all(src, postgres_dsn, max_events=2)
    assert mirror.stats.skipped == 4
    assert mirror.stats.heartbeats == 1
    assert await rows(postgres_dsn, "SELECT resource_version FROM k8s.objects") == [(2,)]
    # Read, not lost: the position is past every message.
    assert await rows(postgres_dsn, "SELECT next_position FROM k8s.positions") == [(7,)]


async def settle(dsn: str, count: int, timeout: float = 20.0) -> None:
    """Wait until the history holds ``count`` changes (or give up: the test then says why)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        try:
            if await rows(dsn, "SELECT count(*) FROM k8s.changes") == [(count,)]:
                return
        except (OSError, asyncpg.PostgresError):
            pass
        await asyncio.sleep(0.05)


def churn(seed: int, n: int, clusters: int = 2) -> tuple[list[bytes], dict[tuple[str, str], int]]:
    """``n`` random changes of a few names in two clusters, and the state they leave."""
    rng = random.Random(seed)
    rv = 0
    live: dict[tuple[str, str], tuple[str, int]] = {}  # (cluster, name) → (uid, rv)
    out: list[bytes] = []
    for i in range(n):
        rv += 1
        cluster = f"c{rng.randrange(clusters)}"
        name = f"p{rng.randrange(40)}"
        held = live.get((cluster, name))
        if held is not None and rng.random() < 0.2:
            out.append(event(name, held[0], rv, "deleted", cluster=cluster))
            del live[(cluster, name)]
        else:
            uid = held[0] if held else f"{cluster}-{name}-{i}"
            out.append(event(name, uid, rv, cluster=cluster))
            live[(cluster, name)] = (uid, rv)
    return out, {k: v[1] for k, v in live.items()}


async def test_connections_killed_at_random_instants_lose_and_double_nothing(
    postgres_server: PostgresServer, postgres_dsn: str
) -> None:
    """pg_terminate_backend at random instants while batches are written: the positions
    are in the rows' transactions, so every event lands exactly once (history counts
    each once, with no gap) and the objects equal the churn's final state."""
    seed = random.randrange(10**6)
    values, final = churn(seed, 6000)
    src = MemorySource()
    for v in values:
        src.append(v)
    mirror = DatabaseMirror(
        src, store(postgres_dsn), max_events=25, max_wait=0, backoff=(0.01, 0.05)
    )
    stop = asyncio.Event()
    task = asyncio.create_task(mirror.run(stop))
    killer = await asyncpg.connect(postgres_server.dsn)
    rng = random.Random(seed)
    kills = 0
    try:
        # Kills at random instants, while the batches are being written.
        while kills < 12 and not src.drained() and not task.done():
            await asyncio.sleep(rng.uniform(0.01, 0.2))
            kills += await killer.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = $1 AND pid <> pg_backend_pid()",
                postgres_dsn.rsplit("/", 1)[1],
            )
    finally:
        await killer.close()
    await settle(postgres_dsn, len(values))
    stop.set()
    await task
    ids = await rows(postgres_dsn, "SELECT count(*), count(DISTINCT position) FROM k8s.changes")
    assert ids == [(len(values), len(values))], f"seed {seed}, {mirror.stats}"
    got = await rows(postgres_dsn, "SELECT cluster, name, resource_version FROM k8s.objects")
    assert {(c, n): rv for c, n, rv in got} == final, f"seed {seed}"
    assert kills >= 3, f"only {kills} kills landed (seed {seed})"


async def test_a_database_that_goes_away_pauses_and_resumes_without_a_gap(
    postgres_control: PostgresServer,
) -> None:
    dsn = postgres_control.new_database()
    values, final = churn(7, 600)
    src = MemorySource()
    mirror = DatabaseMirror(src, store(dsn), max_events=20, max_wait=0, backoff=(0.05, 0.2))
    stop = asyncio.Event()
    task = asyncio.create_task(mirror.run(stop))
    for v in values[:300]:
        src.append(v)
    await asyncio.sleep(0.3)
    postgres_control.stop("immediate")
    for v in values[300:]:
        src.append(v)  # the bus goes on while the database is away
    await asyncio.sleep(1.0)
    assert not task.done(), "the mirror stopped when the database went away"
    postgres_control.start()
    await settle(dsn, 600)
    stop.set()
    await task
    assert await rows(dsn, "SELECT count(*), count(DISTINCT position) FROM k8s.changes") == [
        (600, 600)
    ]
    got = await rows(dsn, "SELECT cluster, name, resource_version FROM k8s.objects")
    assert {(c, n): rv for c, n, rv in got} == final
    assert mirror.stats.database_outages >= 1


async def test_a_schema_it_did_not_create_is_refused(postgres_dsn: str) -> None:
    conn = await asyncpg.connect(postgres_dsn)
    try:
        await conn.execute("CREATE SCHEMA k8s; CREATE TABLE k8s.objects (id int)")
        with pytest.raises(ConfigError, match=r"holds tables k8s-bridge mirror did not create"):
            await store(postgres_dsn).open()
        await conn.execute("DROP SCHEMA k8s CASCADE")
        s = store(postgres_dsn)
        await s.open()  # a new schema: created
        await s.close()
        await conn.execute("ALTER TABLE k8s.objects ADD COLUMN extra int")
        with pytest.raises(ConfigError, match=r"k8s\.objects does not have the mirror's columns"):
            await store(postgres_dsn).open()
    finally:
        await conn.close()


async def test_two_mirrors_of_one_source_write_each_change_once(postgres_dsn: str) -> None:
    """A stray second replica: each batch moves a position only from where it started,
    so the two take turns (the loser reads again) and every change lands once."""
    values, final = churn(11, 2000)
    sources = [MemorySource(partitions=2), MemorySource(partitions=2)]
    for i, v in enumerate(values):
        for src in sources:
            src.append(v, partition=i % 2)
    mirrors = [
        DatabaseMirror(src, store(postgres_dsn), max_events=15, max_wait=0, backoff=(0.01, 0.05))
        for src in sources
    ]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(m.run(stop)) for m in mirrors]
    await settle(postgres_dsn, len(values))
    stop.set()
    await asyncio.gather(*tasks)
    assert await rows(
        postgres_dsn, "SELECT count(*), count(DISTINCT event_id) FROM k8s.changes"
    ) == [(len(values), len(values))]
    got = await rows(postgres_dsn, "SELECT cluster, name, resource_version FROM k8s.objects")
    assert {(c, n): rv for c, n, rv in got} == final
    assert sum(m.stats.rereads for m in mirrors) > 0, "the mirrors never met"


async def test_without_keep_deleted_tombstones_go_after_the_retention(postgres_dsn: str) -> None:
    src = MemorySource()
    src.append(event("a", "u1", 1))
    src.append(event("a", "u1", 2, "deleted", time="2020-01-01T00:00:00Z"))
    src.append(event("b", "u2", 3))
    src.append(event("b", "u2", 4, "deleted"))  # observed "now" (2026-11-27): kept
    await mirror_all(src, postgres_dsn, keep_deleted=False, tombstone_retention=86400 * 365)
    s = store(postgres_dsn, keep_deleted=False, tombstone_retention=86400 * 365)
    await s.open()
    try:
        assert await s.prune() == 1
    finally:
        await s.close()
    assert await rows(postgres_dsn, "SELECT uid FROM k8s.deleted_objects") == [("u2",)]
    kept = store(postgres_dsn, keep_deleted=True, tombstone_retention=1)
    await kept.open()
    try:
        assert await kept.prune() == 0  # keepDeleted: never
    finally:
        await kept.close()


async def test_readiness_follows_the_database(postgres_control: PostgresServer) -> None:
    from bridge.mirror.metrics import readiness

    dsn = postgres_control.new_database()
    src = MemorySource()
    mirror = DatabaseMirror(src, store(dsn), max_events=10, max_wait=0.01, backoff=(0.05, 0.1))
    assert readiness(mirror) == (False, ["not reading yet: connecting to PostgreSQL and the bus"])
    stop = asyncio.Event()
    task = asyncio.create_task(mirror.run(stop))
    try:
        for _ in range(200):
            if readiness(mirror)[0]:
                break
            await asyncio.sleep(0.02)
        assert readiness(mirror) == (True, [])
        postgres_control.stop("immediate")
        src.append(event("a", "u1", 1))
        for _ in range(200):
            if not readiness(mirror)[0]:
                break
            await asyncio.sleep(0.02)
        assert readiness(mirror) == (False, ["PostgreSQL unavailable: paused, retrying"])
        postgres_control.start()
        await settle(dsn, 1)
        assert readiness(mirror) == (True, [])
    finally:
        stop.set()
        await task
