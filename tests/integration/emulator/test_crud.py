"""Create, read, update, patch and delete over HTTP, with the API server's rules."""

from __future__ import annotations

import aiohttp
import pytest

from bridge import errors
from bridge.emulator import Emulator
from tests.integration.emulator.helpers import cm


async def test_create_sets_server_fields_and_get_returns_it(emulator: Emulator) -> None:
    rv_before = emulator.resource_version
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.post("/api/v1/namespaces/default/configmaps", json=cm("a")) as r:
            assert r.status == 201
            created = await r.json()
        async with http.get("/api/v1/namespaces/default/configmaps/a") as r:
            fetched = await r.json()
    meta = created["metadata"]
    assert len(meta["uid"]) == 36
    assert meta["creationTimestamp"].endswith("Z")
    assert int(meta["resourceVersion"]) == rv_before + 1 == emulator.resource_version
    assert meta["generation"] == 1
    assert fetched == created
    assert fetched["kind"] == "ConfigMap" and fetched["apiVersion"] == "v1"


async def test_generate_name_and_already_exists(emulator: Emulator) -> None:
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "job-"}}
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.post("/api/v1/namespaces/default/configmaps", json=body) as r:
            name = (await r.json())["metadata"]["name"]
        async with http.post("/api/v1/namespaces/default/configmaps", json=cm(name)) as r:
            assert r.status == 409
            st = await r.json()
    assert name.startswith("job-") and len(name) == len("job-") + 5
    assert st["kind"] == "Status" and st["reason"] == "AlreadyExists"
    assert st["message"] == f'configmaps "{name}" already exists'


async def test_put_with_current_rv_updates_and_bumps_generation_on_spec_change(
    emulator: Emulator,
) -> None:
    emulator.create(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": 1},
        }
    )
    url = "/apis/apps/v1/namespaces/default/deployments/web"
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get(url) as r:
            obj = await r.json()
        obj["spec"]["replicas"] = 3
        async with http.put(url, json=obj) as r:
            assert r.status == 200
            updated = await r.json()
        updated["status"] = {"replicas": 3}
        async with http.put(url, json=updated) as r:
            status_only = await r.json()
    assert updated["metadata"]["generation"] == 2
    assert int(updated["metadata"]["resourceVersion"]) > int(obj["metadata"]["resourceVersion"])
    assert status_only["metadata"]["generation"] == 2  # status is not spec


async def test_checklist_34_noop_update_keeps_rv_and_stale_put_conflicts(
    emulator: Emulator,
) -> None:
    """Checklist 34: an update that changes nothing keeps the RV; a stale RV gets 409."""
    created = emulator.create(cm("a"))
    url = "/api/v1/namespaces/default/configmaps/a"
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.put(url, json=created) as r:
            same = await r.json()
        rv_after_noop = emulator.resource_version
        changed = dict(created, data={"k": "new"})
        async with http.put(url, json=changed) as r:
            assert r.status == 200
        async with http.put(url, json=dict(created, data={"k": "stale"})) as r:
            assert r.status == 409
            st = await r.json()
    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert rv_after_noop == int(created["metadata"]["resourceVersion"])
    assert st["reason"] == "Conflict" and "the object has been modified" in st["message"]
    with pytest.raises(errors.ConflictError):
        emulator.update(dict(created, data={"k": "stale"}))


async def test_patch_media_types(emulator: Emulator) -> None:
    emulator.create(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "labels": {"a": "1"}},
            "spec": {
                "replicas": 1,
                "template": {
                    "spec": {
                        "containers": [
                            {"name": "app", "image": "v1", "ports": [{"containerPort": 80}]}
                        ]
                    }
                },
            },
        }
    )
    url = "/apis/apps/v1/namespaces/default/deployments/web"
    async with aiohttp.ClientSession(emulator.url) as http:
        merge = {"metadata": {"labels": {"a": None, "b": "2"}}}
        async with http.patch(
            url, json=merge, headers={"Content-Type": "application/merge-patch+json"}
        ) as r:
            merged = await r.json()
        strategic = {
            "spec": {
                "template": {
                    "spec": {
                        "$setElementOrder/containers": [{"name": "app"}],
                        "containers": [{"name": "app", "image": "v2"}],
                    }
                }
            }
        }
        async with http.patch(
            url, json=strategic, headers={"Content-Type": "application/strategic-merge-patch+json"}
        ) as r:
            smp = await r.json()
        ops = [{"op": "replace", "path": "/spec/replicas", "value": 5}]
        async with http.patch(
            url, json=ops, headers={"Content-Type": "application/json-patch+json"}
        ) as r:
            jp = await r.json()
    assert merged["metadata"]["labels"] == {"b": "2"}
    container = smp["spec"]["template"]["spec"]["containers"][0]
    assert container == {"name": "app", "image": "v2", "ports": [{"containerPort": 80}]}
    assert "$setElementOrder/containers" not in smp["spec"]["template"]["spec"]
    assert jp["spec"]["replicas"] == 5


async def test_delete_and_cluster_wide_list(emulator: Emulator) -> None:
    emulator.create(cm("a", "ns1"))
    emulator.create(cm("b", "ns2"))
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get("/api/v1/configmaps") as r:
            everywhere = [i["metadata"]["name"] for i in (await r.json())["items"]]
        async with http.get("/api/v1/namespaces/ns1/configmaps") as r:
            one_ns = [i["metadata"]["name"] for i in (await r.json())["items"]]
        async with http.delete("/api/v1/namespaces/ns1/configmaps/a") as r:
            assert r.status == 200
            assert (await r.json())["status"] == "Success"
        async with http.get("/api/v1/namespaces/ns1/configmaps/a") as r:
            assert r.status == 404
        async with http.get("/api/v1/namespaces") as r:
            namespaces = [i["metadata"]["name"] for i in (await r.json())["items"]]
    assert everywhere == ["a", "b"]
    assert one_ns == ["a"]
    assert {"default", "kube-system"} <= set(namespaces)
    with pytest.raises(errors.NotFoundError):
        emulator.get("v1", "ConfigMap", "a", "ns1")


async def test_custom_resource_crud_through_python_api(emulator: Emulator) -> None:
    w = emulator.create(
        {
            "apiVersion": "example.com/v1",
            "kind": "Widget",
            "metadata": {"name": "w1", "namespace": "default"},
            "spec": {"size": 1},
        }
    )
    w2 = emulator.patch("example.com/v1", "Widget", "w1", {"spec": {"size": 2}}, "default")
    listed = emulator.list("example.com/v1", "Widget")
    deleted = emulator.delete("example.com/v1", "Widget", "w1", "default")
    assert w2["metadata"]["generation"] == 2
    assert [x["spec"]["size"] for x in listed] == [2]
    assert int(deleted["metadata"]["resourceVersion"]) > int(w2["metadata"]["resourceVersion"])
    assert w["metadata"]["uid"] == deleted["metadata"]["uid"]
    assert emulator.list("example.com/v1", "Widget") == []


async def test_access_review_allowed_unless_forbidden(emulator: Emulator) -> None:
    emulator.forbid(verb="list", resource="secrets")
    attrs = {"verb": "list", "resource": "pods"}
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attrs},
    }
    url = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.post(url, json=review) as r:
            allowed = (await r.json())["status"]["allowed"]
        attrs["resource"] = "secrets"
        async with http.post(url, json=review) as r:
            denied = (await r.json())["status"]["allowed"]
    assert allowed is True and denied is False


async def test_secret_string_data_is_folded_into_data_and_not_stored(emulator: Emulator) -> None:
    """As the API server does: stringData is write-only, merged into data as base64."""
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "creds", "namespace": "default"},
        "data": {"user": "YWRtaW4=", "token": "b2xk"},
        "stringData": {"token": "s3cr3t"},
    }
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.post("/api/v1/namespaces/default/secrets", json=body) as r:
            assert r.status == 201
            created = await r.json()
    assert "stringData" not in created
    assert created["data"] == {"user": "YWRtaW4=", "token": "czNjcjN0"}
