"""``k8s-bridge check`` on a real kube-apiserver: it says what ``run`` will lack.

The bridge runs as a ServiceAccount (its token from the TokenRequest API) under
RBAC the test grants step by step. Without the Lease rights leader election
uses, ``run`` would stay a standby for ever; without ``system:auth-delegator``
every ``POST /snapshot`` would be a 503: ``check`` fails naming each, and passes
once RBAC grants them. Beside a running bridge it reads the SQLite checkpoint
the bridge holds instead of failing on its lock, and the bridge goes on.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.bridge_process import BridgeProcess, cli, free_port
from tests.fixtures.kube import KubeCluster
from tests.fixtures.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

LEASE = "bridge-leader"
ACCOUNT = "bridge"


class Bridge(BridgeProcess):
    """``k8s-bridge run`` with the stdout sink: its events kept in a file."""

    def __init__(self, config: Path) -> None:
        super().__init__(config, keep_stdout=True)

    def added(self) -> list[str]:
        return [e["subject"] for e in self.stdout_events("added")]


def bridge_config(tmp_path: Path, kubeconfig: Path, namespace: str, **extra: Any) -> Path:
    path = tmp_path / "bridge.yaml"
    config = {
        "cluster": {"kubeconfig": str(kubeconfig), "name": "real"},
        "resources": [{"apiVersion": "v1", "kind": "ConfigMap", "namespaces": [namespace]}],
        "sink": {"kind": "stdout"},
        "checkpoint": {"kind": "sqlite", "path": str(tmp_path / "state.db"), "commitInterval": 0.1},
        "server": {"host": "127.0.0.1", "port": free_port()},
        "leaderElection": {
            "enabled": True,
            "namespace": namespace,
            "leaseName": LEASE,
            "leaseDuration": 6,
            "renewDeadline": 4,
            "retryPeriod": 1,
        },
        "logging": {"format": "json", "level": "info"},
    } | extra
    path.write_text(yaml.safe_dump(config))
    return path


async def check(config: Path) -> tuple[int, list[str]]:
    code, out, err = await cli("check", "--config", str(config), timeout=60)
    assert "Traceback" not in err, err
    return code, out.splitlines()


def failures(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("FAIL")]


def role(namespace: str, name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": namespace},
        "rules": rules,
    }


def binding(
    kind: str, name: str, namespace: str, role_kind: str = "Role", role_name: str = ""
) -> dict[str, Any]:
    """``kind`` (RoleBinding or ClusterRoleBinding) of the account to the role
    ``role_name`` (default: ``name``)."""
    meta: dict[str, Any] = {"name": name}
    if kind == "RoleBinding":
        meta["namespace"] = namespace
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": meta,
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role_kind,
            "name": role_name or name,
        },
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}],
    }


def watch_role(namespace: str) -> list[dict[str, Any]]:
    """The account may list and watch the configured ConfigMaps, and nothing more."""
    rules = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]}]
    return [role(namespace, "watch", rules), binding("RoleBinding", "watch", namespace)]


async def allowed(
    cluster: KubeCluster, token: str, verb: str, group: str, resource: str, **attrs: str
) -> None:
    """Wait until the API server's RBAC (fed by an informer) lets ``token`` do it."""

    def can() -> bool:
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {"verb": verb, "group": group, "resource": resource} | attrs
            },
        }
        status, out = cluster.raw(
            "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review, token=token
        )
        assert status == 201, out
        return bool(out["status"].get("allowed"))

    await until(can, 20, lambda: f"RBAC never allowed {verb} {resource}.{group} {attrs}")


async def test_check_names_the_lease_and_review_rights_run_needs(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    ns = kube_namespace
    token = kube_cluster.service_account_token(ns, ACCOUNT)
    for obj in watch_role(ns):
        kube_cluster.create(obj)
    await allowed(kube_cluster, token, "watch", "", "configmaps", namespace=ns)
    kubeconfig = kube_cluster.write_kubeconfig(tmp_path / "kubeconfig", token=token)
    config = bridge_config(tmp_path, kubeconfig, ns)
    lease_line = f"leader election lease {ns}/{LEASE}"
    delegator = f"check-{uuid.uuid4().hex[:8]}"
    try:
        # No Lease rights, no reviews: one line for each, naming what to grant.
        code, lines = await check(config)
        assert code == 1, lines
        lease_fail, reviews_fail = failures(lines)
        assert lease_fail.startswith(
            f"FAIL  {lease_line}: forbidden to get, create, update leases.coordination.k8s.io"
            f" in namespace {ns}"
        ), lines
        assert reviews_fail.startswith("FAIL  control endpoint reviews: "), lines
        assert "tokenreviews.authentication.k8s.io and subjectaccessreviews" in reviews_fail
        assert "system:auth-delegator" in reviews_fail
        # The account may not read namespaces, and run never does: said, not failed.
        assert f"ok    leader election namespace {ns}: not verified" in " ".join(lines)
        assert any(line.startswith("ok    resource v1/ConfigMap watch") for line in lines)
        # What the line foretells: run stays a standby, publishing nothing.
        kube_cluster.create(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": ns}}
        )
        standby = Bridge(config)
        await standby.start()
        try:
            await until(
                lambda: "cannot get the leader election lease" in standby.log.read_text(),
                30,
                standby.tail_log,
            )
            assert standby.added() == []
        finally:
            assert await standby.stop() == 0, standby.tail_log()

        # The chart's Lease role, less get: the election reads its Lease first.
        rules = [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": [LEASE],
                "verbs": ["update"],
            },
        ]
        kube_cluster.create(role(ns, "lease", rules))
        kube_cluster.create(binding("RoleBinding", "lease", ns))
        lease = {"namespace": ns, "name": LEASE}
        await allowed(kube_cluster, token, "update", "coordination.k8s.io", "leases", **lease)
        code, lines = await check(config)
        assert code == 1, lines
        assert failures(lines)[0].startswith(f"FAIL  {lease_line}: forbidden to get leases"), lines

        rules[1]["verbs"] = ["get", "update"]
        kube_cluster.patch(
            "rbac.authorization.k8s.io/v1", "Role", "lease", {"rules": rules}, namespace=ns
        )
        await allowed(kube_cluster, token, "get", "coordination.k8s.io", "leases", **lease)
        code, lines = await check(config)
        assert code == 1, lines
        assert [f.split(":")[0] for f in failures(lines)] == ["FAIL  control endpoint reviews"]
        assert (
            f"ok    {lease_line}: get, create, update allowed on leases.coordination.k8s.io"
            f" in namespace {ns}"
        ) in lines

        kube_cluster.create(
            binding("ClusterRoleBinding", delegator, ns, "ClusterRole", "system:auth-delegator")
        )
        await allowed(kube_cluster, token, "create", "authorization.k8s.io", "subjectaccessreviews")
        await allowed(kube_cluster, token, "create", "authentication.k8s.io", "tokenreviews")
        code, lines = await check(config)
        assert code == 0, lines
        assert failures(lines) == []
        assert "ok    control endpoint reviews: create allowed on tokenreviews and " in "\n".join(
            lines
        )
        # Leader election on a SQLite file: said in one line, not a failure (one host works).
        (ha,) = [line for line in lines if line.startswith("WARN  checkpoint sqlite")]
        assert "across hosts" in ha and "nats-kv or kafka" in ha, ha
    finally:
        kube_cluster.raw(
            "DELETE", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{delegator}"
        )


async def test_a_lease_namespace_that_does_not_exist_fails_naming_it(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    absent = f"absent-{uuid.uuid4().hex[:8]}"
    kubeconfig = kube_cluster.write_kubeconfig(tmp_path / "kubeconfig")  # the admin
    config = bridge_config(tmp_path, kubeconfig, kube_namespace)
    doc = yaml.safe_load(config.read_text())
    doc["leaderElection"]["namespace"] = absent
    config.write_text(yaml.safe_dump(doc))
    code, lines = await check(config)
    assert code == 1, lines
    (failed,) = failures(lines)
    assert failed.startswith(f"FAIL  leader election namespace {absent}: does not exist"), lines
    assert "leaderElection.namespace" in failed


async def test_check_beside_a_running_bridge_reads_its_checkpoint_and_leaves_it_be(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    ns = kube_namespace
    kubeconfig = kube_cluster.write_kubeconfig(tmp_path / "kubeconfig")
    config = bridge_config(tmp_path, kubeconfig, ns)

    def config_map(name: str) -> None:
        kube_cluster.create(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}}
        )

    config_map("before")
    bridge = Bridge(config)
    await bridge.start()
    try:
        await bridge.wait_ready(timeout=30)
        # Leading and publishing: its first event is out.
        await until(lambda: bridge.added() == [f"{ns}/before"], 30, bridge.tail_log)
        assert bridge.proc is not None
        code, lines = await check(config)
        assert code == 0, lines
        state = tmp_path / "state.db"
        assert (
            f"ok    checkpoint sqlite: opens read-only: a running k8s-bridge"
            f" (pid {bridge.proc.pid}) holds {state}"
        ) in lines
        # The bridge goes on publishing from the checkpoint check just read.
        config_map("after")
        await until(lambda: bridge.added() == [f"{ns}/before", f"{ns}/after"], 30, bridge.tail_log)
        status, _ = await bridge.readyz()
        assert status == 200
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
    assert "in use" not in bridge.log.read_text()
