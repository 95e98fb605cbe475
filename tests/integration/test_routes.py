"""Routes through the pipeline, against the emulator over HTTP: each event carries
the routes its object decided when it was built (adds, modifications and the
delete alike), nothing is routed without routes, and the checkpoint moves as
without routes (routes are where an event goes, not whether)."""

from __future__ import annotations

import pytest

from bridge.delivery.routes import Router
from bridge.emulator import Emulator
from tests.fixtures.pipeline import Harness, pod
from tests.integration.test_delivery import running

pytestmark = pytest.mark.integration

WEB = "object.metadata.labels.tier == 'web'"
EVEN = "object.metadata.name.matches('[02468]$')"


def routed(harness: Harness, start: int = 0) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(e.type.rsplit(".", 1)[-1], e.subject, e.routes) for e in harness.sink.events[start:]]


async def test_every_event_carries_the_routes_its_object_decides(
    harness: Harness, emulator: Emulator
) -> None:
    harness.router = Router([("web", WEB), ("even", EVEN)], "all")
    emulator.create(pod("p1", tier="web"))
    emulator.create(pod("p2", tier="web"))
    emulator.create(pod("p3", tier="db"))
    p = await harness.pipeline()
    async with running(p):
        await harness.settled(p)
        assert sorted(routed(harness)) == [
            ("added", "default/p1", ("web",)),
            ("added", "default/p2", ("web", "even")),
            ("added", "default/p3", ()),
        ]
        # A change of content moves the object's next events to other routes.
        emulator.patch(
            "v1", "Pod", "p1", {"metadata": {"labels": {"tier": "db"}}}, namespace="default"
        )
        emulator.delete("v1", "Pod", "p2", namespace="default")
        await harness.settled(p)
        assert routed(harness, 3) == [
            ("modified", "default/p1", ()),
            ("deleted", "default/p2", ("web", "even")),
        ]


async def test_first_takes_one_route_and_without_routes_nothing_is_routed(
    harness: Harness, emulator: Emulator
) -> None:
    emulator.create(pod("p2", tier="web"))
    async with running(await harness.pipeline()) as p:
        await harness.settled(p)
    assert routed(harness) == [("added", "default/p2", ())]
    harness.router = Router([("web", WEB), ("even", EVEN)], "first")
    emulator.patch("v1", "Pod", "p2", {"metadata": {"labels": {"x": "1"}}}, namespace="default")
    async with running(await harness.pipeline()) as p:
        await harness.settled(p)
    assert routed(harness, 1) == [("modified", "default/p2", ("web",))]
