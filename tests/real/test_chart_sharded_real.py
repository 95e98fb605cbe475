"""The chart's sharded mode on a real kube-apiserver: ``sharding.replicas: 2`` with a
standby per shard.

``helm install`` stores two StatefulSets (nothing runs: no kubelet, no
controllers). The pods are then run as their env says they would be: the
rendered config, the chart's ServiceAccount token, ``BRIDGE_SHARDING__SHARDINDEX``
the pod index, so the bridge elects on ``<fullname>-shard-<index>``: pod 0 and 1 of the
first set and pod 0 of the standby set. Each shard has one leader under the
chart's Lease rules, the standby waits, and the two leaders together publish
every Pod once, each in the shard its uid hashes to.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from bridge.kube.sharding import shard_range
from tests.e2e.bridge_process import BridgeProcess, free_port, is_leader
from tests.fixtures.kube import KubeCluster
from tests.fixtures.waiting import until
from tests.real.test_chart_rbac import can_i, helm_install

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def pod_config(cluster: KubeCluster, config: dict[str, object], token: str, workdir: Path) -> Path:
    """The chart's rendered config with only what binds it to a pod swapped for local
    values (API server access, sink, port); the shard comes from the env, as in the pod."""
    workdir.mkdir()
    config = dict(config)
    config["cluster"] = {"kubeconfig": str(cluster.write_kubeconfig(workdir / "kc", token=token))}
    config["sink"] = {"kind": "stdout"}
    config["server"] = {"host": "127.0.0.1", "port": free_port()}
    path = workdir / "bridge.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


async def test_sharded_standby_release_runs_one_leader_per_shard_on_its_lease(
    kube_cluster: KubeCluster, kube_namespace: str, tmp_path: Path
) -> None:
    ns = release = kube_namespace
    fullname = f"{release}-k8s-bridge"
    values = {
        "sharding": {"replicas": 2, "standby": True},
        "persistence": {"enabled": False},
        "config": {
            "resources": [{"apiVersion": "v1", "kind": "Pod", "namespaces": [ns]}],
            "sink": {"kind": "nats", "nats": {"servers": ["nats://nats:4222"]}},
            "checkpoint": {"kind": "memory"},
        },
    }
    uninstall = helm_install(kube_cluster, ns, release, values, tmp_path)
    bridges: list[BridgeProcess] = []
    try:
        for name in (fullname, f"{fullname}-standby"):
            sts = kube_cluster.get("apps/v1", "StatefulSet", name, ns)
            assert sts["spec"]["replicas"] == 2
        config = yaml.safe_load(
            kube_cluster.get("v1", "ConfigMap", fullname, ns)["data"]["bridge.yaml"]
        )
        assert config["sharding"] == {"by": "uid", "shards": 2}
        token = kube_cluster.service_account_token(ns, fullname, create=False)
        await until(lambda: can_i(kube_cluster, token, "list", "pods", "-n", ns), 20)
        for i in range(10):
            kube_cluster.create(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"p{i}", "namespace": ns},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]},
                }
            )
        # Pods 0 and 1 of the first set, pod 0 of the standby set, with the env the
        # pod template gives them.
        for pod_name, index in ((f"{fullname}-0", 0), (f"{fullname}-1", 1),
                                (f"{fullname}-standby-0", 0)):  # fmt: skip
            env = {
                "BRIDGE_SHARDING__SHARDINDEX": str(index),
                "BRIDGE_LEADERELECTION__IDENTITY": pod_name,
            }
            path = pod_config(kube_cluster, config, token, tmp_path / pod_name)
            bridges.append(BridgeProcess(path, keep_stdout=True, env=env))
        first, second, standby = bridges
        await asyncio.gather(first.start(), second.start())
        await until(lambda: is_leader(first), 40, first.tail_log)
        await until(lambda: is_leader(second), 40, second.tail_log)
        # The standby of shard 0 comes once shard 0 has its leader: it must wait.
        await standby.start()
        await standby.wait_ready(40)

        def subjects(b: BridgeProcess) -> list[str]:
            return [e["subject"] for e in b.stdout_events("added")]

        await until(lambda: len(subjects(first)) + len(subjects(second)) == 10, 40)
        assert not await is_leader(standby) and subjects(standby) == []
        for index, b in enumerate((first, second)):
            for e in b.stdout_events():
                uid = e["data"]["object"]["metadata"]["uid"]
                assert shard_range(2, index, "uid").contains(uid), e["subject"]
        assert sorted(subjects(first) + subjects(second)) == sorted(f"{ns}/p{i}" for i in range(10))
        for index in range(2):
            lease = kube_cluster.get(
                "coordination.k8s.io/v1", "Lease", f"{fullname}-shard-{index}", ns
            )
            assert lease["spec"]["holderIdentity"] == f"{fullname}-{index}"
        assert not any("forbidden" in b.log.read_text().lower() for b in bridges)
    finally:
        await asyncio.gather(*(b.stop() for b in bridges if b.proc is not None))
        uninstall()
