"""A list or watch of a resource the API server stopped serving names it.

kube-apiserver answers a path it does not serve (a CustomResourceDefinition
deleted since discovery) with a bare text "404 page not found", as the
emulator does for a group it does not serve; the bridge's warning and /readyz
then said only that (tests/real/test_crd_real.py shows it on the real server).
"""

from __future__ import annotations

import pytest

from bridge.errors import NotFoundError
from bridge.kube.client import KubeClient
from bridge.kube.discovery import ResourceInfo
from bridge.kube.listwatch import ListWatch
from bridge.kube.protocols import ListOptions, WatchOptions
from bridge.kube.rawjson import ObjectDecoder

GONE = ResourceInfo("gone.example.com", "v1", "Gizmo", "gizmos", True, ("list", "watch"))
NAMED = r"no longer serves gizmos of gone\.example\.com/v1 \(404 page not found\)"


@pytest.mark.parametrize("decoded", [False, True])
async def test_list_and_watch_of_a_resource_no_longer_served_name_it(
    client: KubeClient, decoded: bool
) -> None:
    decoder = ObjectDecoder() if decoded else None
    lw = ListWatch(client, GONE, namespace="default", decoder=decoder)
    with pytest.raises(NotFoundError, match=NAMED) as listed:
        await lw.list(ListOptions(limit=10))
    assert listed.value.code == 404
    with pytest.raises(NotFoundError, match=NAMED):
        async with lw.list_stream(ListOptions()):
            pass
    with pytest.raises(NotFoundError, match=NAMED):
        async with lw.watch(WatchOptions(resource_version="1")):
            pass


async def test_an_error_inside_an_open_watch_is_not_renamed(client: KubeClient) -> None:
    pods = ResourceInfo("", "v1", "Pod", "pods", True, ("list", "watch"))
    lw = ListWatch(client, pods, namespace="default")
    with pytest.raises(NotFoundError, match=r"^inside$"):
        async with lw.watch(WatchOptions(resource_version="0", timeout_seconds=1)):
            raise NotFoundError("inside")
