"""The chart's RBAC on a real kube-apiserver: enough for the bridge, and nothing more.

``helm install`` puts the chart into the test's namespace (Deployments are
stored, nothing runs: there is no kubelet). The bridge then runs as the pod
would: the config the chart rendered (read back from the release's ConfigMap)
and a token for the chart's ServiceAccount from the TokenRequest API. Only
what ties the config to a pod is swapped for local values: the sink (stdout),
the API server's address (a kubeconfig with that token instead of the in-cluster
one), the checkpoint file and the health port. Leader election stays on, so the
Lease rules are exercised too.

Then the account is taken apart: ``kubectl auth can-i`` under that token must
allow list/watch of every configured resource and deny everything else the
bridge does not need; ``k8s-bridge check`` must report every resource ok; and
once a resource is cut from the Role the chart made, ``check`` and ``run`` must
say so in the documented lines (docs/operations.md, Exit codes: one line naming the
resource and the server's reason).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.bridge_process import BridgeProcess, cli, free_port, run_until_exit
from tests.fixtures.kube import KubeCluster
from tests.fixtures.realdeps import binary
from tests.fixtures.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CHART = Path(__file__).resolve().parents[2] / "charts" / "k8s-bridge"


class StdoutBridge(BridgeProcess):
    """A bridge whose stdout (the stdout sink's events) is kept in a file."""

    def __init__(self, config: Path) -> None:
        super().__init__(config, keep_stdout=True)

    def events(self) -> list[dict[str, Any]]:
        return self.stdout_events()


def helm(kubeconfig: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The built helm against the real server; its cache/config/data kept under ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_")}
    env["KUBECONFIG"] = str(kubeconfig)
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        env[var] = str(home / var.lower())
    return subprocess.run(
        [binary("helm"), *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def helm_install(
    cluster: KubeCluster, ns: str, release: str, values: dict[str, Any], tmp_path: Path
) -> Callable[[], None]:
    """``helm install`` as the admin; returns the uninstall (the release's
    ClusterRoles and ClusterRoleBindings are cluster-wide: leave none behind)."""
    values_file = tmp_path / "values.json"
    values_file.write_text(json.dumps(values))
    admin = cluster.write_kubeconfig(tmp_path / "admin.kubeconfig")
    home = tmp_path / "helm"
    installed = helm(admin, home, "install", release, str(CHART), "-n", ns, "-f", str(values_file))
    assert installed.returncode == 0, installed.stderr

    def uninstall() -> None:
        helm(admin, home, "uninstall", release, "-n", ns)

    return uninstall


def local_config(cluster: KubeCluster, config: dict[str, Any], token: str, tmp_path: Path) -> Path:
    """The chart's rendered config, with only what binds it to a pod swapped for local
    values: API server access (a kubeconfig holding ``token``), sink, files, port."""
    kubeconfig = cluster.write_kubeconfig(tmp_path / "sa.kubeconfig", token=token)
    config["cluster"]["kubeconfig"] = str(kubeconfig)
    config["sink"] = {"kind": "stdout"}
    config["checkpoint"]["path"] = str(tmp_path / "state.db")
    config["server"].update(host="127.0.0.1", port=free_port())
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def gizmo_crd(group: str) -> dict[str, Any]:
    """A namespaced custom resource whose plural the chart cannot guess (Gizmo -> gizmata)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"gizmata.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "gizmata", "singular": "gizmo", "kind": "Gizmo"},
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


def objects(ns: str, group: str, suffix: str) -> list[dict[str, Any]]:
    """One object of each configured kind."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"pod-{suffix}", "namespace": ns},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"cm-{suffix}", "namespace": ns},
            "data": {"k": suffix},
        },
        {
            "apiVersion": f"{group}/v1",
            "kind": "Gizmo",
            "metadata": {"name": f"gizmo-{suffix}", "namespace": ns},
            "spec": {"size": 3},
        },
    ]


KINDS = {"Pod": "pod", "ConfigMap": "cm", "Gizmo": "gizmo"}


def seen(bridge: StdoutBridge, ns: str) -> set[tuple[str, str, str]]:
    """(kind, "before"/"after", change) of each event about the test's objects."""
    out = set()
    for e in bridge.events():
        kind, change = e["type"].rsplit(".", 2)[-2:]
        prefix = KINDS.get(kind)
        if prefix and e["subject"].startswith(f"{ns}/{prefix}-"):
            out.add((kind, e["subject"].rsplit("-", 1)[1], change))
    return out


async def until_seen(bridge: StdoutBridge, ns: str, want: set[tuple[str, str, str]]) -> None:
    await until(
        lambda: want <= seen(bridge, ns),
        60,
        lambda: f"missing {sorted(want - seen(bridge, ns))}; log:\n{bridge.tail_log()}",
    )


def can_i(cluster: KubeCluster, token: str, *args: str) -> bool:
    """``kubectl auth can-i ARGS`` under ``token``: exit 0 is yes, 1 is no, anything else fails."""
    proc = cluster.kubectl("auth", "can-i", *args, token=token, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode == 0


async def test_the_charts_rbac_is_what_the_bridge_needs_on_a_real_server(
    kube_cluster: KubeCluster, kube_namespace: str, tmp_path: Path
) -> None:
    ns = kube_namespace
    release = ns  # fullname "<ns>-k8s-bridge": the chart's ClusterRoles do not collide
    fullname = f"{release}-k8s-bridge"
    group = f"chart-{uuid.uuid4().hex[:8]}.example.com"
    kube_cluster.create(gizmo_crd(group))
    crd_name = f"gizmata.{group}"

    def established() -> bool:
        crd = kube_cluster.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", crd_name)
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    await until(established, 30, lambda: f"CRD {crd_name} not established")

    values = {
        "leaderElection": {"enabled": True},
        "config": {
            "cluster": {"name": "real"},
            "resources": [
                {"apiVersion": "v1", "kind": "Pod", "namespaces": [ns]},
                {"apiVersion": "v1", "kind": "ConfigMap", "namespaces": [ns]},
                {
                    "apiVersion": f"{group}/v1",
                    "kind": "Gizmo",
                    "plural": "gizmata",
                    "namespaces": [ns],
                },
            ],
            # What a pod of the release would use; swapped for stdout below.
            "sink": {"kind": "nats", "nats": {"servers": ["nats://nats:4222"]}},
        },
    }
    # helm install took 0.5-1.2 s here (2 shared cores under other tests' load): the
    # release's 13 objects, no --wait (nothing would ever become ready).
    uninstall = helm_install(kube_cluster, ns, release, values, tmp_path)
    try:
        await _exercise_release(kube_cluster, ns, fullname, group, tmp_path)
    finally:
        uninstall()
        kube_cluster.raw(
            "DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd_name}"
        )


async def _exercise_release(
    cluster: KubeCluster, ns: str, fullname: str, group: str, tmp_path: Path
) -> None:
    # Stored, never run: there is no kubelet.
    assert cluster.get("apps/v1", "Deployment", fullname, ns)["spec"]["replicas"] == 1
    rendered = cluster.get("v1", "ConfigMap", fullname, ns)["data"]["bridge.yaml"]
    config = yaml.safe_load(rendered)
    assert config["leaderElection"] == {"enabled": True, "namespace": ns, "leaseName": fullname}

    token = cluster.service_account_token(ns, fullname, create=False)
    config_file = local_config(cluster, config, token, tmp_path)

    # RBAC reaches the authorizer through its informers: the new Role may lag a moment.
    await until(lambda: can_i(cluster, token, "list", "pods", "-n", ns), 20)

    # -- check: every resource ok ----------------------------------------------------------
    code, out, err = await cli("check", "--config", str(config_file), timeout=60)
    lines = out.splitlines()
    assert code == 0, (lines, err)
    # Warnings (the release's SQLite beside leader election) are advice, never a failure.
    assert all(line.startswith(("ok ", "WARN ")) for line in lines), lines
    for what in ("v1/Pod", "v1/ConfigMap", f"{group}/v1/Gizmo"):
        for verb in ("list", "watch"):
            expected = f"ok    resource {what} {verb}: allowed in namespace {ns}"
            assert expected in lines, (expected, lines)

    # -- run: every configured resource syncs (initial list, then live changes) -----------
    for obj in objects(ns, group, "before"):
        cluster.create(obj)
    bridge = StdoutBridge(config_file)
    await bridge.start()
    try:
        # /readyz says nothing here: a replica waiting for the Lease is ready as a standby.
        await until_seen(bridge, ns, {(k, "before", "added") for k in KINDS})
        for obj in objects(ns, group, "after"):
            cluster.create(obj)
        cluster.delete("v1", "ConfigMap", "cm-before", ns)
        await until_seen(
            bridge,
            ns,
            {(k, "after", "added") for k in KINDS} | {("ConfigMap", "before", "deleted")},
        )
        # It ran as leader on the chart's Lease, under the chart's rules.
        lease = cluster.get("coordination.k8s.io/v1", "Lease", fullname, ns)
        assert lease["spec"].get("holderIdentity"), lease
        assert "forbidden" not in bridge.log.read_text().lower(), bridge.tail_log()
    finally:
        stopped = await bridge.stop()
    assert stopped == 0, bridge.tail_log()

    # -- kubectl auth can-i: what the ServiceAccount may do, and nothing more ------------------------------------------------------
    gizmata = f"gizmata.{group}"
    configured = ["pods", "configmaps", gizmata]
    allowed = [("list", r) for r in configured] + [("watch", r) for r in configured]
    allowed += [
        ("get", f"leases.coordination.k8s.io/{fullname}"),
        ("update", f"leases.coordination.k8s.io/{fullname}"),
        ("create", "leases.coordination.k8s.io"),
    ]
    for verb, resource in allowed:
        assert can_i(cluster, token, verb, resource, "-n", ns), f"may not {verb} {resource}"
    denied = [
        ("create", "pods"),
        ("delete", "pods"),
        ("patch", "pods"),
        ("get", "pods"),
        ("update", "configmaps"),
        ("delete", "configmaps"),
        ("create", gizmata),
        ("delete", gizmata),
        ("get", "secrets"),  # Secrets are not configured
        ("list", "secrets"),
        ("list", "services"),  # nor Services
        ("list", "deployments.apps"),
        ("list", "leases.coordination.k8s.io"),
        ("get", "leases.coordination.k8s.io/someone-elses"),
        ("delete", f"leases.coordination.k8s.io/{fullname}"),
        ("get", "serviceaccounts"),
        ("create", "roles.rbac.authorization.k8s.io"),
    ]
    for verb, resource in denied:
        assert not can_i(cluster, token, verb, resource, "-n", ns), f"may {verb} {resource}"
    # Roles in the configured namespace only: not elsewhere, not cluster-wide.
    assert not can_i(cluster, token, "list", "pods", "-n", "default")
    assert not can_i(cluster, token, "list", "pods", "--all-namespaces")
    assert not can_i(cluster, token, "list", "namespaces")
    assert not can_i(cluster, token, "delete", "*", "--all-namespaces")

    # -- one resource cut from the Role: the documented 403 lines --------------------------
    role = cluster.get("rbac.authorization.k8s.io/v1", "Role", f"{fullname}-watch", ns)
    rules = [r for r in role["rules"] if r["resources"] != ["configmaps"]]
    assert len(rules) == len(role["rules"]) - 1, role["rules"]
    cluster.patch("rbac.authorization.k8s.io/v1", "Role", f"{fullname}-watch", {"rules": rules}, ns)
    await until(lambda: not can_i(cluster, token, "list", "configmaps", "-n", ns), 20)

    code, out, err = await cli("check", "--config", str(config_file), timeout=60)
    lines = out.splitlines()
    assert code == 1, (lines, err)
    failed = [line for line in lines if line.startswith("FAIL")]
    assert failed == [
        f"FAIL  resource v1/ConfigMap {verb}: forbidden in namespace {ns}: grant {verb} on configmaps"
        for verb in ("list", "watch")
    ], lines

    denied_bridge = StdoutBridge(config_file)
    try:
        code, log = await run_until_exit(denied_bridge, timeout=90)
    except TimeoutError:
        raise AssertionError(f"run did not stop:\n{denied_bridge.tail_log(80)}") from None
    assert code == 1, log
    assert "Traceback" not in log, log
    last = log.splitlines()[-1]
    prefix = f"k8s-bridge run: resource v1/configmaps@{ns}: the API server forbids it: "
    assert last.startswith(prefix), last
    # A streaming list is a watch: whichever request came first was refused.
    assert re.search(
        f'cannot (list|watch) resource "configmaps" in API group "" in the namespace "{ns}"', last
    ), last
    assert last.endswith("(the RBAC rules must allow list and watch)"), last


async def test_a_resource_limited_to_namespaces_gets_no_cluster_wide_grant(
    kube_cluster: KubeCluster, kube_namespace: str, tmp_path: Path
) -> None:
    """Pods in all namespaces need a ClusterRole; Secrets and ConfigMaps configured in one
    namespace must stay readable there only, not everywhere with the Pods. (The chart
    used to put every resource into the ClusterRole as soon as one spanned all
    namespaces: this Secret entry let the bridge list every Secret of the cluster.)"""
    ns = kube_namespace
    fullname = f"{ns}-k8s-bridge"
    values = {
        "config": {
            "cluster": {"name": "real"},
            "resources": [
                {"apiVersion": "v1", "kind": "Pod"},
                {"apiVersion": "v1", "kind": "Secret", "namespaces": [ns]},
                {"apiVersion": "v1", "kind": "ConfigMap", "namespaces": [ns]},
            ],
            "sink": {"kind": "stdout"},
        },
    }
    uninstall = helm_install(kube_cluster, ns, ns, values, tmp_path)
    try:
        rendered = kube_cluster.get("v1", "ConfigMap", fullname, ns)["data"]["bridge.yaml"]
        token = kube_cluster.service_account_token(ns, fullname, create=False)
        config_file = local_config(kube_cluster, yaml.safe_load(rendered), token, tmp_path)
        await until(lambda: can_i(kube_cluster, token, "list", "secrets", "-n", ns), 20)
        for verb in ("list", "watch"):
            assert can_i(kube_cluster, token, verb, "pods", "--all-namespaces")
            for resource in ("secrets", "configmaps"):
                assert can_i(kube_cluster, token, verb, resource, "-n", ns), (verb, resource)
                for elsewhere in (["-n", "default"], ["--all-namespaces"]):
                    assert not can_i(kube_cluster, token, verb, resource, *elsewhere), (
                        verb,
                        resource,
                        elsewhere,
                    )
        assert not can_i(kube_cluster, token, "get", "secrets", "-n", ns)
        assert not can_i(kube_cluster, token, "create", "pods", "-n", ns)

        # check on the same account: Pods in all namespaces (an access review and a
        # LIST of one object), Secrets and ConfigMaps in the namespace.
        code, out, err = await cli("check", "--config", str(config_file), timeout=60)
        lines = out.splitlines()
        assert code == 0, (lines, err)
        assert "ok    resource v1/Pod list: allowed in all namespaces" in lines, lines
        assert f"ok    resource v1/Secret watch: allowed in namespace {ns}" in lines, lines
    finally:
        uninstall()
