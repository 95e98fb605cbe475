"""Who may call the control endpoint (``POST /snapshot``): ``server.controlAuth``.

- ``kubernetes`` (the default without a ``server.controlToken``): the caller's
  bearer token is reviewed by the API server (bridge/kube/review.py) and must be
  allowed ``post`` on the non-resource URL ``/snapshot``.
- ``token``: the caller sends ``server.controlToken`` as a bearer token.
- ``none``: anyone who reaches the port; only when chosen, and said at start.

Each answers a request with a ``Decision``: 200, or the status and one line of
the refusal (401 no or bad token, 403 not allowed, 503 the review failed).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Protocol

from bridge.kube.review import AccessReviewer, Decision, JsonRequester
from bridge.service.settings import ServerSettings

# The request the SubjectAccessReview asks about: as the API server names a
# non-resource request (path, lowercased method), so RBAC grants it with
# nonResourceURLs: ["/snapshot"], verbs: ["post"].
CONTROL_PATH = "/snapshot"
CONTROL_VERB = "post"


class ControlAuth(Protocol):
    @property
    def mode(self) -> str: ...

    async def check(self, authorization: str) -> Decision:
        """``authorization``: the request's ``Authorization`` header ("" when absent)."""
        ...


def bearer_token(authorization: str) -> str:
    """The token of an ``Authorization: Bearer <token>`` header; "" for anything else."""
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return ""
    return token.strip()


class StaticToken:
    mode = "token"

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("an empty control token would let every caller in")
        self._token = token.encode()

    async def check(self, authorization: str) -> Decision:
        given = bearer_token(authorization)
        if not given:
            return Decision(401, "unauthorized: send Authorization: Bearer <server.controlToken>")
        if not hmac.compare_digest(given.encode(), self._token):
            return Decision(401, "unauthorized: the bearer token is not server.controlToken")
        return Decision(200)


class KubernetesAccess:
    mode = "kubernetes"

    def __init__(self, reviewer: AccessReviewer) -> None:
        self._reviewer = reviewer

    async def check(self, authorization: str) -> Decision:
        token = bearer_token(authorization)
        if not token:
            return Decision(
                401,
                "unauthorized: send Authorization: Bearer <a Kubernetes token allowed to "
                f"{self._reviewer.verb} {self._reviewer.path}>",
            )
        return await self._reviewer.review(token)


class Unauthenticated:
    mode = "none"

    async def check(self, authorization: str) -> Decision:
        return Decision(200)


def control_auth(server: ServerSettings, client: Callable[[], JsonRequester | None]) -> ControlAuth:
    """The check ``server`` asks for; ``client`` gives the bridge's Kubernetes client
    (None until it is connected) for the reviews of ``kubernetes``."""
    mode = server.control_mode
    if mode == "token":
        assert server.control_token is not None  # settings validation makes sure
        return StaticToken(server.control_token.get_secret_value())
    if mode == "none":
        return Unauthenticated()
    return KubernetesAccess(AccessReviewer(client, path=CONTROL_PATH, verb=CONTROL_VERB))
