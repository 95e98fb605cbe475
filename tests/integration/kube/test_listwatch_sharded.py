"""ListWatch with a shard on the emulator: the parsed-whole LIST (as ``check`` reads)
and the probe, with the server honouring ``shardSelector`` and ignoring it."""

from __future__ import annotations

import pytest
import structlog

from bridge.emulator import Emulator
from bridge.kube.client import KubeClient
from bridge.kube.listwatch import ListWatch
from bridge.kube.protocols import ListOptions
from bridge.kube.sharding import shard_ranges
from tests.integration.kube.conftest import CONFIGMAPS


@pytest.mark.parametrize("honours", [True, False])
async def test_whole_lists_and_the_probe_of_a_shard(
    client: KubeClient, emulator: Emulator, honours: bool
) -> None:
    emulator.sharded_list_watch = honours
    made = [
        emulator.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"c{i}", "namespace": "default"},
            }
        )
        for i in range(12)
    ]
    ranges = shard_ranges(2, "uid")
    with structlog.testing.capture_logs() as logs:
        probed = ListWatch(client, CONFIGMAPS, namespace="default", shard=ranges[0])
        assert probed.shard_honoured is None
        assert await probed.probe_shard() is honours
        assert await ListWatch(client, CONFIGMAPS, namespace="default").probe_shard() is None
        got: list[set[str]] = []
        for r in ranges:
            lw = ListWatch(client, CONFIGMAPS, namespace="default", shard=r)  # no decoder
            items = (await lw.list(ListOptions()))["items"]
            names = {o["metadata"]["name"] for o in items}
            assert names == {
                o["metadata"]["name"] for o in made if r.contains(o["metadata"]["uid"])
            }
            assert all(o["kind"] == "ConfigMap" for o in items)
            assert lw.shard_honoured is honours
            assert lw.client_filtered == (0 if honours else len(made) - len(names))
            got.append(names)
    assert got[0] | got[1] == {o["metadata"]["name"] for o in made} and not got[0] & got[1]
    warned = [e for e in logs if e["event"].startswith("the API server ignores shardSelector")]
    assert len(warned) == (0 if honours else 3)
