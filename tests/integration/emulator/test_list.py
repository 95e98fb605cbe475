"""LIST: resource versions, pagination and selectors, as the real API server answers them."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from bridge.emulator import Emulator
from tests.integration.emulator.helpers import cm

CMS = "/api/v1/namespaces/default/configmaps"


async def _get(emulator: Emulator, path: str, **params: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get(path, params=params) as r:
            return r.status, await r.json()


def _names(body: dict[str, Any]) -> list[str]:
    return [i["metadata"]["name"] for i in body["items"]]


async def test_checklist_32_list_has_rv_and_items_lack_kind(emulator: Emulator) -> None:
    """Checklist 32: metadata.resourceVersion on the list; kind/apiVersion only on the list."""
    emulator.create(cm("a"))
    code, body = await _get(emulator, CMS)
    assert code == 200
    assert body["kind"] == "ConfigMapList" and body["apiVersion"] == "v1"
    assert body["metadata"]["resourceVersion"] == str(emulator.resource_version)
    assert "kind" not in body["items"][0] and "apiVersion" not in body["items"][0]


async def test_checklist_32_limit_gives_continue_and_remaining_count(emulator: Emulator) -> None:
    """Checklist 32: limit → continue + remainingItemCount; pages are one consistent snapshot."""
    for i in range(5):
        emulator.create(cm(f"cm{i}"))
    _, page1 = await _get(emulator, CMS, limit="2")
    emulator.create(cm("cm9"))  # after the snapshot: must not show up in later pages
    emulator.delete("v1", "ConfigMap", "cm4", "default")  # still listed: the snapshot had it
    _, page2 = await _get(emulator, CMS, limit="2", **{"continue": page1["metadata"]["continue"]})
    _, page3 = await _get(emulator, CMS, limit="2", **{"continue": page2["metadata"]["continue"]})
    assert _names(page1) == ["cm0", "cm1"]
    assert page1["metadata"]["remainingItemCount"] == 3
    assert _names(page2) == ["cm2", "cm3"]
    assert page2["metadata"]["remainingItemCount"] == 1
    assert _names(page3) == ["cm4"]
    assert "continue" not in page3["metadata"]
    rvs = {p["metadata"]["resourceVersion"] for p in (page1, page2, page3)}
    assert len(rvs) == 1


async def test_rv_zero_ignores_limit_like_the_watch_cache(emulator: Emulator) -> None:
    for i in range(3):
        emulator.create(cm(f"cm{i}"))
    _, whole = await _get(emulator, CMS, limit="1", resourceVersion="0")
    _, paged = await _get(emulator, CMS, limit="1", resourceVersion="")
    assert _names(whole) == ["cm0", "cm1", "cm2"] and "continue" not in whole["metadata"]
    assert _names(paged) == ["cm0"] and paged["metadata"]["continue"]


async def test_checklist_32_expired_continue_token_is_410(emulator: Emulator) -> None:
    """Checklist 32: a continue token whose RV was compacted → 410 Expired."""
    for i in range(3):
        emulator.create(cm(f"cm{i}"))
    _, page1 = await _get(emulator, CMS, limit="1")
    emulator.create(cm("later"))
    emulator.chaos.compact()
    code, st = await _get(emulator, CMS, limit="1", **{"continue": page1["metadata"]["continue"]})
    assert code == 410
    assert st["kind"] == "Status" and st["reason"] == "Expired" and st["code"] == 410


async def test_checklist_32_exact_rv_serves_history_and_410_once_compacted(
    emulator: Emulator,
) -> None:
    """Checklist 32: resourceVersionMatch=Exact lists the past; a compacted RV → 410."""
    emulator.create(cm("a"))
    then = emulator.resource_version
    emulator.patch("v1", "ConfigMap", "a", {"data": {"k": "changed"}}, "default")
    emulator.create(cm("b"))
    code, past = await _get(emulator, CMS, resourceVersion=str(then), resourceVersionMatch="Exact")
    assert code == 200
    assert past["metadata"]["resourceVersion"] == str(then)
    assert _names(past) == ["a"] and past["items"][0]["data"] == {"k": "a"}
    emulator.chaos.compact()
    code, st = await _get(emulator, CMS, resourceVersion=str(then), resourceVersionMatch="Exact")
    assert code == 410 and st["reason"] == "Expired"
    assert st["message"] == "The resourceVersion for the provided list is too old."


@pytest.mark.parametrize("match", ["", "NotOlderThan", "Exact"])
async def test_checklist_32_rv_ahead_of_server_is_504_too_large(
    emulator: Emulator, match: str
) -> None:
    """Checklist 32: an RV the server has not reached → 504 ResourceVersionTooLarge."""
    params = {"resourceVersion": str(emulator.resource_version + 10)}
    if match:
        params["resourceVersionMatch"] = match
    code, st = await _get(emulator, CMS, **params)
    assert code == 504
    assert st["reason"] == "Timeout"
    assert st["message"] == (
        f"Timeout: Too large resource version: {params['resourceVersion']}, "
        f"current: {emulator.resource_version}"
    )
    assert st["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"


async def test_not_older_than_and_zero_serve_current_state(emulator: Emulator) -> None:
    emulator.create(cm("a"))
    rv = emulator.resource_version
    emulator.create(cm("b"))
    for params in (
        {"resourceVersion": "0"},
        {"resourceVersion": str(rv), "resourceVersionMatch": "NotOlderThan"},
        {"resourceVersion": str(rv)},
    ):
        code, body = await _get(emulator, CMS, **params)
        assert code == 200 and _names(body) == ["a", "b"]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=web", ["w1", "w2"]),
        ("app==web", ["w1", "w2"]),
        ("app!=web", ["d1", "plain"]),
        ("app in (web,db)", ["d1", "w1", "w2"]),
        ("app notin (web)", ["d1", "plain"]),
        ("tier", ["w2"]),
        ("!tier", ["d1", "plain", "w1"]),
        ("app=web,tier=front", ["w2"]),
    ],
)
async def test_label_selectors(emulator: Emulator, selector: str, expected: list[str]) -> None:
    emulator.create(cm("w1", app="web"))
    emulator.create(cm("w2", app="web", tier="front"))
    emulator.create(cm("d1", app="db"))
    emulator.create(cm("plain"))
    code, body = await _get(emulator, CMS, labelSelector=selector)
    assert code == 200
    assert _names(body) == expected


async def test_field_selectors_on_pods(emulator: Emulator) -> None:
    for name, node, phase, ns in (
        ("p1", "n1", "Running", "a"),
        ("p2", "n2", "Running", "b"),
        ("p3", "n1", "Pending", "b"),
    ):
        emulator.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"nodeName": node},
                "status": {"phase": phase},
            }
        )
    cases = {
        "spec.nodeName=n1": ["p1", "p3"],
        "status.phase==Running": ["p1", "p2"],
        "status.phase!=Running": ["p3"],
        "metadata.namespace=b,spec.nodeName=n1": ["p3"],
        "metadata.name=p2": ["p2"],
    }
    for selector, expected in cases.items():
        code, body = await _get(emulator, "/api/v1/pods", fieldSelector=selector)
        assert (code, _names(body)) == (200, expected), selector
    code, st = await _get(emulator, "/api/v1/pods", fieldSelector="spec.bogus=x")
    assert code == 400 and st["reason"] == "BadRequest"
    assert st["message"] == "field label not supported: spec.bogus"
    code, st = await _get(emulator, "/api/v1/pods", fieldSelector="status.phase")
    assert code == 400 and "can't understand" in st["message"]
