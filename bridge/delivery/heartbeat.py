"""Heartbeats: one ``io.k8s.bridge.heartbeat`` event per resource every ``heartbeatInterval``.

A consumer that sees no change of a resource for an hour cannot tell from the
changes alone whether nothing changed (quiet) or the bridge stopped seeing
changes (stuck). A heartbeat says which: the committed watermark (the
resourceVersion up to which every event is acknowledged and checkpointed), the
number of cached objects, the seconds since the last published change, and
whether the informer has synced and its watch is up (``k8s_bridge_watch_up``).
Quiet is ``synced and watchUp`` with a watermark that keeps pace; stuck is a
watch down, an informer not synced, a growing ``unacknowledged`` count, or
heartbeats that stop arriving.

Heartbeats are not changes: they skip the outbox (no write-ahead, no
checkpoint, no sequence number), so they can neither delay nor reorder change
events, and a restart never republishes one. Each carries an id of its own
(``hb:{run}:{n}``) so the bus never drops one as a redelivery. When the bus
does not take one (unreachable, refused), it is skipped: the next one carries
the current figures anyway, and ``/readyz`` already reports the bus.

Where they go: NATS subject
``k8s.{cluster}.heartbeat.{group|core}.{version}.{resource}.{namespace|_}``
(inside the stream's ``k8s.>``; the third token ``heartbeat`` is never an API
group, which always holds a dot or is a built-in name, so no object's subject
looks like it); Kafka: ``sink.kafka.heartbeatTopic`` (bridge/sinks/kafka.py),
away from the change events, so a compacted state topic and consumers of
changes see none.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from bridge.errors import SinkError
from bridge.ground.envelope import HEARTBEAT_TYPE, Event, nats_token, rfc3339
from bridge.logging import get_logger
from bridge.sinks.base import Sink

log = get_logger(__name__)


class HeartbeatSource(Protocol):
    """What a heartbeat reports about one resource (``ResourcePipeline`` is one)."""

    @property
    def label(self) -> str: ...

    @property
    def resource_id(self) -> str: ...

    @property
    def committed_resource_version(self) -> str: ...

    @property
    def sink_healthy(self) -> bool: ...

    def has_synced(self) -> bool: ...

    def watch_up(self) -> bool: ...

    def object_count(self) -> int: ...

    def unacknowledged(self) -> int: ...

    def seconds_since_last_change(self) -> float | None: ...

    def checkpoint_lag(self) -> float: ...


@dataclass(frozen=True, slots=True)
class HeartbeatTarget:
    """Who the heartbeats of one resource scope speak for; fixed at configuration time."""

    cluster: str
    group: str
    version: str
    kind: str
    plural: str
    namespace: str | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def source(self) -> str:
        return f"k8s://{self.cluster}/{self.api_version}/{self.plural}"

    @property
    def nats_subject(self) -> str:
        tokens = (
            self.cluster,
            "heartbeat",
            self.group or "core",
            self.version,
            self.plural,
            self.namespace or "",
        )
        return "k8s." + ".".join(nats_token(t) for t in tokens)


class HeartbeatBuilder:
    """Builds the heartbeat events of one resource scope."""

    def __init__(
        self,
        target: HeartbeatTarget,
        interval: float,
        *,
        run_id: str | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.target = target
        self.interval = interval
        # Unique per process start: ids never repeat, so the bus never drops one.
        self._run = run_id or secrets.token_hex(6)
        self._clock = clock
        self.sequence = 0
        self._subject = target.nats_subject

    def build(self, source: HeartbeatSource) -> Event:
        self.sequence += 1
        t = self.target
        since = source.seconds_since_last_change()
        watermark = source.committed_resource_version
        data: dict[str, Any] = {
            "cluster": t.cluster,
            "apiVersion": t.api_version,
            "kind": t.kind,
            "resource": t.plural,
            "namespace": t.namespace,
            "checkpointId": source.resource_id,
            "watermark": watermark,
            "objects": source.object_count(),
            "secondsSinceLastChange": None if since is None else round(since, 3),
            "synced": source.has_synced(),
            "watchUp": source.watch_up(),
            "unacknowledged": source.unacknowledged(),
            "checkpointLagSeconds": round(source.checkpoint_lag(), 3),
            "intervalSeconds": self.interval,
            "sequence": self.sequence,
        }
        return Event(
            id=f"hb:{self._run}:{self.sequence}",
            type=HEARTBEAT_TYPE,
            source=t.source,
            subject=source.label,
            time=rfc3339(self._clock()),
            resource_version=watermark,
            initial=False,
            data=data,
            nats_subject=self._subject,
        )


class Heartbeat:
    """Sends one resource's heartbeats until cancelled; a heartbeat the bus does not take
    is skipped, never retried (the next one says the same, newer)."""

    def __init__(
        self,
        source: HeartbeatSource,
        builder: HeartbeatBuilder,
        sink: Sink,
        *,
        timeout: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.builder = builder
        self.sink = sink
        # A heartbeat later than its interval says nothing the next one will not.
        self.timeout = timeout if timeout is not None else min(builder.interval, 10.0)
        self._monotonic = monotonic
        self.sent = 0
        self.skipped = 0

    async def beat(self) -> bool:
        """Publish one heartbeat now; True when the bus took it."""
        if not self.source.sink_healthy:
            # The pipeline is already retrying the bus: a heartbeat would only queue behind it.
            self.skipped += 1
            return False
        event = self.builder.build(self.source)
        try:
            async with asyncio.timeout(self.timeout):
                refused = await self.sink.publish([event])
        except (SinkError, TimeoutError) as e:
            self.skipped += 1
            log.debug("heartbeat skipped", resource=self.source.label, error=str(e))
            return False
        if refused:
            self.skipped += 1
            log.warning(
                "the bus refused a heartbeat", resource=self.source.label, reason=refused.get(0)
            )
            return False
        self.sent += 1
        return True

    async def run(self) -> None:
        interval = self.builder.interval
        # Ticks keep their cadence: a slow publish does not push the next one later.
        next_at = self._monotonic() + interval
        while True:
            await asyncio.sleep(max(0.0, next_at - self._monotonic()))
            next_at += interval
            now = self._monotonic()
            if next_at <= now:  # fell behind (a stopped clock, a long publish): skip ticks
                next_at = now + interval
            await self.beat()
