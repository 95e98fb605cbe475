"""``k8s-bridge snapshot``: asks the running bridge for a snapshot signal (``POST /snapshot``).

What a snapshot does inside the bridge is ``bridge.delivery.snapshot``.
"""

from __future__ import annotations

from typing import Any

import orjson

from bridge.errors import ConfigError, SnapshotError
from bridge.service.configured import find_resource
from bridge.service.settings import Settings


def control_url(settings: Settings) -> str:
    """Where the running bridge of ``settings`` listens (its health/metrics server)."""
    host = settings.server.host
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"  # bound everywhere: this machine's loopback reaches it
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.server.port}"


async def control_bearer(settings: Settings) -> tuple[str | None, str]:
    """The bearer token ``k8s-bridge snapshot`` sends, as ``server.controlAuth`` wants it,
    and why there is none: ``server.controlToken``; for kubernetes, the token of the
    credentials the config's ``cluster`` section names (a kubeconfig, else the pod's
    ServiceAccount)."""
    mode = settings.server.control_mode
    if mode == "none":
        return None, ""
    if mode == "token":
        assert settings.server.control_token is not None  # settings validation makes sure
        return settings.server.control_token.get_secret_value(), ""
    from bridge.kube.client import KubeClient

    try:
        client = await KubeClient.from_kubeconfig(
            settings.cluster.kubeconfig,
            settings.cluster.context,
            compression=settings.cluster.compression,
        )
    except ConfigError as e:
        return None, str(e).removeprefix("config error: ")
    try:
        token = await client.bearer_token()
    except ConfigError as e:
        return None, str(e).removeprefix("config error: ")
    finally:
        await client.close()
    if token is None:
        return None, "the credentials of cluster.kubeconfig carry no bearer token"
    return token, ""


async def request_snapshot(
    settings: Settings,
    wanted: str,
    *,
    url: str | None = None,
    timeout: float = 600.0,
    token: str | None = None,
) -> dict[str, Any]:
    """Ask the running bridge to snapshot ``wanted`` (a configured resource); its counts.

    ``token`` is the bearer token to send; None: the one ``control_bearer`` finds.
    Raises ``ConfigError`` for a resource the configuration does not name, and
    ``SnapshotError`` (one line naming host:port) when the bridge cannot be
    reached, refuses, or does not answer within ``timeout``.
    """
    import aiohttp

    res = find_resource(settings, wanted)
    base = (url or control_url(settings)).rstrip("/")
    where = base.removeprefix("http://").removeprefix("https://")
    headers = {}
    # Without a token the bridge still answers (401, or it is not running): its
    # answer comes first, and why no token was sent is added to a 401.
    missing = ""
    if token is None:
        token, missing = await control_bearer(settings)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.post(
                f"{base}/snapshot", params={"resource": res.gvk}, headers=headers
            ) as response,
        ):
            text = await response.text()
            status = response.status
    except TimeoutError:
        raise SnapshotError(
            f"the bridge at {where} did not finish the snapshot of {res.gvk} within "
            f"{timeout:g}s (it goes on; see its log)",
            status=504,
        ) from None
    except aiohttp.ClientError as e:
        raise SnapshotError(
            f"cannot reach the bridge at {where} (is `k8s-bridge run` running with this "
            f"config?): {e}",
            status=503,
        ) from None
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError:
        body = {"error": text.strip().splitlines()[0] if text.strip() else f"HTTP {status}"}
    if status != 200 or not isinstance(body, dict):
        error = body.get("error") if isinstance(body, dict) else None
        hint = (
            f" (no token sent: {missing}; pass --token, e.g. from `kubectl create token`)"
            if status == 401 and missing
            else ""
        )
        raise SnapshotError(
            f"the bridge at {where} refused: {error or status}{hint}", status=status
        )
    return body


def summary(body: dict[str, Any]) -> str:
    """One line for a person: the signal id and the counts."""
    by = body.get("skippedBy") or {}
    why = ", ".join(f"{n} {reason}" for reason, n in sorted(by.items()))
    return (
        f"snapshot {body.get('signalId')} of {', '.join(body.get('resources') or [])}: "
        f"announced {body.get('announced', 0)}, skipped {body.get('skipped', 0)}"
        + (f" ({why})" if why else "")
        + f", listed {body.get('listed', 0)} in {body.get('seconds', 0)}s"
    )
