"""The ``CheckpointStore`` seam."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from bridge.ground.digest import CERTAIN, Digest
from bridge.ground.records import LooseRecord, PackedColumns, pack_state


@dataclass
class Checkpoint:
    """Where a resource stopped: the last published resourceVersion and the digests
    (key → uid, resourceVersion, fingerprint) of the objects as published."""

    resource_version: str
    digests: dict[str, Digest] = field(default_factory=dict)


@runtime_checkable
class CheckpointStore(Protocol):
    """Stores checkpoints per resource id (e.g. ``apps/v1/deployments``).

    ``commit`` writes the watermark and the digest changes of one step
    together: after a crash the store holds either the step or none of it (or,
    where the backend cannot do that, never a watermark ahead of its digests).
    Deletes apply before upserts, so a key in both ends with its upserted digest.
    A ``resource_version`` of None leaves the watermark as it is: that is how
    the outbox writes ahead the digests of events it is about to publish.

    ``load`` returns None only for a resource never committed at all; a
    checkpoint with an empty watermark (the first list never completed) still
    returns its digests.
    """

    async def open(self) -> None: ...

    async def load(self, resource_id: str) -> Checkpoint | None: ...

    async def commit(
        self,
        resource_id: str,
        resource_version: str | None,
        upserts: Iterable[Digest],
        deletes: Iterable[str],
    ) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class ProbedStore(Protocol):
    """A store whose ``open`` has effects a diagnostic must not have: it creates what
    is missing (a topic, a bucket) or reads the whole checkpoint. ``k8s-bridge
    check`` asks ``probe`` instead: one line on what ``open`` would find, or the
    ``BridgeError`` it would raise, with nothing created or read."""

    async def probe(self) -> str: ...


@dataclass
class BulkCheckpoint:
    """A checkpoint as a restart reads it. Nearly every row is certain and has no
    earlier incarnation: those come in the cache's own layout (``packed``: keys and
    packed states, bridge/ground/records.py), so the store's bytes become the cache
    without a record object per row; the few of them whose values do not pack are
    ``loose`` records; the others (uncertain, deleting, with earlier incarnations)
    come as digests.

    A million ``Digest`` objects cost seconds to build and ~200 MB while they live.
    """

    resource_version: str
    packed: PackedColumns = field(default_factory=PackedColumns)
    loose: list[LooseRecord] = field(default_factory=list)
    others: list[Digest] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.packed) + len(self.loose) + len(self.others)

    def add_plain(self, key: str, uid: str, resource_version: str, fingerprint: str) -> None:
        """One certain row with no earlier incarnation, packed if it can be."""
        state = pack_state(uid, resource_version, fingerprint)
        if state is None:
            self.loose.append(LooseRecord(key, uid, resource_version, fingerprint, False))
        else:
            self.packed.keys.append(key)
            self.packed.packed.append(state)

    @classmethod
    def of(cls, checkpoint: Checkpoint) -> BulkCheckpoint:
        bulk = cls(checkpoint.resource_version)
        for d in checkpoint.digests.values():
            if d.state == CERTAIN and not d.prior:
                bulk.add_plain(d.key, d.uid, d.resource_version, d.fingerprint)
            else:
                bulk.others.append(d)
        return bulk


@runtime_checkable
class ListableStore(Protocol):
    """A store that names the resource ids it holds a checkpoint for.

    Re-sharding needs it (bridge/delivery/reshard.py): a shard starting under a new
    layout finds the checkpoints the old layout's shards left of the same resource.
    A store is *shared* (every replica reads the same ids) unless it says
    ``per_replica = True`` (a SQLite file on one replica's disk).
    """

    async def resource_ids(self) -> list[str]: ...


@runtime_checkable
class WatermarkReader(Protocol):
    """A store that reads a resource's watermark without its digests (None: no
    watermark stored). Re-sharding compares the watermarks of every layout's
    checkpoints at each start; without it, each is a whole ``load``."""

    async def watermark(self, resource_id: str) -> str | None: ...


async def watermark_of(store: CheckpointStore, resource_id: str) -> str | None:
    """The stored watermark of ``resource_id`` (None: never committed), from any store."""
    if isinstance(store, WatermarkReader):
        return await store.watermark(resource_id)
    checkpoint = await store.load(resource_id)
    return None if checkpoint is None else checkpoint.resource_version


def is_per_replica(store: CheckpointStore) -> bool:
    """The store lives with one replica (its checkpoints are invisible to the others)."""
    return bool(getattr(store, "per_replica", False))


@runtime_checkable
class BulkLoader(Protocol):
    """A store that reads a restart's checkpoint without a ``Digest`` per row."""

    async def load_bulk(self, resource_id: str) -> BulkCheckpoint | None: ...


async def load_bulk(store: CheckpointStore, resource_id: str) -> BulkCheckpoint | None:
    """The checkpoint of ``resource_id`` in bulk form, from any store."""
    if isinstance(store, BulkLoader):
        return await store.load_bulk(resource_id)
    checkpoint = await store.load(resource_id)
    return None if checkpoint is None else BulkCheckpoint.of(checkpoint)
