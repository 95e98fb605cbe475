"""The one error tree of k8s-bridge.

Every transport translates its own failures into these at its boundary (the
way httpx does), so callers catch ``KubeError`` or ``SinkError`` and never an
aiohttp, nats or aiokafka exception.

    BridgeError
    ├── ConfigError                 bad settings; names the key
    ├── KubeError                   anything from talking to Kubernetes
    │   ├── KubeConnectionError     could not reach the API server / stream broke
    │   ├── WatchStalledError       a watch delivered no bytes for too long
    │   ├── ApiStatusError          the server answered with a Status (code, reason)
    │   │   ├── BadRequestError         400
    │   │   ├── UnauthorizedError       401
    │   │   ├── ForbiddenError          403
    │   │   ├── NotFoundError           404
    │   │   ├── ConflictError           409 (Conflict / AlreadyExists)
    │   │   ├── ExpiredError            410 (Gone / Expired: RV compacted)
    │   │   ├── TooManyRequestsError    429 (retry_after)
    │   │   ├── ServerError             5xx
    │   │   └── TooLargeResourceVersionError  504 ResourceVersionTooLarge
    │   ├── ListRejectedError       a LIST the server rejects (400), or forbids before the first sync (403): never retried
    │   └── DiscoveryError          the API does not serve what was asked
    │       └── UnknownKindError    apiVersion+kind not served
    ├── ResourceFailedError         a resource's pipeline stopped for good; names the resource
    ├── SinkError                   publishing to the bus failed for good (auth, missing stream)
    │   └── SinkUnavailableError    the bus cannot be reached right now
    ├── PoisonEventError            the bus refused one event for good and the policy is "fail"
    ├── CheckpointError             the checkpoint store failed
    ├── SnapshotError               a snapshot signal was refused or did not reach the bridge
    └── ListenError                 a server of ours cannot listen (its port is taken)
"""

from __future__ import annotations

import errno
import socket
from typing import Any


class BridgeError(Exception):
    """Base of every error k8s-bridge raises on purpose."""


class ConfigError(BridgeError):
    """Settings are invalid. The message names the key and the bad value."""


class KubeError(BridgeError):
    """Talking to the Kubernetes API failed."""


class KubeConnectionError(KubeError):
    """The API server could not be reached, or a stream from it broke."""


class WatchStalledError(KubeConnectionError):
    """A watch delivered neither events nor bookmarks for too long."""


class ApiStatusError(KubeError):
    """The API server answered with an error ``Status``."""

    code: int = 0

    def __init__(
        self,
        message: str,
        *,
        code: int | None = None,
        reason: str = "",
        status: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.reason = reason
        self.status: dict[str, Any] = status or {}
        self.retry_after = retry_after


class BadRequestError(ApiStatusError):
    code = 400


class UnauthorizedError(ApiStatusError):
    code = 401


class ForbiddenError(ApiStatusError):
    code = 403


class NotFoundError(ApiStatusError):
    code = 404


class ConflictError(ApiStatusError):
    code = 409


class ExpiredError(ApiStatusError):
    """410: the requested resourceVersion (or continue token) is no longer available."""

    code = 410


class TooManyRequestsError(ApiStatusError):
    code = 429


class ServerError(ApiStatusError):
    code = 500


class TooLargeResourceVersionError(ServerError):
    """504 ResourceVersionTooLarge: the server has not caught up with the asked RV."""

    code = 504


class ListRejectedError(KubeError):
    """The API server rejects the LIST itself (400), e.g. for a field selector the kind
    does not support, or forbids listing/watching before the resource ever synced
    (403: missing RBAC rules). client-go would retry it forever; the same request can
    never succeed, so the bridge stops and says so instead of hanging silently."""


class DiscoveryError(KubeError):
    """The API does not serve what was asked for."""


class UnknownKindError(DiscoveryError):
    """No served resource matches the apiVersion and kind."""


class ResourceFailedError(BridgeError):
    """One resource's pipeline failed for good; the message names the resource and why."""


class SinkError(BridgeError):
    """Publishing to the message bus failed."""


class SinkUnavailableError(SinkError):
    """The bus cannot be reached right now; retry later, do not advance checkpoints.

    ``soon``: the server answered, but nothing serves the subject yet (a JetStream
    stream electing its leader, or loading after a restart): that lasts seconds,
    so it is retried at a short fixed delay rather than a growing one
    (bridge/delivery/retry.py)."""

    def __init__(self, message: str, *, soon: bool = False) -> None:
        super().__init__(message)
        self.soon = soon


class PoisonEventError(BridgeError):
    """The bus refused an event for good (too large, not permitted) under ``poisonPolicy: fail``."""


class CheckpointError(BridgeError):
    """Reading or writing a checkpoint failed; ``soon`` as on ``SinkUnavailableError``."""

    def __init__(self, message: str, *, soon: bool = False) -> None:
        super().__init__(message)
        self.soon = soon


class SnapshotError(BridgeError):
    """A snapshot signal was refused (``status`` is the HTTP status the control endpoint
    answers with) or could not reach the running bridge."""

    def __init__(self, message: str, *, status: int = 503) -> None:
        super().__init__(message)
        self.status = status


class ListenError(BridgeError):
    """A server of ours (health, emulator) cannot listen where it was told to."""


def listen_error(host_key: str, port_key: str, host: str, port: int, exc: OSError) -> BridgeError:
    """One line naming the setting at fault when binding ``host:port`` failed.

    A name that does not resolve, an address this machine does not have or a
    port it may not use are bad values (``ConfigError``); a port another
    process holds is a condition of the moment (``ListenError``).
    """
    reason = exc.strerror or str(exc)
    if isinstance(exc, socket.gaierror):
        return ConfigError(f"config error: {host_key}: {host!r} does not resolve ({reason})")
    if exc.errno == errno.EADDRNOTAVAIL:
        return ConfigError(f"config error: {host_key}: {host!r} is not an address of this machine")
    if exc.errno == errno.EACCES:
        return ConfigError(f"config error: {port_key}: {port} may not be listened on ({reason})")
    if exc.errno == errno.EADDRINUSE:
        return ListenError(f"{port_key}: port {port} on {host} is already in use")
    return ListenError(f"cannot listen on {host}:{port} ({host_key}, {port_key}): {reason}")


_BY_CODE: dict[int, type[ApiStatusError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    410: ExpiredError,
    429: TooManyRequestsError,
    504: TooLargeResourceVersionError,
}


def status_error(
    status: dict[str, Any], *, http_code: int | None = None, retry_after: float | None = None
) -> ApiStatusError:
    """Build the right ``ApiStatusError`` from a Kubernetes ``Status`` object."""
    code = int(status.get("code") or http_code or 500)
    reason = str(status.get("reason") or "")
    message = str(status.get("message") or reason or f"HTTP {code}")
    if retry_after is None:
        details = status.get("details") or {}
        if isinstance(details, dict) and details.get("retryAfterSeconds") is not None:
            retry_after = float(details["retryAfterSeconds"])
    cls = _BY_CODE.get(code)
    if cls is None:
        cls = ServerError if code >= 500 else ApiStatusError
    return cls(message, code=code, reason=reason, status=status, retry_after=retry_after)
