"""A world of several resources for the exactly-once crash tests, on kube-apiserver.

Exactly-once runs one transactional producer per resource, all of them writing
the checkpoint topic's one partition, so the shape that matters is several
resources changing at once: Pods, ConfigMaps in two namespaces and Secrets
(four pipelines, four producers), created, patched and deleted at random.

The record (``EosWorld``) keeps every state each object went through, so the
check can ask for more than the last state: **every change exactly once**. A
``read_committed`` consumer (aiokafka, not the bridge's reader) must see each
state the API server served, once, in order per object, and each delete once;
a state may be missing only where a LIST replaced the watch (the first sync, a
410 relist) after the object had already moved past it: the bridge logs each
list with its resourceVersion, and that is the one allowance.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bridge.delivery.changes import Fingerprinter
from tests.fixtures.kube import KubeCluster
from tests.real.kafkabus import read_topic

Body = dict[str, Any]

FINGERPRINT = Fingerprinter([]).fingerprint


@dataclass(frozen=True)
class Kind:
    kind: str
    plural: str
    namespace: str

    @property
    def label(self) -> str:
        """The pipeline's label in the bridge's log lines."""
        return f"v1/{self.plural}@{self.namespace}"

    @property
    def resource_id(self) -> str:
        return f"core/v1/{self.plural}@{self.namespace}"

    def body(self, name: str, n: int) -> Body:
        md = {"name": name, "namespace": self.namespace, "annotations": {"n": str(n)}}
        if self.kind == "Pod":
            spec = {"containers": [{"name": "c", "image": "nginx:1"}]}
            return {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": spec}
        if self.kind == "ConfigMap":
            return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": md, "data": {"n": str(n)}}
        # Annotations only: a Secret's values are redacted on the bus, and its
        # fingerprint there would not be the API server's.
        return {"apiVersion": "v1", "kind": "Secret", "metadata": md, "type": "Opaque"}


def kinds(ns: str, ns2: str) -> list[Kind]:
    return [
        Kind("Pod", "pods", ns),
        Kind("ConfigMap", "configmaps", ns),
        Kind("ConfigMap", "configmaps", ns2),
        Kind("Secret", "secrets", ns2),
    ]


def resources(world_kinds: list[Kind]) -> list[Body]:
    """The bridge's ``resources:`` for these kinds: one pipeline (and producer) each."""
    by_kind: dict[str, list[str]] = defaultdict(list)
    for k in world_kinds:
        by_kind[k.kind].append(k.namespace)
    return [{"apiVersion": "v1", "kind": kind, "namespaces": nss} for kind, nss in by_kind.items()]


@dataclass
class EosWorld:
    """Random changes to objects of several kinds, and every state they went through."""

    cluster: KubeCluster
    kinds: list[Kind]
    rng: random.Random
    live: dict[tuple[Kind, str], str] = field(default_factory=dict)  # (kind, name) → uid
    kind_of: dict[str, Kind] = field(default_factory=dict)  # uid → kind
    # uid → the resourceVersions of its states, in order.
    states: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    # uid → an upper bound of its delete's resourceVersion (etcd's revision read
    # right after the DELETE; a Pod's delete may take two writes).
    deleted: dict[str, int] = field(default_factory=dict)
    n: int = 0
    changes: int = 0
    log: list[str] = field(default_factory=list)

    def create(self, kind: Kind | None = None) -> None:
        kind = kind or self.rng.choice(self.kinds)
        self.n += 1
        name = f"o{self.n}"
        obj = self.cluster.create(kind.body(name, 0))
        uid = obj["metadata"]["uid"]
        self.live[(kind, name)] = uid
        self.kind_of[uid] = kind
        self._state(uid, obj)

    def _state(self, uid: str, obj: Body) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        self.states[uid].append(rv)
        self.changes += 1

    def step(self) -> None:
        r = self.rng.random()
        if len(self.live) < 8 or r < 0.3:
            self.create()
            return
        (kind, name), uid = self.rng.choice(sorted(self.live.items(), key=lambda kv: kv[1]))
        if r < 0.8:
            patch = {"metadata": {"annotations": {"n": str(self.rng.randrange(10**6))}}}
            self._state(uid, self.cluster.patch("v1", kind.kind, name, patch, kind.namespace))
        else:
            self.cluster.delete("v1", kind.kind, name, kind.namespace)
            del self.live[(kind, name)]
            self.deleted[uid] = self.cluster.resource_version
            self.changes += 1

    async def churn(self, seconds: float, rate: float) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while loop.time() < end:
            await asyncio.to_thread(self.step)
            await asyncio.sleep(1 / rate)


def listed_at(logs: list[Path]) -> dict[str, list[int]]:
    """Every LIST the bridges made, per pipeline label: its resourceVersion (the first
    sync, 410 relists, a resume that chose to list)."""
    out: dict[str, list[int]] = defaultdict(list)
    for log in logs:
        if not log.exists():
            continue
        for line in log.read_bytes().splitlines():
            if b'"listed"' not in line:
                continue
            doc = orjson.loads(line)
            if doc.get("event") == "listed" and doc.get("resource_version"):
                out[str(doc.get("reflector"))].append(int(doc["resource_version"]))
    return out


def relists_by_choice(logs: list[Path]) -> list[str]:
    """Restarts that listed though they had a watermark to watch from: with exactly-once
    nothing is uncertain after a kill, so a list there collapses changes for nothing."""
    out = []
    for log in logs:
        if not log.exists():
            continue
        for line in log.read_bytes().splitlines():
            if b"resuming from checkpoint" not in line:
                continue
            doc = orjson.loads(line)
            if doc.get("relist") and doc.get("resource_version"):
                out.append(f"{doc.get('resource')} at {doc['resource_version']}")
    return out


@dataclass
class Verdict:
    events: int
    states: int
    checked: int  # states that had to be published (no list could have collapsed them)
    collapsed: int  # states a list passed over, allowed missing and missing


def check_every_change_once(
    world: EosWorld, events: list[Body], lists: dict[str, list[int]], where: str
) -> Verdict:
    """Every state and delete of the world on the bus exactly once, in order per object;
    a state missing only where a LIST passed over it; the last state of every live
    object last."""
    ids = Counter(e["id"] for e in events)
    twice = {i: n for i, n in ids.items() if n > 1}
    assert not twice, (
        f"{len(twice)} ids more than once on read_committed: {sorted(twice)[:5]} {where}"
    )
    by_uid: dict[str, list[Body]] = defaultdict(list)
    for e in events:
        by_uid[str(e["id"]).split(":", 1)[0]].append(e)
    checked = collapsed = 0
    for uid, rvs in world.states.items():
        kind = world.kind_of[uid]
        evs = by_uid.get(uid, [])
        published = [int(e["resourceversion"]) for e in evs if not e["type"].endswith(".deleted")]
        deletes = [e for e in evs if e["type"].endswith(".deleted")]
        assert published == sorted(published), (
            f"{kind.label} {uid} out of order {published} {where}"
        )
        assert not deletes or evs[-1] is deletes[-1], f"{uid}: events after its delete {where}"
        # What the bus may show beyond the world's record: the terminating state of a
        # Pod's two-write delete.
        extra = set(published) - set(rvs)
        for e in evs:
            if int(e.get("resourceversion") or 0) in extra:
                assert e["data"]["object"]["metadata"].get("deletionTimestamp"), (
                    f"invented state {e['id']} {where}"
                )
        ends = [*rvs[1:], world.deleted.get(uid)]
        for rv, after in zip(rvs, ends, strict=True):
            if rv in published:
                checked += 1
                continue
            passed_over = after is not None and any(
                rv < r and after <= r for r in lists.get(kind.label, [])
            )
            assert passed_over, (
                f"{kind.label} {uid} state {rv} never published (states {rvs}, published"
                f" {published}, lists {lists.get(kind.label)}) {where}"
            )
            collapsed += 1
        if uid in world.deleted and published:
            assert deletes, f"{kind.label} {uid}: delete never published ({published}) {where}"
        if uid not in world.deleted:
            assert published and published[-1] == rvs[-1], (
                f"{kind.label} {uid}: last state {rvs[-1]} not last on the bus {published} {where}"
            )
    return Verdict(len(events), sum(map(len, world.states.values())), checked, collapsed)


async def read_committed(bootstrap: str, topic: str) -> list[Body]:
    """Every event of ``topic`` as aiokafka's read_committed consumer reads it."""
    records = await read_topic(bootstrap, topic, isolation_level="read_committed")
    return [orjson.loads(r.value) for r in records if r.value is not None]


class OpenTransactions:
    """Tells whether a transaction is open on a topic: its last stable offset (the end
    a read_committed consumer sees) behind its high watermark."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        self.topics = topics
        self._committed = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, isolation_level="read_committed"
        )
        self._uncommitted = AIOKafkaConsumer(bootstrap_servers=bootstrap)

    async def __aenter__(self) -> OpenTransactions:
        await self._committed.start()
        await self._uncommitted.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._committed.stop()
        await self._uncommitted.stop()

    async def open_on(self) -> list[str]:
        """The topics with a transaction open now (LSO < high watermark); each topic has
        one partition (``make_topics``)."""
        parts = [TopicPartition(topic, 0) for topic in self.topics]
        lso = await self._committed.end_offsets(parts)
        hw = await self._uncommitted.end_offsets(parts)
        return sorted({tp.topic for tp in parts if lso[tp] < hw[tp]})


async def make_topics(bootstrap: str, events: str, checkpoint: str) -> None:
    """The events topic and the checkpoint topic (compacted), one partition each, made
    before the bridge starts, so the probe knows them from the first look."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(events, 1, 1),
                NewTopic(checkpoint, 1, 1, topic_configs={"cleanup.policy": "compact"}),
            ]
        )
    finally:
        await admin.close()


def live_caught_up(world: EosWorld, events: list[Body]) -> bool:
    """The bus shows every live object's current state last and every delete."""
    last: dict[str, Body] = {}
    for e in events:
        last[str(e["id"]).split(":", 1)[0]] = e
    for uid, rvs in world.states.items():
        e = last.get(uid)
        if uid in world.deleted:
            if e is not None and not e["type"].endswith(".deleted"):
                return False
        elif e is None or int(e["resourceversion"]) != rvs[-1]:
            return False
    return True


def fingerprints_match(world: EosWorld, events: list[Body]) -> list[str]:
    """Live objects whose last event is not their current content (a LIST on the
    server): their names, none when all match."""
    last: dict[str, Body] = {}
    for e in events:
        last[str(e["id"]).split(":", 1)[0]] = e
    wrong = []
    for k in world.kinds:
        for obj in world.cluster.list("v1", k.kind, k.namespace)["items"]:
            obj.setdefault("apiVersion", "v1")  # a LIST's items carry neither
            obj.setdefault("kind", k.kind)
            e = last.get(obj["metadata"]["uid"])
            if e is None or FINGERPRINT(e["data"]["object"]) != FINGERPRINT(obj):
                wrong.append(f"{k.label}/{obj['metadata']['name']}")
    return wrong
