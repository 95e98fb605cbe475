"""Heartbeats and ``k8s-bridge snapshot`` end to end: ``k8s-bridge run`` as a process,
the emulator over HTTP, a real nats-server.

A snapshot during churn keeps resourceVersion order per object; a kill -9 in the
middle of a snapshot leaves a checkpoint from which the restart publishes
nothing; heartbeats arrive on their own subject with the committed watermark.
"""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import nats
import pytest

from bridge.emulator import Emulator
from tests.e2e.bridge_process import (
    BridgeProcess,
    cli,
    jetstream_events,
    kill9,
    probe,
    published,
    write_config,
)
from tests.e2e.test_run_nats import pod, watermark
from tests.fixtures.nats import NatsServer
from tests.fixtures.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

HEARTBEATS = "k8s.e2e.heartbeat.core.v1.pods._"


def signal_config(tmp_path: Path, kubeconfig: Path, nats: NatsServer, **extra: Any) -> Path:
    path = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [nats.url]}, **extra.pop("sink", {})},
        **extra,
    )
    return path


def pods_with_heartbeats(interval: float) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "ignoreFields": ["status.conditions"],
            "heartbeatInterval": interval,
        }
    ]


async def test_heartbeats_and_a_snapshot_signal_reach_jetstream(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    for i in range(5):
        emulator.create(pod(f"p{i}"))
    config = signal_config(tmp_path, kubeconfig, nats_control, resources=pods_with_heartbeats(0.3))
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready()

        async def beats() -> list[dict[str, Any]]:
            return [
                e for e in await jetstream_events(nats_control.url) if e["_subject"] == HEARTBEATS
            ]

        await until(lambda: _at_least(beats, 3), 20, bridge.tail_log)
        rc, out, err = await cli("snapshot", "--config", str(config), "--resource", "Pod")
        assert rc == 0, err
        rc_unknown, _, err_unknown = await cli(
            "snapshot", "--config", str(config), "--resource", "Widget"
        )
        events = await jetstream_events(nats_control.url)
    finally:
        assert await bridge.stop() == 0
    m = re.match(r"snapshot (\w+) of v1/pods: announced 5, skipped 0, listed 5 in ", out)
    assert m, out
    signal = m.group(1)
    snaps = [e for e in events if e["type"] == "io.k8s.core.v1.Pod.snapshot"]
    assert sorted(e["subject"] for e in snaps) == [f"default/p{i}" for i in range(5)]
    for e in snaps:
        uid = e["data"]["object"]["metadata"]["uid"]
        assert e["id"] == e["_msg_id"] == f"{uid}:{e['resourceversion']}:snapshot:{signal}"
    assert rc_unknown == 2 and err_unknown.count("\n") == 1
    hb = [e for e in events if e["_subject"] == HEARTBEATS]
    assert all(e["type"] == "io.k8s.bridge.heartbeat" for e in hb)
    assert len({e["id"] for e in hb}) == len(hb) == len({e["_msg_id"] for e in hb})
    last = hb[-1]["data"]
    assert (last["objects"], last["synced"], last["watchUp"]) == (5, True, True)
    # The watermark it reports is one the checkpoint committed: never ahead of it.
    assert 0 < int(last["watermark"]) <= watermark(tmp_path / "state.db")


async def _at_least(fetch: Any, n: int) -> bool:
    return len(await fetch()) >= n


async def test_a_snapshot_during_churn_keeps_order_and_a_kill_during_one_republishes_nothing(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    n = 1000
    names = [f"s{i}" for i in range(n)]
    for name in names:
        emulator.create(pod(name))
    # Small pages and batches: a snapshot takes long enough to be interrupted.
    config = signal_config(
        tmp_path,
        kubeconfig,
        nats_control,
        resources=pods_with_heartbeats(5),
        sink={"maxBatch": 10},
        informer={"pageSize": 10},
    )
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready(60)
        stop = asyncio.Event()

        async def churn() -> None:
            i = 0
            while not stop.is_set():
                i += 1
                emulator.patch(
                    "v1",
                    "Pod",
                    names[i % 50],
                    {"spec": {"nodeName": f"n{(i // 50) % 2}"}},
                    namespace="default",
                )
                await asyncio.sleep(0.003)

        churner = asyncio.create_task(churn())
        try:
            rc, out, err = await cli(
                "snapshot", "--config", str(config), "--resource", "v1/Pod", timeout=90
            )
        finally:
            stop.set()
            await churner
        assert rc == 0, err
        assert re.search(r"announced \d+, skipped \d+", out), out
        # The churn's last changes are in the stream once a later change is.
        await probe(emulator, nats_control.url, pod("probe1"), 30, bridge.tail_log)

        # A second snapshot, interrupted by kill -9 half way.
        snapshot = asyncio.create_task(
            cli("snapshot", "--config", str(config), "--resource", "Pod", timeout=90)
        )

        nc = await nats.connect(nats_control.url)
        try:
            js = nc.jetstream()
            start = (await js.stream_info("K8S")).state.messages
            while (await js.stream_info("K8S")).state.messages < start + 50:
                await asyncio.sleep(0.005)
            kill9(bridge)
        finally:
            await nc.close()
        rc_killed, _, err_killed = await snapshot
        before = await jetstream_events(nats_control.url)
    finally:
        await bridge.stop()
    assert rc_killed == 1 and "127.0.0.1:" in err_killed
    snaps_before = [e for e in before if e["type"].endswith(".snapshot")]
    assert len(snaps_before) < 2 * n, "the kill came after the snapshot: nothing was in flight"

    # Per object: resourceVersion order across live changes and both snapshots.
    by_subject: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in before:
        if e["type"].startswith("io.k8s.core.v1.Pod."):
            by_subject[e["subject"]].append(e)
    for subject, events in by_subject.items():
        rvs = [int(e["resourceversion"]) for e in events]
        assert rvs == sorted(rvs), subject

    # The restart publishes nothing: nothing changed while it was down.
    restarted = BridgeProcess(config)
    await restarted.start()
    try:
        await restarted.wait_ready(60)
        await probe(emulator, nats_control.url, pod("probe2"), 30, restarted.tail_log)

        async def counted() -> bool:  # the metric follows the pipeline's own count
            return published(await restarted.metrics()) >= 1

        await until(counted, 20, restarted.tail_log)
        metrics = await restarted.metrics()
        after = await jetstream_events(nats_control.url)
    finally:
        assert await restarted.stop() == 0
    # Only the probe: anything the restart republished would have come before it.
    assert published(metrics) == 1, restarted.tail_log()
    new = [e for e in after[len(before) :] if e["_subject"] != HEARTBEATS]
    assert [e["subject"] for e in new] == ["default/probe2"]


async def test_check_names_where_heartbeats_go_and_fails_when_the_stream_would_not_keep_them(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    config = signal_config(tmp_path, kubeconfig, nats_control, resources=pods_with_heartbeats(30))
    code, out, err = await cli("check", "--config", str(config), timeout=40)
    assert code == 0, (out, err)
    assert f"ok    resource v1/Pod heartbeat: every 30s on {HEARTBEATS}" in out.splitlines()
    narrow = signal_config(
        tmp_path,
        kubeconfig,
        nats_control,
        resources=pods_with_heartbeats(30),
        sink={
            "nats": {
                "servers": [nats_control.url],
                "stream": "NARROW",
                "subjects": ["k8s.e2e.core.>"],
            }
        },
    )
    code, out, _ = await cli("check", "--config", str(narrow), timeout=40)
    assert code == 1
    assert any(
        line.startswith("FAIL  resource v1/Pod heartbeat:") and "sink.nats.subjects" in line
        for line in out.splitlines()
    ), out
