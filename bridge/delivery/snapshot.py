"""Snapshot signals: the running bridge re-announces every current object of a resource.

A new consumer that needs the whole state, or one that lost its own, asks for
it (``k8s-bridge snapshot``, which calls ``POST /snapshot`` on the bridge's
server) instead of restarting the bridge or replaying history.

What makes a snapshot safe to interleave with live changes:

- **Order.** Each announcement goes through the resource's outbox
  (``Outbox.announce``) behind every event decided before it, and every event
  decided after it leaves after it; so per object the bus sees events in
  resourceVersion order, announcements included.
- **What it announces is what was published.** In slim mode the cache holds
  only identity, resourceVersion and fingerprint, so the objects are read by a
  paginated consistent LIST (one page in memory at a time). An object is
  announced only when the cache holds that very state: the same uid *and*
  resourceVersion (and fingerprint). Then every change up to it was decided
  before the announcement, and nothing it says is news. Otherwise it is
  skipped and counted: cached at another version (changed during the
  snapshot: its live events say it, or the change was only in ignored fields),
  not cached (created or deleted meanwhile, not yet seen), or uncertain after a
  restart (its settling event is on its way). Comparing fingerprints alone is
  not enough: an object that went A → B → A could be listed at the old A after
  the cache published the new A, and an announcement of the old version
  would then follow a newer event.
- **The checkpoint does not change.** Announcements are never written ahead
  and dirty no key: the state they announce is the state the checkpoint (or
  an earlier decision's write-ahead row) already holds. A crash during a
  snapshot leaves the checkpoint as it was, and the restart republishes
  nothing for it.
- **Bounded memory.** Each announcement waits for room in the outbox's window
  (``max_pending``) as live decisions do; a slow bus slows the snapshot.

Events: type ``io.k8s.{group|core}.{version}.{Kind}.snapshot``, id (and NATS
``Nats-Msg-Id``) ``{uid}:{resourceVersion}:snapshot:{signal-id}``, the object
redacted and masked like any event, ``initial: false``.
"""

from __future__ import annotations

import secrets
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from bridge.delivery.changes import Change, ChangeDetector, ChangeKind
from bridge.delivery.events import EventBuilder
from bridge.errors import SnapshotError
from bridge.ground.digest import Digest
from bridge.ground.envelope import Event
from bridge.kube.objects import RawObject, meta, namespace_key
from bridge.kube.protocols import ListerWatcher, ListOptions
from bridge.logging import get_logger

log = get_logger(__name__)

SNAPSHOT = "snapshot"


class SnapshotTarget(Protocol):
    """One resource's pipeline as a snapshot sees it (``ResourcePipeline`` is one)."""

    @property
    def label(self) -> str: ...

    @property
    def lister(self) -> ListerWatcher: ...

    @property
    def detector(self) -> ChangeDetector: ...

    @property
    def builder(self) -> EventBuilder: ...

    def has_synced(self) -> bool: ...

    def cached_digest(self, key: str) -> Digest | None: ...

    def is_uncertain(self, key: str) -> bool: ...

    def is_filtered_out(self, key: str) -> bool: ...

    def announce(self, key: str, uid: str, event: Event) -> int: ...

    async def wait_for_room(self) -> None: ...

    async def wait_acknowledged(self, seq: int) -> None: ...


def new_signal_id() -> str:
    return secrets.token_hex(6)


@dataclass
class SnapshotResult:
    signal_id: str
    resources: list[str] = field(default_factory=list)
    listed: int = 0
    announced: int = 0
    # reason → count: changed, not-cached, uncertain, filtered
    skipped: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def add(self, other: SnapshotResult) -> None:
        self.resources.extend(other.resources)
        self.listed += other.listed
        self.announced += other.announced
        self.skipped.update(other.skipped)
        self.seconds = max(self.seconds, other.seconds)

    def to_dict(self) -> dict[str, Any]:
        return {
            "signalId": self.signal_id,
            "resources": self.resources,
            "listed": self.listed,
            "announced": self.announced,
            "skipped": sum(self.skipped.values()),
            "skippedBy": dict(self.skipped),
            "seconds": round(self.seconds, 3),
        }


def snapshot_event(builder: EventBuilder, obj: RawObject, key: str, signal_id: str) -> Event:
    """The announcement of ``obj``: built (redacted, masked) as its change events are."""
    event = builder.build(Change(ChangeKind.ADDED, obj, key))
    prefix = event.type.rpartition(".")[0]
    return replace(
        event,
        id=f"{event.id}:{SNAPSHOT}:{signal_id}",
        type=f"{prefix}.{SNAPSHOT}",
        initial=False,
    )


def _why_not(target: SnapshotTarget, key: str, obj: RawObject) -> str | None:
    """Why ``obj`` (as listed) is not announced, or None when the cache holds exactly it."""
    if target.is_uncertain(key):
        return "uncertain"
    if target.is_filtered_out(key):
        return "filtered"  # outside the resource's filter: never published, never announced
    cached = target.cached_digest(key)
    if cached is None:
        return "not-cached"
    m = meta(obj)
    if cached.uid != str(m.get("uid", "")) or cached.resource_version != str(
        m.get("resourceVersion", "")
    ):
        return "changed"
    if cached.fingerprint != target.detector.fingerprinter.fingerprint(obj):
        return "changed"  # a cache that disagrees with its own version: never announce it
    return None


async def take_snapshot(
    target: SnapshotTarget,
    signal_id: str,
    *,
    page_size: int = 500,
    clock: Callable[[], float] = time.monotonic,
) -> SnapshotResult:
    """Announce every object of ``target`` the cache holds as listed; returns the counts once
    the bus has acknowledged every announcement."""
    if not target.has_synced():
        raise SnapshotError(f"{target.label}: not synced yet; try again once /readyz is 200")
    started = clock()
    result = SnapshotResult(signal_id, [target.label])
    builder = target.builder
    last_seq = 0
    token: str | None = None
    while True:
        # No resourceVersion: a consistent (quorum) read, paginated at its first page's version.
        page = await target.lister.list(ListOptions(limit=page_size, continue_token=token))
        for obj in page.get("items") or ():
            result.listed += 1
            key = namespace_key(obj)
            reason = _why_not(target, key, obj)
            if reason is not None:
                result.skipped[reason] += 1
                continue
            # No await between the check above and the announcement: the cache
            # cannot move in between, so the announcement follows its state's event.
            event = snapshot_event(builder, obj, key, signal_id)
            last_seq = target.announce(key, str(meta(obj).get("uid", "")), event)
            result.announced += 1
            await target.wait_for_room()
        token = (page.get("metadata") or {}).get("continue") or None
        if not token:
            break
    if last_seq:
        await target.wait_acknowledged(last_seq)
    result.seconds = clock() - started
    log.info(
        "snapshot announced",
        resource=target.label,
        signal=signal_id,
        listed=result.listed,
        announced=result.announced,
        skipped=dict(result.skipped),
        seconds=round(result.seconds, 2),
    )
    return result
