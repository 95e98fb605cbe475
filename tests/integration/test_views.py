"""Change triggers and projections through the pipeline, against the emulator over HTTP.

A trigger suppresses modifications elsewhere; a projection carries only its
fields; a restart with a changed configuration publishes only the objects that
changed while the bridge was down (once each), never the unchanged ones.
"""

from __future__ import annotations

from typing import Any

import pytest

from bridge.delivery.changes import ChangeDetector
from bridge.delivery.events import EventBuilder
from bridge.delivery.pipeline import ResourcePipeline
from bridge.delivery.views import fingerprinter_for
from bridge.emulator import Emulator
from bridge.kube.client import KubeClient
from bridge.kube.discovery import Discovery
from bridge.kube.listwatch import ListWatch
from bridge.service.wiring import object_decoder
from tests.fixtures.pipeline import FAST, Harness, pod

pytestmark = pytest.mark.integration


class ViewHarness(Harness):
    """The pipeline harness with triggerPaths/fields, changeable between runs."""

    def __init__(self, client: KubeClient, emulator: Emulator) -> None:
        super().__init__(client, emulator)
        self.trigger: list[str] = []
        self.fields: list[str] = []
        self.slim = False

    async def pipeline(self) -> ResourcePipeline:
        from dataclasses import replace

        info = await Discovery(self.client).resolve("v1", "Pod")
        fingerprinter = fingerprinter_for(
            ignore_fields=self.ignore, trigger=self.trigger, fields=self.fields
        )
        builder = EventBuilder(
            cluster="test", group="", version="v1", kind="Pod", plural="pods", fields=self.fields
        )
        return ResourcePipeline(
            resource_id="core/v1/pods",
            lw=ListWatch(self.client, info, decoder=object_decoder(fingerprinter, builder, None)),
            detector=ChangeDetector(fingerprinter),
            builder=builder,
            sink=self.sink,
            checkpoints=self.checkpoints,
            settings=replace(FAST, slim=self.slim),
        )


@pytest.fixture
def views(client: KubeClient, emulator: Emulator) -> ViewHarness:
    return ViewHarness(client, emulator)


def patch(emulator: Emulator, name: str, body: dict[str, Any]) -> None:
    emulator.patch("v1", "Pod", name, body, namespace="default")


@pytest.mark.parametrize("slim", [False, True])
async def test_a_trigger_suppresses_modifications_elsewhere(
    views: ViewHarness, emulator: Emulator, slim: bool
) -> None:
    views.trigger, views.slim = ["spec.nodeName"], slim
    async with views.running() as p:
        emulator.create(pod("web"))
        patch(emulator, "web", {"status": {"phase": "Running"}})
        patch(emulator, "web", {"metadata": {"labels": {"tier": "x"}}})
        patch(emulator, "web", {"spec": {"nodeName": "n1"}})
        patch(emulator, "web", {"status": {"phase": "Succeeded"}})
        emulator.delete("v1", "Pod", "web", namespace="default")
        await views.settled(p)
    assert views.kinds() == [
        ("added", "default/web"),
        ("modified", "default/web"),
        ("deleted", "default/web"),
    ]
    assert views.sink.events[1].data["object"]["spec"]["nodeName"] == "n1"


async def test_a_projection_carries_only_its_fields_and_their_changes(
    views: ViewHarness, emulator: Emulator
) -> None:
    views.fields = ["status.phase"]
    async with views.running() as p:
        emulator.create(pod("web", app="web"))
        patch(emulator, "web", {"spec": {"nodeName": "n1"}})  # not projected: nothing
        patch(emulator, "web", {"status": {"phase": "Running"}})
        await views.settled(p)
    assert views.kinds() == [("added", "default/web"), ("modified", "default/web")]
    obj = views.sink.events[1].data["object"]
    md = obj["metadata"]
    assert set(obj) == {"apiVersion", "kind", "metadata", "status"}
    assert set(md) == {"name", "namespace", "uid", "resourceVersion"}
    assert obj["status"] == {"phase": "Running"}
    assert md["resourceVersion"] == views.sink.events[1].resource_version


@pytest.mark.parametrize("compact", [False, True], ids=["resume", "relist"])
@pytest.mark.parametrize("slim", [False, True])
async def test_restart_with_changed_views_publishes_only_real_changes(
    views: ViewHarness, emulator: Emulator, compact: bool, slim: bool
) -> None:
    """Unchanged objects stay quiet; one changed while down (outside the new
    triggers, even) is published once: old and new fingerprints are of different views."""
    views.slim = slim
    for name in ("quiet", "moved"):
        emulator.create(pod(name))
    async with views.running() as p:
        await views.settled(p)
    first = len(views.sink.events)
    assert first == 2
    # Down; the configuration changes to a trigger on spec.nodeName and a projection.
    views.trigger, views.fields = ["spec.nodeName"], ["status"]
    patch(emulator, "moved", {"status": {"phase": "Running"}})
    if compact:
        emulator.chaos.compact()
    async with views.running() as p:
        await views.settled(p)
        assert views.kinds(first) == [("modified", "default/moved")]
        # "quiet"'s digest still holds an old-view fingerprint unless a relist
        # refreshed the cache: after a resumed watch its first change, wherever it
        # is, is published once (as "moved" was); after that the triggers decide.
        patch(emulator, "quiet", {"status": {"phase": "Running"}})
        patch(emulator, "quiet", {"status": {"phase": "Failed"}})
        patch(emulator, "moved", {"status": {"phase": "Failed"}})
        patch(emulator, "quiet", {"spec": {"nodeName": "n1"}})
        await views.settled(p)
    once = [] if compact else [("modified", "default/quiet")]
    assert views.kinds(first) == [
        ("modified", "default/moved"),
        *once,
        ("modified", "default/quiet"),
    ]
    moved = views.sink.events[first].data["object"]
    assert moved["status"]["phase"] == "Running" and "spec" not in moved
