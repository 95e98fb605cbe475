"""kill -9 at random moments, change and compact while down, restart: the promise holds.

The property (delivery-core issue, point 3), checked against what the test did
to the API emulator and what the bus holds after many rounds:

1. every delete of an object that ever reached the bus is published;
2. every live object's current state is the last event for it;
3. nothing else is published: every event is a real state of its object (or a
   real delete), in resourceVersion order per object, and a redelivery keeps
   its id (JetStream's duplicate window then drops it: no id twice on NATS).

The kill moments, the changes and the compactions are random; the seed is in
every failure message (``CRASH_SEED=… pytest …`` replays a run).
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer

from bridge.changes import CERTAIN, Fingerprinter
from bridge.checkpoints.nats_kv import NatsKvCheckpointStore
from bridge.emulator import Emulator
from tests.e2e.bridge_process import (
    BridgeProcess,
    jetstream_events,
    kafka_sink,
    kill9,
    until,
    write_config,
)
from tests.fixtures.nats import NatsServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

FINGERPRINT = Fingerprinter([]).fingerprint


def pod(name: str, node: str = "") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "nginx:1"}], "nodeName": node},
        "status": {"phase": "Pending"},
    }


class World:
    """Random changes to the emulator, and a record of every state they produced."""

    def __init__(self, emulator: Emulator, rng: random.Random) -> None:
        self.emulator = emulator
        self.rng = rng
        self.live: dict[str, str] = {}  # name → uid
        self.states: set[tuple[str, str]] = set()  # (uid, resourceVersion) ever served
        self.deleted: set[str] = set()  # uids deleted
        self.gone_names: list[str] = []
        self.recent: list[str] = []  # names touched last, newest at the end
        self.n = 0
        self.log: list[str] = []  # what happened, for failure messages
        self.round = 0

    def create(self, name: str | None = None) -> None:
        if name is None:
            self.n += 1
            name = f"p{self.n}"
        obj = self.emulator.create(pod(name))
        self._record(name, obj)

    def _record(self, name: str, obj: dict[str, Any]) -> None:
        md = obj["metadata"]
        self.log.append(f"r{self.round} {name} {md['uid']} rv={md['resourceVersion']}")
        self.recent = [*self.recent[-49:], name]
        self.live[name] = md["uid"]
        self.states.add((md["uid"], md["resourceVersion"]))

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
            node = f"n{self.rng.randrange(10**6)}"
            obj = self.emulator.patch(
                "v1", "Pod", name, {"spec": {"nodeName": node}}, namespace="default"
            )
            self._record(name, obj)
        else:
            name = self.pick(recent_first)
            gone = self.emulator.delete("v1", "Pod", name, namespace="default")
            self.log.append(
                f"r{self.round} {name} deleted rv={gone['metadata']['resourceVersion']}"
            )
            self.deleted.add(self.live.pop(name))
            self.gone_names.append(name)

    async def churn(self, seconds: float, rate: float = 150.0) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while loop.time() < end:
            self.step()
            await asyncio.sleep(1 / rate)


def history(evs: list[dict[str, Any]]) -> list[str]:
    return [f"{e['subject']} {e['id']} {e['type'].rsplit('.', 1)[-1]}" for e in evs]


def check_property(world: World, events: list[dict[str, Any]], seed: int, bus: str) -> None:
    where = f"(CRASH_SEED={seed}, {bus}, {len(events)} events)"
    first: dict[str, dict[str, Any]] = {}
    for e in events:
        first.setdefault(e["id"], e)
    by_uid: dict[str, list[dict[str, Any]]] = defaultdict(list)
    last_by_subject: dict[str, dict[str, Any]] = {}
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
            assert (uid, e["resourceversion"]) in world.states, f"invented state {e['id']} {where}"
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
    for name, uid in world.live.items():
        current = world.emulator.get("v1", "Pod", name, namespace="default")
        last = last_by_subject.get(f"default/{name}")
        assert last is not None, f"default/{name} never published {where}"
        assert not last["type"].endswith(".deleted"), f"default/{name} last is a delete {where}"
        obj = last["data"]["object"]
        assert obj["metadata"]["uid"] == uid, f"default/{name} last event is another uid {where}"
        assert FINGERPRINT(obj) == FINGERPRINT(current), f"default/{name} stale {where}"


Settled = Callable[[Emulator], Awaitable[bool]]


async def crash_rounds(
    emulator: Emulator, config: Path, rng: random.Random, rounds: int, is_settled: Settled
) -> World:
    world = World(emulator, rng)
    for _ in range(1500):  # a first list long enough to be killed in the middle of
        world.create()
    for r in range(rounds):
        world.round = r
        bridge = BridgeProcess(config)
        await bridge.start()
        await world.churn(rng.uniform(0.3, 2.5))
        world.log.append(f"r{r} kill at rv={emulator.resource_version}")
        kill9(bridge)
        assert bridge.proc is not None
        await bridge.proc.wait()
        for _ in range(rng.randrange(60)):
            world.step(recent_first=True)
        world.log.append(f"r{r} down")
        if rng.random() < 0.5:
            emulator.chaos.compact()
            world.log.append(f"r{r} compacted at rv={emulator.resource_version}")
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready(60)
        await world.churn(0.5)
        await until(lambda: is_settled(emulator), 60, bridge.tail_log)
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
    return world


def sqlite_settled(db: Path) -> Settled:
    """The checkpoint caught up: the watermark is the emulator's, nothing is uncertain."""

    async def settled(emulator: Emulator) -> bool:
        con = sqlite3.connect(db)
        try:
            row = con.execute(
                "select resource_version from watermarks where resource_id = 'core/v1/pods'"
            ).fetchone()
            pending = con.execute("select count(*) from digests where state != ''").fetchone()[0]
        finally:
            con.close()
        return row is not None and row[0] == str(emulator.resource_version) and pending == 0

    return settled


def nats_kv_settled(url: str, bucket: str) -> Settled:
    async def settled(emulator: Emulator) -> bool:
        store = NatsKvCheckpointStore([url], bucket=bucket)
        await store.open()
        try:
            cp = await store.load("core/v1/pods")
        finally:
            await store.close()
        return (
            cp is not None
            and cp.resource_version == str(emulator.resource_version)
            and all(d.state == CERTAIN for d in cp.digests.values())
        )

    return settled


def CHECKPOINT(tmp_path: Path) -> dict[str, Any]:
    # The default cadence: a second of acknowledged events not yet committed as certain.
    return {"kind": "sqlite", "path": str(tmp_path / "state.db"), "flushInterval": 1.0}


def seed() -> int:
    return int(os.environ.get("CRASH_SEED") or time.time_ns() % 10**9)


async def test_kill9_at_random_moments_against_jetstream(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    s = seed()
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [nats_control.url]}},
        resources=[{"apiVersion": "v1", "kind": "Pod"}],
        checkpoint=CHECKPOINT(tmp_path),
    )
    world = await crash_rounds(
        emulator, config, random.Random(s), 8, sqlite_settled(tmp_path / "state.db")
    )
    events = await jetstream_events(nats_control.url)
    ids = [e["id"] for e in events]
    # The duplicate window drops every redelivery: ids are stable across crashes.
    assert len(ids) == len(set(ids)), f"an id reached the stream twice (CRASH_SEED={s})"
    check_property(world, events, s, "jetstream")


async def test_kill9_at_random_moments_with_checkpoints_in_nats_kv(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    """The same property with the checkpoint in a JetStream KV bucket (no disk)."""
    s = seed()
    bucket = "crash-" + uuid.uuid4().hex[:8]
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [nats_control.url]}},
        resources=[{"apiVersion": "v1", "kind": "Pod"}],
        checkpoint={"kind": "nats-kv", "bucket": bucket, "flushInterval": 1.0},
    )
    world = await crash_rounds(
        emulator, config, random.Random(s), 6, nats_kv_settled(nats_control.url, bucket)
    )
    events = await jetstream_events(nats_control.url)
    ids = [e["id"] for e in events]
    assert len(ids) == len(set(ids)), f"an id reached the stream twice (CRASH_SEED={s})"
    check_property(world, events, s, "jetstream+nats-kv")


async def test_kill9_at_random_moments_against_kafka(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, kafka_broker: str
) -> None:
    s = seed()
    topic = "crash-" + uuid.uuid4().hex[:8]
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink=kafka_sink(kafka_broker, topic),
        resources=[{"apiVersion": "v1", "kind": "Pod"}],
        checkpoint=CHECKPOINT(tmp_path),
    )
    world = await crash_rounds(
        emulator, config, random.Random(s), 5, sqlite_settled(tmp_path / "state.db")
    )
    events = await kafka_events(kafka_broker, topic)
    check_property(world, events, s, "kafka")


async def kafka_events(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
    )
    await consumer.start()
    out: list[dict[str, Any]] = []
    try:
        idle = 0
        while idle < 5:
            batch = await consumer.getmany(timeout_ms=300)
            got = [r for recs in batch.values() for r in recs]
            idle = 0 if got else idle + 1
            out.extend(orjson.loads(r.value) for r in got if r.value is not None)
    finally:
        await consumer.stop()
    return out
