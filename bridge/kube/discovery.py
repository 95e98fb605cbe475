"""Which resource serves an apiVersion + kind, read from the API's discovery documents."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from bridge.errors import NotFoundError, UnknownKindError


class _JsonClient(Protocol):
    async def request_json(self, method: str, path: str) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ResourceInfo:
    """One served resource: enough to build its URLs and name it in events."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    verbs: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def base(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """Collection URL (all namespaces when ``namespace`` is None), or one object's."""
        if namespace and self.namespaced:
            p = f"{self.base}/namespaces/{namespace}/{self.plural}"
        else:
            p = f"{self.base}/{self.plural}"
        return f"{p}/{name}" if name else p


def split_api_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


class Discovery:
    """Resolves kinds to resources, caching each group/version's document.

    A miss re-reads the document once: a CustomResourceDefinition may have been
    installed after the first read.
    """

    def __init__(self, client: _JsonClient) -> None:
        self._client = client
        self._cache: dict[str, dict[str, ResourceInfo]] = {}
        self._lock = asyncio.Lock()

    async def _load(self, api_version: str) -> dict[str, ResourceInfo] | None:
        group, version = split_api_version(api_version)
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        try:
            doc = await self._client.request_json("GET", path)
        except NotFoundError:
            return None
        kinds: dict[str, ResourceInfo] = {}
        for r in doc.get("resources") or []:
            name = str(r.get("name", ""))
            if not name or "/" in name:  # subresources such as pods/status
                continue
            info = ResourceInfo(
                group=group,
                version=version,
                kind=str(r.get("kind", "")),
                plural=name,
                namespaced=bool(r.get("namespaced", False)),
                verbs=tuple(str(v) for v in r.get("verbs") or ()),
            )
            kinds.setdefault(info.kind, info)
        return kinds

    async def resolve(self, api_version: str, kind: str) -> ResourceInfo:
        async with self._lock:
            kinds = self._cache.get(api_version)
            if kinds is None or kind not in kinds:
                loaded = await self._load(api_version)
                if loaded is None:
                    self._cache.pop(api_version, None)
                    raise UnknownKindError(
                        f"kind {kind!r} apiVersion {api_version!r}: "
                        f"the API server does not serve {api_version}"
                    )
                self._cache[api_version] = kinds = loaded
            info = kinds.get(kind)
            if info is None:
                served = ", ".join(sorted(kinds)) or "none"
                raise UnknownKindError(
                    f"kind {kind!r} apiVersion {api_version!r}: not served; "
                    f"{api_version} serves: {served}"
                )
            return info
