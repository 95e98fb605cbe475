"""Checklist 33: every error is a Status object with the real server's code, reason and message."""

from __future__ import annotations

from typing import Any

import aiohttp

from bridge import errors
from bridge.emulator import Emulator
from tests.integration.emulator.helpers import cm


async def _request(
    emulator: Emulator, method: str, path: str, **kwargs: Any
) -> tuple[int, dict[str, str], dict[str, Any]]:
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.request(method, path, **kwargs) as r:
            return r.status, dict(r.headers), await r.json()


def _is_status(body: dict[str, Any], code: int, reason: str) -> None:
    assert body["kind"] == "Status" and body["apiVersion"] == "v1"
    assert body["status"] == "Failure"
    assert body["code"] == code and body["reason"] == reason
    # The shared translation yields the matching error class.
    assert errors.status_error(body).code == code


async def test_checklist_33_not_found(emulator: Emulator) -> None:
    code, _, body = await _request(
        emulator, "GET", "/apis/example.com/v1/namespaces/x/widgets/nope"
    )
    assert code == 404
    _is_status(body, 404, "NotFound")
    assert body["message"] == 'widgets.example.com "nope" not found'
    code, _, body = await _request(emulator, "GET", "/api/v1/nosuchthings")
    assert code == 404 and body["reason"] == "NotFound"


async def test_checklist_33_forbidden_names_verb_resource_group_namespace(
    emulator: Emulator,
) -> None:
    emulator.forbid(verb="list", resource="deployments", namespace="prod")
    code, _, body = await _request(emulator, "GET", "/apis/apps/v1/namespaces/prod/deployments")
    assert code == 403
    _is_status(body, 403, "Forbidden")
    assert body["message"] == (
        'deployments.apps is forbidden: User "emulator-admin" cannot list resource '
        '"deployments" in API group "apps" in the namespace "prod"'
    )
    emulator.forbid(verb="watch", resource="nodes")
    code, _, body = await _request(emulator, "GET", "/api/v1/nodes", params={"watch": "1"})
    assert code == 403
    assert body["message"].endswith(
        'cannot watch resource "nodes" in API group "" at the cluster scope'
    )
    code, _, _ = await _request(emulator, "GET", "/apis/apps/v1/namespaces/dev/deployments")
    assert code == 200


async def test_checklist_33_conflict_and_already_exists(emulator: Emulator) -> None:
    created = emulator.create(cm("a"))
    emulator.patch("v1", "ConfigMap", "a", {"data": {"k": "v2"}}, "default")
    path = "/api/v1/namespaces/default/configmaps"
    code, _, body = await _request(emulator, "POST", path, json=cm("a"))
    _is_status(body, 409, "AlreadyExists")
    code, _, body = await _request(emulator, "PUT", f"{path}/a", json=created)
    assert code == 409
    _is_status(body, 409, "Conflict")


async def test_checklist_33_expired(emulator: Emulator) -> None:
    emulator.create(cm("a"))
    emulator.create(cm("b"))
    emulator.chaos.compact()
    code, _, body = await _request(
        emulator,
        "GET",
        "/api/v1/configmaps",
        params={"resourceVersion": "2", "resourceVersionMatch": "Exact"},
    )
    assert code == 410
    _is_status(body, 410, "Expired")


async def test_checklist_33_too_many_requests_with_retry_after(emulator: Emulator) -> None:
    emulator.chaos.fail_next(2, status=429, retry_after=3)
    results = [await _request(emulator, "GET", "/api/v1/configmaps") for _ in range(3)]
    for code, headers, body in results[:2]:
        assert code == 429
        assert headers["Retry-After"] == "3"
        _is_status(body, 429, "TooManyRequests")
        assert body["details"]["retryAfterSeconds"] == 3
        assert errors.status_error(body).retry_after == 3.0
    assert results[2][0] == 200


async def test_checklist_33_internal_error(emulator: Emulator) -> None:
    emulator.chaos.fail_next(1, status=500)
    code, _, body = await _request(emulator, "GET", "/api/v1/namespaces/default/configmaps")
    assert code == 500
    _is_status(body, 500, "InternalError")
    code, _, _ = await _request(emulator, "GET", "/api/v1/namespaces/default/configmaps")
    assert code == 200


async def test_requests_are_recorded_with_query(emulator: Emulator) -> None:
    await _request(
        emulator, "GET", "/api/v1/configmaps", params={"limit": "5", "labelSelector": "a=b"}
    )
    rec = emulator.requests[-1]
    assert (rec.method, rec.path) == ("GET", "/api/v1/configmaps")
    assert rec.query == {"limit": "5", "labelSelector": "a=b"}
