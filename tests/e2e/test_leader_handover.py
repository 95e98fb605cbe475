"""Two ``k8s-bridge run`` replicas with leader election: one publishes, the other waits.

As a Deployment with ``replicas: 2`` runs it: both processes watch the same
API (the emulator over HTTP) and share one bus and one checkpoint store (NATS
JetStream and its KV bucket; in HA a replica's own disk would resume from a
stale state). The leader is kill -9'd while changes keep coming; the standby
takes over after about the lease duration and resumes from the shared
checkpoint, so every change made across the hand-over reaches the bus exactly
once per (subject, resourceVersion): what the dead leader published but had
not checkpointed is published again with the same id, and JetStream's
duplicate window drops it.

Readiness of a standby: it answers /readyz 200. It is healthy (API resolved,
bus connected) and ready to lead; a not-ready standby would block every
rolling update of the Deployment (maxUnavailable) and page for nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bridge.emulator import Emulator
from tests.e2e.bridge_process import (
    BridgeProcess,
    gauge,
    is_leader,
    jetstream_events,
    kill9,
    probe,
    published,
    until,
    without,
    write_config,
)
from tests.fixtures.nats import NatsServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

LEASE, RENEW, RETRY = 2.0, 1.5, 0.3


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "nginx:1"}]},
        "status": {"phase": "Pending"},
    }


def replica_config(
    tmp_path: Path, kubeconfig: Path, nats: NatsServer, identity: str
) -> BridgeProcess:
    home = tmp_path / identity
    home.mkdir()
    config = write_config(
        home / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [nats.url]}},
        checkpoint={"kind": "nats-kv", "bucket": "k8s-bridge-ha", "flushInterval": 0.1},
        leaderElection={
            "enabled": True,
            "identity": identity,
            "leaseDuration": LEASE,
            "renewDeadline": RENEW,
            "retryPeriod": RETRY,
        },
    )
    return BridgeProcess(config)


class Churn:
    """Creates a pod and updates the previous one every ``interval``; records each change."""

    def __init__(self, emulator: Emulator, interval: float = 0.05) -> None:
        self.emulator = emulator
        self.interval = interval
        self.made: list[tuple[str, str]] = []  # (subject, resourceVersion)
        self._n = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            name = f"p{self._n}"
            body = self.emulator.create(pod(name))
            self.made.append((f"default/{name}", body["metadata"]["resourceVersion"]))
            if self._n > 0:
                prev = f"p{self._n - 1}"
                body = self.emulator.patch(
                    "v1", "Pod", prev, {"status": {"phase": "Running"}}, namespace="default"
                )
                self.made.append((f"default/{prev}", body["metadata"]["resourceVersion"]))
            self._n += 1
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="churn")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def test_standby_takes_over_after_kill9_and_no_change_is_lost(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    emulator.create(pod("before"))
    a = replica_config(tmp_path, kubeconfig, nats_control, "replica-a")
    b = replica_config(tmp_path, kubeconfig, nats_control, "replica-b")
    churn = Churn(emulator)
    await a.start()
    try:
        await until(lambda: is_leader(a), 20, a.tail_log)
        await a.wait_ready()
        await b.start()
        # The standby is ready (see the module docstring) and does not lead.
        await b.wait_ready()
        lease = emulator.get("coordination.k8s.io/v1", "Lease", "k8s-bridge", namespace="default")
        assert lease["spec"]["holderIdentity"] == "replica-a"

        churn.start()

        async def some_published() -> bool:
            return len(await jetstream_events(nats_control.url)) >= 20

        await until(some_published, 20, a.tail_log)
        a_metrics, b_metrics = await a.metrics(), await b.metrics()
        # Exactly one leader; the standby has published nothing at all.
        assert gauge(a_metrics, "k8s_bridge_leader") == 1.0
        assert gauge(b_metrics, "k8s_bridge_leader") == 0.0
        assert published(a_metrics, None) > 0
        assert published(b_metrics, None) == 0.0

        kill9(a)
        killed_at = time.monotonic()
        assert a.proc is not None
        await a.proc.wait()
        await until(lambda: is_leader(b), 4 * LEASE + 5, b.tail_log)
        handover = time.monotonic() - killed_at
        # Not before the lease (as last renewed) ran out; not much after it.
        assert LEASE - RETRY - 0.5 <= handover <= 2 * LEASE + 2, handover

        # Changes keep coming until the new leader has published some of them.
        async def b_publishes() -> bool:
            return published(await b.metrics(), None) >= 5

        await until(b_publishes, 20, b.tail_log)
        await churn.stop()
        made = set(churn.made)

        async def all_there() -> bool:
            events = await jetstream_events(nats_control.url)
            return {(e["subject"], e["resourceversion"]) for e in events} >= made

        await until(all_there, 20, b.tail_log)
        # A duplicate or a stray change would be in the stream before the probe.
        await probe(emulator, nats_control.url, pod("probe"), message=b.tail_log)
        events = without(await jetstream_events(nats_control.url), "probe")
        b_metrics = await b.metrics()
        lease = emulator.get("coordination.k8s.io/v1", "Lease", "k8s-bridge", namespace="default")
    finally:
        await churn.stop()
        if a.proc is not None and a.proc.returncode is None:
            kill9(a)
            await a.proc.wait()
        if b.proc is not None:
            assert await b.stop() == 0
    assert lease["spec"]["holderIdentity"] == "replica-b"
    assert published(b_metrics, None) > 0
    seen = Counter((e["subject"], e["resourceversion"]) for e in events)
    twice = {k: n for k, n in seen.items() if n > 1}
    assert not twice, f"published more than once: {twice}"
    expected = set(churn.made) | {
        (e["subject"], e["resourceversion"]) for e in events if e["subject"] == "default/before"
    }
    assert set(seen) == expected, set(seen) ^ expected
    # Per object, the bus holds its changes in resourceVersion order.
    by_subject: dict[str, list[int]] = {}
    for e in events:
        by_subject.setdefault(e["subject"], []).append(int(e["resourceversion"]))
    assert all(rvs == sorted(rvs) for rvs in by_subject.values())
    print(f"hand-over after kill -9: {handover:.2f}s; {len(churn.made)} changes made")
