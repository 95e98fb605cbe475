"""Who may make the bridge snapshot (``POST /snapshot``), on a real kube-apiserver.

``server.controlAuth: kubernetes`` (the default without a token): the bridge runs
as the ServiceAccount the chart makes, under the RBAC the chart renders (``helm
template``, applied with kubectl): ``system:auth-delegator`` for the bridge, a
``<fullname>-snapshot`` ClusterRole bound to ``rbac.snapshotCallers``. Each
caller's token comes from the TokenRequest API. A caller bound to the role gets
a snapshot (200, the announcements on the bus); one without gets 403; no token
and a garbage token get 401; once the bridge loses its right to review, a caller
gets 503, never a snapshot.

``server.controlToken``: only that token opens the endpoint; a valid Kubernetes
token does not.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.e2e.bridge_process import BridgeProcess, cli, free_port
from tests.fixtures.kube import KubeCluster
from tests.fixtures.realdeps import binary
from tests.fixtures.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CHART = Path(__file__).resolve().parents[2] / "charts" / "k8s-bridge"
CALLER = "snapshot-caller"
STRANGER = "stranger"


class Bridge(BridgeProcess):
    """``k8s-bridge run`` with the stdout sink: its events kept in a file."""

    def __init__(self, config: Path, env: dict[str, str] | None = None) -> None:
        super().__init__(config, keep_stdout=True, env=env)

    def events(self, change: str | None = None) -> list[dict[str, Any]]:
        return self.stdout_events(change)

    async def post(self, token: str | None) -> tuple[int, dict[str, Any]]:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"http://127.0.0.1:{self.port}/snapshot",
                params={"resource": "ConfigMap"},
                headers=headers,
            ) as r,
        ):
            body: dict[str, Any] = await r.json()
            return r.status, body


def bridge_config(tmp_path: Path, kubeconfig: Path, namespace: str, **server: Any) -> Path:
    path = tmp_path / "bridge.yaml"
    config = {
        "cluster": {"kubeconfig": str(kubeconfig), "name": "real"},
        "resources": [{"apiVersion": "v1", "kind": "ConfigMap", "namespaces": [namespace]}],
        "sink": {"kind": "stdout"},
        "checkpoint": {"kind": "sqlite", "path": str(tmp_path / "state.db")},
        "server": {"host": "127.0.0.1", "port": free_port(), **server},
        "logging": {"format": "json", "level": "info"},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def config_maps(cluster: KubeCluster, namespace: str, n: int) -> None:
    for i in range(n):
        cluster.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"cm-{i}", "namespace": namespace},
                "data": {"i": str(i)},
            }
        )


def chart_manifests(
    tmp_path: Path, cluster: KubeCluster, release: str, namespace: str
) -> list[dict[str, Any]]:
    """The chart's ServiceAccount and RBAC for a bridge of ConfigMaps in ``namespace``,
    with the ServiceAccount ``CALLER`` among the snapshot callers."""
    values = {
        "config": {
            "resources": [{"apiVersion": "v1", "kind": "ConfigMap", "namespaces": [namespace]}],
            "sink": {"kind": "stdout"},
        },
        "rbac": {
            "selfSubjectAccessReview": False,
            "snapshotCallers": [{"kind": "ServiceAccount", "name": CALLER, "namespace": namespace}],
        },
    }
    values_file = tmp_path / "values.json"
    values_file.write_text(json.dumps(values))
    home = tmp_path / "helm-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_")}
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        env[var] = str(home / var.lower())
    out = subprocess.run(
        [binary("helm"), "template", release, str(CHART), "--namespace", namespace,
         "-f", str(values_file), "--kube-version", cluster.request("GET", "/version")["gitVersion"],
         "--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/rbac.yaml"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def named(manifests: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    (found,) = [
        m for m in manifests if m["kind"] == kind and m["metadata"]["name"].endswith(suffix)
    ]
    return found


async def test_kubernetes_auth_lets_in_only_callers_the_chart_role_names(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    ns = kube_namespace
    release = f"ctl{uuid.uuid4().hex[:6]}"
    manifests = chart_manifests(tmp_path, kube_cluster, release, ns)
    delegator = named(manifests, "ClusterRoleBinding", "-auth-delegator")
    assert delegator["roleRef"]["name"] == "system:auth-delegator"
    role = named(manifests, "ClusterRole", "-snapshot")
    assert role["rules"] == [{"nonResourceURLs": ["/snapshot"], "verbs": ["post"]}]
    account = named(manifests, "ServiceAccount")["metadata"]["name"]
    as_yaml = yaml.safe_dump_all(manifests)
    try:
        kube_cluster.kubectl("apply", "-n", ns, "-f", "-", stdin=as_yaml)
        # What the bridge will ask, asked by kubectl: the role names the right request.
        for who, answer in ((CALLER, "yes"), (STRANGER, "no")):
            can = kube_cluster.kubectl(
                "auth", "can-i", "post", "/snapshot", f"--as=system:serviceaccount:{ns}:{who}",
                check=False,
            )  # fmt: skip
            assert can.stdout.strip() == answer, (who, can.stdout, can.stderr)
        config_maps(kube_cluster, ns, 3)
        bridge_token = kube_cluster.service_account_token(ns, account, create=False)
        caller = kube_cluster.service_account_token(ns, CALLER)
        stranger = kube_cluster.service_account_token(ns, STRANGER)
        kubeconfig = kube_cluster.write_kubeconfig(tmp_path / "kubeconfig", token=bridge_token)
        config = bridge_config(tmp_path, kubeconfig, ns)
        bridge = Bridge(config)
        await bridge.start()
        try:
            await bridge.wait_ready(timeout=30)
            await until(lambda: len(bridge.events("added")) == 3, 20)

            status, body = await bridge.post(None)
            assert status == 401 and body["error"].startswith("unauthorized: send Authorization")
            status, body = await bridge.post("not-a-token")
            assert (status, body) == (
                401,
                {"error": "unauthorized: the bearer token is not valid (TokenReview)"},
            )
            status, body = await bridge.post(stranger)
            assert status == 403, body
            assert body["error"].startswith(
                f"forbidden: 'system:serviceaccount:{ns}:{STRANGER}' may not post /snapshot"
            )
            assert bridge.events("snapshot") == []

            status, body = await bridge.post(caller)
            assert status == 200, body
            assert (body["listed"], body["announced"]) == (3, 3)
            snaps = bridge.events("snapshot")
            assert sorted(e["subject"] for e in snaps) == [f"{ns}/cm-{i}" for i in range(3)]
            assert {e["id"].rsplit(":", 1)[-1] for e in snaps} == {body["signalId"]}

            # The CLI sends the config's own credentials: the bridge's account, not a caller.
            rc, out, err = await cli("snapshot", "--config", str(config), "--resource", "ConfigMap")
            assert rc == 1 and err.count("\n") == 1, err
            assert f"'system:serviceaccount:{ns}:{account}' may not post /snapshot" in err
            rc, out, err = await cli(
                "snapshot", "--config", str(config), "--resource", "ConfigMap", "--token", caller
            )
            assert rc == 0, err
            assert "announced 3, skipped 0, listed 3" in out
            assert len(bridge.events("snapshot")) == 6

            # The bridge loses its right to review: a caller it has not seen gets 503.
            kube_cluster.kubectl("delete", "clusterrolebinding", delegator["metadata"]["name"])
            seen: list[tuple[int, dict[str, Any]]] = []

            async def refused() -> bool:
                # A new token each time: an allowed answer is cached per token.
                fresh = kube_cluster.service_account_token(ns, CALLER, create=False)
                seen.append(await bridge.post(fresh))
                return seen[-1][0] == 503

            await until(refused, 20, lambda: f"answers: {seen[-3:]}")
            assert "system:auth-delegator" in seen[-1][1]["error"]
            assert {s for s, _ in seen} <= {200, 503}  # 200 only before RBAC caught up
            announced = sum(b.get("announced", 0) for s, b in seen if s == 200)
            assert len(bridge.events("snapshot")) == 6 + announced
        finally:
            assert await bridge.stop() == 0, bridge.tail_log()
    finally:
        kube_cluster.kubectl(
            "delete", "--ignore-not-found", "clusterrole,clusterrolebinding",
            "-l", f"app.kubernetes.io/instance={release}",
        )  # fmt: skip


async def test_a_static_token_opens_the_endpoint_and_a_kubernetes_token_does_not(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    ns = kube_namespace
    config_maps(kube_cluster, ns, 2)
    kubeconfig = kube_cluster.write_kubeconfig(tmp_path / "kubeconfig")
    config = bridge_config(tmp_path, kubeconfig, ns)
    # From the environment, as the chart's envFromSecrets hands it over.
    env = {"BRIDGE_SERVER__CONTROLTOKEN": "s3cret-" + uuid.uuid4().hex}
    bridge = Bridge(config, env)
    await bridge.start()
    try:
        await bridge.wait_ready(timeout=30)
        await until(lambda: len(bridge.events("added")) == 2, 20)
        status, body = await bridge.post(None)
        assert (status, body) == (
            401,
            {"error": "unauthorized: send Authorization: Bearer <server.controlToken>"},
        )
        # The admin's token is valid for the API server, but it is not the control token.
        status, body = await bridge.post(kube_cluster.admin_token)
        assert (status, body) == (
            401,
            {"error": "unauthorized: the bearer token is not server.controlToken"},
        )
        assert bridge.events("snapshot") == []
        status, body = await bridge.post(env["BRIDGE_SERVER__CONTROLTOKEN"])
        assert status == 200 and body["announced"] == 2, body
        cli_env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"} | env
        rc, out, err = await cli(
            "snapshot", "--config", str(config), "--resource", "ConfigMap", env=cli_env
        )
        assert rc == 0, err
        assert "announced 2, skipped 0, listed 2" in out
        assert len(bridge.events("snapshot")) == 4
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
    log = bridge.log.read_text()
    assert env["BRIDGE_SERVER__CONTROLTOKEN"] not in log
