"""Checkpoints across sharding layouts: a shard's id, and its start under a new layout.

With ``sharding.by: uid`` or ``namespace`` each shard keeps its own checkpoint
under the resource's id plus ``~<field>-<index>of<shards>``; the unsharded id
(no suffix) covers the whole hash space, so checkpoints written before sharding
keep working and take part in a change like any other layout.

A shard starting under a layout that differs from the one the store last saw
(``shards`` changed, ``by`` changed, back to an earlier layout, sharding turned
on or off) builds its checkpoint from every checkpoint of the same resource:

- **newest wins, per object.** For each object in its slice, the digest comes
  from the checkpoint with the highest watermark whose slice holds the object,
  whether it holds the digest or not: absent there means deleted by then, even
  if an older layout still has it. Watermarks are resourceVersions of the one
  etcd, so the highest is the latest knowledge; a stale layout (left behind by
  an earlier change, or the one being returned to) always loses to a newer one.
- **relist, never resume.** The merged digests are written under the shard's
  own id with an empty watermark: the old watermarks belong to other slices, so
  the shard lists its slice (a consistent read) and publishes only what differs
  from the digests: changes and deletes made meanwhile, nothing unchanged.

A shard whose own checkpoint is at least as new as every other layout's that
overlaps it resumes as always (a plain restart costs one listing of the ids).
A store that lives with one replica (SQLite) cannot see the other shards'
checkpoints, so a start that would need them is refused with one line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bridge.checkpoints.base import (
    CheckpointStore,
    ListableStore,
    is_per_replica,
    watermark_of,
)
from bridge.errors import ConfigError
from bridge.ground.digest import Digest
from bridge.kube.sharding import ShardField, ShardRange, shard_range
from bridge.logging import get_logger

log = get_logger(__name__)

_SUFFIX = re.compile(r"~(uid|namespace)-(\d+)of(\d+)$")


def shard_suffix(field: ShardField, index: int, shards: int) -> str:
    return f"~{field}-{index}of{shards}"


def sharded_id(base: str, field: ShardField, index: int, shards: int) -> str:
    """The checkpoint id of shard ``index`` of ``shards`` of the resource ``base``."""
    return base + shard_suffix(field, index, shards)


def parse_id(resource_id: str) -> tuple[str, ShardRange | None]:
    """(the unsharded id, the slice) of a checkpoint id; None: the whole hash space."""
    m = _SUFFIX.search(resource_id)
    if m is None:
        return resource_id, None
    field, index, shards = m.group(1), int(m.group(2)), int(m.group(3))
    try:
        rng = shard_range(shards, index, field)  # type: ignore[arg-type]
    except ValueError:
        return resource_id, None  # not one of ours: an id that merely looks like it
    return resource_id[: m.start()], rng


def holds(rng: ShardRange | None, digest: Digest) -> bool:
    """The slice ``rng`` holds the object of ``digest`` (the field never changes for an
    object: a uid is fixed, a namespace is part of the key)."""
    if rng is None:
        return True
    if rng.field == "uid":
        return rng.contains(digest.uid)
    namespace, sep, _ = digest.key.partition("/")
    return rng.contains(namespace if sep else "")


def may_overlap(a: ShardRange | None, b: ShardRange | None) -> bool:
    """Some object may be in both slices (slices of different fields may always share one)."""
    if a is None or b is None or a.field != b.field:
        return True
    return a.overlaps(b)


@dataclass(frozen=True, slots=True)
class _Source:
    resource_id: str
    range: ShardRange | None
    watermark: int  # -1: empty or not numeric (no knowledge to rank by)


def _rank(watermark: str) -> int:
    try:
        return int(watermark)
    except ValueError:
        return -1


async def _watermark(store: CheckpointStore, resource_id: str) -> int | None:
    mark = await watermark_of(store, resource_id)
    return None if mark is None else _rank(mark)


async def adopt_layout(store: CheckpointStore, resource_id: str, *, label: str) -> bool:
    """Before resuming ``resource_id``: if a checkpoint of another layout of the same
    resource knows more of its slice than its own, rebuild its own from the newest
    (see the module docstring). True when it did (the resume then relists)."""
    if not isinstance(store, ListableStore):
        return False
    base, mine = parse_id(resource_id)
    ids = await store.resource_ids()
    others = [
        rid
        for rid in ids
        if rid != resource_id and parse_id(rid)[0] == base and may_overlap(mine, parse_id(rid)[1])
    ]
    if not others:
        return False
    own_mark = await _watermark(store, resource_id)
    sources: list[_Source] = []
    for rid in others:
        mark = await _watermark(store, rid)
        if mark is not None:
            sources.append(_Source(rid, parse_id(rid)[1], mark))
    newer = [s for s in sources if own_mark is None or s.watermark > own_mark]
    if not newer:
        return False
    if is_per_replica(store):
        where = getattr(store, "path", "the checkpoint store")
        raise ConfigError(
            f"config error: resource {label}: {where} holds checkpoints of another sharding"
            f" layout ({', '.join(s.resource_id for s in newer)}) and, on one replica's disk,"
            " not the other shards': a layout change needs a shared store (checkpoint.kind:"
            " nats-kv or kafka); or go back to the earlier layout, or delete the file to"
            " start over (every object is published again as added)"
        )
    own = await store.load(resource_id)
    if own is not None:
        sources.append(_Source(resource_id, mine, own_mark if own_mark is not None else -1))
    # Newest first; on a tie the shard's own checkpoint wins (it is this slice's own).
    sources.sort(key=lambda s: (s.watermark, s.resource_id == resource_id), reverse=True)
    merged: dict[str, Digest] = {}
    for source in sources:
        checkpoint = (
            own if source.resource_id == resource_id else await store.load(source.resource_id)
        )
        if checkpoint is None:
            continue
        for d in checkpoint.digests.values():
            if not holds(mine, d):
                continue
            # The newest checkpoint whose slice holds the object decides it.
            if next(s for s in sources if holds(s.range, d)) is not source:
                continue
            kept = merged.get(d.key)
            # Two incarnations of one name in one slice (uid sharding): the later one.
            if kept is None or _rank(d.resource_version) > _rank(kept.resource_version):
                merged[d.key] = d
    stale = [k for k in (own.digests if own is not None else {}) if k not in merged]
    # An empty watermark: the digests are this slice's, the resume point is nobody's.
    await store.commit(resource_id, "", merged.values(), stale)
    log.warning(
        "sharding layout changed: checkpoint rebuilt from the newest of every layout;"
        " relisting the slice",
        resource=label,
        sources=[s.resource_id for s in sources],
        objects=len(merged),
    )
    return True
