"""The ``CheckpointStore`` seam."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from bridge.changes import Digest


@dataclass
class Checkpoint:
    """Where a resource stopped: the last published resourceVersion and the digests
    (key → uid, resourceVersion, fingerprint) of the objects as published."""

    resource_version: str
    digests: dict[str, Digest] = field(default_factory=dict)


@runtime_checkable
class CheckpointStore(Protocol):
    """Stores checkpoints per resource id (e.g. ``apps/v1/deployments``).

    ``commit`` writes the watermark and the digest changes of one flush
    together: after a crash the store holds either the flush or none of it (or,
    where the backend cannot do that, never a watermark ahead of its digests).
    Deletes apply before upserts, so a key in both ends with its upserted digest.
    """

    async def open(self) -> None: ...

    async def load(self, resource_id: str) -> Checkpoint | None: ...

    async def commit(
        self,
        resource_id: str,
        resource_version: str,
        upserts: Iterable[Digest],
        deletes: Iterable[str],
    ) -> None: ...

    async def close(self) -> None: ...
