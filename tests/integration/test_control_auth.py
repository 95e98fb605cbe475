"""The Kubernetes check of the control endpoint against the emulator over HTTP: a
TokenReview says whose token it is, a SubjectAccessReview whether they may ``post
/snapshot``. The emulator knows one token (its kubeconfig's) and refuses what a forbid
rule names; kube-apiserver with real RBAC is tests/real/test_control_auth.py."""

from __future__ import annotations

from typing import Any

import aiohttp

from bridge.emulator import Emulator
from bridge.emulator.server import EMULATOR_TOKEN
from bridge.ground.prometheus import Registry
from bridge.kube.client import KubeClient
from bridge.kube.review import AccessReviewer
from bridge.service.control import CONTROL_PATH, CONTROL_VERB, KubernetesAccess
from bridge.service.health import HealthServer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def reviewer(client: KubeClient | None, clock: Clock, ttl: float = 10.0) -> AccessReviewer:
    return AccessReviewer(
        lambda: client, path=CONTROL_PATH, verb=CONTROL_VERB, allow_ttl=ttl, clock=clock
    )


async def test_a_token_is_reviewed_then_its_access(client: KubeClient, emulator: Emulator) -> None:
    check = reviewer(client, Clock())
    allowed = await check.review(EMULATOR_TOKEN)
    assert (allowed.status, allowed.user) == (200, "emulator-admin")
    bad = await check.review("not-a-token")
    assert bad.status == 401
    assert bad.message == "unauthorized: the bearer token is not valid (TokenReview)"
    emulator.forbid(verb="post", resource="/snapshot")
    fresh = reviewer(client, Clock())
    denied = await fresh.review(EMULATOR_TOKEN)
    assert denied.status == 403
    assert denied.message.startswith("forbidden: 'emulator-admin' may not post /snapshot")


async def test_only_an_allowed_answer_is_cached_and_only_briefly(
    client: KubeClient, emulator: Emulator
) -> None:
    clock = Clock()
    check = reviewer(client, clock)
    assert (await check.review(EMULATOR_TOKEN)).status == 200
    rule = emulator.forbid(verb="post", resource="/snapshot")
    clock.now += 9.0
    assert (await check.review(EMULATOR_TOKEN)).status == 200  # cached: no review made
    clock.now += 1.5
    assert (await check.review(EMULATOR_TOKEN)).status == 403  # expired: reviewed again
    emulator.forbid_rules.remove(rule)
    # A refusal is not cached: the caller granted a moment later gets in at once.
    assert (await check.review(EMULATOR_TOKEN)).status == 200


async def test_a_review_that_cannot_be_made_refuses_with_503(
    client: KubeClient, emulator: Emulator
) -> None:
    clock = Clock()
    check = reviewer(client, clock)
    assert (await check.review(EMULATOR_TOKEN)).status == 200
    await emulator.stop()
    clock.now += 11.0
    down = await check.review(EMULATOR_TOKEN)
    assert down.status == 503 and down.message.startswith("cannot review the token: ")
    assert "\n" not in down.message
    not_yet = await reviewer(None, clock).review(EMULATOR_TOKEN)
    assert (not_yet.status, not_yet.message) == (
        503,
        "cannot review the token yet: not connected to the API server",
    )


async def test_the_bridge_may_not_review_says_which_role_it_lacks(
    client: KubeClient, emulator: Emulator
) -> None:
    emulator.forbid(verb="create", resource="tokenreviews")
    refused = await reviewer(client, Clock()).review(EMULATOR_TOKEN)
    assert refused.status == 503 and "system:auth-delegator" in refused.message


async def test_the_endpoint_answers_401_403_and_200_as_the_reviews_say(
    client: KubeClient, emulator: Emulator
) -> None:
    asked: list[str] = []

    async def snapshot(resource: str) -> dict[str, Any]:
        asked.append(resource)
        return {"signalId": "s1"}

    server = HealthServer(
        "127.0.0.1",
        0,
        Registry(),
        lambda: (True, []),
        snapshot=snapshot,
        # Nothing cached: the forbid rule below applies to the next request.
        control_auth=KubernetesAccess(reviewer(client, Clock(), ttl=0)),
    )
    async with server, aiohttp.ClientSession() as http:
        url = f"{server.url}/snapshot"
        query = {"resource": "Pod"}

        async def post(token: str | None) -> tuple[int, Any]:
            headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
            async with http.post(url, params=query, headers=headers) as r:
                return r.status, await r.json()

        status, body = await post(None)
        assert (
            status == 401
            and "Bearer <a Kubernetes token allowed to post /snapshot>" in (body["error"])
        )
        assert (await post("garbage"))[0] == 401
        assert await post(EMULATOR_TOKEN) == (200, {"signalId": "s1"})
        emulator.forbid(verb="post", resource="/snapshot")
        status, body = await post(EMULATOR_TOKEN)
        assert status == 403 and "may not post /snapshot" in body["error"]
    assert asked == ["Pod"]
