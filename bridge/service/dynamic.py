"""Discovery that follows the cluster, for entries that select kinds (group, kinds, allKinds).

``KindFollower`` watches CustomResourceDefinitions and APIServices; any change of
either (and, as a fallback, every ``refresh_every`` seconds) re-reads the
discovery catalog and resolves the selecting entries again. The app then starts
a pipeline for each kind that appeared and stops the pipeline of each kind that
went away (bridge/service/app.py, ``apply_kinds``).

Before a selected kind gets a pipeline, one LIST of at most one object asks
whether the bridge may read it: a 403 is one warning line and the metric
``kinds_skipped{reason="forbidden"}``, a 503 (an aggregated APIService that does
not answer) one warning and ``reason="unavailable"``; the other kinds go on, and
the next refresh asks again. Explicit entries (``apiVersion`` + ``kind``) are not
followed: they stay as resolved at start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from bridge.aiotasks import cancel_and_wait
from bridge.errors import (
    ApiStatusError,
    BridgeError,
    ForbiddenError,
    KubeConnectionError,
    NotFoundError,
)
from bridge.kube.client import KubeClient
from bridge.kube.discovery import ResourceInfo
from bridge.kube.kinds import KindCatalog, read_catalog
from bridge.logging import get_logger
from bridge.service.kinds import ResolvedResource, resolve_entries
from bridge.service.metrics import Metrics
from bridge.service.settings import ResourceSettings, Settings

log = get_logger(__name__)

# What is watched to notice kinds coming and going.
_WATCHED = (
    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    "/apis/apiregistration.k8s.io/v1/apiservices",
)
# A CRD becomes Established a moment before aggregated discovery lists it: a change
# is read at once and once more this much later.
_SECOND_LOOK = 2.0
# At most this many access probes (LISTs of one object) at once.
_PROBES = 8


@dataclass(frozen=True)
class Skipped:
    resource: ResolvedResource
    reason: str  # forbidden | unavailable
    error: str


async def probe_access(
    client: KubeClient, resolved: Sequence[ResolvedResource]
) -> tuple[list[ResolvedResource], list[Skipped]]:
    """``resolved`` split into those the bridge may list now and those it may not."""
    gate = asyncio.Semaphore(_PROBES)

    async def one(r: ResolvedResource) -> Skipped | None:
        ns = r.settings.namespaces[0] if r.settings.namespaces else None
        async with gate:
            try:
                await client.request_json("GET", r.info.path(ns), params={"limit": 1})
            except ForbiddenError as e:
                return Skipped(r, "forbidden", str(e))
            except NotFoundError as e:
                return Skipped(r, "unavailable", str(e))
            except ApiStatusError as e:
                if e.code == 503:
                    return Skipped(r, "unavailable", str(e))
                raise
        return None

    results = await asyncio.gather(*(one(r) for r in resolved))
    ok = [r for r, s in zip(resolved, results, strict=True) if s is None]
    return ok, [s for s in results if s is not None]


def label_of(info: ResourceInfo) -> str:
    return f"{info.api_version}/{info.plural}"


class KindFollower:
    """Re-resolves the selecting entries whenever the served kinds may have changed."""

    def __init__(
        self,
        settings: Settings,
        client: KubeClient,
        entries: Sequence[tuple[int, ResourceSettings]],
        apply: Callable[[list[ResolvedResource], KindCatalog, set[str]], Awaitable[None]],
        *,
        refresh_every: float = 30.0,
    ) -> None:
        self._settings = settings
        self._client = client
        self._entries = [(i, r) for i, r in entries if r.selects_kinds]
        self._apply = apply
        self._refresh_every = refresh_every
        self._dirty = asyncio.Event()
        self.refreshes = 0

    @property
    def follows(self) -> bool:
        return bool(self._entries)

    async def run(self) -> None:
        if not self._entries:
            await asyncio.Event().wait()
        watchers = [
            asyncio.create_task(self._watch(path), name=f"kinds:{path}") for path in _WATCHED
        ]
        watchers.append(asyncio.create_task(self._tick(), name="kinds:tick"))
        try:
            while True:
                await self._dirty.wait()
                self._dirty.clear()
                await self.refresh()
                # The second look: a CRD just Established, not yet in aggregated discovery.
                await asyncio.sleep(_SECOND_LOOK)
                if not self._dirty.is_set():
                    await self.refresh()
        finally:
            await cancel_and_wait(watchers)

    async def refresh(self) -> None:
        self.refreshes += 1
        try:
            catalog = await read_catalog(self._client)
            stale: set[str] = set()
            resolved = await resolve_entries(
                self._settings, self._client, self._entries, catalog=catalog, stale=stale
            )
        except BridgeError as e:
            # A group that went away, an exclusion naming a kind deleted since: the kinds
            # running stay as they are until the entries resolve again.
            log.warning("discovery changed, entries do not resolve; kinds unchanged", error=str(e))
            return
        await self._apply(resolved, catalog, stale)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_every)
            self._dirty.set()

    async def _watch(self, path: str) -> None:
        """Mark the catalog dirty at every change of what ``path`` lists."""
        warned = False
        while True:
            try:
                params: dict[str, str | int | bool] = {"watch": 1, "timeoutSeconds": 300}
                async with self._client.stream_decoded("GET", path, params) as events:
                    async for event in events:
                        if isinstance(event, dict) and event.get("type") != "BOOKMARK":
                            self._dirty.set()
            except ForbiddenError as e:
                if not warned:
                    warned = True
                    log.warning(
                        "may not watch; new kinds are noticed only every refresh",
                        path=path,
                        every=self._refresh_every,
                        error=str(e),
                    )
                await asyncio.sleep(self._refresh_every)
            except (KubeConnectionError, ApiStatusError):
                await asyncio.sleep(1.0)


def skipped_metric(metrics: Metrics, skipped: Sequence[Skipped]) -> None:
    for s in skipped:
        metrics.kinds_skipped.labels(resource=label_of(s.resource.info), reason=s.reason).set(1)
