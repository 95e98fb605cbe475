"""What the cluster failover tests share: churn on kube-apiserver while a bus node
dies, the time the bus took to acknowledge again, and the oracle.

The churn is the crash tests' World (tests/e2e/crash_world.py): Pods created,
annotated, deleted, names reused, each change recorded. It runs in a thread, so
its blocking API calls leave the event loop free to time the recovery. The
oracle reads the bus with a client of its own (never the bridge's) and holds it
against the World's record and a LIST on kube-apiserver.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from tests.e2e.bridge_process import BridgeProcess
from tests.e2e.crash_world import Target, World, annotation_patch, check_property
from tests.fixtures.kube import KubeCluster


def churn_target(cluster: KubeCluster, ns: str) -> Target:
    """Pods in ``ns`` on a real kube-apiserver; these tests never compact."""
    return Target(cluster, ns, lambda: "no compaction", mutate=annotation_patch, rate=25.0)


@contextlib.asynccontextmanager
async def churning(world: World) -> AsyncIterator[list[int]]:
    """Changes at the target's rate until the block ends; yields a one-item count of them."""
    stop = asyncio.Event()
    count = [0]

    async def loop() -> None:
        while not stop.is_set():
            await asyncio.to_thread(world.step)
            count[0] += 1
            await asyncio.sleep(1 / world.target.rate)

    task = asyncio.create_task(loop(), name="churn")
    try:
        yield count
    finally:
        stop.set()
        await task


async def recovery_after(
    kill: Callable[[], None],
    acknowledged: Callable[[], Awaitable[int]],
    bridge: BridgeProcess,
    timeout: float = 60.0,
) -> float:
    """Seconds from ``kill()`` until the bus has acknowledged an event it had not
    before (``acknowledged``: the bus's count of stored events, read by the oracle's
    own client; a read that fails meanwhile is retried). The bridge must not exit."""
    before = await _read(acknowledged, timeout)
    kill()
    killed = time.monotonic()
    while True:
        assert bridge.proc is not None and bridge.proc.returncode is None, (
            f"the bridge exited ({bridge.proc and bridge.proc.returncode}):\n{bridge.tail_log()}"
        )
        now = await _read(acknowledged, timeout, quiet=True)
        if now > before:
            return time.monotonic() - killed
        assert time.monotonic() - killed < timeout, (
            f"nothing acknowledged {timeout}s after the kill:\n{bridge.tail_log()}"
        )
        await asyncio.sleep(0.05)


async def _read(
    acknowledged: Callable[[], Awaitable[int]], timeout: float, quiet: bool = False
) -> int:
    try:
        async with asyncio.timeout(2):
            return await acknowledged()
    except Exception:
        if quiet:
            return -1
        raise


def check_against_the_api(world: World, events: list[dict[str, Any]], seed: int, bus: str) -> None:
    """The crash property (each object's events in order, real states, deletes last),
    and a LIST on kube-apiserver: each Pod it lists has its current state as its last
    event on the bus, and every Pod the bus holds as live is listed."""
    check_property(world, events, seed, bus)
    listed = world.objects.list("v1", "Pod", namespace=world.ns)["items"]  # type: ignore[attr-defined]
    names = {p["metadata"]["name"]: p["metadata"]["uid"] for p in listed}
    assert names == world.live, f"the LIST and the changes made disagree ({bus})"
    last: dict[str, dict[str, Any]] = {}
    for e in events:
        last[e["subject"]] = e
    live_on_bus = {
        s.split("/", 1)[1] for s, e in last.items() if not e["type"].endswith(".deleted")
    }
    assert live_on_bus == set(names), (
        f"live on the bus but not listed: {sorted(live_on_bus - set(names))[:5]}; "
        f"listed but not live on the bus: {sorted(set(names) - live_on_bus)[:5]} ({bus})"
    )


def new_world(cluster: KubeCluster, ns: str, seed: int, initial: int) -> World:
    world = World(churn_target(cluster, ns), random.Random(seed))
    for _ in range(initial):
        world.create()
    return world
