"""Small HTTP helpers for talking to the emulator the way a client would."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson


def cm(name: str, namespace: str = "default", **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": name}}


async def next_event(resp: aiohttp.ClientResponse, timeout: float = 5.0) -> dict[str, Any]:
    line = await asyncio.wait_for(resp.content.readline(), timeout)
    assert line, "watch stream ended"
    event: dict[str, Any] = orjson.loads(line)
    return event


async def events_until_close(
    resp: aiohttp.ClientResponse, timeout: float = 5.0
) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        out = []
        async for line in resp.content:
            out.append(orjson.loads(line))
        return out

    return await asyncio.wait_for(collect(), timeout)


def names(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"].get("name", "")) for e in events]
