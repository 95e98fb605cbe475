"""Discovery: what kubectl and the bridge read before they touch a resource."""

from __future__ import annotations

import aiohttp

from bridge.emulator import Emulator


async def test_version_and_core_group(emulator: Emulator) -> None:
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get("/version") as r:
            assert r.status == 200
            assert (await r.json())["major"] == "1"
        async with http.get("/api") as r:
            assert (await r.json())["versions"] == ["v1"]
        async with http.get("/api/v1") as r:
            doc = await r.json()
    by_name = {e["name"]: e for e in doc["resources"]}
    assert by_name["pods"]["namespaced"] is True
    assert by_name["pods"]["kind"] == "Pod"
    assert by_name["pods"]["singularName"] == "pod"
    assert "watch" in by_name["pods"]["verbs"]
    assert by_name["pods"]["shortNames"] == ["po"]
    assert by_name["namespaces"]["namespaced"] is False
    assert by_name["nodes"]["namespaced"] is False


async def test_groups_include_builtins_and_registered_custom_resource(emulator: Emulator) -> None:
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get("/apis") as r:
            groups = {g["name"]: g for g in (await r.json())["groups"]}
        async with http.get("/apis/example.com/v1") as r:
            widgets = (await r.json())["resources"]
        async with http.get("/apis/example.com") as r:
            group = await r.json()
        async with http.get("/apis/nope.example/v1") as r:
            missing = r.status
    assert {"apps", "coordination.k8s.io", "authorization.k8s.io", "example.com"} <= set(groups)
    assert groups["example.com"]["preferredVersion"]["groupVersion"] == "example.com/v1"
    assert group["kind"] == "APIGroup"
    assert widgets[0]["name"] == "widgets" and widgets[0]["kind"] == "Widget"
    assert widgets[0]["shortNames"] == ["wd"]
    assert missing == 404


async def test_resource_registered_after_start_is_served(emulator: Emulator) -> None:
    emulator.register_resource(
        group="example.org", version="v1alpha1", kind="Gadget", plural="gadgets", namespaced=False
    )
    created = emulator.create(
        {"apiVersion": "example.org/v1alpha1", "kind": "Gadget", "metadata": {"name": "g"}}
    )
    assert "namespace" not in created["metadata"]
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get("/apis/example.org/v1alpha1/gadgets/g") as r:
            assert r.status == 200
            assert (await r.json())["kind"] == "Gadget"
