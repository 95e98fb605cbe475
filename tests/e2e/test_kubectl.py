"""The real kubectl against the emulator: it must not tell it from a small cluster.

``kubectl apply`` runs with ``--validate=false``: the emulator serves no OpenAPI
documents, and kubectl's client-side validation needs them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from bridge.emulator import Emulator
from tests.e2e.kubectl import kubectl, kubectl_env
from tests.fixtures.realdeps import binary

pytestmark = [
    pytest.mark.e2e,
]

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: app
        image: IMAGE
        ports: [{containerPort: 80}]
---
apiVersion: example.com/v1
kind: Widget
metadata: {name: w1}
spec: {size: SIZE}
"""


async def test_kubectl_get_lists_objects_as_table_and_json(
    emulator: Emulator, kubeconfig: Path, tmp_path: Path
) -> None:
    emulator.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p1", "namespace": "default", "labels": {"app": "x"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": "Running"},
        }
    )
    table = await kubectl(tmp_path, kubeconfig, "get", "pods")
    as_json = orjson.loads(await kubectl(tmp_path, kubeconfig, "get", "pods", "-o", "json"))
    namespaces = await kubectl(tmp_path, kubeconfig, "get", "ns", "-o", "name")
    header, row = table.splitlines()[:2]
    assert header.split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert row.split()[:3] == ["p1", "0/1", "Running"]
    assert [i["metadata"]["name"] for i in as_json["items"]] == ["p1"]
    assert as_json["items"][0]["kind"] == "Pod"
    assert "namespace/default" in namespaces.split()


async def test_kubectl_apply_reapply_and_delete(
    emulator: Emulator, kubeconfig: Path, tmp_path: Path
) -> None:
    manifest = tmp_path / "app.yaml"
    manifest.write_text(DEPLOYMENT.replace("IMAGE", "nginx:1").replace("SIZE", "1"))
    created = await kubectl(tmp_path, kubeconfig, "apply", "--validate=false", "-f", str(manifest))
    assert "deployment.apps/web created" in created
    assert "widget.example.com/w1 created" in created
    first = emulator.get("apps/v1", "Deployment", "web", "default")

    manifest.write_text(DEPLOYMENT.replace("IMAGE", "nginx:2").replace("SIZE", "2"))
    configured = await kubectl(
        tmp_path, kubeconfig, "apply", "--validate=false", "-f", str(manifest)
    )
    assert "deployment.apps/web configured" in configured
    second = emulator.get("apps/v1", "Deployment", "web", "default")
    widget = emulator.get("example.com/v1", "Widget", "w1", "default")
    containers = second["spec"]["template"]["spec"]["containers"]
    assert containers == [{"name": "app", "image": "nginx:2", "ports": [{"containerPort": 80}]}]
    assert second["metadata"]["generation"] == first["metadata"]["generation"] + 1
    assert second["metadata"]["uid"] == first["metadata"]["uid"]
    assert widget["spec"] == {"size": 2}

    unchanged = await kubectl(
        tmp_path, kubeconfig, "apply", "--validate=false", "-f", str(manifest)
    )
    assert "deployment.apps/web unchanged" in unchanged
    third = emulator.get("apps/v1", "Deployment", "web", "default")
    assert third["metadata"]["resourceVersion"] == second["metadata"]["resourceVersion"]

    deleted = await kubectl(tmp_path, kubeconfig, "delete", "-f", str(manifest))
    assert 'deployment.apps "web" deleted' in deleted
    assert emulator.list("apps/v1", "Deployment") == []
    assert emulator.list("example.com/v1", "Widget") == []


async def test_kubectl_get_watch_sees_a_change_arrive(
    emulator: Emulator, kubeconfig: Path, tmp_path: Path
) -> None:
    def widget(name: str) -> dict[str, object]:
        return {
            "apiVersion": "example.com/v1",
            "kind": "Widget",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"size": 1},
        }

    emulator.create(widget("w1"))
    proc = await asyncio.create_subprocess_exec(
        binary("kubectl"),
        "get",
        "widgets",
        "-w",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=kubectl_env(tmp_path, kubeconfig),
    )
    stdout = proc.stdout
    assert stdout is not None
    try:
        seen: list[str] = []

        async def until(name: str) -> None:
            while not seen or seen[-1] != name:
                line = (await stdout.readline()).decode()
                assert line, "kubectl get -w ended early"
                seen.append(line.split()[0])

        await asyncio.wait_for(until("w1"), 20)
        # The list is done; the watch is open (kubectl watches from the list's RV).
        for _ in range(100):
            if any(r.query.get("watch") for r in emulator.requests):
                break
            await asyncio.sleep(0.05)
        emulator.create(widget("w2"))
        await asyncio.wait_for(until("w2"), 20)
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 10)
    assert seen[0] == "NAME"
    assert seen[-2:] == ["w1", "w2"]
    watch = next(r for r in emulator.requests if r.query.get("watch"))
    assert watch.path == "/apis/example.com/v1/namespaces/default/widgets"
