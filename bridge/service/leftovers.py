"""Checkpoints a selected kind left behind while the bridge was down.

Two ways a kind that a group or ``allKinds`` entry selects can leave its checkpoint
with no pipeline to read it (docs/configuration-kinds.md, "Kinds that come and go"):

- **its CRD was deleted.** The API server deleted its objects, but no watch saw
  it. A relist that finds nothing would publish each object's delete: so does
  ``publish_gone``, from the digests (``deleted`` with ``tombstone: true``, id
  ``{uid}:deleted``), then drops them from the checkpoint. The checkpoint itself
  (its watermark) is kept, as for a kind that goes away while the bridge runs.
- **its preferred version changed** (v1beta1 → v1). The checkpoint key names the
  version (``<group>/<version>/<plural>...``, bridge/service/wiring.py), so the
  kind finds none under its new key. ``adopt_version`` builds it from the
  newest checkpoint of another version of the same group and plural in the
  same scope and shard: nothing is published again for an unchanged object.

A checkpoint id gives group, version and plural; an event also needs the Kind.
The store keeps it: the pseudo-resource ``!kinds`` holds one row per selected
kind (key ``<group or core>/<plural>``, the Kind in the row's uid field),
written when the kind's pipeline is built.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from bridge.checkpoints.base import CheckpointStore, ListableStore, watermark_of
from bridge.delivery.changes import Change, ChangeKind, Fingerprinter, object_from_digest
from bridge.ground.digest import CERTAIN, GONE, Digest
from bridge.ground.envelope import Event
from bridge.kube.discovery import ResourceInfo
from bridge.kube.kinds import KindCatalog, would_select
from bridge.kube.objects import meta, namespace_key
from bridge.kube.protocols import ListerWatcher, ListOptions
from bridge.logging import get_logger
from bridge.service.kinds import as_entry, selection_of
from bridge.service.settings import ResourceSettings, Settings, in_shard
from bridge.service.wiring import checkpoint_id, event_builder, transactional_send
from bridge.sinks.base import Sink

log = get_logger(__name__)

# The pseudo-resource holding the Kind of each selected kind (no resource id starts
# with "!": a group is a DNS name).
KINDS_ID = "!kinds"
_ID = re.compile(r"^([^/!]+)/([^/]+)/([^@#~]+)(.*)$")


@dataclass(frozen=True, slots=True)
class StoredId:
    """A checkpoint id taken apart: ``rest`` is the scope, selectors and shard suffix."""

    group: str
    version: str
    plural: str
    rest: str

    @property
    def namespace(self) -> str | None:
        if not self.rest.startswith("@"):
            return None
        return re.split(r"[#~]", self.rest[1:], maxsplit=1)[0]


def parse_stored_id(resource_id: str) -> StoredId | None:
    m = _ID.match(resource_id)
    if m is None:
        return None
    group = "" if m.group(1) == "core" else m.group(1)
    return StoredId(group, m.group(2), m.group(3), m.group(4))


def _name_key(group: str, plural: str) -> str:
    return f"{group or 'core'}/{plural}"


async def known_kinds(store: CheckpointStore) -> dict[str, str]:
    """``<group or core>/<plural>`` → Kind, of every kind a selecting entry ever took."""
    checkpoint = await store.load(KINDS_ID)
    if checkpoint is None:
        return {}
    return {d.key: d.uid for d in checkpoint.digests.values()}


async def record_kinds(
    store: CheckpointStore, known: dict[str, str], infos: Sequence[ResourceInfo]
) -> None:
    """Remember the Kind of each of ``infos`` (one commit for those not known yet)."""
    rows = []
    for info in infos:
        key = _name_key(info.group, info.plural)
        if known.get(key) != info.kind:
            known[key] = info.kind
            rows.append(Digest(key, info.kind, "", ""))
    if rows:
        await store.commit(KINDS_ID, "", rows, [])


async def adopt_version(
    store: CheckpointStore,
    resource_id: str,
    lw: ListerWatcher,
    fingerprinter: Fingerprinter,
    info: ResourceInfo,
    *,
    label: str,
    page_size: int = 500,
) -> bool:
    """Before a selected kind's pipeline starts with no checkpoint under its key: if
    another version of the same group and plural (same scope, selectors, shard) has
    one, build this key's from the newest of them. True when it did.

    The digests' fingerprints were taken of objects naming the old apiVersion: each
    object listed now whose fingerprint under the old apiVersion equals its digest's
    is unchanged, and gets the fingerprint of its new form. The others keep their
    digest, so the pipeline's relist (the watermark is left empty, as a re-shard
    does) publishes exactly what changed meanwhile: a modification, a delete, an add.
    """
    if not isinstance(store, ListableStore) or await watermark_of(store, resource_id) is not None:
        return False
    mine = parse_stored_id(resource_id)
    if mine is None:
        return False
    best: tuple[int, str, StoredId] | None = None
    for rid in await store.resource_ids():
        other = parse_stored_id(rid)
        if (
            other is None
            or rid == resource_id
            or (other.group, other.plural, other.rest) != (mine.group, mine.plural, mine.rest)
        ):
            continue
        mark = await watermark_of(store, rid)
        try:
            rank = int(mark or "")
        except ValueError:
            rank = -1
        if best is None or rank > best[0]:
            best = (rank, rid, other)
    if best is None:
        return False
    _, source, other = best
    old = await store.load(source)
    if old is None:
        return False
    old_api_version = f"{other.group}/{other.version}" if other.group else other.version
    digests = dict(old.digests)
    kept = 0
    token: str | None = None
    while True:
        page = await lw.list(ListOptions(limit=page_size, continue_token=token))
        for obj in page.get("items") or ():
            key = namespace_key(obj)
            d = digests.get(key)
            m = meta(obj)
            if d is None or d.state != CERTAIN or d.prior or d.uid != m.get("uid"):
                continue
            as_before = dict(obj)
            as_before["apiVersion"] = old_api_version
            if fingerprinter.fingerprint(as_before) == d.fingerprint:
                fp = fingerprinter.fingerprint(obj)
                digests[key] = Digest(key, d.uid, str(m.get("resourceVersion", "")), fp)
                kept += 1
        token = (page.get("metadata") or {}).get("continue") or None
        if not token:
            break
    # An empty watermark: the pipeline relists and diffs against these digests.
    await store.commit(resource_id, "", digests.values(), [])
    log.warning(
        "kind moved to another version: checkpoint taken from the old one; relisting",
        resource=label,
        source=source,
        api_version=info.api_version,
        objects=len(digests),
        unchanged=kept,
    )
    return True


@dataclass(frozen=True, slots=True)
class GoneKind:
    """A checkpoint of a kind that an entry selects and the server no longer serves."""

    resource_id: str
    settings: ResourceSettings
    info: ResourceInfo


async def gone_kinds(
    settings: Settings,
    store: CheckpointStore,
    catalog: KindCatalog,
    entries: Sequence[tuple[int, ResourceSettings]],
    known: dict[str, str],
    running: set[str],
    unnamed: list[str] | None = None,
) -> list[GoneKind]:
    """The checkpoints (not in ``running``) of kinds the selecting ``entries`` of this
    replica take but the server serves at no version. The ids of such checkpoints in
    a selected group whose Kind was never recorded (written before the bridge
    recorded Kinds) go to ``unnamed``: their deletes cannot be published."""
    if not isinstance(store, ListableStore):
        return []
    selecting = [(i, r) for i, r in entries if r.selects_kinds]
    if not selecting:
        return []
    plurals: dict[str, set[str]] = {}  # per group asked about: every plural it serves

    async def served(group: str, plural: str) -> bool:
        if group not in plurals:
            plurals[group] = set()
            g = catalog.groups.get(group)
            for version in g.versions if g is not None else ():
                plurals[group].update(i.plural for i in await catalog.resources(group, version))
        return plural in plurals[group]

    out: list[GoneKind] = []
    for rid in await store.resource_ids():
        sid = parse_stored_id(rid)
        if sid is None or rid in running:
            continue
        kind = known.get(_name_key(sid.group, sid.plural))
        if kind is None:
            if unnamed is not None and not await served(sid.group, sid.plural):
                if any(selection_of(r, i).group in (None, sid.group) for i, r in selecting):
                    unnamed.append(rid)
            continue
        if await served(sid.group, sid.plural):
            continue
        info = ResourceInfo(sid.group, sid.version, kind, sid.plural, namespaced=True)
        for index, res in selecting:
            if not would_select(selection_of(res, index), info):
                continue
            entry = as_entry(res, info)
            if not in_shard(settings, entry.gvk):
                continue
            scopes: list[str | None] = list(res.namespaces) if res.namespaces else [None]
            if any(checkpoint_id(settings, info, ns, entry) == rid for ns in scopes):
                out.append(GoneKind(rid, entry, info))
                break
    return out


async def publish_gone(
    settings: Settings, store: CheckpointStore, sink: Sink, gone: GoneKind
) -> int:
    """Publish the delete of every object ``gone``'s digests hold, as a relist that
    found nothing would, then drop those digests (the watermark stays). How many."""
    checkpoint = await store.load(gone.resource_id)
    if checkpoint is None or not checkpoint.digests:
        return 0
    builder = event_builder(settings, gone.settings, gone.info)
    send = transactional_send(sink, gone.resource_id)
    if send is not None:
        await sink.transactions.start([gone.resource_id])  # type: ignore[attr-defined]
    everything = list(checkpoint.digests.values())
    batch = max(1, settings.sink.max_batch)
    published = refused_count = 0
    for start in range(0, len(everything), batch):
        digests = everything[start : start + batch]
        events: list[Event] = []
        owner: list[str] = []  # the key of each event
        for d in digests:
            if d.state == GONE:
                continue  # its delete is on the bus already
            # Earlier incarnations whose deletes were in flight, then the object itself.
            uids = [*filter(None, d.prior.split(",")), d.uid]
            for uid in uids:
                rv = d.resource_version if uid == d.uid else ""
                obj = object_from_digest(
                    Digest(d.key, uid, rv, ""),
                    api_version=gone.info.api_version,
                    kind=gone.info.kind,
                )
                change = Change(ChangeKind.DELETED, obj, d.key, tombstone=True)
                events.append(builder.build(change))
                owner.append(d.key)

        def rows(
            refused: Collection[int], digests: list[Digest] = digests, owner: list[str] = owner
        ) -> tuple[list[Digest], list[str]]:
            kept = {owner[i] for i in refused if i < len(owner)}
            return [], [d.key for d in digests if d.key not in kept]

        if not events:
            await store.commit(gone.resource_id, None, *rows(()))
            continue
        if send is not None:
            # Published with the digests' removal, in one transaction.
            refused = await send(events, rows)
        else:
            refused = await sink.publish(events)
            await store.commit(gone.resource_id, None, *rows(refused.keys()))
        published += len(events) - len(refused)
        refused_count += len(refused)
    log.warning(
        "kind no longer served: the deletes of its objects published from the checkpoint",
        resource=gone.resource_id,
        api_version=gone.info.api_version,
        kind=gone.info.kind,
        published=published,
        refused=refused_count,
    )
    return published
