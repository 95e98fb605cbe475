"""From bus messages to rows: what one event says about one object, and a batch's winners.

An event is ours when it is a CloudEvent of the bridge: type
``io.k8s.{group}.{version}.{Kind}.{change}``, source ``k8s://{cluster}/...``,
an integer ``resourceversion`` and ``data.object.metadata.uid``. Heartbeats
are ours but no change (``None``); anything else raises ``NotOurs`` and is
counted and skipped by the caller, never fatal.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from bridge.ground.envelope import HEARTBEAT_TYPE, ReceivedEvent

UPSERTS = frozenset({"added", "modified", "snapshot"})
# ``filtered``: the object left its resource's view (docs/events.md): it leaves the
# mirror as a delete does, but may come back with a newer resourceVersion.
REMOVALS = frozenset({"deleted", "filtered"})


class NotOurs(ValueError):
    """A message that is not a change event of the bridge."""


@dataclass(slots=True)
class Change:
    cluster: str
    uid: str
    api_version: str
    kind: str
    namespace: str  # '' for a cluster-scoped object
    name: str
    resource_version: int
    change: str  # added | modified | snapshot | deleted | filtered
    labels: str  # JSON text
    object: str  # JSON text
    event_id: str
    observed_at: datetime
    partition: int
    position: int
    winner: bool = False

    @property
    def removes(self) -> bool:
        return self.change in REMOVALS

    def record(self, source: str) -> tuple[Any, ...]:
        """The row of the staging table (``schema.STAGED_COLUMNS`` order)."""
        return (
            self.cluster, self.uid, self.api_version, self.kind, self.namespace, self.name,
            self.resource_version, self.change, self.labels, self.object, self.event_id,
            self.observed_at, source, self.partition, self.position, self.winner,
        )  # fmt: skip


def decode(raw: bytes | None, partition: int, position: int) -> Change | None:
    """The change ``raw`` carries; ``None`` for a heartbeat; ``NotOurs`` for anything else."""
    if raw is None:
        raise NotOurs("an empty message (a tombstone record?)")
    try:
        event = ReceivedEvent.parse(raw)
    except ValueError as e:
        raise NotOurs(str(e)) from None
    if event.type == HEARTBEAT_TYPE:
        return None
    parts = event.type.split(".")
    if len(parts) < 5 or parts[0] != "io" or parts[1] != "k8s":
        raise NotOurs(f"type {event.type!r} is not io.k8s.<group>.<version>.<Kind>.<change>")
    change = parts[-1]
    if change not in UPSERTS and change not in REMOVALS:
        raise NotOurs(f"type {event.type!r}: unknown change {change!r}")
    if not event.source.startswith("k8s://"):
        raise NotOurs(f"source {event.source!r} is not k8s://<cluster>/...")
    cluster = event.source[len("k8s://") :].split("/", 1)[0]
    obj = event.object
    md = obj.get("metadata")
    if not isinstance(md, dict) or not md.get("uid") or not md.get("name"):
        raise NotOurs(f"event {event.id}: data.object.metadata has no uid or name")
    try:
        rv = int(event.resource_version or md.get("resourceVersion") or "")
    except ValueError:
        raise NotOurs(f"event {event.id}: resourceversion is not an integer") from None
    group, version = ".".join(parts[2:-3]), parts[-3]
    api_version = str(
        obj.get("apiVersion") or (version if group == "core" else f"{group}/{version}")
    )
    labels = md.get("labels")
    return Change(
        cluster=cluster,
        uid=str(md["uid"]),
        api_version=api_version,
        kind=str(obj.get("kind") or parts[-2]),
        namespace=str(md.get("namespace") or ""),
        name=str(md["name"]),
        resource_version=rv,
        change=change,
        labels=orjson.dumps(labels if isinstance(labels, dict) else {}).decode(),
        object=orjson.dumps(obj).decode(),
        event_id=event.id,
        observed_at=_time(event.time),
        partition=partition,
        position=position,
    )


def _time(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return datetime.now(UTC)
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def mark_winners(changes: list[Change]) -> None:
    """Mark the one change per object the batch leaves standing.

    Per (cluster, uid): the highest resourceVersion, a removal winning a tie (a
    delete seen through a relist carries the last known resourceVersion). Then
    per name: of two live objects claiming one (cluster, apiVersion, kind,
    namespace, name), only the newer can exist; the older was deleted before
    the newer was created. The database applies the same rules against what
    it holds (schema.py), so batch boundaries do not change the outcome.
    """
    best: dict[tuple[str, str], Change] = {}
    for c in changes:
        c.winner = False
        key = (c.cluster, c.uid)
        held = best.get(key)
        if held is None or (c.resource_version, c.removes) > (held.resource_version, held.removes):
            best[key] = c
    by_name: dict[tuple[str, str, str, str, str], Change] = {}
    for c in best.values():
        if c.removes:
            c.winner = True
            continue
        name = (c.cluster, c.api_version, c.kind, c.namespace, c.name)
        held = by_name.get(name)
        if held is None or c.resource_version > held.resource_version:
            by_name[name] = c
    for c in by_name.values():
        c.winner = True
