"""Which kinds the API server serves, and which of them a group or ``allKinds`` entry selects.

The catalog is read from the aggregated discovery documents (``/api`` and ``/apis``
asked for ``APIGroupDiscoveryList``, one request each, every group, version and
resource with its verbs) where the server has them, else from the legacy documents
(``/api``, ``/apis`` and one ``APIResourceList`` per group version, read only for the
versions a selection asks about). Versions are kept in the server's order of
preference: the first is the preferred one.

A selection takes only resources that support both ``list`` and ``watch`` (a
pipeline does both) and never subresources; virtual kinds (TokenReview,
SubjectAccessReview, ...) have neither verb and so are never taken.
"""

from __future__ import annotations

import asyncio
import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from bridge.errors import ApiStatusError, NotFoundError, UnknownKindError
from bridge.kube.discovery import ResourceInfo

AGGREGATED_ACCEPT = (
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
)

# Kinds ``allKinds`` leaves out unless an entry names them: they churn (Events,
# Leases renewed every few seconds, EndpointSlices rewritten with every pod) and
# would drown the rest of the stream.
DEFAULT_EXCLUDED: frozenset[tuple[str, str]] = frozenset(
    {
        ("", "Event"),
        ("events.k8s.io", "Event"),
        ("coordination.k8s.io", "Lease"),
        ("discovery.k8s.io", "EndpointSlice"),
    }
)

# Legacy documents of many groups are read at once, but not all at once.
_LEGACY_CONCURRENCY = 8


class JsonClient(Protocol):
    async def request_json(
        self, method: str, path: str, *, accept: str = "application/json"
    ) -> dict[str, Any]: ...


@dataclass
class ServedGroup:
    name: str
    versions: list[str]  # preferred first
    # version → resources; a version missing here has not been read (legacy discovery).
    resources: dict[str, list[ResourceInfo]] = field(default_factory=dict)
    # Versions the aggregated document marks Stale: an aggregated APIService that
    # does not answer; their resources are the last ones known, if any.
    stale: set[str] = field(default_factory=set)


class KindCatalog:
    """Groups, versions and resources the API server serves (one reading)."""

    def __init__(self, client: JsonClient, groups: dict[str, ServedGroup], aggregated: bool):
        self._client = client
        self.groups = groups
        self.aggregated = aggregated

    async def resources(self, group: str, version: str) -> list[ResourceInfo]:
        g = self.groups[group]
        found = g.resources.get(version)
        if found is None:
            loaded = await _legacy_resources(self._client, group, version)
            if loaded is None:  # its aggregated APIService does not answer
                g.stale.add(version)
                loaded = []
            found = g.resources[version] = loaded
        return found

    async def preload(self, wanted: Iterable[tuple[str, str]]) -> None:
        """Read the legacy documents of ``wanted`` (group, version) pairs, a few at once."""
        missing = [(g, v) for g, v in dict.fromkeys(wanted) if v not in self.groups[g].resources]
        if not missing:
            return
        gate = asyncio.Semaphore(_LEGACY_CONCURRENCY)

        async def one(g: str, v: str) -> None:
            async with gate:
                await self.resources(g, v)

        await asyncio.gather(*(one(g, v) for g, v in missing))


async def read_catalog(client: JsonClient) -> KindCatalog:
    """The server's catalog: aggregated discovery when it answers with it, else legacy."""
    core = await client.request_json("GET", "/api", accept=AGGREGATED_ACCEPT)
    if core.get("kind") == "APIGroupDiscoveryList":
        groups = await client.request_json("GET", "/apis", accept=AGGREGATED_ACCEPT)
        if groups.get("kind") == "APIGroupDiscoveryList":
            out: dict[str, ServedGroup] = {}
            for doc in (core, groups):
                for item in doc.get("items") or ():
                    g = _aggregated_group(item)
                    out[g.name] = g
            return KindCatalog(client, out, aggregated=True)
    out = {"": ServedGroup("", [str(v) for v in core.get("versions") or ()])}
    listed = await client.request_json("GET", "/apis")
    for item in listed.get("groups") or ():
        name = str(item.get("name", ""))
        versions = [str(v.get("version")) for v in item.get("versions") or ()]
        preferred = str((item.get("preferredVersion") or {}).get("version") or "")
        if preferred in versions:
            versions.remove(preferred)
            versions.insert(0, preferred)
        out[name] = ServedGroup(name, versions)
    return KindCatalog(client, out, aggregated=False)


def _aggregated_group(item: dict[str, Any]) -> ServedGroup:
    name = str((item.get("metadata") or {}).get("name") or "")
    g = ServedGroup(name, [])
    for v in item.get("versions") or ():
        version = str(v.get("version", ""))
        g.versions.append(version)
        if v.get("freshness") == "Stale":
            g.stale.add(version)
        infos = []
        for r in v.get("resources") or ():
            plural = str(r.get("resource", ""))
            kind = str((r.get("responseKind") or {}).get("kind") or "")
            if not plural or not kind:
                continue
            infos.append(
                ResourceInfo(
                    group=name,
                    version=version,
                    kind=kind,
                    plural=plural,
                    namespaced=r.get("scope") == "Namespaced",
                    verbs=tuple(str(x) for x in r.get("verbs") or ()),
                )
            )
        g.resources[version] = infos
    return g


async def _legacy_resources(
    client: JsonClient, group: str, version: str
) -> list[ResourceInfo] | None:
    """The group version's resources; None when its APIService does not answer (503)."""
    path = f"/apis/{group}/{version}" if group else f"/api/{version}"
    try:
        doc = await client.request_json("GET", path)
    except NotFoundError:
        return []
    except ApiStatusError as e:
        # 503 of an aggregated APIService that is down: its kinds are unknown for now.
        if e.code == 503:
            return None
        raise
    infos = []
    for r in doc.get("resources") or ():
        plural = str(r.get("name", ""))
        if not plural or "/" in plural:  # subresources such as pods/status
            continue
        infos.append(
            ResourceInfo(
                group=group,
                version=version,
                kind=str(r.get("kind", "")),
                plural=plural,
                namespaced=bool(r.get("namespaced", False)),
                verbs=tuple(str(v) for v in r.get("verbs") or ()),
            )
        )
    return infos


def watchable(info: ResourceInfo) -> bool:
    return "list" in info.verbs and "watch" in info.verbs


@dataclass(frozen=True)
class KindSelection:
    """What one group or ``allKinds`` entry asks for; ``where`` names it in errors."""

    where: str
    group: str | None  # None: every group (allKinds)
    version: str | None = None  # pinned; None: the group's preferred version
    kinds: tuple[str, ...] = ("*",)  # kind names or shell patterns (``*``, ``Cron*``)
    exclude: tuple[str, ...] = ()  # ``Kind`` (any group) or ``Kind.group``
    # Unpinned, each kind is taken at the group's most preferred version serving it.
    namespaced_only: bool = False  # the entry names namespaces: cluster-scoped kinds left out

    @property
    def all_groups(self) -> bool:
        return self.group is None


def _excluded(pattern: str, info: ResourceInfo) -> bool:
    kind, dot, group = pattern.partition(".")
    if dot and group != info.group and not (group == "core" and info.group == ""):
        return False
    return fnmatch.fnmatchcase(info.kind, kind)


def would_select(sel: KindSelection, info: ResourceInfo) -> bool:
    """Whether ``sel`` takes ``info`` by its group, pinned version, patterns and
    exclusions, whether the server serves it or not (a kind gone while the bridge was
    down: bridge/service/leftovers.py)."""
    if sel.group is not None and sel.group != info.group:
        return False
    if sel.version is not None and sel.version != info.version:
        return False
    if not any(fnmatch.fnmatchcase(info.kind, k) for k in sel.kinds):
        return False
    if any(_excluded(p, info) for p in sel.exclude):
        return False
    return not (sel.all_groups and (info.group, info.kind) in DEFAULT_EXCLUDED)


def _is_pattern(name: str) -> bool:
    return any(c in name for c in "*?[")


async def select_kinds(catalog: KindCatalog, sel: KindSelection) -> list[ResourceInfo]:
    """The resources ``sel`` takes today, in group then kind order.

    Raises ``UnknownKindError`` (one line naming the entry's key) for a group the
    server does not serve, a pinned version it does not serve, a kind named
    without a pattern that is not served (or cannot be listed and watched), and
    an exclusion that names no served kind.
    """
    if sel.group is not None and sel.group not in catalog.groups:
        groups = ", ".join(sorted(g or '""' for g in catalog.groups))
        raise UnknownKindError(
            f"config error: {sel.where}.group: {sel.group!r} is not served by the API server"
            f" (served groups: {groups})"
        )
    names = [sel.group] if sel.group is not None else sorted(catalog.groups)
    chosen: list[tuple[str, str]] = []
    for name in names:
        g = catalog.groups[name]
        if sel.version is not None:
            if sel.version not in g.versions:
                raise UnknownKindError(
                    f"config error: {sel.where}.apiVersion: {name or 'core'} does not serve "
                    f"{sel.version} (served: {', '.join(g.versions) or 'none'})"
                )
            chosen.append((name, sel.version))
        else:
            # Every version, preferred first: a kind is taken at the first that serves
            # it (CRDs of one group may serve different versions).
            chosen.extend((name, v) for v in g.versions)
    await catalog.preload(chosen)
    served: list[ResourceInfo] = []
    for name, version in chosen:
        served.extend(await catalog.resources(name, version))
    for pattern in sel.exclude:
        if not any(_excluded(pattern, i) for i in served):
            raise UnknownKindError(
                f"config error: {sel.where}.exclude: {pattern!r} names no kind the API server"
                f" serves in {_scope(sel)}"
            )
    for name in sel.kinds:
        if _is_pattern(name):
            continue
        match = [i for i in served if i.kind == name]
        if not match:
            kinds = ", ".join(sorted({i.kind for i in served})) or "none"
            raise UnknownKindError(
                f"config error: {sel.where}.kinds: {name!r} is not served in {_scope(sel)}"
                f" (served: {kinds})"
            )
        if not any(watchable(i) for i in match):
            raise UnknownKindError(
                f"config error: {sel.where}.kinds: {name!r} cannot be listed and watched"
                " (its verbs lack list or watch)"
            )
    out: list[ResourceInfo] = []
    seen: set[tuple[str, str]] = set()
    for info in served:
        if (info.group, info.kind) in seen:
            continue  # served at a version preferred over this one
        seen.add((info.group, info.kind))
        if not watchable(info):
            continue
        if not any(fnmatch.fnmatchcase(info.kind, k) for k in sel.kinds):
            continue
        if any(_excluded(p, info) for p in sel.exclude):
            continue
        if sel.all_groups and (info.group, info.kind) in DEFAULT_EXCLUDED:
            continue
        if sel.namespaced_only and not info.namespaced:
            continue
        out.append(info)
    out.sort(key=lambda i: (i.group, i.kind))
    return out


def stale_versions(catalog: KindCatalog, sel: KindSelection) -> list[str]:
    """``group/version`` of what ``sel`` reads that an unavailable APIService serves
    (aggregated discovery's ``Stale``, or a legacy document answering 503)."""
    names = [sel.group] if sel.group is not None else sorted(catalog.groups)
    out = []
    for name in names:
        g = catalog.groups.get(name)
        if g is None:
            continue
        for version in sorted(g.stale):
            if sel.version in (None, version):
                out.append(f"{name}/{version}" if name else version)
    return out


def _scope(sel: KindSelection) -> str:
    if sel.group is None:
        return "any group"
    where = sel.group or "the core group"
    return f"{where} {sel.version}" if sel.version else where
