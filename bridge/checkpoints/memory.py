"""An in-memory checkpoint store: for tests and for running without state."""

from __future__ import annotations

from collections.abc import Iterable

from bridge.checkpoints.base import Checkpoint
from bridge.errors import CheckpointError
from bridge.ground.digest import Digest


class MemoryCheckpointStore:
    def __init__(self) -> None:
        self._data: dict[str, Checkpoint] = {}
        self.commits = 0
        self.fail_next = 0

    async def open(self) -> None:
        return None

    async def load(self, resource_id: str) -> Checkpoint | None:
        cp = self._data.get(resource_id)
        # A copy, so the caller cannot change what is stored behind the store's back.
        return None if cp is None else Checkpoint(cp.resource_version, dict(cp.digests))

    async def watermark(self, resource_id: str) -> str | None:
        cp = self._data.get(resource_id)
        return None if cp is None else cp.resource_version

    async def resource_ids(self) -> list[str]:
        return sorted(self._data)

    async def commit(
        self,
        resource_id: str,
        resource_version: str | None,
        upserts: Iterable[Digest],
        deletes: Iterable[str],
    ) -> None:
        if self.fail_next > 0:
            self.fail_next -= 1
            raise CheckpointError("memory checkpoint store told to fail")
        current = self._data.get(resource_id)
        digests = dict(current.digests) if current else {}
        # Deletes first: a key deleted and re-created within one flush keeps its new digest.
        for key in deletes:
            digests.pop(key, None)
        for d in upserts:
            digests[d.key] = d
        if resource_version is None:
            resource_version = current.resource_version if current else ""
        self._data[resource_id] = Checkpoint(resource_version, digests)
        self.commits += 1

    async def close(self) -> None:
        return None
