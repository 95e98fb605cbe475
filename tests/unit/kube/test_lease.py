"""Leader election over a Lease (client-go tools/leaderelection semantics), in fake time.

The electors talk to ``InMemoryLeaseClient`` (resourceVersions, 409 on stale
PUTs, AlreadyExists) through a wrapper that can add latency, drop requests or
cut one replica off, so whole elections run in milliseconds of real time.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any

import pytest

from bridge.errors import ConflictError, KubeConnectionError
from bridge.kube.lease import InMemoryLeaseClient, LeaderElector, Lease
from tests.fixtures.waiting import until

pytestmark = pytest.mark.looptime

NS, NAME = "bridge", "k8s-bridge"


class Link:
    """One replica's view of the API server: latency, random failures, a partition."""

    def __init__(
        self,
        server: InMemoryLeaseClient,
        *,
        latency: float = 0.05,
        failure_rate: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.server = server
        self.latency = latency
        self.failure_rate = failure_rate
        self.rng = random.Random(seed)
        self.down = False
        self.before_update: Any = None

    async def _hop(self) -> None:
        await asyncio.sleep(self.latency)
        if self.down or self.rng.random() < self.failure_rate:
            raise KubeConnectionError("connection refused")

    async def get(self, namespace: str, name: str) -> Lease:
        await self._hop()
        return await self.server.get(namespace, name)

    async def create(self, namespace: str, lease: Lease) -> Lease:
        await self._hop()
        return await self.server.create(namespace, lease)

    async def update(self, namespace: str, lease: Lease) -> Lease:
        await self._hop()
        if self.before_update is not None:
            await self.before_update()
        return await self.server.update(namespace, lease)


class Timeline:
    """Records when each replica starts and stops leading (loop time)."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, str]] = []

    def callbacks(self, who: str, work: Any = None) -> tuple[Any, Any]:
        async def started() -> None:
            self.events.append((now(), who, "start"))
            if work is not None:
                await work()
            else:
                await asyncio.Event().wait()  # lead until cancelled

        async def stopped() -> None:
            self.events.append((now(), who, "stop"))

        return started, stopped

    def first(self, who: str, what: str) -> float:
        return next(t for t, w, e in self.events if w == who and e == what)

    def intervals(self, end: float) -> list[tuple[float, float, str]]:
        open_: dict[str, float] = {}
        out = []
        for t, who, what in self.events:
            if what == "start":
                open_[who] = t
            else:
                out.append((open_.pop(who), t, who))
        out.extend((start, end, who) for who, start in open_.items())
        return sorted(out)


def now() -> float:
    return asyncio.get_running_loop().time()


def elector(client: Any, identity: str, **kw: Any) -> LeaderElector:
    kw.setdefault("lease_duration", 15)
    kw.setdefault("renew_deadline", 10)
    kw.setdefault("retry_period", 2)
    return LeaderElector(
        client, namespace=NS, name=NAME, identity=identity, rng=random.Random(identity), **kw
    )


async def stop(*tasks: asyncio.Task[None]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def dead_holder_lease(server: InMemoryLeaseClient, holder: str, renew_time: str) -> None:
    """A Lease written once by a holder that never renews."""
    await server.create(
        NS,
        {
            "metadata": {"name": NAME},
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": 15,
                "acquireTime": renew_time,
                "renewTime": renew_time,
                "leaseTransitions": 3,
            },
        },
    )


# --- acquiring ----------------------------------------------------------------------


async def test_first_candidate_creates_the_lease() -> None:
    server = InMemoryLeaseClient()
    a = elector(Link(server), "a")
    assert await a.try_acquire_or_renew()
    spec = server.leases[(NS, NAME)]["spec"]
    assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == 15
    assert spec["leaseTransitions"] == 0 and spec["renewTime"].endswith("Z")


@pytest.mark.parametrize(
    "renew_time", ["2000-01-01T00:00:00.000000Z", "2999-01-01T00:00:00.000000Z"]
)
async def test_checklist_36_candidate_waits_lease_duration_from_its_own_observation(
    renew_time: str,
) -> None:
    """Checklist 36: the holder's renewTime (ancient or in the future) is ignored; the
    candidate takes the Lease only lease_duration after it first saw the record."""
    server = InMemoryLeaseClient()
    await dead_holder_lease(server, "ghost", renew_time)
    timeline = Timeline()
    b = elector(Link(server), "b")
    t0 = now()
    task = asyncio.create_task(b.run(*timeline.callbacks("b")))
    await until(lambda: b.is_leader, timeout=60)
    taken = timeline.first("b", "start") - t0
    # Observed at ~0.05 s (one hop); allowed after 15 s of observation, then at most
    # one jittered retry (2 s * 2.2) plus the hops of the attempt.
    assert 15.0 <= taken <= 15.05 + 2 * (1 + 1.2) + 0.2
    spec = server.leases[(NS, NAME)]["spec"]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 4
    await stop(task)


async def test_checklist_36_a_renewing_holder_is_never_taken_over() -> None:
    """Every change of the record restarts the candidate's observation."""
    server = InMemoryLeaseClient()
    timeline = Timeline()
    a, b = elector(Link(server, seed=1), "a"), elector(Link(server, seed=2), "b")
    ta = asyncio.create_task(a.run(*timeline.callbacks("a")))
    await until(lambda: a.is_leader, timeout=5)
    tb = asyncio.create_task(b.run(*timeline.callbacks("b")))
    await asyncio.sleep(120)
    assert a.is_leader and not b.is_leader
    assert b.observed_holder == "a"
    await stop(ta, tb)


# --- losing -------------------------------------------------------------------------


async def test_checklist_37_leader_stops_before_anyone_can_take_over() -> None:
    """Checklist 37: cut the leader off; it stops leading within renew_deadline of its
    last renewal, and the other replica takes over only after lease_duration."""
    server = InMemoryLeaseClient()
    timeline = Timeline()
    link_a = Link(server, seed=1)
    a, b = elector(link_a, "a"), elector(Link(server, seed=2), "b")
    ta = asyncio.create_task(a.run(*timeline.callbacks("a")))
    await until(lambda: a.is_leader, timeout=5)
    tb = asyncio.create_task(b.run(*timeline.callbacks("b")))
    await asyncio.sleep(7)
    last_renew = now()
    link_a.down = True
    last_write = max(
        0.0, last_renew - 2 - 0.1
    )  # the last successful renewal was within a retry period
    await until(lambda: b.is_leader, timeout=60)
    stopped, taken = timeline.first("a", "stop"), timeline.first("b", "start")
    assert stopped < taken, "the old leader must stop before the new one starts"
    assert stopped <= last_renew + 10 + 0.1, "stopped within renew_deadline of its last renewal"
    assert taken >= last_write + 15, "taken over only after a full lease duration"
    await ta  # run() returns after losing leadership
    assert not a.is_leader
    assert server.leases[(NS, NAME)]["spec"]["leaseTransitions"] == 1
    await stop(tb)


async def test_leader_that_sees_another_holder_stops_at_once() -> None:
    server = InMemoryLeaseClient()
    timeline = Timeline()
    a = elector(Link(server), "a")
    ta = asyncio.create_task(a.run(*timeline.callbacks("a")))
    await until(lambda: a.is_leader, timeout=5)
    lease = await server.get(NS, NAME)
    lease["spec"]["holderIdentity"] = "usurper"
    await server.update(NS, lease)
    t = now()
    await asyncio.wait_for(ta, timeout=30)
    assert timeline.first("a", "stop") - t <= 2 + 0.5  # next renewal, not renew_deadline later
    assert server.leases[(NS, NAME)]["spec"]["holderIdentity"] == "usurper", "not released"


# --- conflicts and transitions ------------------------------------------------------------


async def test_checklist_38_stale_put_fails_the_attempt() -> None:
    """Checklist 38: the PUT carries the resourceVersion read; a write in between → 409."""
    server = InMemoryLeaseClient()
    await dead_holder_lease(server, "ghost", "2000-01-01T00:00:00.000000Z")
    link = Link(server)
    b = LeaderElector(
        link,
        namespace=NS,
        name=NAME,
        identity="b",
        lease_duration=3,
        renew_deadline=2,
        retry_period=1,
    )
    assert not await b.try_acquire_or_renew()  # first observation: still valid
    await asyncio.sleep(15.5)  # the holder's leaseDurationSeconds counts, not ours

    async def rival_writes() -> None:
        lease = await server.get(NS, NAME)
        lease["spec"]["holderIdentity"] = "rival"
        await server.update(NS, lease)

    link.before_update = rival_writes
    assert not await b.try_acquire_or_renew(), "409 must fail the attempt"
    assert server.leases[(NS, NAME)]["spec"]["holderIdentity"] == "rival"
    link.before_update = None
    # The rival's write is a new observation: b waits a full duration again.
    assert not await b.try_acquire_or_renew()
    await asyncio.sleep(15.5)
    assert await b.try_acquire_or_renew()
    assert server.leases[(NS, NAME)]["spec"]["leaseTransitions"] == 4


async def test_in_memory_client_enforces_resource_version() -> None:
    server = InMemoryLeaseClient()
    created = await server.create(NS, {"metadata": {"name": NAME}, "spec": {}})
    with pytest.raises(ConflictError):
        await server.create(NS, {"metadata": {"name": NAME}, "spec": {}})
    await server.update(NS, created)
    with pytest.raises(ConflictError):
        await server.update(NS, created)  # stale now


async def test_checklist_38_renewals_keep_transitions_and_acquire_time() -> None:
    server = InMemoryLeaseClient()
    timeline = Timeline()
    a = elector(Link(server), "a")
    ta = asyncio.create_task(a.run(*timeline.callbacks("a")))
    await until(lambda: a.is_leader, timeout=5)
    first = dict(server.leases[(NS, NAME)]["spec"])
    await asyncio.sleep(30)
    later = server.leases[(NS, NAME)]["spec"]
    assert later["acquireTime"] == first["acquireTime"]
    assert later["leaseTransitions"] == first["leaseTransitions"] == 0
    assert int(server.leases[(NS, NAME)]["metadata"]["resourceVersion"]) >= 10  # renewed ~every 2 s
    await stop(ta)


# --- releasing and ending -------------------------------------------------------------------


async def test_cancel_releases_so_a_successor_need_not_wait() -> None:
    server = InMemoryLeaseClient()
    timeline = Timeline()
    a, b = elector(Link(server, seed=1), "a"), elector(Link(server, seed=2), "b")
    ta = asyncio.create_task(a.run(*timeline.callbacks("a")))
    await until(lambda: a.is_leader, timeout=5)
    tb = asyncio.create_task(b.run(*timeline.callbacks("b")))
    await asyncio.sleep(5)
    await stop(ta)
    released = now()
    assert server.leases[(NS, NAME)]["spec"]["holderIdentity"] == ""
    assert timeline.events[-1][1:] == ("a", "stop")
    await until(lambda: b.is_leader, timeout=15)
    assert timeline.first("b", "start") - released <= 2 * (1 + 1.2) + 0.5
    await stop(tb)


async def test_leading_task_error_releases_and_propagates() -> None:
    server = InMemoryLeaseClient()
    timeline = Timeline()

    async def work() -> None:
        await asyncio.sleep(3)
        raise RuntimeError("sink exploded")

    a = elector(Link(server), "a")
    with pytest.raises(RuntimeError, match="sink exploded"):
        await a.run(*timeline.callbacks("a", work))
    assert [e[1:] for e in timeline.events] == [("a", "start"), ("a", "stop")]
    assert server.leases[(NS, NAME)]["spec"]["holderIdentity"] == ""
    assert not a.is_leader


async def test_never_two_leaders_under_flaky_api() -> None:
    """Three replicas, 30% of requests failing, one replica cut off for a while:
    leadership intervals never overlap, and someone leads most of the time."""
    server = InMemoryLeaseClient()
    timeline = Timeline()
    links = [Link(server, failure_rate=0.3, seed=i, latency=0.2) for i in range(3)]
    electors = [elector(link, f"r{i}") for i, link in enumerate(links)]

    async def campaign(e: LeaderElector, who: str) -> None:
        while True:  # rejoin as a candidate after losing
            await e.run(*timeline.callbacks(who))

    tasks = [asyncio.create_task(campaign(e, f"r{i}")) for i, e in enumerate(electors)]
    await asyncio.sleep(150)
    links[0].down = links[1].down = True
    await asyncio.sleep(100)
    links[0].down = links[1].down = False
    await asyncio.sleep(150)
    end = now()
    await stop(*tasks)
    intervals = timeline.intervals(end)
    assert len({who for _, _, who in intervals}) >= 2, intervals
    for (_, end_a, who_a), (start_b, _, who_b) in itertools.pairwise(intervals):
        assert end_a <= start_b, f"{who_a} and {who_b} led at the same time"
    led = sum(e - s for s, e, _ in intervals)
    assert led > 0.6 * 400


async def test_started_callback_may_return_at_once_and_leading_goes_on() -> None:
    """As in client-go, OnStartedLeading returning is no reason to stop renewing."""
    server = InMemoryLeaseClient()
    timeline = Timeline()

    async def quick() -> None:
        return None

    a = elector(Link(server), "a")
    task = asyncio.create_task(a.run(*timeline.callbacks("a", quick)))
    await until(lambda: a.is_leader, timeout=5)
    rv = int(server.leases[(NS, NAME)]["metadata"]["resourceVersion"])
    await asyncio.sleep(60)
    assert a.is_leader and not task.done()
    assert int(server.leases[(NS, NAME)]["metadata"]["resourceVersion"]) > rv + 20
    assert [e[1:] for e in timeline.events] == [("a", "start")]
    await stop(task)
    assert server.leases[(NS, NAME)]["spec"]["holderIdentity"] == ""


def test_timing_rules_are_validated() -> None:
    server = InMemoryLeaseClient()
    with pytest.raises(ValueError, match="lease_duration"):
        LeaderElector(server, namespace=NS, name=NAME, identity="a", lease_duration=10)
    with pytest.raises(ValueError, match="renew_deadline"):
        LeaderElector(server, namespace=NS, name=NAME, identity="a", retry_period=10)
    with pytest.raises(ValueError, match="identity"):
        LeaderElector(server, namespace=NS, name=NAME, identity="")
