"""Shared pieces for reflector tests over HTTP against the emulator."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bridge.emulator import Emulator
from bridge.kube.client import KubeClient
from bridge.kube.discovery import ResourceInfo
from bridge.kube.listwatch import ListWatch
from bridge.kube.reflector import Reflector, ReflectorSettings

PODS = ResourceInfo("", "v1", "Pod", "pods", True, ("list", "watch"))
CONFIGMAPS = ResourceInfo("", "v1", "ConfigMap", "configmaps", True, ("list", "watch"))

# Short backoffs keep real-time tests fast; the semantics are those of the defaults.
FAST = ReflectorSettings(
    watch_list="off", backoff_initial=0.05, backoff_cap=0.5, idle_timeout=30, short_watch=0.05
)


@pytest.fixture
async def client(emulator: Emulator, tmp_path: Path) -> AsyncIterator[KubeClient]:
    path = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    c = await KubeClient.from_kubeconfig(str(path))
    try:
        yield c
    finally:
        await c.close()


def pod_body(name: str, namespace: str = "default", **labels: str) -> dict[str, object]:
    md: dict[str, object] = {"name": name, "namespace": namespace}
    if labels:
        md["labels"] = labels
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": md,
        "spec": {"containers": [{"name": "c", "image": "nginx"}]},
    }


@contextlib.asynccontextmanager
async def running(reflector: Reflector) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(reflector.run(), name="reflector")
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def make(client: KubeClient, res: ResourceInfo = PODS, **kw: object) -> ListWatch:
    return ListWatch(client, res, **kw)  # type: ignore[arg-type]
