"""A bus in memory for the mirror: a list of messages per partition, read from given positions."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import orjson

from bridge.mirror.sources import Message


class MemorySource:
    """``Source`` over lists: ``append`` adds a message; ``seek`` and ``fetch`` as a bus."""

    def __init__(self, identity: str = "memory:events", partitions: int = 1) -> None:
        self.identity = identity
        self.log: dict[int, list[bytes | None]] = {p: [] for p in range(partitions)}
        self._next: dict[int, int] = {p: 0 for p in range(partitions)}
        self.seeks = 0

    def append(self, value: bytes | None, partition: int = 0) -> None:
        self.log[partition].append(value)

    async def seek(self, positions: Mapping[int, int]) -> None:
        self.seeks += 1
        self._next = {p: positions.get(p, 0) for p in self.log}

    async def fetch(self, max_messages: int, wait: float) -> list[Message]:
        out: list[Message] = []
        for p, values in self.log.items():
            start = self._next[p]
            for pos in range(start, min(len(values), start + max_messages - len(out))):
                out.append(Message(p, pos, values[pos]))
                self._next[p] = pos + 1
        if not out:  # a bus waits for something to come
            await asyncio.sleep(max(wait, 0.001))
        return out

    def drained(self) -> bool:
        return all(self._next[p] >= len(v) for p, v in self.log.items())

    async def close(self) -> None:
        pass


def event(
    name: str,
    uid: str,
    rv: int,
    change: str = "modified",
    *,
    cluster: str = "c1",
    namespace: str = "ns",
    kind: str = "Pod",
    time: str = "2026-11-27T10:00:00.000000Z",
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> bytes:
    """A change event as the bridge publishes it (docs/events.md)."""
    suffix = {"deleted": "deleted", "filtered": f"filtered:{rv}"}.get(change, str(rv))
    obj = {
        "apiVersion": "apps/v1" if kind == "Deployment" else "v1",
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "resourceVersion": str(rv),
            "labels": labels if labels is not None else {"app": name},
        },
        "spec": spec or {"containers": [{"name": "c", "image": f"img:{rv}"}]},
    }
    return orjson.dumps(
        {
            "specversion": "1.0",
            "id": f"{uid}:{suffix}",
            "type": f"io.k8s.{'apps' if kind == 'Deployment' else 'core'}.v1.{kind}.{change}",
            "source": f"k8s://{cluster}/v1/pods",
            "subject": f"{namespace}/{name}",
            "time": time,
            "datacontenttype": "application/json",
            "resourceversion": str(rv),
            "initial": False,
            "data": {"object": obj},
        }
    )
