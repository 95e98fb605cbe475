"""Resource entries that select kinds (group, kinds, allKinds): the forms the settings
accept, each mistake one line naming the key, and selection over the emulator's legacy
discovery documents (the real server's aggregated discovery: tests/real/test_kinds_real.py)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import pytest

from bridge.emulator import Emulator
from bridge.errors import ConfigError, UnknownKindError
from bridge.kube.client import KubeClient
from bridge.kube.kinds import KindSelection, read_catalog, select_kinds
from bridge.service.kinds import resolve_entries
from bridge.service.settings import Settings, load_settings, resources_for_shard
from tests.e2e.bridge_process import until


def settings(*resources: dict[str, Any], **extra: Any) -> Settings:
    return load_settings(None, {"resources": list(resources), "sink": {"kind": "stdout"}, **extra})


def error(*resources: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as e:
        settings(*resources)
    return str(e.value)


def test_entries_select_kinds_by_group_by_pinned_version_or_all() -> None:
    s = settings(
        {"group": "apps", "exclude": ["ControllerRevision"], "namespaces": ["a"]},
        {"apiVersion": "batch/v1", "kinds": ["CronJob", "Job"]},
        {"allKinds": True, "exclude": ["Secret"], "metadataOnly": True},
        {"apiVersion": "v1", "kind": "Pod"},
    )
    assert [r.selects_kinds for r in s.resources] == [True, True, True, False]
    assert s.resources[0].api_group == "apps" and s.resources[2].all_kinds
    assert s.resources[2].metadata_only


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"apiVersion": "v1"}, "resources[0].kind: required key is missing"),
        ({"kind": "Pod"}, "resources[0].apiVersion: required key is missing"),
        ({"group": "apps", "kind": "Deployment"}, "resources[0].kind: names one kind"),
        ({"allKinds": True, "group": "apps"}, "resources[0].allKinds: cannot be combined"),
        ({"kinds": ["Pod"]}, "resources[0].kinds: needs group (or apiVersion)"),
        ({"group": "apps", "apiVersion": "batch/v1"}, "'batch/v1' is not of group 'apps'"),
        ({"apiVersion": "v1", "kind": "Pod", "exclude": ["X"]}, "resources[0].exclude: only"),
        ({"group": "apps", "plural": "x"}, "resources[0].plural: only for an entry naming one"),
    ],
)
def test_a_malformed_entry_is_one_line_naming_its_key(entry: dict[str, Any], message: str) -> None:
    text = error(entry)
    assert message in text and "\n" not in text


def test_selecting_entries_are_sharded_kind_by_kind_not_as_a_whole() -> None:
    s = settings({"group": "apps"}, {"apiVersion": "v1", "kind": "Pod"}, sharding={"shards": 4})
    assert s.resources[0] in resources_for_shard(s)


async def test_legacy_discovery_selects_a_group_and_all_kinds(
    emulator: Emulator, tmp_path: Path
) -> None:
    emulator.register_resource(group="example.com", version="v2", kind="Gadget", plural="gadgets")
    kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    async with await KubeClient.from_kubeconfig(str(kubeconfig)) as client:
        catalog = await read_catalog(client)
        assert not catalog.aggregated  # the emulator has no aggregated documents
        picked = await select_kinds(catalog, KindSelection("resources[0]", "example.com"))
        # Each kind at the most preferred version serving it (the emulator prefers v1).
        assert [(i.api_version, i.kind) for i in picked] == [
            ("example.com/v2", "Gadget"),
            ("example.com/v1", "Widget"),
        ]
        pinned = await select_kinds(
            catalog, KindSelection("resources[0]", "example.com", version="v2")
        )
        assert [(i.api_version, i.kind) for i in pinned] == [("example.com/v2", "Gadget")]
        everything = await select_kinds(catalog, KindSelection("resources[0]", None))
        kinds = {(i.group, i.kind) for i in everything}
        assert ("", "ConfigMap") in kinds and ("example.com", "Widget") in kinds
        assert ("", "Event") not in kinds
        with pytest.raises(UnknownKindError, match=r"resources\[0\].apiVersion: example.com"):
            await select_kinds(catalog, KindSelection("resources[0]", "example.com", version="v9"))


async def test_an_explicit_entry_takes_its_kind_out_of_selecting_entries_and_overlaps_fail(
    emulator: Emulator, tmp_path: Path
) -> None:
    kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    s = settings(
        {"group": "", "kinds": ["ConfigMap", "Secret"], "ignoreFields": ["data.x"]},
        {"apiVersion": "v1", "kind": "Secret", "namespaces": ["a"]},
    )
    async with await KubeClient.from_kubeconfig(str(kubeconfig)) as client:
        got = await resolve_entries(s, client, list(enumerate(s.resources)))
        assert [(r.entry, r.settings.kind, r.settings.namespaces) for r in got] == [
            (1, "Secret", ["a"]),
            (0, "ConfigMap", []),
        ]
        # The selected kind is the entry, named: every other setting carried.
        assert got[1].settings.api_version == "v1" and got[1].settings.ignore_fields == ["data.x"]
        # A group entry takes its kinds out of allKinds; two group entries may not share.
        ranked = settings({"allKinds": True}, {"group": "", "kinds": ["ConfigMap"]})
        got = await resolve_entries(ranked, client, list(enumerate(ranked.resources)))
        assert [r.entry for r in got if r.settings.kind == "ConfigMap"] == [1]
        assert len([r for r in got if r.entry == 0]) > 5
        twice = settings({"group": "", "kinds": ["ConfigMap"]}, {"group": "", "kinds": ["Conf*"]})
        with pytest.raises(ConfigError, match=r"resources\[0\] and resources\[1\] both select"):
            await resolve_entries(twice, client, list(enumerate(twice.resources)))


async def test_a_refresh_while_pipelines_wait_their_turn_to_list_starts_no_second_one(
    emulator: Emulator, tmp_path: Path
) -> None:
    """At most ``start_concurrency`` pipelines list at once at start; the kind follower's
    refreshes meanwhile must count those still waiting as running."""
    from bridge.checkpoints.memory import MemoryCheckpointStore
    from bridge.ground.prometheus import Registry
    from bridge.service.app import BridgeApp

    kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    s = settings(
        {"group": "", "kinds": ["*"], "namespaces": ["default"]},
        cluster={"kubeconfig": str(kubeconfig)},
        server={"host": "127.0.0.1", "port": 0},
        checkpoint={"kind": "memory"},
    )
    app = BridgeApp(s, checkpoints=MemoryCheckpointStore(), registry=Registry())
    app.start_concurrency = 1
    app.kinds_refresh_every = 0.05
    stop = asyncio.Event()
    runner = asyncio.create_task(app.run(stop))
    try:

        async def synced() -> bool:
            assert not runner.done(), runner
            return len(app.pipelines) > 3 and all(p.has_synced() for p in app.pipelines)

        await until(synced, 30)
        await asyncio.sleep(0.3)  # more refreshes
        labels = [p.label for p in app.pipelines]
        assert len(labels) == len(set(labels)), labels
        assert len(app._tasks) == len(labels)
    finally:
        stop.set()
        await runner


async def test_a_kind_registered_while_the_bridge_runs_gets_its_pipeline(
    emulator: Emulator, tmp_path: Path
) -> None:
    """The emulator tier of tests/real/test_kinds_real.py: no CRD watch there (the
    emulator serves no CRDs), so the periodic refresh notices the new kind."""
    from bridge.checkpoints.memory import MemoryCheckpointStore
    from bridge.ground.prometheus import Registry
    from bridge.service.app import BridgeApp
    from tests.doubles.memory_sink import MemorySink

    kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    s = settings(
        {"group": "example.com"},
        cluster={"kubeconfig": str(kubeconfig)},
        server={"host": "127.0.0.1", "port": 0},
        checkpoint={"kind": "memory"},
    )
    sink = MemorySink()
    app = BridgeApp(s, sink=sink, checkpoints=MemoryCheckpointStore(), registry=Registry())
    app.kinds_refresh_every = 0.1
    stop = asyncio.Event()
    runner = asyncio.create_task(app.run(stop))
    try:
        await until(lambda: app.pipelines and all(p.has_synced() for p in app.pipelines), 30)
        assert [p.label for p in app.pipelines] == ["example.com/v1/widgets"]
        emulator.register_resource(
            group="example.com", version="v1", kind="Gadget", plural="gadgets"
        )
        emulator.create(
            {
                "apiVersion": "example.com/v1",
                "kind": "Gadget",
                "metadata": {"name": "g", "namespace": "default"},
            }
        )
        await until(
            lambda: [e.type for e in sink.events] == ["io.k8s.example.com.v1.Gadget.added"], 10
        )
        assert sink.events[0].initial
        assert not runner.done()
    finally:
        stop.set()
        await runner


async def test_only_checkpoints_of_selected_kinds_served_at_no_version_count_as_gone(
    emulator: Emulator, tmp_path: Path
) -> None:
    from bridge.checkpoints.memory import MemoryCheckpointStore
    from bridge.ground.digest import Digest
    from bridge.kube.discovery import ResourceInfo
    from bridge.service.leftovers import (
        gone_kinds,
        known_kinds,
        parse_stored_id,
        record_kinds,
    )

    s = settings(
        {"group": "example.com", "namespaces": ["a"], "exclude": ["Widget"]},
        {"allKinds": True, "labelSelector": "tier=web", "exclude": ["Dropped"]},
    )
    store = MemoryCheckpointStore()
    await store.open()
    gadget = ResourceInfo("example.com", "v1", "Gadget", "gadgets", True)
    dropped = ResourceInfo("other.io", "v1", "Dropped", "droppeds", True)
    thing = ResourceInfo("other.io", "v1", "Thing", "things", True)
    known: dict[str, str] = {}
    await record_kinds(store, known, [gadget, dropped, thing])
    await record_kinds(store, known, [gadget])  # known already: no second row
    assert await known_kinds(store) == {
        "example.com/gadgets": "Gadget",
        "other.io/droppeds": "Dropped",
        "other.io/things": "Thing",
    }
    web = (
        "#" + hashlib.sha256(f"tier=web|{s.resources[1].field_selector}".encode()).hexdigest()[:12]
    )
    row = [Digest("a/g1", "u1", "5", "f")]
    ids = [
        "example.com/v1/gadgets@a",  # the group entry's: gone
        "example.com/v1/gadgets@b",  # a namespace no entry names
        "example.com/v1/gadgets",  # all namespaces: allKinds, but without its selector
        "example.com/v1/widgets@a",  # still served
        f"other.io/v1/droppeds{web}",  # excluded
        f"other.io/v1/things{web}",  # the allKinds entry's: gone
        "example.com/v1/sprockets@a",  # never recorded: unnamed
    ]
    for rid in ids:
        await store.commit(rid, "5", row, [])
    kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    async with await KubeClient.from_kubeconfig(str(kubeconfig)) as client:
        catalog = await read_catalog(client)
        entries = list(enumerate(s.resources))
        unnamed: list[str] = []
        gone = await gone_kinds(s, store, catalog, entries, known, set(), unnamed)
        assert [(g.resource_id, g.info.kind, g.settings.namespaces) for g in gone] == [
            ("example.com/v1/gadgets@a", "Gadget", ["a"]),
            (f"other.io/v1/things{web}", "Thing", []),
        ]
        assert unnamed == ["example.com/v1/sprockets@a"]
        # A pipeline's own checkpoint is never one.
        running = await gone_kinds(s, store, catalog, entries, known, {ids[0]})
        assert [g.resource_id for g in running] == [f"other.io/v1/things{web}"]
    sid = parse_stored_id("core/v1/configmaps@ns#abc~uid-0of2")
    assert sid is not None and (sid.group, sid.plural, sid.namespace) == ("", "configmaps", "ns")
    assert parse_stored_id("!kinds") is None
