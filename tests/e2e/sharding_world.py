"""One kind split across ``k8s-bridge run`` processes by uid or namespace hash, checked
against one unsharded bridge watching the same history.

Works against anything with the emulator's object calls (``create``, ``patch``,
``delete``): the emulator and tests/fixtures/kube.py's real kube-apiserver. Every
bridge prints to its own stdout file (the stdout sink), so each shard's stream is
read apart. Event ids are ``uid:resourceVersion`` and ``uid:deleted``, the same in
every bridge for the same change, so streams compare id for id.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge.kube.sharding import ShardField, shard_range
from tests.e2e.bridge_process import BridgeProcess, write_config
from tests.e2e.crash_world import Objects
from tests.fixtures.waiting import until

Body = dict[str, Any]


def pod(name: str, ns: str) -> Body:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "nginx:1"}]},
    }


@dataclass
class World:
    """What the test did: per key (ns/name), the ids its changes must publish, in order."""

    api: Objects
    namespaces: list[str]
    rng: random.Random
    live: dict[str, Body] = field(default_factory=dict)  # key -> last object written
    ids: list[tuple[str, str]] = field(default_factory=list)  # (id, change) in order
    serial: int = 0

    def create(self) -> str:
        self.serial += 1
        ns = self.rng.choice(self.namespaces)
        obj = self.api.create(pod(f"p{self.serial}", ns))
        key = f"{ns}/p{self.serial}"
        self.live[key] = obj
        self.ids.append((f"{obj['metadata']['uid']}:{obj['metadata']['resourceVersion']}", "added"))
        return key

    def update(self, key: str | None = None) -> str:
        key = key or self.rng.choice(sorted(self.live))
        ns, name = key.split("/")
        self.serial += 1
        obj = self.api.patch(
            "v1", "Pod", name, {"metadata": {"labels": {"step": str(self.serial)}}}, ns
        )
        self.live[key] = obj
        md = obj["metadata"]
        self.ids.append((f"{md['uid']}:{md['resourceVersion']}", "modified"))
        return key

    def delete(self, key: str | None = None) -> str:
        key = key or self.rng.choice(sorted(self.live))
        ns, name = key.split("/")
        self.api.delete("v1", "Pod", name, ns)
        obj = self.live.pop(key)
        self.ids.append((f"{obj['metadata']['uid']}:deleted", "deleted"))
        return key

    def churn(self, steps: int) -> None:
        for _ in range(steps):
            roll = self.rng.random()
            if roll < 0.4 or len(self.live) < 5:
                self.create()
            elif roll < 0.75:
                self.update()
            else:
                self.delete()

    def final(self) -> set[str]:
        """The id each object's story ends with: its last state, or its delete."""
        last: dict[str, str] = {}
        for event_id, _ in self.ids:
            last[event_id.split(":", 1)[0]] = event_id
        return set(last.values())


def bridge_config(
    workdir: Path,
    kubeconfig: Path,
    namespaces: list[str],
    *,
    by: str = "resource",
    shards: int = 1,
    index: int = 0,
    checkpoint: Body | None = None,
    sink_nats: str | None = None,
) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    sink: Body = {"kind": "stdout"}
    if sink_nats is not None:
        # The stdout sink, with NATS settings for the nats-kv checkpoint to reach.
        sink["nats"] = {"servers": [sink_nats]}
    return write_config(
        workdir / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink=sink,
        resources=[{"apiVersion": "v1", "kind": "Pod", "namespaces": namespaces}],
        checkpoint=checkpoint
        or {"kind": "sqlite", "path": str(workdir / "state.db"), "flushInterval": 0.1},
        sharding={"by": by, "shards": shards, "shardIndex": index},
    )


def shard_bridges(
    root: Path,
    kubeconfig: Path,
    namespaces: list[str],
    by: ShardField,
    shards: int,
    **kw: Any,
) -> list[BridgeProcess]:
    return [
        BridgeProcess(
            bridge_config(
                root / f"{by}-{index}of{shards}",
                kubeconfig,
                namespaces,
                by=by,
                shards=shards,
                index=index,
                **kw,
            ),
            keep_stdout=True,
        )
        for index in range(shards)
    ]


def stream(bridge: BridgeProcess) -> list[tuple[str, str]]:
    """(id, change) of every event the bridge printed, in order."""
    return [(e["id"], e["type"].rsplit(".", 1)[-1]) for e in bridge.stdout_events()]


def in_slice(event: Body, by: ShardField, shards: int, index: int) -> bool:
    md = event["data"]["object"]["metadata"]
    return shard_range(shards, index, by).contains_object(md)


async def until_published(bridges: list[BridgeProcess], ids: set[str], timeout: float) -> None:
    """Until the bridges' streams together hold every id of ``ids``."""

    def seen() -> set[str]:
        return {i for b in bridges for i, _ in stream(b)}

    await until(
        lambda: ids <= seen(),
        timeout,
        lambda: (
            f"missing {sorted(ids - seen())[:5]}; log:\n"
            + "\n".join(b.tail_log(10) for b in bridges)
        ),
    )


def check_union(
    shards: list[BridgeProcess], reference: list[tuple[str, str]], by: ShardField
) -> None:
    """The shards' streams together are the reference stream event for event; no
    object in two shards; each shard holds only its slice, in the reference's order."""
    n = len(shards)
    owners: dict[str, int] = {}
    for index, bridge in enumerate(shards):
        for e in bridge.stdout_events():
            assert in_slice(e, by, n, index), f"shard {index} published {e['id']} of another slice"
            uid = e["id"].split(":", 1)[0]
            assert owners.setdefault(uid, index) == index, f"object {uid} in two shards"
    union = Counter(ev for b in shards for ev in stream(b))
    assert union == Counter(reference), (
        f"union differs from the unsharded stream: extra {sorted(union - Counter(reference))[:5]},"
        f" missing {sorted(Counter(reference) - union)[:5]}"
    )
    # Per object, the same order as the unsharded bridge.
    want = per_object(reference)
    for index, bridge in enumerate(shards):
        for uid, events in per_object(stream(bridge)).items():
            assert events == want[uid], f"shard {index}: object {uid} out of order"


def per_object(events: list[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for ev in events:
        out.setdefault(ev[0].split(":", 1)[0], []).append(ev)
    return out
