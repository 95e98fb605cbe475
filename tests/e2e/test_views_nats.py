"""``k8s-bridge run`` with triggerPaths and fields, against the emulator and a real nats-server.

Only trigger changes are published, events carry only the projected fields
(Secret values still redacted), and a restart with a changed configuration
republishes nothing that did not change.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from bridge.emulator import Emulator
from tests.e2e.bridge_process import BridgeProcess, changes, jetstream_events, until, write_config
from tests.fixtures.nats import NatsServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "nginx:1"}]},
        "status": {"phase": "Pending"},
    }


def config(path: Path, kubeconfig: Path, url: str, pod_entry: dict[str, Any]) -> Path:
    return write_config(
        path,
        kubeconfig=kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [url]}},
        resources=[
            {"apiVersion": "v1", "kind": "Pod", **pod_entry},
            {"apiVersion": "v1", "kind": "Secret", "fields": ["data"]},
        ],
    )


async def test_triggers_and_projections_on_jetstream_and_a_restart_with_new_views(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    path = tmp_path / "bridge.yaml"
    config(
        path,
        kubeconfig,
        nats_control.url,
        {"triggerPaths": ["spec.nodeName"], "fields": ["spec.nodeName", "status.phase"]},
    )
    emulator.create(pod("web"))
    emulator.create(pod("idle"))
    emulator.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds", "namespace": "default"},
            "data": {"password": "aHVudGVyMg=="},
            "type": "Opaque",
        }
    )

    async def count(n: int) -> bool:
        return len(await jetstream_events(nats_control.url)) >= n

    bridge = BridgeProcess(path)
    await bridge.start()
    try:
        await bridge.wait_ready()
        await until(lambda: count(3), 20, bridge.tail_log)
        emulator.patch("v1", "Pod", "web", {"status": {"phase": "Running"}}, namespace="default")
        emulator.patch("v1", "Pod", "web", {"spec": {"nodeName": "n1"}}, namespace="default")
        await until(lambda: count(4), 20, bridge.tail_log)
        await asyncio.sleep(0.5)  # anything extra would arrive now
    finally:
        assert await bridge.stop() == 0
    events = await jetstream_events(nats_control.url)
    assert sorted(changes(events)) == sorted(
        [
            ("Pod", "added", "default/web"),
            ("Pod", "added", "default/idle"),
            ("Secret", "added", "default/creds"),
            ("Pod", "modified", "default/web"),
        ]
    )
    modified = events[-1]
    assert modified["data"]["object"]["spec"] == {"nodeName": "n1"}
    assert modified["data"]["object"]["status"] == {"phase": "Running"}
    assert set(modified["data"]["object"]) == {"apiVersion", "kind", "metadata", "spec", "status"}
    assert not any(b"aHVudGVyMg==" in e["_raw"] for e in events)
    secret = next(e for e in events if e["subject"] == "default/creds")
    assert set(secret["data"]["object"]) == {"apiVersion", "kind", "metadata", "data"}

    # Restart with other views: nothing changed meanwhile, so nothing is published.
    config(path, kubeconfig, nats_control.url, {"generationOnly": True, "fields": ["metadata"]})
    bridge = BridgeProcess(path)
    await bridge.start()
    try:
        await bridge.wait_ready()
        await asyncio.sleep(1.0)
        assert len(await jetstream_events(nats_control.url)) == 4
    finally:
        assert await bridge.stop() == 0
