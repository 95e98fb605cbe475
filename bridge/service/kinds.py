"""Configured entries to resources: an entry naming one kind resolves to it; a group,
``kinds`` or ``allKinds`` entry becomes one resource per kind it selects.

A selected kind becomes the entry with ``apiVersion`` and ``kind`` filled in, every
other setting unchanged, so the pipeline, its checkpoint key, its events and its
filters are exactly those a hand-written entry of that kind would get: switching
between a group entry and explicit entries keeps the checkpoints.

The more specific entry takes a kind: one named by an explicit entry is left out of
every selecting entry, one selected by a group entry is left out of ``allKinds``
entries. Two entries of the same rank that take the same kind with overlapping
namespaces and the same selectors would publish each change twice: that is one
config error naming both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bridge.errors import ConfigError
from bridge.ground.sections import replace
from bridge.kube.discovery import Discovery, ResourceInfo
from bridge.kube.kinds import (
    JsonClient,
    KindCatalog,
    KindSelection,
    read_catalog,
    select_kinds,
    stale_versions,
)
from bridge.service.settings import ResourceSettings, Settings, in_shard


@dataclass(frozen=True, slots=True)
class ResolvedResource:
    settings: ResourceSettings  # apiVersion and kind always filled in
    info: ResourceInfo
    entry: int = 0  # index in ``resources`` of the entry it came from


def selection_of(res: ResourceSettings, index: int) -> KindSelection:
    group = res.api_group
    version = None
    if res.api_version:
        group, _, version = res.api_version.rpartition("/")
    return KindSelection(
        where=f"resources[{index}]",
        group=None if res.all_kinds else group,
        version=version,
        kinds=tuple(res.kinds) or ("*",),
        exclude=tuple(res.exclude),
        namespaced_only=bool(res.namespaces),
    )


def as_entry(res: ResourceSettings, info: ResourceInfo) -> ResourceSettings:
    """``res`` as a hand-written entry of the selected kind ``info``."""
    return replace(
        res,
        api_version=info.api_version,
        kind=info.kind,
        api_group=None,
        kinds=[],
        all_kinds=False,
        exclude=[],
    )


async def resolve_entries(
    settings: Settings,
    client: JsonClient,
    entries: Sequence[tuple[int, ResourceSettings]],
    *,
    catalog: KindCatalog | None = None,
    stale: set[str] | None = None,
) -> list[ResolvedResource]:
    """Every resource of ``entries`` (index, entry) this replica serves, today.

    An unknown kind, group or exclusion fails in one line naming the entry."""
    discovery = Discovery(client)
    resolved: list[ResolvedResource] = []
    explicit: set[str] = set()
    for index, res in entries:
        if res.selects_kinds:
            continue
        info = await discovery.resolve(res.api_version, res.kind)
        if res.namespaces and not info.namespaced:
            raise ConfigError(
                f"config error: resources[{res.api_version}/{res.kind}].namespaces: "
                f"{res.kind} is cluster-scoped; remove namespaces"
            )
        explicit.add(_group_kind(info))
        resolved.append(ResolvedResource(res, info, index))
    taken: dict[tuple[str, str, str], list[ResolvedResource]] = {}
    by_group: set[str] = set()
    # Group entries before allKinds ones: the more specific entry takes the kind.
    selecting = [(i, r) for i, r in entries if r.selects_kinds]
    selecting.sort(key=lambda e: e[1].all_kinds)
    for index, res in selecting:
        if catalog is None:
            catalog = await read_catalog(client)
        selection = selection_of(res, index)
        picked = await select_kinds(catalog, selection)
        if stale is not None:
            # What an unavailable APIService serves: known again once it answers.
            stale.update(stale_versions(catalog, selection))
        for info in picked:
            if _group_kind(info) in explicit:
                continue
            if res.all_kinds and _group_kind(info) in by_group:
                continue
            if not res.all_kinds:
                by_group.add(_group_kind(info))
            entry = as_entry(res, info)
            if not in_shard(settings, entry.gvk):
                continue
            r = ResolvedResource(entry, info, index)
            _no_twice(taken.setdefault(entry.selects(), []), r)
            resolved.append(r)
    return resolved


def _group_kind(info: ResourceInfo) -> str:
    return f"{info.kind}.{info.group}" if info.group else info.kind


def _no_twice(earlier: list[ResolvedResource], r: ResolvedResource) -> None:
    from bridge.service.settings import _namespace_overlap

    for e in earlier:
        overlap = _namespace_overlap(e.settings.namespaces, r.settings.namespaces)
        if overlap is not None:
            raise ConfigError(
                f"config error: resources[{e.entry}] and resources[{r.entry}] both select "
                f"{r.settings.gvk} with the same selectors {overlap}: each change would be "
                "published twice; exclude it from one of them"
            )
    earlier.append(r)
