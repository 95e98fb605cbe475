"""Kinds that change or vanish while the bridge is down, on kube-apiserver.

A CRD deleted while no bridge ran takes its objects with it: the next start
publishes each object's delete once (a tombstone, id ``{uid}:deleted``), as a
relist that found nothing would, and nothing else. A CRD whose preferred version
moved (v1beta1 → v1) while no bridge ran: the kind resumes from the old version's
checkpoint, so nothing is published again for an unchanged object; a later change
is published once, under v1. The oracle is the JetStream stream, read whole.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.bridge_process import BridgeProcess, jetstream_events, kill9, until, write_config
from tests.fixtures.kube import KubeCluster
from tests.fixtures.nats import NatsServer
from tests.fixtures.realkafka import KafkaBroker
from tests.real.eos_world import read_committed
from tests.real.test_kinds_real import Group, crd_manifest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def _crd(cluster: KubeCluster, manifest: str, name: str) -> None:
    cluster.kubectl("apply", "-f", "-", stdin=manifest)
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")


async def _restart(bridge: BridgeProcess, config: Path, *, hard: bool) -> BridgeProcess:
    if hard:
        kill9(bridge)
        assert bridge.proc is not None
        await bridge.proc.wait()
    else:
        assert await bridge.stop() == 0, bridge.tail_log()
    return BridgeProcess(config)


@pytest.mark.parametrize("bus", ["nats", "kafka-exactly-once"])
async def test_a_crd_deleted_while_the_bridge_is_down_publishes_each_delete_once(
    bus: str,
    kube_cluster: KubeCluster,
    kube_namespace: str,
    real_kubeconfig: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    ns = kube_namespace
    group = Group()
    kinds = (("Gizmo", "gizmos"), ("Sprocket", "sprockets"), ("Widget", "widgets"))
    for kind, plural in kinds:
        _crd(kube_cluster, crd_manifest(group.name, kind, plural, ["v1"]), f"{plural}.{group.name}")
    for kind, name in (("Gizmo", "g1"), ("Gizmo", "g2"), ("Sprocket", "s1"), ("Widget", "w1")):
        kube_cluster.kubectl("apply", "-f", "-", stdin=group.obj(kind, name, ns, 1))
    read: Callable[[], Awaitable[list[dict[str, Any]]]]
    if bus == "nats":
        nats: NatsServer = request.getfixturevalue("nats_control")
        sink: dict[str, Any] = {"kind": "nats", "nats": {"servers": [nats.url]}}
        extra: dict[str, Any] = {}

        async def read() -> list[dict[str, Any]]:
            return await jetstream_events(nats.url)
    else:
        # The deletes go out in a transaction with the digests' removal; the oracle
        # is aiokafka's read_committed consumer.
        kafka: KafkaBroker = request.getfixturevalue("real_kafka")
        topic = f"kinds-{group.name.split('.')[0]}"
        sink = {
            "kind": "kafka",
            "kafka": {
                "bootstrapServers": [kafka.bootstrap],
                "topic": topic,
                "exactlyOnce": True,
                "transactionalIdPrefix": topic,
            },
        }
        extra = {"checkpoint": {"kind": "kafka", "kafka": {"topic": f"{topic}-cp"}}}

        async def read() -> list[dict[str, Any]]:
            return await read_committed(kafka.bootstrap, topic)

    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=real_kubeconfig,
        sink=sink,
        resources=[{"group": group.name, "namespaces": [ns]}],
        **extra,
    )

    async def ours() -> list[dict[str, Any]]:
        return [e for e in await read() if group.name in e["type"]]

    def short(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return [(e["type"].split(".", 2)[2], e["subject"]) for e in events]

    async def published(expected: list[tuple[str, str]]) -> bool:
        return sorted(short(await ours())) == sorted(expected)

    v1 = f"{group.name}.v1"
    expected = [
        (f"{v1}.Gizmo.added", f"{ns}/g1"),
        (f"{v1}.Gizmo.added", f"{ns}/g2"),
        (f"{v1}.Sprocket.added", f"{ns}/s1"),
        (f"{v1}.Widget.added", f"{ns}/w1"),
    ]
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready(60)
        await until(lambda: published(expected), 30, bridge.tail_log)
        # Stopped gracefully, then killed: each time one CRD goes while no bridge runs
        # (Widget stays, so the group is still served).
        for (kind, plural), names, hard in (
            (kinds[0], ["g1", "g2"], False),
            (kinds[1], ["s1"], True),
        ):
            bridge = await _restart(bridge, config, hard=hard)
            kube_cluster.kubectl(
                "delete", "crd", f"{plural}.{group.name}", "--wait=true", "--timeout=60s"
            )
            await bridge.start()
            await bridge.wait_ready(60)
            expected.extend((f"{v1}.{kind}.deleted", f"{ns}/{n}") for n in names)
            await until(lambda: published(expected), 30, bridge.tail_log)
            await asyncio.sleep(2)  # anything more would be a second publish
            assert await published(expected), short(await ours())
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
        group.delete(kube_cluster)
        kube_cluster.kubectl(
            "delete", "crd", f"widgets.{group.name}", "--ignore-not-found", "--wait=false"
        )
    events = await ours()
    assert sorted(short(events)) == sorted(expected)
    added = {e["subject"]: e["data"]["object"]["metadata"]["uid"] for e in events[:4]}
    for e in events:
        if e["type"].endswith(".deleted"):
            # As a relist that found nothing publishes it: a tombstone of the last
            # known metadata, with the delete's id.
            assert e["data"].get("tombstone") is True, e
            assert e["id"] == f"{added[e['subject']]}:deleted", e
            assert e["data"]["object"]["kind"] in ("Gizmo", "Sprocket"), e
    assert Counter(e["id"] for e in events).most_common(1)[0][1] == 1


def _versioned_crd(group: str, served: dict[str, bool], storage: str) -> str:
    crd = json.loads(crd_manifest(group, "Gizmo", "gizmos", list(served)))
    for v in crd["spec"]["versions"]:
        v["served"] = served[v["name"]]
        v["storage"] = v["name"] == storage
    return json.dumps(crd)


async def test_a_preferred_version_changed_while_down_republishes_nothing(
    kube_cluster: KubeCluster,
    kube_namespace: str,
    real_kubeconfig: Path,
    nats_control: NatsServer,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    group = Group()
    name = f"gizmos.{group.name}"
    _crd(kube_cluster, _versioned_crd(group.name, {"v1beta1": True}, "v1beta1"), name)
    beta = f"{group.name}/v1beta1"
    for obj in ("g1", "g2", "g3"):
        body = json.loads(group.obj("Gizmo", obj, ns, 1))
        body["apiVersion"] = beta
        kube_cluster.kubectl("apply", "-f", "-", stdin=json.dumps(body))
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=real_kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [nats_control.url]}},
        # Annotations decide nothing: a change of them alone publishes nothing.
        resources=[
            {"group": group.name, "namespaces": [ns], "ignoreFields": ["metadata.annotations"]}
        ],
    )

    async def ours() -> list[dict[str, Any]]:
        return [e for e in await jetstream_events(nats_control.url) if group.name in e["type"]]

    def short(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return [(e["type"].split(".", 2)[2], e["subject"]) for e in events]

    async def published(expected: list[tuple[str, str]]) -> bool:
        return sorted(short(await ours())) == sorted(expected)

    expected = [(f"{group.name}.v1beta1.Gizmo.added", f"{ns}/g{i}") for i in (1, 2, 3)]
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready(60)
        await until(lambda: published(expected), 30, bridge.tail_log)
        assert await bridge.stop() == 0, bridge.tail_log()
        # Upgraded while down: v1 served and stored, v1beta1 no longer served.
        _crd(
            kube_cluster,
            _versioned_crd(group.name, {"v1": True, "v1beta1": False}, "v1"),
            name,
        )
        # A new resourceVersion, nothing that decides a change: the relist must not
        # take the old version's fingerprint for a change of the object.
        kube_cluster.kubectl("annotate", "-n", ns, f"gizmos.{group.name}/g3", "touched=yes")
        bridge = BridgeProcess(config)
        await bridge.start()
        await bridge.wait_ready(60)
        await asyncio.sleep(3)  # anything published now would be a republish
        assert await published(expected), f"republished: {short(await ours())}"
        kube_cluster.kubectl("apply", "-f", "-", stdin=group.obj("Gizmo", "g2", ns, 2))
        expected.append((f"{group.name}.v1.Gizmo.modified", f"{ns}/g2"))
        await until(lambda: published(expected), 30, bridge.tail_log)

        # The same while the bridge runs: v2 replaces v1; the kind moves once v1 is no
        # longer served, and takes v1's checkpoint with it.
        _crd(
            kube_cluster,
            _versioned_crd(group.name, {"v2": True, "v1": False, "v1beta1": False}, "v2"),
            name,
        )

        def moved() -> bool:
            return any(
                "kinds appeared" in line and f"{group.name}/v2/gizmos" in line
                for line in bridge.log.read_text().splitlines()
            )

        await until(moved, 30, bridge.tail_log)
        await bridge.wait_ready(30)
        await asyncio.sleep(2)
        assert await published(expected), f"republished: {short(await ours())}"
        body = json.loads(group.obj("Gizmo", "g1", ns, 3))
        body["apiVersion"] = f"{group.name}/v2"
        kube_cluster.kubectl("apply", "-f", "-", stdin=json.dumps(body))
        expected.append((f"{group.name}.v2.Gizmo.modified", f"{ns}/g1"))
        await until(lambda: published(expected), 30, bridge.tail_log)
        await asyncio.sleep(2)
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
        kube_cluster.kubectl("delete", "crd", name, "--ignore-not-found", "--wait=false")
    assert sorted(short(await ours())) == sorted(expected)
