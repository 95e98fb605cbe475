"""Two ``k8s-bridge run`` replicas with leader election: one publishes, the other waits.

As a Deployment with ``replicas: 2`` runs it: both processes watch the same
API (the emulator over HTTP) and share one bus and one checkpoint store (NATS
JetStream and its KV bucket; in HA a replica's own disk would resume from a
stale state), or, as two replicas on one host do, one SQLite file: a standby
never opens the store (nor takes its lock) until it holds the Lease, and the
leader lets go of it when it stops leading. The leader is kill -9'd while changes keep coming; the standby
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

from bridge.checkpoints.sqlite import SqliteCheckpointStore
from bridge.cli.check import sqlite_holder
from bridge.emulator import Emulator
from tests.e2e.bridge_process import (
    BridgeProcess,
    gauge,
    is_leader,
    jetstream_events,
    kill9,
    probe,
    published,
    without,
    write_config,
)
from tests.fixtures.nats import NatsServer
from tests.fixtures.waiting import until

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


def checkpoint_of(kind: str, tmp_path: Path) -> dict[str, Any]:
    """One checkpoint store both replicas share."""
    if kind == "sqlite":
        return {"kind": "sqlite", "path": str(tmp_path / "shared.db"), "flushInterval": 0.1}
    return {"kind": "nats-kv", "bucket": "k8s-bridge-ha", "flushInterval": 0.1}


def replica_config(
    tmp_path: Path,
    kubeconfig: Path,
    nats: NatsServer,
    identity: str,
    checkpoint: str = "nats-kv",
) -> BridgeProcess:
    home = tmp_path / identity
    home.mkdir()
    config = write_config(
        home / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [nats.url]}},
        checkpoint=checkpoint_of(checkpoint, tmp_path),
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


def lock_holder(tmp_path: Path, kind: str) -> str | None:
    """The pid holding the shared SQLite file's lock (None: nobody, or not SQLite)."""
    return sqlite_holder(str(tmp_path / "shared.db")) if kind == "sqlite" else None


@pytest.mark.parametrize("checkpoint", ["nats-kv", "sqlite"])
async def test_standby_takes_over_after_kill9_and_no_change_is_lost(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer, checkpoint: str
) -> None:
    emulator.create(pod("before"))
    a = replica_config(tmp_path, kubeconfig, nats_control, "replica-a", checkpoint)
    b = replica_config(tmp_path, kubeconfig, nats_control, "replica-b", checkpoint)
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
        assert a.proc is not None and b.proc is not None
        if checkpoint == "sqlite":
            # The standby, ready, has not touched the store: the leader alone holds it.
            assert lock_holder(tmp_path, checkpoint) == str(a.proc.pid)

        churn.start()

        async def some_published() -> bool:
            return len(await jetstream_events(nats_control.url)) >= 20

        await until(some_published, 20, a.tail_log)

        # The stream took them; the leader counts an event once its ack is back.
        async def a_counts() -> bool:
            return published(await a.metrics(), None) > 0

        await until(a_counts, 10, a.tail_log)
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
        if checkpoint == "sqlite":
            assert lock_holder(tmp_path, checkpoint) == str(b.proc.pid)
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


async def test_a_leader_waits_for_a_held_store_and_lets_go_of_it_with_the_lease(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    """A new leader whose SQLite file is still held (an old leader flushing its last
    batch) is not-ready and retries, with one warning, instead of exiting; a leader
    that loses the Lease closes the store before it goes."""
    emulator.create(pod("held"))

    def warnings(bridge: BridgeProcess) -> int:
        return bridge.log.read_text().count("checkpoint store cannot be opened yet")

    a = replica_config(tmp_path, kubeconfig, nats_control, "replica-a", "sqlite")
    old = SqliteCheckpointStore(tmp_path / "shared.db")
    await old.open()  # the old leader, still holding the file
    try:
        await a.start()
        assert a.proc is not None

        async def held_not_ready() -> bool:
            status, body = await a.readyz()
            return await is_leader(a) and status == 503 and "is in use" in body

        await until(held_not_ready, 20, a.tail_log)
        await until(lambda: warnings(a) >= 1, 10, a.tail_log)
        # Held a while longer (the backoff starts at 0.5 s): a few more attempts,
        # still within the one term.
        await asyncio.sleep(2.0)
        assert (await a.readyz())[0] == 503
        assert a.proc.returncode is None
    finally:
        await old.close()
    try:
        await a.wait_ready()
        assert lock_holder(tmp_path, "sqlite") == str(a.proc.pid)
        await probe(emulator, nats_control.url, pod("after"), message=a.tail_log)
        # One warning for the one reason, however many retries it took; the term
        # went on: no pipelines stopped, no store closed and reopened in between.
        assert warnings(a) == 1, a.tail_log()
        assert "leading, but the checkpoint store cannot be opened yet" in a.log.read_text()
        assert "stopped leading" not in a.log.read_text(), a.tail_log()

        # Someone else takes the Lease (as a rival does once a renewal fails): the
        # replica stops leading, closes the store and exits 0, client-go's way (its
        # restart campaigns anew).
        lease = emulator.get("coordination.k8s.io/v1", "Lease", "k8s-bridge", namespace="default")
        lease["spec"]["holderIdentity"] = "rival"
        lease["spec"]["leaseDurationSeconds"] = 600
        emulator.update(lease)
        async with asyncio.timeout(20):
            code = await a.proc.wait()
    finally:
        if a.proc.returncode is None:
            await a.stop()
    assert code == 0, a.tail_log()
    assert "checkpoint store closed" in a.log.read_text()
    assert lock_holder(tmp_path, "sqlite") is None
