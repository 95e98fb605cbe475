"""The chart's mirror on a real kube-apiserver: ``helm install`` with ``mirror.enabled``
stores a Deployment the API server accepts, and the mirror runs as its pod would.

There is no kubelet: the Deployment is stored, not run. The mirror then runs
here with the pod's arguments and the config the chart rendered (read back
from the release's ConfigMap); only what ties it to the cluster's network is
swapped for local values: the NATS server, the PostgreSQL DSN, the server's
port. It needs no Kubernetes access at all (no token mounted, no RBAC).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
import nats
import pytest
import yaml

from tests.doubles.memory_source import event
from tests.e2e.bridge_process import free_port
from tests.e2e.mirror_process import query
from tests.fixtures.kube import KubeCluster
from tests.fixtures.nats import NatsServer
from tests.fixtures.waiting import until
from tests.real.test_chart_rbac import helm_install

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


async def test_the_charts_mirror_runs_with_the_config_it_rendered(
    tmp_path: Path,
    kube_cluster: KubeCluster,
    kube_namespace: str,
    nats_control: NatsServer,
    postgres_dsn: str,
) -> None:
    ns = kube_namespace
    uninstall = helm_install(
        kube_cluster,
        ns,
        "mir",
        {"mirror": {"enabled": True, "envFromSecrets": ["mirror-postgres"]}},
        tmp_path,
    )
    try:
        deploy = kube_cluster.get("apps/v1", "Deployment", "mir-k8s-bridge-mirror", ns)
        cm = kube_cluster.get("v1", "ConfigMap", "mir-k8s-bridge-mirror", ns)
    finally:
        uninstall()
    pod = deploy["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    args = container["args"]
    assert args[:2] == ["mirror", "--config"]
    config = yaml.safe_load(cm["data"]["mirror.yaml"])
    # The chart's config, with the cluster's addresses swapped for this machine's.
    port = free_port()
    config["source"]["nats"]["servers"] = [nats_control.url]
    config["postgres"]["dsn"] = postgres_dsn
    config["server"]["port"] = port
    path = tmp_path / "mirror.yaml"
    path.write_text(yaml.safe_dump(config))

    nc = await nats.connect(nats_control.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=config["source"]["nats"]["stream"], subjects=["k8s.>"])
        await js.publish("k8s.c1.core.v1.pods.ns.a", event("a", "u1", 1))
    finally:
        await nc.close()
    log = (tmp_path / "mirror.log").open("wb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bridge.cli", *args[:2], str(path), *args[3:],
        stderr=log, stdout=asyncio.subprocess.DEVNULL, env=env,
    )  # fmt: skip
    try:

        async def ready() -> bool:
            async with aiohttp.ClientSession() as http:
                try:
                    async with http.get(f"http://127.0.0.1:{port}{container['readinessProbe']['httpGet']['path']}") as r:  # fmt: skip
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

        await until(ready, 30)
        written = [("a", 1)]
        await until(
            lambda: _rows(postgres_dsn, written), 30, lambda: (tmp_path / "mirror.log").read_text()
        )
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        log.close()


async def _rows(dsn: str, want: list[tuple[str, int]]) -> bool:
    return await query(dsn, "SELECT name, resource_version FROM k8s.objects") == want
