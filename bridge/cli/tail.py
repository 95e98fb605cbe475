"""``k8s-bridge tail``: prints the events of the configured bus, redeliveries dropped."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TextIO

from bridge.aiotasks import cancel_and_wait
from bridge.consumer import LAST, ReceivedEvent, consume
from bridge.consuming.positions import SqlitePositions
from bridge.errors import ConfigError
from bridge.service.configured import find_resource
from bridge.service.settings import Settings


def summary_line(event: ReceivedEvent) -> str:
    tomb = " (tombstone)" if event.data.get("tombstone") else ""
    initial = " initial" if event.initial else ""
    return f"{event.change.upper():9} {event.kind:12} {event.subject}  rv={event.resource_version}{initial}{tomb}"


async def tail(
    settings: Settings,
    *,
    resource: str | None,
    count: int,
    from_start: bool,
    idle_timeout: float | None,
    stop: asyncio.Event,
    out: TextIO,
    as_json: bool = True,
    group: str | None = None,
    positions: str | None = None,
) -> int:
    """Print events (JSON lines, or summaries) until ``count``, ``idle_timeout`` or ``stop``.

    ``resource`` must be a configured one: anything else would wait forever
    for events that the bridge never publishes. With ``group``, printing is
    handling: a tail of the same group resumes after the last event printed
    (``positions``: a SQLite file for the group's positions instead of its
    store on the bus).
    """
    if positions and not group:
        raise ConfigError("--positions: only with --group (the positions are the group's)")
    if resource:
        find_resource(settings, resource)
    seen = 0
    store = SqlitePositions(positions, group=group or "") if positions else None
    events = consume(
        settings, resource=resource, from_start=from_start, group=group, positions=store
    )
    stopper = asyncio.create_task(stop.wait())
    try:
        while not stop.is_set():
            nxt = asyncio.ensure_future(anext(events))
            done, _ = await asyncio.wait(
                {nxt, stopper}, timeout=idle_timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if nxt not in done:
                await cancel_and_wait([nxt])
                break
            event = nxt.result()
            out.write((event.raw.decode() if as_json else summary_line(event)) + "\n")
            out.flush()
            seen += 1
            if count and seen >= count:
                if group:
                    # Printed is handled: record it before the generator ends.
                    with contextlib.suppress(StopAsyncIteration):
                        await events.asend(LAST)
                break
    except StopAsyncIteration:
        pass
    finally:
        stopper.cancel()
        await events.aclose()
    return 0
