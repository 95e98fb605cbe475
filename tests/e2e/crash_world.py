"""The kill -9 crash property, against the API emulator or a real kube-apiserver.

A ``World`` scripts random changes to Pods in one namespace through a
``Target`` (the emulator, or a ``KubeCluster``: both answer ``create``,
``patch``, ``delete`` and ``get`` synchronously) and records every state they
produced. ``crash_rounds`` kills the bridge at random moments, changes and
compacts while it is down, and finally lets a bridge settle;
``check_property`` then holds what the bus received against the record:

1. every delete of an object that ever reached the bus is published;
2. every live object's current state is the last event for it;
3. nothing else is published: every event is a real state of its object (or a
   real delete), in resourceVersion order per object, and a redelivery keeps
   its id (JetStream's duplicate window then drops it: no id twice on NATS).

The seed is in every failure message (``CRASH_SEED=… pytest …`` replays a run).
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson
from aiokafka import AIOKafkaConsumer

from bridge.checkpoints.kafka import KafkaCheckpointStore
from bridge.checkpoints.nats_kv import NatsKvCheckpointStore
from bridge.delivery.changes import Fingerprinter
from bridge.errors import CheckpointError
from bridge.ground.digest import CERTAIN
from tests.e2e.bridge_process import BridgeProcess, kill9
from tests.fixtures.waiting import until

FINGERPRINT = Fingerprinter([]).fingerprint

Body = dict[str, Any]


class Objects(Protocol):
    """What the World changes objects through (``Emulator`` and ``KubeCluster`` alike)."""

    def create(self, obj: Body) -> Body: ...

    def patch(
        self, api_version: str, kind: str, name: str, patch: Any, namespace: str | None = None
    ) -> Body: ...

    def delete(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> Body: ...

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Body: ...


def node_name_patch(rng: random.Random) -> Body:
    """A change the emulator accepts: it lets a Pod's spec.nodeName change."""
    return {"spec": {"nodeName": f"n{rng.randrange(10**6)}"}}


def annotation_patch(rng: random.Random) -> Body:
    """A change kube-apiserver accepts: it refuses most changes to a Pod's spec (nodeName too)."""
    return {"metadata": {"annotations": {"n": f"n{rng.randrange(10**6)}"}}}


@dataclass
class Target:
    """Where the World's Pods live and how their server forgets history."""

    objects: Objects
    namespace: str
    # Forgets history up to now (410 for older resourceVersions); returns what it did.
    compact: Callable[[], str]
    # The resourceVersion a settled checkpoint's watermark reaches; None: the World's
    # newest change (a real etcd's revision moves with every other writer too).
    settled_rv: Callable[[], int] | None = None
    mutate: Callable[[random.Random], Body] = node_name_patch
    # Changes per second while the bridge runs, and at most this many while it is down.
    rate: float = 150.0
    down_changes: int = 60
    # How long each round's bridge runs before its kill -9, at random in this range
    # (a bridge process takes a second or two to start: kills early in that range
    # land before it lists, later ones in its first sync or its watch).
    run_seconds: tuple[float, float] = (0.3, 2.5)
    # Count run_seconds from when the bridge's health port answers rather than from
    # the process start: where starting takes seconds, no round is wasted on a kill
    # before the bridge did anything. The World churns meanwhile all the same.
    from_health: bool = False


def pod(name: str, namespace: str) -> Body:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "nginx:1"}]},
        "status": {"phase": "Pending"},
    }


class World:
    """Random changes to the target's Pods, and a record of every state they produced."""

    def __init__(self, target: Target, rng: random.Random) -> None:
        self.target = target
        self.objects = target.objects
        self.ns = target.namespace
        self.rng = rng
        self.live: dict[str, str] = {}  # name → uid
        self.states: set[tuple[str, str]] = set()  # (uid, resourceVersion) ever served
        self.deleted: set[str] = set()  # uids deleted
        # uid → the delete's resourceVersion. kube-apiserver deletes a Pod in two
        # writes (deletionTimestamp set, then the delete); the first's state is real
        # too, but its resourceVersion is not in the DELETE's answer.
        self.delete_rv: dict[str, int] = {}
        self.gone_names: list[str] = []
        self.recent: list[str] = []  # names touched last, newest at the end
        self.n = 0
        self.last_rv = 0  # the newest resourceVersion a change of the World made
        self.log: list[str] = []  # what happened, for failure messages
        self.round = 0

    def create(self, name: str | None = None) -> None:
        if name is None:
            self.n += 1
            name = f"p{self.n}"
        obj = self.objects.create(pod(name, self.ns))
        self._record(name, obj)

    def _record(self, name: str, obj: Body) -> None:
        md = obj["metadata"]
        self.log.append(f"r{self.round} {name} {md['uid']} rv={md['resourceVersion']}")
        self.recent = [*self.recent[-49:], name]
        self.live[name] = md["uid"]
        self.states.add((md["uid"], md["resourceVersion"]))
        self.last_rv = max(self.last_rv, int(md["resourceVersion"]))

    def pick(self, recent_first: bool) -> str:
        """A live name; while the bridge is down, mostly one that changed just before."""
        recent = [n for n in self.recent if n in self.live]
        if recent_first and recent and self.rng.random() < 0.7:
            return self.rng.choice(recent)
        return self.rng.choice(sorted(self.live))

    def step(self, recent_first: bool = False) -> None:
        r = self.rng.random()
        if not self.live or r < 0.3:
            if self.gone_names and self.rng.random() < 0.3:
                # The same name again: a new uid (delete + add downstream).
                self.create(self.gone_names.pop(self.rng.randrange(len(self.gone_names))))
            else:
                self.create()
        elif r < 0.75:
            name = self.pick(recent_first)
            patch = self.target.mutate(self.rng)
            obj = self.objects.patch("v1", "Pod", name, patch, namespace=self.ns)
            self._record(name, obj)
        else:
            name = self.pick(recent_first)
            gone = self.objects.delete("v1", "Pod", name, namespace=self.ns)
            rv = gone["metadata"]["resourceVersion"]
            self.log.append(f"r{self.round} {name} deleted rv={rv}")
            self.last_rv = max(self.last_rv, int(rv))
            uid = self.live.pop(name)
            self.deleted.add(uid)
            self.delete_rv[uid] = int(rv)
            self.gone_names.append(name)

    async def churn(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while loop.time() < end:
            self.step()
            await asyncio.sleep(1 / self.target.rate)

    def settled_rv(self) -> int:
        return self.target.settled_rv() if self.target.settled_rv else self.last_rv


def history(evs: list[Body]) -> list[str]:
    return [f"{e['subject']} {e['id']} {e['type'].rsplit('.', 1)[-1]}" for e in evs]


def check_property(
    world: World, events: list[Body], seed: int, bus: str, *, metadata_only: bool = False
) -> None:
    """``metadata_only``: events carry apiVersion, kind and metadata (``metadataOnly``),
    so a live object's last event is compared with that part of it."""
    where = f"(CRASH_SEED={seed}, {bus}, {len(events)} events)"
    first: dict[str, Body] = {}
    for e in events:
        first.setdefault(e["id"], e)
    by_uid: dict[str, list[Body]] = defaultdict(list)
    last_by_subject: dict[str, Body] = {}
    for e in first.values():
        uid = e["data"]["object"]["metadata"]["uid"]
        by_uid[uid].append(e)
    for e in events:
        last_by_subject[e["subject"]] = e

    for uid, evs in by_uid.items():
        upserts = [e for e in evs if not e["type"].endswith(".deleted")]
        deletes = [e for e in evs if e["type"].endswith(".deleted")]
        # 3. every event is a real state of its object, or a real delete...
        for e in upserts:
            if (uid, e["resourceversion"]) not in world.states:
                # Only the terminating state a two-write delete leaves is not recorded.
                md = e["data"]["object"]["metadata"]
                terminating = md.get("deletionTimestamp") and int(
                    e["resourceversion"]
                ) < world.delete_rv.get(uid, 0)
                assert terminating, f"invented state {e['id']} {where}"
        for e in deletes:
            assert uid in world.deleted, f"delete of a live object {e['id']} {where}"
            assert e["id"] == f"{uid}:deleted", f"delete id {e['id']} {where}"
        # ...in resourceVersion order per object, a delete last.
        rvs = [int(e["resourceversion"]) for e in upserts]
        assert rvs == sorted(rvs) and len(set(rvs)) == len(rvs), f"order of {uid}: {rvs} {where}"
        if deletes:
            assert evs[-1]["type"].endswith(".deleted"), f"{uid}: events after its delete {where}"
        # 1. every object that reached the bus and is gone has its delete.
        if uid not in world.live.values():
            name = evs[0]["subject"].split("/")[1]
            told = [line for line in world.log if f" {name} " in line or " p" not in line]
            assert deletes, f"delete of {uid} never published: {history(evs)} {told} {where}"

    # 2. every live object's current state is the last event for it.
    ns = world.ns
    for name, uid in world.live.items():
        current = world.objects.get("v1", "Pod", name, namespace=ns)
        last = last_by_subject.get(f"{ns}/{name}")
        assert last is not None, f"{ns}/{name} never published {where}"
        assert not last["type"].endswith(".deleted"), f"{ns}/{name} last is a delete {where}"
        obj = last["data"]["object"]
        assert obj["metadata"]["uid"] == uid, f"{ns}/{name} last event is another uid {where}"
        if metadata_only:
            current = {k: current[k] for k in ("apiVersion", "kind", "metadata")}
        assert FINGERPRINT(obj) == FINGERPRINT(current), f"{ns}/{name} stale {where}"


Settled = Callable[[World], Awaitable[bool]]


async def crash_rounds(
    target: Target,
    config: Path,
    rng: random.Random,
    rounds: int,
    is_settled: Settled,
    *,
    initial: int = 1500,
    seed: int | None = None,
    kill: Callable[[BridgeProcess, World], Awaitable[None]] | None = None,
) -> World:
    """``initial`` Pods, then ``rounds`` of start, churn, kill -9, change (and compact) while
    down; then a last bridge runs until ``is_settled``. The World it leaves is the record.
    ``kill``: how each round's bridge dies after its churn (default: kill -9 at once),
    e.g. stopped at instants until it is caught inside what the test aims at."""
    world = World(target, rng)
    for _ in range(initial):  # a first list long enough to be killed in the middle of
        world.create()
    for r in range(rounds):
        world.round = r
        bridge = BridgeProcess(config)
        await bridge.start()
        if target.from_health:
            await started(bridge, world)
        await world.churn(rng.uniform(*target.run_seconds))
        world.log.append(f"r{r} kill at rv={world.last_rv}")
        if kill is None:
            kill9(bridge)
        else:
            await kill(bridge, world)
        assert bridge.proc is not None
        await bridge.proc.wait()
        for _ in range(rng.randrange(target.down_changes)):
            world.step(recent_first=True)
        world.log.append(f"r{r} down")
        if rng.random() < 0.5:
            world.log.append(f"r{r} {target.compact()} at rv={world.last_rv}")
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready(60)
        await world.churn(0.5)
        await until(
            lambda: is_settled(world),
            60,
            lambda: (
                f"not settled (CRASH_SEED={seed}) at rv {world.settled_rv()}; "
                f"log:\n{bridge.tail_log()}"
            ),
        )
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
    return world


async def started(bridge: BridgeProcess, world: World, timeout: float = 60.0) -> None:
    """Churn until ``bridge`` answers on its health port."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (await bridge.readyz())[0] == 0:
        assert bridge.proc is not None and bridge.proc.returncode is None, bridge.tail_log()
        assert loop.time() < deadline, f"bridge not listening; log:\n{bridge.tail_log()}"
        await world.churn(0.2)


def sqlite_settled(db: Path, resource_id: str = "core/v1/pods") -> Settled:
    """The checkpoint caught up: the watermark reached the World's, nothing is uncertain."""

    async def settled(world: World) -> bool:
        con = sqlite3.connect(db)
        try:
            row = con.execute(
                "select resource_version from watermarks where resource_id = ?", (resource_id,)
            ).fetchone()
            pending = con.execute("select count(*) from digests where state != ''").fetchone()[0]
        finally:
            con.close()
        return (
            row is not None and bool(row[0]) and int(row[0]) >= world.settled_rv() and pending == 0
        )

    return settled


def nats_kv_settled(url: str, bucket: str, resource_id: str = "core/v1/pods") -> Settled:
    async def settled(world: World) -> bool:
        store = NatsKvCheckpointStore([url], bucket=bucket)
        await store.open()
        try:
            cp = await store.load(resource_id)
        finally:
            await store.close()
        return (
            cp is not None
            and bool(cp.resource_version)
            and int(cp.resource_version) >= world.settled_rv()
            and all(d.state == CERTAIN for d in cp.digests.values())
        )

    return settled


def kafka_checkpoint_settled(bootstrap: str, topic: str, resource_id: str) -> Settled:
    """As ``nats_kv_settled``, for a checkpoint in a Kafka topic (read committed)."""

    async def settled(world: World) -> bool:
        store = KafkaCheckpointStore({"bootstrap_servers": [bootstrap]}, topic)
        try:
            await store.open()
            cp = await store.load(resource_id)
        except CheckpointError:
            return False  # the topic not made yet: the bridge is starting
        finally:
            await store.close()
        return (
            cp is not None
            and bool(cp.resource_version)
            and int(cp.resource_version) >= world.settled_rv()
            and all(d.state == CERTAIN for d in cp.digests.values())
        )

    return settled


def seed() -> int:
    return int(os.environ.get("CRASH_SEED") or time.time_ns() % 10**9)


async def kafka_events(
    bootstrap: str,
    topic: str,
    timeout: float = 30.0,
    *,
    isolation_level: str = "read_uncommitted",
) -> list[Body]:
    """Every event in ``topic``, from its start up to the end offsets it had when asked
    (the last stable offset under ``read_committed``, aborted transactions left out)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
        isolation_level=isolation_level,
    )
    await consumer.start()
    out: list[Body] = []
    try:
        async with asyncio.timeout(timeout):
            while not consumer.assignment():  # no group: every partition, once known
                await asyncio.sleep(0.05)
        partitions = sorted(consumer.assignment())
        ends = await consumer.end_offsets(partitions)
        async with asyncio.timeout(timeout):
            while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
                batch = await consumer.getmany(*partitions, timeout_ms=300)
                out.extend(
                    orjson.loads(r.value)
                    for recs in batch.values()
                    for r in recs
                    if r.value is not None
                )
    finally:
        await consumer.stop()
    return out
