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
