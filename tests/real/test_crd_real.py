"""Custom resources through kube-apiserver's real discovery.

A CustomResourceDefinition applied with the built kubectl, once Established, is
served under its group's discovery document; the bridge resolves the configured
kind there and publishes its objects as it does a built-in kind's.

A CRD deleted while the bridge runs: the real server's finalizer deletes every
object of it first (the bridge's watch delivers each as DELETED and the bridge
publishes the deletes), then the resource leaves discovery and its watch ends;
every list or watch of it is then a 404. The bridge keeps the other resources
flowing, says in one warning line which resource the API server no longer
serves, retries with backoff (the backoff's cap, 30 s, is how long a re-created
CRD may wait to be noticed), reports not-ready after ``informer.unhealthyAfter``
naming it, and resumes once the CRD is back. A kind configured that is not
served fails ``run`` at start with one line naming it.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.bridge_process import BridgeProcess, jetstream_events, run_until_exit, write_config
from tests.fixtures.kube import KubeCluster
from tests.fixtures.nats import NatsServer
from tests.fixtures.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


class Crd:
    """A namespaced ``Gizmo`` kind in a group of the test's own (the API server is shared)."""

    def __init__(self) -> None:
        self.group = f"t{uuid.uuid4().hex[:8]}.k8s-bridge.test"
        self.api_version = f"{self.group}/v1"
        self.name = f"gizmos.{self.group}"

    def manifest(self) -> str:
        crd = {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": self.name},
            "spec": {
                "group": self.group,
                "scope": "Namespaced",
                "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo"},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            }
                        },
                    }
                ],
            },
        }
        return json.dumps(crd)  # JSON is YAML: kubectl reads it from stdin

    def gizmo(self, name: str, namespace: str, size: int) -> str:
        obj = {
            "apiVersion": self.api_version,
            "kind": "Gizmo",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"size": size},
        }
        return json.dumps(obj)

    def apply(self, cluster: KubeCluster) -> None:
        cluster.kubectl("apply", "-f", "-", stdin=self.manifest())
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{self.name}", "--timeout=60s")

    def served(self, cluster: KubeCluster) -> bool:
        status, doc = cluster.raw("GET", f"/apis/{self.api_version}")
        return status == 200 and any(r["kind"] == "Gizmo" for r in doc.get("resources", []))


def kinds_of(events: list[dict[str, Any]], kind: str) -> list[tuple[str, str]]:
    """(change, subject) of the events of ``kind``, in bus order."""
    return [
        (e["type"].rsplit(".", 1)[-1], e["subject"])
        for e in events
        if e["type"].split(".")[-2] == kind
    ]


def log_records(bridge: BridgeProcess) -> list[dict[str, Any]]:
    out = []
    for line in bridge.log.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


async def test_a_crd_applied_with_kubectl_is_watched_through_real_discovery_and_its_deletion(
    kube_cluster: KubeCluster,
    kube_namespace: str,
    real_kubeconfig: Path,
    nats_control: NatsServer,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    crd = Crd()
    crd.apply(kube_cluster)
    assert crd.served(kube_cluster)
    kube_cluster.kubectl("apply", "-f", "-", stdin=crd.gizmo("g1", ns, 1))
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=real_kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [nats_control.url]}},
        resources=[
            {"apiVersion": crd.api_version, "kind": "Gizmo", "namespaces": [ns]},
            {"apiVersion": "v1", "kind": "ConfigMap", "namespaces": [ns]},
        ],
        informer={"unhealthyAfter": 3},
    )
    bridge = BridgeProcess(config)
    await bridge.start()

    async def bus() -> list[dict[str, Any]]:
        return await jetstream_events(nats_control.url)

    async def gizmos_are(expected: list[tuple[str, str]]) -> bool:
        return kinds_of(await bus(), "Gizmo") == expected

    try:
        await bridge.wait_ready(60)
        # Objects made with kubectl: created, applied again with a change, another one.
        kube_cluster.kubectl("apply", "-f", "-", stdin=crd.gizmo("g1", ns, 2))
        kube_cluster.kubectl("apply", "-f", "-", stdin=crd.gizmo("g2", ns, 1))
        published = [("added", f"{ns}/g1"), ("modified", f"{ns}/g1"), ("added", f"{ns}/g2")]
        await until(lambda: gizmos_are(published), 30, bridge.tail_log)
        g1 = next(e for e in await bus() if e["subject"] == f"{ns}/g1")
        assert g1["type"] == f"io.k8s.{crd.group}.v1.Gizmo.added"
        assert g1["data"]["object"]["spec"] == {"size": 1}

        # The CRD goes while the bridge runs: its objects go first, each a delete.
        kube_cluster.kubectl("delete", "crd", crd.name, "--wait=true", "--timeout=60s")
        await until(lambda: not crd.served(kube_cluster), 30)
        deleted = [*published, ("deleted", f"{ns}/g1"), ("deleted", f"{ns}/g2")]
        await until(
            lambda: gizmos_are(deleted) or gizmos_are([*published, *reversed(deleted[3:])]),
            30,
            bridge.tail_log,
        )
        # Delivered by the watch as DELETED events with the last state, not found
        # missing by a relist (which would publish tombstones).
        deletes = [e for e in await bus() if e["type"].endswith(".Gizmo.deleted")]
        assert [e["data"].get("tombstone", False) for e in deletes] == [False, False], deletes
        assert {e["data"]["object"]["spec"]["size"] for e in deletes} == {1, 2}
        # Not ready, naming the resource; the other resource keeps flowing meanwhile.
        label = f"{crd.api_version}/gizmos@{ns}"

        async def not_ready_naming_it() -> bool:
            status, body = await bridge.readyz()
            return status == 503 and label in body

        await until(not_ready_naming_it, 30, bridge.tail_log)
        kube_cluster.create(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": ns}}
        )

        async def configmap_published() -> bool:
            return kinds_of(await bus(), "ConfigMap") == [("added", f"{ns}/c")]

        await until(configmap_published, 30, bridge.tail_log)
        assert bridge.proc is not None and bridge.proc.returncode is None
        gone = [
            r
            for r in log_records(bridge)
            if r.get("reflector") == label and r.get("level") == "warning"
        ]
        assert gone, bridge.tail_log()
        assert any("no longer serves" in str(r.get("error", "")) for r in gone), gone

        # Back: the same CRD again, a new object of it; the bridge resumes.
        crd.apply(kube_cluster)
        kube_cluster.kubectl("apply", "-f", "-", stdin=crd.gizmo("g3", ns, 1))
        await until(lambda: _ends_with(bus, "Gizmo", [("added", f"{ns}/g3")]), 60, bridge.tail_log)
        await bridge.wait_ready(30)
        assert (await bridge.readyz())[0] == 200
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
        kube_cluster.kubectl("delete", "crd", crd.name, "--ignore-not-found", "--wait=false")
    gizmos = kinds_of(await bus(), "Gizmo")
    # Nothing published twice: each change once, the resumed list added only g3.
    assert sorted(gizmos[:5]) == sorted(deleted)
    assert gizmos[5:] == [("added", f"{ns}/g3")]


async def _ends_with(bus: Any, kind: str, tail: list[tuple[str, str]]) -> bool:
    got = kinds_of(await bus(), kind)
    return got[-len(tail) :] == tail


async def test_a_kind_the_real_discovery_does_not_serve_stops_run_with_one_line(
    kube_cluster: KubeCluster,
    kube_namespace: str,
    real_kubeconfig: Path,
    nats_control: NatsServer,
    tmp_path: Path,
) -> None:
    crd = Crd()
    crd.apply(kube_cluster)
    try:
        nope = "nope.k8s-bridge.test/v1"
        for api_version, kind, why in (
            (crd.api_version, "Gadget", f"not served; {crd.api_version} serves: Gizmo"),
            (nope, "Gizmo", f"the API server does not serve {nope}"),
        ):
            folder = tmp_path / kind
            folder.mkdir()
            config = write_config(
                folder / "bridge.yaml",
                kubeconfig=real_kubeconfig,
                sink={"kind": "nats", "nats": {"servers": [nats_control.url]}},
                resources=[
                    {"apiVersion": api_version, "kind": kind, "namespaces": [kube_namespace]}
                ],
            )
            code, log = await run_until_exit(BridgeProcess(config), 60)
            assert code == 1, log
            lines = [line for line in log.splitlines() if line.startswith("k8s-bridge run:")]
            assert lines == [f"k8s-bridge run: kind {kind!r} apiVersion {api_version!r}: {why}"], (
                log
            )
            assert await jetstream_events(nats_control.url) == []
    finally:
        kube_cluster.kubectl("delete", "crd", crd.name, "--ignore-not-found", "--wait=false")
