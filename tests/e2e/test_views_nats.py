"""``k8s-bridge run`` with triggerPaths and fields, against the emulator and a real nats-server.

Only trigger changes are published, events carry only the projected fields
(Secret values still redacted), and a restart with a changed configuration
republishes nothing that did not change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bridge.emulator import Emulator
from tests.e2e.bridge_process import (
    BridgeProcess,
    changes,
    jetstream_events,
    probe,
    published,
    without,
    write_config,
)
from tests.fixtures.nats import NatsServer
from tests.fixtures.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "nginx:1"}]},
        "status": {"phase": "Pending"},
    }


def secret(name: str, **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": "default"},
        "data": data,
        "type": "Opaque",
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
    emulator.create(secret("creds", password="aHVudGVyMg=="))

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
        # The status change alone triggers nothing: were it published, it would be
        # in the stream before the probe.
        await probe(emulator, nats_control.url, pod("probe1"), message=bridge.tail_log)
    finally:
        assert await bridge.stop() == 0
    events = without(await jetstream_events(nats_control.url), "probe1")
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
    creds = next(e for e in events if e["subject"] == "default/creds")
    assert set(creds["data"]["object"]) == {"apiVersion", "kind", "metadata", "data"}

    # Restart with other views: nothing changed meanwhile, so nothing is published.
    config(path, kubeconfig, nats_control.url, {"generationOnly": True, "fields": ["metadata"]})
    bridge = BridgeProcess(path)
    await bridge.start()
    try:
        await bridge.wait_ready()
        await probe(emulator, nats_control.url, pod("probe2"), message=bridge.tail_log)
        await probe(emulator, nats_control.url, secret("probe3"), message=bridge.tail_log)
        events = await jetstream_events(nats_control.url)
        assert [e["subject"] for e in events[5:]] == ["default/probe2", "default/probe3"]
        assert len(without(events, "probe1", "probe2", "probe3")) == 4

        # The bus drops a republish of the same id; the bridge's own count does not.
        async def counted() -> bool:
            m = await bridge.metrics()
            return published(m, "v1/pods") >= 1 and published(m, "v1/secrets") >= 1

        await until(counted, 20, bridge.tail_log)
        m = await bridge.metrics()
        assert (published(m, "v1/pods"), published(m, "v1/secrets")) == (1, 1)
    finally:
        assert await bridge.stop() == 0
