"""Group, ``kinds`` and ``allKinds`` entries against kube-apiserver's real discovery.

The catalog is read from the server's aggregated discovery (one request for the
core group, one for the rest); a group entry selects the kinds of that group that
can be listed and watched, at the preferred version; ``allKinds`` leaves out
Events, Leases, EndpointSlices and everything without list+watch (TokenReview,
SubjectAccessReview). A selected kind's pipeline keeps the checkpoint key a
hand-written entry of that kind has: switching between the two publishes nothing
again.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from bridge.errors import UnknownKindError
from bridge.kube.client import KubeClient
from bridge.kube.kinds import KindSelection, read_catalog, select_kinds
from tests.e2e.bridge_process import (
    BridgeProcess,
    jetstream_events,
    kill9,
    run_until_exit,
    until,
    write_config,
)
from tests.fixtures.kube import KubeCluster
from tests.fixtures.nats import NatsServer
from tests.real.test_check_real import allowed, binding, check, failures, role

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def crd_manifest(group: str, kind: str, plural: str, versions: list[str]) -> str:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
            "versions": [
                {
                    "name": v,
                    "served": True,
                    "storage": i == 0,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
                for i, v in enumerate(versions)
            ],
        },
    }
    return json.dumps(crd)


class Group:
    """Two namespaced kinds, Gizmo and Sprocket, in a group of the test's own."""

    def __init__(self) -> None:
        self.name = f"k{uuid.uuid4().hex[:8]}.k8s-bridge.test"
        self.api_version = f"{self.name}/v1"

    def apply(self, cluster: KubeCluster) -> None:
        for kind, plural in (("Gizmo", "gizmos"), ("Sprocket", "sprockets")):
            cluster.kubectl("apply", "-f", "-", stdin=crd_manifest(self.name, kind, plural, ["v1"]))
            cluster.kubectl(
                "wait", "--for=condition=Established", f"crd/{plural}.{self.name}", "--timeout=60s"
            )

    def delete(self, cluster: KubeCluster) -> None:
        for plural in ("gizmos", "sprockets"):
            cluster.kubectl(
                "delete", "crd", f"{plural}.{self.name}", "--ignore-not-found", "--wait=false"
            )

    def obj(self, kind: str, name: str, namespace: str, size: int) -> str:
        return json.dumps(
            {
                "apiVersion": self.api_version,
                "kind": kind,
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"size": size},
            }
        )


async def test_the_real_aggregated_discovery_selects_groups_and_all_kinds(
    kube_cluster: KubeCluster, real_kubeconfig: Path
) -> None:
    async with await KubeClient.from_kubeconfig(str(real_kubeconfig)) as client:
        catalog = await read_catalog(client)
        assert catalog.aggregated
        apps = await select_kinds(catalog, KindSelection("resources[0]", "apps"))
        assert [i.kind for i in apps] == [
            "ControllerRevision",
            "DaemonSet",
            "Deployment",
            "ReplicaSet",
            "StatefulSet",
        ]
        assert {i.version for i in apps} == {"v1"}
        core = await select_kinds(
            catalog, KindSelection("resources[0]", "", kinds=("Config*", "Secret"))
        )
        assert [(i.api_version, i.kind) for i in core] == [("v1", "ConfigMap"), ("v1", "Secret")]
        everything = await select_kinds(catalog, KindSelection("resources[0]", None))
        kinds = {(i.group, i.kind) for i in everything}
        assert {("", "Pod"), ("", "ConfigMap"), ("", "Secret"), ("apps", "Deployment")} <= kinds
        for left_out in (
            ("", "Event"),
            ("events.k8s.io", "Event"),
            ("coordination.k8s.io", "Lease"),
            ("discovery.k8s.io", "EndpointSlice"),
            ("authentication.k8s.io", "TokenReview"),
            ("authorization.k8s.io", "SubjectAccessReview"),
        ):
            assert left_out not in kinds
        assert all("list" in i.verbs and "watch" in i.verbs for i in everything)
        # Namespaces named: cluster-scoped kinds are left out; exclusions by Kind.group.
        namespaced = await select_kinds(
            catalog,
            KindSelection(
                "resources[1]", None, exclude=("Secret", "Deployment.apps"), namespaced_only=True
            ),
        )
        names = {(i.group, i.kind) for i in namespaced}
        assert ("", "Namespace") not in names and ("", "Node") not in names
        assert ("", "Secret") not in names and ("apps", "Deployment") not in names
        assert ("apps", "StatefulSet") in names

        with pytest.raises(UnknownKindError) as bad_group:
            await select_kinds(catalog, KindSelection("resources[2]", "nope.example.com"))
        assert str(bad_group.value).startswith(
            "config error: resources[2].group: 'nope.example.com' is not served"
        )
        with pytest.raises(UnknownKindError) as bad_exclude:
            await select_kinds(catalog, KindSelection("resources[3]", "apps", exclude=("Dog",)))
        assert "resources[3].exclude: 'Dog' names no kind" in str(bad_exclude.value)
        with pytest.raises(UnknownKindError) as virtual:
            await select_kinds(
                catalog,
                KindSelection("resources[4]", "authentication.k8s.io", kinds=("TokenReview",)),
            )
        assert "cannot be listed and watched" in str(virtual.value)


async def test_a_group_entry_publishes_every_kind_and_keeps_the_checkpoints_of_explicit_entries(
    kube_cluster: KubeCluster,
    kube_namespace: str,
    real_kubeconfig: Path,
    nats_control: NatsServer,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    group = Group()
    group.apply(kube_cluster)
    try:
        kube_cluster.kubectl("apply", "-f", "-", stdin=group.obj("Gizmo", "g1", ns, 1))
        kube_cluster.kubectl("apply", "-f", "-", stdin=group.obj("Sprocket", "s1", ns, 1))
        settings = {"namespaces": [ns], "ignoreFields": ["metadata.labels"]}
        by_group = [{"group": group.name, "kinds": ["*"], **settings}]
        explicit = [
            {"apiVersion": group.api_version, "kind": k, **settings} for k in ("Gizmo", "Sprocket")
        ]

        def config(resources: list[dict[str, Any]]) -> Path:
            return write_config(
                tmp_path / "bridge.yaml",
                kubeconfig=real_kubeconfig,
                sink={"kind": "nats", "nats": {"servers": [nats_control.url]}},
                resources=resources,
            )

        async def ours() -> list[tuple[str, str]]:
            return [
                (e["type"].split(".", 2)[2], e["subject"])
                for e in await jetstream_events(nats_control.url)
                if group.name in e["type"]
            ]

        v1 = f"{group.name}.v1"
        first = [(f"{v1}.Gizmo.added", f"{ns}/g1"), (f"{v1}.Sprocket.added", f"{ns}/s1")]

        async def published(expected: list[tuple[str, str]]) -> bool:
            return sorted(await ours()) == sorted(expected)

        bridge = BridgeProcess(config(by_group))
        await bridge.start()
        try:
            await bridge.wait_ready(60)
            await until(lambda: published(first), 30, bridge.tail_log)
            # Every setting of the entry applies to each kind: ignoreFields.
            kube_cluster.kubectl("label", "gizmo", "g1", "-n", ns, "ignored=yes")
            kube_cluster.kubectl("apply", "-f", "-", stdin=group.obj("Sprocket", "s1", ns, 2))
            second = [*first, (f"{v1}.Sprocket.modified", f"{ns}/s1")]
            await until(lambda: published(second), 30, bridge.tail_log)
        finally:
            assert await bridge.stop() == 0, bridge.tail_log()

        # The same kinds by explicit entries: the same checkpoints, nothing again.
        kube_cluster.kubectl("apply", "-f", "-", stdin=group.obj("Gizmo", "g2", ns, 1))
        bridge = BridgeProcess(config(explicit))
        await bridge.start()
        third = [*second, (f"{v1}.Gizmo.added", f"{ns}/g2")]
        try:
            await bridge.wait_ready(60)
            await until(lambda: published(third), 30, bridge.tail_log)
        finally:
            assert await bridge.stop() == 0, bridge.tail_log()
        # And back to the group entry: still nothing again.
        kube_cluster.kubectl("delete", "sprocket", "s1", "-n", ns)
        bridge = BridgeProcess(config(by_group))
        await bridge.start()
        fourth = [*third, (f"{v1}.Sprocket.deleted", f"{ns}/s1")]
        try:
            await bridge.wait_ready(60)
            await until(lambda: published(fourth), 30, bridge.tail_log)
        finally:
            assert await bridge.stop() == 0, bridge.tail_log()
        assert sorted(await ours()) == sorted(fourth)
    finally:
        group.delete(kube_cluster)


async def test_a_group_entry_the_server_does_not_serve_stops_run_with_one_line(
    kube_cluster: KubeCluster, real_kubeconfig: Path, nats_control: NatsServer, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=real_kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [nats_control.url]}},
        resources=[{"group": "apps", "exclude": ["Deployment", "Kennel"]}],
    )
    code, err = await run_until_exit(BridgeProcess(config), 60)
    assert code != 0
    lines = [line for line in err.splitlines() if "Kennel" in line]
    assert len(lines) == 1, err
    assert "resources[0].exclude: 'Kennel' names no kind the API server serves in apps" in lines[0]


async def test_check_says_which_kinds_a_group_entry_selects_and_which_it_may_not_list(
    kube_cluster: KubeCluster, kube_namespace: str, tmp_path: Path
) -> None:
    ns = kube_namespace
    group = Group()
    group.apply(kube_cluster)
    try:
        token = kube_cluster.service_account_token(ns, "bridge")
        rules = [{"apiGroups": [group.name], "resources": ["gizmos"], "verbs": ["list", "watch"]}]
        kube_cluster.create(role(ns, "watch", rules))
        kube_cluster.create(binding("RoleBinding", "watch", ns))
        await allowed(kube_cluster, token, "watch", group.name, "gizmos", namespace=ns)
        kubeconfig = kube_cluster.write_kubeconfig(tmp_path / "kubeconfig", token=token)
        config = write_config(
            tmp_path / "bridge.yaml",
            kubeconfig=kubeconfig,
            sink={"kind": "stdout"},
            resources=[{"group": group.name, "namespaces": [ns]}],
            server={"host": "127.0.0.1", "port": 0, "controlAuth": "none"},
        )
        code, lines = await check(config)
        assert code == 1, lines
        gizmo, sprocket = f"{group.api_version}/Gizmo", f"{group.api_version}/Sprocket"
        assert f"ok    resources[0] kinds: selects {gizmo}, {sprocket}" in lines, lines
        assert any(line.startswith(f"ok    resource {gizmo} watch: allowed") for line in lines)
        failed = failures(lines)
        assert [line.split(":")[0] for line in failed] == [
            f"FAIL  resource {sprocket} list",
            f"FAIL  resource {sprocket} watch",
        ], lines
        assert f"grant list on sprockets.{group.name}" in failed[0]
    finally:
        group.delete(kube_cluster)


@pytest.mark.parametrize("watch_list", ["on", "off"])
async def test_metadata_only_publishes_metadata_changes_exactly_across_a_restart(
    watch_list: str,
    kube_cluster: KubeCluster,
    kube_namespace: str,
    real_kubeconfig: Path,
    nats_control: NatsServer,
    tmp_path: Path,
) -> None:
    ns = kube_namespace

    def cm(name: str, data: str, **labels: str) -> str:
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": name,
                    "namespace": ns,
                    "labels": labels,
                    "finalizers": ["k8s-bridge.test/keep"] if name == "b" else [],
                },
                "data": {"payload": data},
            }
        )

    for name in ("a", "b", "c"):
        kube_cluster.kubectl("apply", "-f", "-", stdin=cm(name, "x" * 1000, tier="one"))
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=real_kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [nats_control.url]}},
        resources=[{"group": "", "kinds": ["ConfigMap"], "namespaces": [ns], "metadataOnly": True}],
        # on: a streaming list (a watch); off: paginated LISTs
        informer={"watchList": watch_list},
    )

    async def ours() -> list[dict[str, Any]]:
        return [
            e
            for e in await jetstream_events(nats_control.url)
            if e["subject"].startswith(f"{ns}/")
            and e["type"].startswith("io.k8s.core.v1.ConfigMap.")
        ]

    def changes(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return [(e["type"].rsplit(".", 1)[1], e["subject"]) for e in events]

    async def published(expected: list[tuple[str, str]]) -> bool:
        return sorted(changes(await ours())) == sorted(expected)

    added = [("added", f"{ns}/{n}") for n in ("a", "b", "c")]
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready(60)
        await until(lambda: published(added), 30, bridge.tail_log)
        obj = next(e for e in await ours() if e["subject"] == f"{ns}/b")["data"]["object"]
        # The object is its metadata, named as the ConfigMap it is; data never travelled.
        assert set(obj) == {"apiVersion", "kind", "metadata"}, obj
        assert (obj["apiVersion"], obj["kind"]) == ("v1", "ConfigMap")
        assert obj["metadata"]["labels"] == {"tier": "one"}
        assert obj["metadata"]["finalizers"] == ["k8s-bridge.test/keep"]
        # A change of data alone publishes nothing; a label change does.
        # (a patch: apply would change the last-applied annotation, which is metadata)
        patch = json.dumps({"data": {"payload": "y" * 1000}})
        kube_cluster.kubectl("patch", "configmap", "a", "-n", ns, "--type=merge", "-p", patch)
        kube_cluster.kubectl("apply", "-f", "-", stdin=cm("c", "x" * 1000, tier="two"))
        await until(lambda: published([*added, ("modified", f"{ns}/c")]), 30, bridge.tail_log)
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
    # While down: a deleted, a label of b changed.
    kube_cluster.kubectl("delete", "configmap", "a", "-n", ns)
    kube_cluster.kubectl("apply", "-f", "-", stdin=cm("b", "x" * 1000, tier="three"))
    bridge = BridgeProcess(config)
    await bridge.start()
    final = [*added, ("modified", f"{ns}/c"), ("deleted", f"{ns}/a"), ("modified", f"{ns}/b")]
    try:
        await bridge.wait_ready(60)
        await until(lambda: published(final), 30, bridge.tail_log)
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
    events = await ours()
    assert sorted(changes(events)) == sorted(final)
    # Ids as for full objects: uid:resourceVersion, each once.
    assert all(
        e["id"] == f"{e['data']['object']['metadata']['uid']}:{e['resourceversion']}"
        for e in events
        if not e["type"].endswith("deleted")
    ), events
    assert len({e["id"] for e in events}) == len(events)


async def test_kinds_that_appear_and_go_while_the_bridge_runs(
    kube_cluster: KubeCluster,
    kube_namespace: str,
    real_kubeconfig: Path,
    nats_control: NatsServer,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    group = Group()
    gizmos, sprockets = f"gizmos.{group.name}", f"sprockets.{group.name}"

    def crd(kind: str, plural: str, versions: list[str]) -> None:
        kube_cluster.kubectl(
            "apply", "-f", "-", stdin=crd_manifest(group.name, kind, plural, versions)
        )
        name = f"{plural}.{group.name}"
        kube_cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")

    crd("Gizmo", "gizmos", ["v1"])
    kube_cluster.kubectl("apply", "-f", "-", stdin=group.obj("Gizmo", "g1", ns, 1))
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=real_kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [nats_control.url]}},
        resources=[{"group": group.name, "namespaces": [ns]}],
    )

    async def ours() -> list[dict[str, Any]]:
        return [e for e in await jetstream_events(nats_control.url) if group.name in e["type"]]

    def changes(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return [(e["type"].split(".", 2)[2], e["subject"]) for e in events]

    async def published(expected: list[tuple[str, str]]) -> bool:
        return sorted(changes(await ours())) == sorted(expected)

    v1 = f"{group.name}.v1"
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready(60)
        first = [(f"{v1}.Gizmo.added", f"{ns}/g1")]
        await until(lambda: published(first), 30, bridge.tail_log)

        # A kind appears: its objects are published, as the initial list's adds.
        loop = asyncio.get_running_loop()
        started = loop.time()
        crd("Sprocket", "sprockets", ["v1"])
        kube_cluster.kubectl("apply", "-f", "-", stdin=group.obj("Sprocket", "s1", ns, 1))
        kube_cluster.kubectl("apply", "-f", "-", stdin=group.obj("Sprocket", "s2", ns, 1))
        second = [
            *first,
            (f"{v1}.Sprocket.added", f"{ns}/s1"),
            (f"{v1}.Sprocket.added", f"{ns}/s2"),
        ]
        await until(lambda: published(second), 20, bridge.tail_log)
        print(f"CRD applied → its objects published: {loop.time() - started:.1f}s")

        # A new served (and preferred) version of Gizmo: nothing republished; the
        # pipeline goes on at v1, still served.
        crd("Gizmo", "gizmos", ["v1", "v2"])
        await asyncio.sleep(6)  # a change is read at once and 2 s later
        assert await published(second), changes(await ours())
        kube_cluster.kubectl("apply", "-f", "-", stdin=group.obj("Gizmo", "g1", ns, 2))
        third = [*second, (f"{v1}.Gizmo.modified", f"{ns}/g1")]
        await until(lambda: published(third), 20, bridge.tail_log)

        # A kind goes: its objects' deletes, then its pipeline stops with one line.
        kube_cluster.kubectl("delete", "crd", sprockets, "--wait=true", "--timeout=60s")
        fourth = [
            *third,
            (f"{v1}.Sprocket.deleted", f"{ns}/s1"),
            (f"{v1}.Sprocket.deleted", f"{ns}/s2"),
        ]
        await until(lambda: published(fourth), 30, bridge.tail_log)

        def stopped() -> list[str]:
            return [
                line
                for line in bridge.log.read_text().splitlines()
                if "kind no longer served" in line
            ]

        await until(lambda: bool(stopped()), 30, bridge.tail_log)
        assert len(stopped()) == 1 and f"{group.name}/v1/sprockets@{ns}" in stopped()[0]
        await bridge.wait_ready(30)
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
        kube_cluster.kubectl(
            "delete", "crd", gizmos, sprockets, "--ignore-not-found", "--wait=false"
        )
    assert sorted(changes(await ours())) == sorted(fourth)


async def test_a_selected_kind_the_bridge_may_not_list_is_one_warning_and_a_metric(
    kube_cluster: KubeCluster,
    kube_namespace: str,
    nats_control: NatsServer,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    group = Group()
    group.apply(kube_cluster)
    try:
        kube_cluster.kubectl("apply", "-f", "-", stdin=group.obj("Gizmo", "g1", ns, 1))
        kube_cluster.kubectl("apply", "-f", "-", stdin=group.obj("Sprocket", "s1", ns, 1))
        token = kube_cluster.service_account_token(ns, "bridge")
        rules = [{"apiGroups": [group.name], "resources": ["gizmos"], "verbs": ["list", "watch"]}]
        kube_cluster.create(role(ns, "watch", rules))
        kube_cluster.create(binding("RoleBinding", "watch", ns))
        await allowed(kube_cluster, token, "watch", group.name, "gizmos", namespace=ns)
        kubeconfig = kube_cluster.write_kubeconfig(tmp_path / "kubeconfig", token=token)
        config = write_config(
            tmp_path / "bridge.yaml",
            kubeconfig=kubeconfig,
            sink={"kind": "nats", "nats": {"servers": [nats_control.url]}},
            resources=[{"group": group.name, "namespaces": [ns]}],
        )
        bridge = BridgeProcess(config)
        await bridge.start()
        try:
            await bridge.wait_ready(60)

            async def gizmo_published() -> bool:
                events = await jetstream_events(nats_control.url)
                return [e["subject"] for e in events if group.name in e["type"]] == [f"{ns}/g1"]

            await until(gizmo_published, 30, bridge.tail_log)
            label = f"{group.api_version}/sprockets"
            left_out = [
                line
                for line in bridge.log.read_text().splitlines()
                if "selected kind left out" in line
            ]
            assert len(left_out) == 1 and label in left_out[0], bridge.tail_log()
            assert "may not list it" in left_out[0]
            metric = f'k8s_bridge_kinds_skipped{{reason="forbidden",resource="{label}"}} 1.0'
            assert metric in await bridge.metrics()
        finally:
            assert await bridge.stop() == 0, bridge.tail_log()
    finally:
        group.delete(kube_cluster)


async def test_kill_9_while_a_kind_is_being_added_loses_nothing_and_republishes_nothing(
    kube_cluster: KubeCluster,
    kube_namespace: str,
    real_kubeconfig: Path,
    nats_control: NatsServer,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    group = Group()
    kube_cluster.kubectl(
        "apply", "-f", "-", stdin=crd_manifest(group.name, "Gizmo", "gizmos", ["v1"])
    )
    kube_cluster.kubectl(
        "wait", "--for=condition=Established", f"crd/gizmos.{group.name}", "--timeout=60s"
    )
    kube_cluster.kubectl("apply", "-f", "-", stdin=group.obj("Gizmo", "g1", ns, 1))
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=real_kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [nats_control.url]}},
        resources=[{"group": group.name, "namespaces": [ns]}],
    )

    async def ours() -> list[dict[str, Any]]:
        return [e for e in await jetstream_events(nats_control.url) if group.name in e["type"]]

    def create(name: str) -> None:
        path = f"/apis/{group.api_version}/namespaces/{ns}/sprockets"
        body = json.loads(group.obj("Sprocket", name, ns, 1))
        status, out = kube_cluster.raw("POST", path, body)
        assert status == 201, out

    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready(60)
        await until(lambda: _count(ours, 1), 30, bridge.tail_log)
        kube_cluster.kubectl(
            "apply", "-f", "-", stdin=crd_manifest(group.name, "Sprocket", "sprockets", ["v1"])
        )
        kube_cluster.kubectl(
            "wait", "--for=condition=Established", f"crd/sprockets.{group.name}", "--timeout=60s"
        )
        # Objects created while the bridge starts the kind's pipeline; killed mid-way.
        for i in range(40):
            await asyncio.to_thread(create, f"s{i}")
            if i == 10:
                await until(lambda: _count(ours, 2), 20, bridge.tail_log)
            if i == 20:
                kill9(bridge)
                assert bridge.proc is not None
                await bridge.proc.wait()
        bridge = BridgeProcess(config)
        await bridge.start()
        await bridge.wait_ready(60)
        await until(lambda: _count(ours, 41), 30, bridge.tail_log)
        await asyncio.sleep(2)  # anything more would be a republish
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
        group.delete(kube_cluster)
    events = await ours()
    subjects = [e["subject"] for e in events]
    # Every object once; g1, published before the kill, not again.
    assert sorted(subjects) == sorted([f"{ns}/g1", *(f"{ns}/s{i}" for i in range(40))]), subjects
    # Each with the id of its creation: an add written ahead but not on the bus at the
    # kill is republished (as modified) with that same id, never with a new one.
    for e in events:
        obj = e["data"]["object"]["metadata"]
        assert e["id"] == f"{obj['uid']}:{obj['resourceVersion']}", e
        assert e["type"].rsplit(".", 1)[1] in ("added", "modified"), e


async def _count(ours: Any, n: int) -> bool:
    return len(await ours()) >= n


async def test_all_kinds_go_on_beside_an_aggregated_api_that_does_not_answer(
    kube_cluster: KubeCluster,
    kube_namespace: str,
    real_kubeconfig: Path,
    nats_control: NatsServer,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    group = f"a{uuid.uuid4().hex[:8]}.k8s-bridge.test"
    api_service = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": f"v1.{group}"},
        "spec": {
            "group": group,
            "version": "v1",
            # A Service with no endpoints: the aggregator cannot reach it.
            "service": {"namespace": ns, "name": "nothing", "port": 443},
            "groupPriorityMinimum": 1000,
            "versionPriority": 15,
            "insecureSkipTLSVerify": True,
        },
    }
    kube_cluster.kubectl("apply", "-f", "-", stdin=json.dumps(api_service))
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=real_kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [nats_control.url]}},
        resources=[{"allKinds": True, "namespaces": [ns]}],
    )
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready(90)
        kube_cluster.create(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": ns}}
        )

        async def published() -> bool:
            return any(
                e["subject"] == f"{ns}/c" and e["type"].endswith("ConfigMap.added")
                for e in await jetstream_events(nats_control.url)
            )

        await until(published, 30, bridge.tail_log)
        warned = [
            line for line in bridge.log.read_text().splitlines() if "API not answering" in line
        ]
        assert len(warned) == 1 and f"{group}/v1" in warned[0], bridge.tail_log()
        metric = f'k8s_bridge_kinds_skipped{{reason="unavailable",resource="{group}/v1"}} 1.0'
        assert metric in await bridge.metrics()
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
        kube_cluster.kubectl("delete", "apiservice", f"v1.{group}", "--ignore-not-found")
