"""Leader election over HTTP against the emulator: two replicas, one Lease.

Real time with short durations (lease 1 s, renew deadline 0.7 s, retry 0.15 s);
each replica has its own client and connection, as two pods would.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from bridge.emulator import Emulator
from bridge.errors import ConflictError
from bridge.kube.client import KubeClient
from bridge.kube.lease import KubeLeaseClient, LeaderElector
from tests.fixtures.waiting import until

pytestmark = pytest.mark.integration

NS, NAME = "default", "k8s-bridge"
LEASE, RENEW, RETRY = 1.0, 0.7, 0.15


class Timeline:
    def __init__(self) -> None:
        self.events: list[tuple[float, str, str]] = []

    def callbacks(
        self, who: str
    ) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
        async def started() -> None:
            self.events.append((now(), who, "start"))
            await asyncio.Event().wait()

        async def stopped() -> None:
            self.events.append((now(), who, "stop"))

        return started, stopped

    def first(self, who: str, what: str) -> float:
        return next(t for t, w, e in self.events if w == who and e == what)

    def assert_never_two_leaders(self) -> None:
        leading: set[str] = set()
        for _, who, what in self.events:
            if what == "start":
                assert not leading, f"{who} started while {leading} led"
                leading.add(who)
            else:
                leading.discard(who)


def now() -> float:
    return asyncio.get_running_loop().time()


@pytest.fixture
async def clients(emulator: Emulator, tmp_path: Path) -> AsyncIterator[list[KubeClient]]:
    path = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    made = [await KubeClient.from_kubeconfig(str(path)) for _ in range(2)]
    try:
        yield made
    finally:
        for c in made:
            await c.close()


def elector(client: KubeClient, identity: str, *, release: bool = True) -> LeaderElector:
    return LeaderElector(
        KubeLeaseClient(client),
        namespace=NS,
        name=NAME,
        identity=identity,
        lease_duration=LEASE,
        renew_deadline=RENEW,
        retry_period=RETRY,
        release_on_cancel=release,
    )


def agree_on(electors: dict[int, LeaderElector], holder: str) -> bool:
    """Every elector has read the record ``holder`` holds (and so tried and lost)."""
    return all(e.observed_holder == holder for e in electors.values())


async def cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_one_leader_and_take_over_after_the_lease_duration(
    clients: list[KubeClient],
) -> None:
    """Checklists 36-38 end to end: only one replica leads; when the leader stops
    renewing (crash: no release) the other takes over, but only a full lease
    duration after it last saw the record change, and leaseTransitions goes up."""
    timeline = Timeline()
    a, b = elector(clients[0], "pod-a", release=False), elector(clients[1], "pod-b")
    ta = asyncio.create_task(a.run(*timeline.callbacks("a")))
    await until(lambda: a.is_leader, timeout=5)
    tb = asyncio.create_task(b.run(*timeline.callbacks("b")))
    try:
        await asyncio.sleep(3 * LEASE)  # several lease durations of renewals
        assert a.is_leader and not b.is_leader and b.observed_holder == "pod-a"
        lease = await clients[1].request_json(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{NAME}"
        )
        assert lease["spec"]["holderIdentity"] == "pod-a"
        assert lease["spec"]["leaseDurationSeconds"] == 1
        assert lease["spec"]["leaseTransitions"] == 0

        crashed = now()
        await cancel(ta)  # stops renewing, does not release
        await until(lambda: b.is_leader, timeout=10)
        taken = timeline.first("b", "start") - crashed
        # a's last renewal was at most one retry period (plus a request) before the crash.
        assert LEASE - RETRY - 0.2 <= taken <= LEASE + RETRY * 2.2 + 1.0, taken

        lease = await clients[1].request_json(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{NAME}"
        )
        assert lease["spec"]["holderIdentity"] == "pod-b"
        assert lease["spec"]["leaseTransitions"] == 1
        timeline.assert_never_two_leaders()
    finally:
        await cancel(ta)
        await cancel(tb)


async def test_graceful_stop_releases_and_hands_over_quickly(clients: list[KubeClient]) -> None:
    timeline = Timeline()
    a, b = elector(clients[0], "pod-a"), elector(clients[1], "pod-b")
    ta = asyncio.create_task(a.run(*timeline.callbacks("a")))
    await until(lambda: a.is_leader, timeout=5)
    tb = asyncio.create_task(b.run(*timeline.callbacks("b")))
    try:
        await asyncio.sleep(LEASE)
        stopped = now()
        await cancel(ta)
        await until(lambda: b.is_leader, timeout=5)
        assert timeline.first("b", "start") - stopped < LEASE - 0.5, "no need to wait out the lease"
        timeline.assert_never_two_leaders()
    finally:
        await cancel(ta)
        await cancel(tb)


async def test_checklist_38_stale_put_is_a_conflict(clients: list[KubeClient]) -> None:
    """The API server refuses a PUT with an old resourceVersion; the elector relies on it."""
    leases = KubeLeaseClient(clients[0])
    created = await leases.create(
        NS,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "x"},
            "spec": {"holderIdentity": "a"},
        },
    )
    created["spec"]["holderIdentity"] = "b"
    await leases.update(NS, created)
    created["spec"]["holderIdentity"] = "c"
    with pytest.raises(ConflictError):
        await leases.update(NS, created)
    assert (await leases.get(NS, "x"))["spec"]["holderIdentity"] == "b"


async def test_racing_candidates_never_both_lead(clients: list[KubeClient]) -> None:
    """Both start at once on an empty cluster: one create wins (AlreadyExists for the
    other), and across a few crash/restart rounds leadership never overlaps."""
    timeline = Timeline()
    names = itertools.count()
    tasks: dict[int, asyncio.Task[None]] = {}
    electors: dict[int, LeaderElector] = {}

    def start(i: int) -> None:
        e = elector(clients[i], f"pod-{i}-{next(names)}", release=False)
        electors[i] = e
        tasks[i] = asyncio.create_task(e.run(*timeline.callbacks(str(i))))

    start(0)
    start(1)
    try:
        for _ in range(2):
            await until(lambda: any(e.is_leader for e in electors.values()), timeout=10)
            leader = next(i for i, e in electors.items() if e.is_leader)
            await until(functools.partial(agree_on, electors, electors[leader].identity), 10)
            assert sum(e.is_leader for e in electors.values()) == 1
            await cancel(tasks[leader])  # crash the leader, then restart it as a candidate
            start(leader)
        await until(lambda: any(e.is_leader for e in electors.values()), timeout=10)
        timeline.assert_never_two_leaders()
    finally:
        for task in tasks.values():
            await cancel(task)
