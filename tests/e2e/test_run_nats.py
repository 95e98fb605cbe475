"""``k8s-bridge run`` as a process, against the emulator over HTTP and a real nats-server.

The guarantees of the README's table, end to end: each real change once, in order;
nothing for ignored fields, reconnects or restarts; the changes made while the
bridge was dead (kill -9) — deletes included — after a restart, even when the
history was compacted meanwhile; nothing lost while the bus was down, and the
checkpoint never ahead of the bus; Secret values never on the bus.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from cloudevents.v1.http import from_json

from bridge.emulator import Emulator
from tests.e2e.bridge_process import (
    BridgeProcess,
    changes,
    jetstream_events,
    kill9,
    probe,
    published_once,
    without,
    write_config,
)
from tests.fixtures.nats import NatsServer
from tests.fixtures.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def pod(name: str, ns: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "nginx:1"}]},
        "status": {"phase": "Pending"},
    }


def watermark(db: Path, resource: str = "core/v1/pods") -> int:
    """The stored resourceVersion watermark of a resource (0 if none), read independently."""
    con = sqlite3.connect(db)
    try:
        tables = [r[0] for r in con.execute("select name from sqlite_master where type='table'")]
        for table in tables:
            cols = [r[1] for r in con.execute(f"pragma table_info({table})")]
            if "resource_version" in cols and "resource_id" in cols and "key" not in cols:
                row = con.execute(
                    f"select resource_version from {table} where resource_id = ?", (resource,)
                ).fetchone()
                return int(row[0]) if row and row[0] else 0
        raise AssertionError(f"no watermark table in {tables}")
    finally:
        con.close()


@pytest.fixture
def config(tmp_path: Path, kubeconfig: Path, nats_control: NatsServer) -> Path:
    return write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [nats_control.url]}},
    )


async def events_now(nats: NatsServer) -> list[dict[str, Any]]:
    return await jetstream_events(nats.url)


async def test_live_changes_reach_jetstream_once_in_order_as_cloudevents(
    config: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    emulator.create(pod("before"))
    emulator.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds", "namespace": "default"},
            "data": {"password": "aHVudGVyMg=="},
            "stringData": {"token": "s3cr3t-value"},
        }
    )
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready()
        emulator.create(pod("web"))
        emulator.patch("v1", "Pod", "web", {"status": {"phase": "Running"}}, namespace="default")
        emulator.patch(
            "v1",
            "Pod",
            "web",
            {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
            namespace="default",
        )
        emulator.create(
            {
                "apiVersion": "example.com/v1",
                "kind": "Widget",
                "metadata": {"name": "w1", "namespace": "default"},
                "spec": {"size": 1},
            }
        )
        emulator.delete("v1", "Pod", "web", namespace="default")

        async def all_arrived() -> bool:
            return len(await events_now(nats_control)) >= 6

        await until(all_arrived, 20, bridge.tail_log)
        # The conditions-only change is ignored: were it published, it would be in
        # the stream before the probe.
        await probe(emulator, nats_control.url, pod("probe"), message=bridge.tail_log)
        events = without(await events_now(nats_control), "probe")
    finally:
        assert await bridge.stop() == 0
    got = changes(events)
    # Order is guaranteed per object; pipelines of different kinds interleave freely.
    assert sorted(got) == sorted(
        [
            ("Pod", "added", "default/before"),
            ("Secret", "added", "default/creds"),
            ("Pod", "added", "default/web"),
            ("Pod", "modified", "default/web"),
            ("Widget", "added", "default/w1"),
            ("Pod", "deleted", "default/web"),
        ]
    )
    assert [c for c in got if c[2] == "default/web"] == [
        ("Pod", "added", "default/web"),
        ("Pod", "modified", "default/web"),
        ("Pod", "deleted", "default/web"),
    ]
    initial = {e["subject"] for e in events if e["initial"]}
    assert initial == {"default/before", "default/creds"}
    for e in events:
        ce = from_json(e["_raw"])  # the CloudEvents SDK accepts every event
        assert ce["specversion"] == "1.0" and ce["id"] == e["_msg_id"]
        assert e["_subject"].startswith("k8s.e2e.")
    web = [e for e in events if e["subject"] == "default/web"]
    assert web[0]["_subject"] == "k8s.e2e.core.v1.pods.default.web"
    rvs = [int(e["resourceversion"]) for e in web]
    assert rvs == sorted(rvs)
    raw = b"".join(e["_raw"] for e in events)
    assert b"aHVudGVyMg==" not in raw and b"s3cr3t-value" not in raw


async def test_kill9_then_changes_and_compaction_then_restart_publishes_exactly_the_missed(
    config: Path, emulator: Emulator, nats_control: NatsServer, tmp_path: Path
) -> None:
    for name in ("keep", "change", "gone"):
        emulator.create(pod(name))
    bridge = BridgeProcess(config)
    await bridge.start()
    await bridge.wait_ready()
    await until(lambda: watermark(tmp_path / "state.db") >= emulator.resource_version - 0, 20)
    kill9(bridge)
    await bridge.proc.wait()  # type: ignore[union-attr]
    first = await events_now(nats_control)
    assert len(first) == 3
    emulator.patch("v1", "Pod", "change", {"spec": {"nodeName": "n1"}}, namespace="default")
    emulator.delete("v1", "Pod", "gone", namespace="default")
    emulator.create(pod("new"))
    emulator.patch(
        "v1",
        "Pod",
        "keep",
        {"status": {"conditions": [{"type": "PodScheduled"}]}},
        namespace="default",
    )
    emulator.chaos.compact()

    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready()

        async def three_more() -> bool:
            return len(await events_now(nats_control)) >= 6

        await until(three_more, 20, bridge.tail_log)
        await probe(emulator, nats_control.url, pod("probe"), message=bridge.tail_log)
        # The missed three and the probe; "keep" (an ignored field) not again.
        assert await published_once(bridge, 4) == 4
        events = without(await events_now(nats_control), "probe")
        metrics = await bridge.metrics()
    finally:
        assert await bridge.stop() == 0
    missed = sorted(changes(events[3:]))
    assert missed == [
        ("Pod", "added", "default/new"),
        ("Pod", "deleted", "default/gone"),
        ("Pod", "modified", "default/change"),
    ]
    assert "k8s_bridge_relists_total" in metrics or "relists" in metrics


async def test_graceful_restart_without_changes_publishes_nothing(
    config: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    emulator.create(pod("a"))
    emulator.create(pod("b"))
    for i, want in enumerate((3, 1)):  # a, b and a probe; then the probe alone
        bridge = BridgeProcess(config)
        await bridge.start()
        try:
            await bridge.wait_ready()
            await probe(emulator, nats_control.url, pod(f"probe{i}"), message=bridge.tail_log)
            assert await published_once(bridge, want) == want
        finally:
            assert await bridge.stop(signal.SIGINT) == 0
    subjects = [e["subject"] for e in await events_now(nats_control)]
    assert sorted(subjects) == ["default/a", "default/b", "default/probe0", "default/probe1"]


async def test_bus_down_then_back_loses_nothing_and_checkpoint_waits(
    config: Path, emulator: Emulator, nats_control: NatsServer, tmp_path: Path
) -> None:
    db = tmp_path / "state.db"
    emulator.create(pod("one"))
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready()
        await until(lambda: watermark(db) >= emulator.resource_version, 20)
        before = watermark(db)
        nats_control.stop()
        for i in range(5):
            emulator.create(pod(f"while-down-{i}"))

        async def not_ready() -> bool:
            return (await bridge.readyz())[0] == 503

        await until(not_ready, 20, bridge.tail_log)
        assert watermark(db) == before  # nothing acknowledged, nothing checkpointed
        nats_control.start()
        await bridge.wait_ready(30)

        async def all_there() -> bool:
            return len(await events_now(nats_control)) >= 6

        await until(all_there, 30, bridge.tail_log)
        await until(lambda: watermark(db) >= emulator.resource_version, 20)
        events = await events_now(nats_control)
    finally:
        assert await bridge.stop() == 0
    subjects = [e["subject"] for e in events]
    assert sorted(set(subjects)) == sorted(
        ["default/one"] + [f"default/while-down-{i}" for i in range(5)]
    )
    assert len(subjects) == len(set(subjects))  # the duplicate window dropped any redelivery


async def test_dropped_watches_lose_nothing_and_republish_nothing(
    config: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    emulator.create(pod("steady"))
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready()
        for i in range(3):
            await asyncio.sleep(1.2)  # each new watch lives past the short-watch window
            emulator.chaos.drop_watches()
            emulator.patch(
                "v1", "Pod", "steady", {"spec": {"nodeName": f"n{i}"}}, namespace="default"
            )

        async def four() -> bool:
            return len(await events_now(nats_control)) >= 4

        await until(four, 20, bridge.tail_log)
        # A resumed watch republishes nothing: the probe comes next, and the count
        # (which the stream's duplicate window cannot hide) is four and the probe.
        await probe(emulator, nats_control.url, pod("probe"), message=bridge.tail_log)
        assert await published_once(bridge, 5) == 5
        events = without(await events_now(nats_control), "probe")
        metrics = await bridge.metrics()
    finally:
        assert await bridge.stop() == 0
    assert (
        changes(events)
        == [("Pod", "added", "default/steady")] + [("Pod", "modified", "default/steady")] * 3
    )
    restarts = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("k8s_bridge_watch_restarts_total{") and "pods" in line
    ]
    assert sum(restarts) >= 3, metrics
