"""Who is calling, and may they? A caller's bearer token, reviewed by the API server.

The Kubernetes way of protecting an endpoint that is not the API server's own,
as controller-runtime's ``filters.WithAuthenticationAndAuthorization`` protects
its metrics: a **TokenReview** (authentication.k8s.io/v1) says whose token it
is, then a **SubjectAccessReview** (authorization.k8s.io/v1) asks whether that
user may do the request, named as the API server names a request that is not
for a resource: the URL path and the lowercased HTTP method (``post
/snapshot``). RBAC grants it with a ClusterRole rule ``nonResourceURLs:
["/snapshot"], verbs: ["post"]``, and ``kubectl auth can-i post /snapshot
--as=...`` answers it. Both reviews are created with the bridge's own
credentials (the ``system:auth-delegator`` ClusterRole allows them).

Only positive answers are cached, for ``allow_ttl`` seconds (10 by default,
the API server's own cache of successful token reviews): a snapshot is a rare
request, so the cache only keeps a burst of retries from turning into a burst
of reviews, and a revoked binding or token takes effect within that time. A
refusal is never cached, so a caller who was just granted the role is let in
at once; and a review that could not be made is never an answer: the caller
gets 503, never access.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from bridge.errors import ForbiddenError, KubeError
from bridge.logging import get_logger

log = get_logger(__name__)

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECT_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"

# Positive answers kept at most this many tokens at once (oldest dropped first).
_CACHE_ENTRIES = 256
# Reviews in flight at once: unauthenticated callers must not be able to make
# the bridge flood the API server.
_CONCURRENT_REVIEWS = 4


class JsonRequester(Protocol):
    """What a review needs of the Kubernetes client (``KubeClient`` is one)."""

    async def request_json(self, method: str, path: str, *, body: Any = None) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer for one request: ``status`` 200 lets it through; else the HTTP status
    of the refusal and one line saying why."""

    status: int
    message: str = ""
    user: str = ""

    @property
    def allowed(self) -> bool:
        return self.status == 200


@dataclass(frozen=True, slots=True)
class UserInfo:
    username: str
    uid: str = ""
    groups: list[str] = field(default_factory=list)
    extra: dict[str, list[str]] = field(default_factory=dict)


class AccessReviewer:
    """Reviews bearer tokens for one non-resource request (``verb`` on ``path``).

    ``client`` is called for each review, so the reviewer can exist before the
    bridge has connected (it answers 503 until then).
    """

    def __init__(
        self,
        client: Callable[[], JsonRequester | None],
        *,
        path: str,
        verb: str,
        allow_ttl: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self.path = path
        self.verb = verb
        self._allow_ttl = allow_ttl
        self._clock = clock
        # sha256(token) -> (expiry, username): the token itself is never kept.
        self._allowed: OrderedDict[bytes, tuple[float, str]] = OrderedDict()
        self._gate = asyncio.Semaphore(_CONCURRENT_REVIEWS)

    async def review(self, token: str) -> Decision:
        if not token:
            return Decision(401, "unauthorized: send Authorization: Bearer <token>")
        key = hashlib.sha256(token.encode()).digest()
        cached = self._allowed.get(key)
        now = self._clock()
        if cached is not None:
            if cached[0] > now:
                return Decision(200, user=cached[1])
            del self._allowed[key]
        async with self._gate:
            decision = await self._review(token)
        if decision.allowed and self._allow_ttl > 0:
            self._allowed[key] = (self._clock() + self._allow_ttl, decision.user)
            while len(self._allowed) > _CACHE_ENTRIES:
                self._allowed.popitem(last=False)
        return decision

    async def _review(self, token: str) -> Decision:
        client = self._client()
        if client is None:
            return Decision(503, "cannot review the token yet: not connected to the API server")
        try:
            user = await self._authenticate(client, token)
            if user is None:
                return Decision(401, "unauthorized: the bearer token is not valid (TokenReview)")
            allowed, reason = await self._authorize(client, user)
        except ForbiddenError as e:
            # The bridge's own account lacks the rights: say which, never let the caller in.
            return Decision(
                503,
                f"cannot review the token: the bridge may not create token or access "
                f"reviews (bind its ServiceAccount to system:auth-delegator): {_line(e)}",
            )
        except KubeError as e:
            return Decision(503, f"cannot review the token: {_line(e)}")
        if not allowed:
            why = f" ({reason})" if reason else ""
            return Decision(
                403,
                f"forbidden: {user.username!r} may not {self.verb} {self.path}{why}",
                user=user.username,
            )
        return Decision(200, user=user.username)

    async def _authenticate(self, client: JsonRequester, token: str) -> UserInfo | None:
        answer = await client.request_json(
            "POST",
            TOKEN_REVIEWS,
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        status = answer.get("status") or {}
        if status.get("authenticated") is not True:
            if status.get("error"):
                log.info("control token not authenticated", error=str(status["error"]))
            return None
        user = status.get("user") or {}
        username = str(user.get("username") or "")
        if not username:
            return None  # an identity without a name cannot be authorized
        return UserInfo(
            username=username,
            uid=str(user.get("uid") or ""),
            groups=[str(g) for g in user.get("groups") or ()],
            extra={str(k): [str(x) for x in v] for k, v in (user.get("extra") or {}).items()},
        )

    async def _authorize(self, client: JsonRequester, user: UserInfo) -> tuple[bool, str]:
        spec: dict[str, Any] = {
            "user": user.username,
            "groups": user.groups,
            "nonResourceAttributes": {"path": self.path, "verb": self.verb},
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = user.extra
        answer = await client.request_json(
            "POST",
            SUBJECT_ACCESS_REVIEWS,
            body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": spec,
            },
        )
        status = answer.get("status") or {}
        reason = str(status.get("reason") or status.get("evaluationError") or "")
        return status.get("allowed") is True and status.get("denied") is not True, reason


def _line(e: BaseException) -> str:
    return str(e).replace("\n", " ")
