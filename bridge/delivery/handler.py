"""The informer's handler: each notification decides its events at once, into the outbox.

There is no await between the cache update and the decision; only then does
the handler wait for room while too much is unacknowledged, which is how a
slow bus slows the watch. The first news of a key a previous run left
uncertain (bridge/delivery/resume.py) settles it: an unchanged object is
republished with the id it was written ahead with, a change goes out as
modified, a vanished object as deleted.
"""

from __future__ import annotations

from collections.abc import Callable

from bridge.delivery.changes import FINGERPRINT_FIELD, Change, ChangeDetector, ChangeKind
from bridge.delivery.events import EventBuilder
from bridge.delivery.filters import Filter
from bridge.delivery.notify import Notifier
from bridge.delivery.outbox import Outbox
from bridge.delivery.settings import PipelineSettings
from bridge.delivery.stats import PipelineStats
from bridge.ground.digest import Digest
from bridge.kube.objects import (
    CachedObject,
    DeletedFinalStateUnknown,
    RawObject,
    meta,
    namespace_key,
)
from bridge.kube.store import Indexer


class ChangeHandler:
    """Turns informer notifications into decided events (``ResourceEventHandler``)."""

    def __init__(
        self,
        *,
        detector: ChangeDetector,
        builder: EventBuilder,
        filter: Filter | None,
        outbox: Outbox,
        settings: PipelineSettings,
        stats: PipelineStats,
        observe: Callable[[], None],
        decided: Callable[[], None],
        acknowledged: Notifier,
    ) -> None:
        self.detector = detector
        self._build = builder.build
        self.filter = filter
        self.outbox = outbox
        self.settings = settings
        self._stats = stats
        # At each notification: the reflector's position, a watermark candidate.
        self._observe = observe
        # Events were decided: the writer may take them.
        self._decided = decided
        # The bus acknowledged events: there may be room again.
        self._acknowledged = acknowledged
        # The informer's cache, the one store of per-object state (set once it exists).
        self.store: Indexer | None = None
        # Resumed from a checkpoint: the initial list is not "initial" for consumers.
        self.resumed = False
        # Objects whose delete a previous run put on the bus past the watermark the
        # watch resumed from (bridge/delivery/resume.py): their replayed states and
        # delete are not news. Per key, until the replayed delete (or another uid).
        self.replayed_deletes: dict[str, Digest] = {}
        # Keys of cached objects outside the filter: never published (or taken out
        # with a filtered event), so no digest, no delete. Only these keys cost
        # memory; the checkpoint holds the objects in view.
        self.out: set[str] = set()

    def digest_of(self, key: str) -> Digest | None:
        """The cached state of ``key`` as a checkpoint digest (the cache is the one store)."""
        if key in self.out:
            return None  # outside the filter: not published, not checkpointed
        store = self.store
        obj = store.get_by_key(key) if store is not None else None
        if obj is None:
            return None
        if not isinstance(obj, dict):
            return Digest(key, *obj.values())
        fp = obj.get(FINGERPRINT_FIELD)
        if not isinstance(fp, str):
            return self.detector.digest_of(obj)
        m = meta(obj)
        return Digest(key, str(m.get("uid", "")), str(m.get("resourceVersion", "")), fp)

    # -- notifications --------------------------------------------------------

    async def on_add(self, obj: CachedObject, is_in_initial_list: bool) -> None:
        self._observe()
        if not isinstance(obj, dict):
            # A cached record is what a handler added late catches up on; this one
            # is attached before the informer starts, so it never gets one.
            return
        if is_in_initial_list:
            self._stats.listed += 1
        key = namespace_key(obj)
        if self.replayed_deletes and self._replayed(key, obj):
            return
        if self.filter is not None and not self.filter.matches(obj, None, "added"):
            # First seen in this run (not cached): in view only if a previous run
            # may have published it, which the uncertain check in _leave_view knows.
            self._leave_view(key, obj, was_in=False)
        else:
            uncertain = self.outbox.resolve(key)
            if uncertain is not None:
                self._decide(*self._confirm(uncertain, obj))
            else:
                initial = is_in_initial_list and not self.resumed
                self._decide(self.detector.on_add(obj, None, initial=initial))
        await self.wait_for_room()

    async def on_update(self, old: CachedObject, new: CachedObject) -> None:
        self._observe()
        if not isinstance(new, dict) or FINGERPRINT_FIELD in new:
            return  # a resync of a cached (slim) record: never news, never a confirmation
        key = namespace_key(new)
        if self.replayed_deletes and self._replayed(key, new):
            return
        if self.filter is not None:
            full_old = old if isinstance(old, dict) and FINGERPRINT_FIELD not in old else None
            if not self.filter.matches(new, full_old, "modified"):
                self._leave_view(key, new, was_in=key not in self.out)
                await self.wait_for_room()
                return
            if key in self.out:
                # Entering the view: for consumers it appears now.
                self.out.discard(key)
                self.outbox.resolve(key)
                self._decide(self.detector.on_add(new, None))
                await self.wait_for_room()
                return
        uncertain = self.outbox.resolve(key)
        if uncertain is not None:
            self._decide(*self._confirm(uncertain, new))
        else:
            self._decide(self.detector.on_update(old, new))
        await self.wait_for_room()

    async def on_delete(self, obj: CachedObject | DeletedFinalStateUnknown) -> None:
        self._observe()
        key = namespace_key(obj)
        if self.replayed_deletes and self._replayed(key, obj, deleted=True):
            return
        if key in self.out:
            self.out.discard(key)  # never published (or already taken out): nothing to say
            return
        self.outbox.resolve(key)
        self._decide(self.detector.on_delete(obj))
        await self.wait_for_room()

    async def wait_for_room(self) -> None:
        """Until what is unacknowledged is below both bounds (count and bytes)."""
        s, outbox = self.settings, self.outbox
        if (
            outbox.unacknowledged >= s.pending_limit
            or outbox.unacknowledged_bytes >= s.max_pending_bytes
        ):
            await self._acknowledged.until(self._has_room)

    def _has_room(self) -> bool:
        s, outbox = self.settings, self.outbox
        return (
            outbox.unacknowledged < s.pending_limit
            and outbox.unacknowledged_bytes < s.max_pending_bytes
        )

    def _replayed(
        self, key: str, obj: CachedObject | DeletedFinalStateUnknown, *, deleted: bool = False
    ) -> bool:
        """``obj`` is a replayed state (or the replayed delete) of an object whose delete
        is already on the bus: nothing to publish. Its guard ends with the delete, or
        with another object of the same name."""
        gone = self.replayed_deletes.get(key)
        if gone is None:
            return False
        uid = _uid_of(obj)
        if uid and uid != gone.uid:
            del self.replayed_deletes[key]  # a new object of that name: news again
            return False
        if deleted:
            del self.replayed_deletes[key]
        self._stats.suppressed += 1
        return True

    # -- deciding -------------------------------------------------------------

    def _leave_view(self, key: str, obj: RawObject, *, was_in: bool) -> None:
        """``obj`` does not match the filter. If consumers may hold it (it was in view,
        or a previous run may have published it), it leaves with a filtered event."""
        if key in self.out:
            self._stats.suppressed += 1
            return
        self.out.add(key)
        uncertain = self.outbox.resolve(key)
        if was_in or uncertain is not None:
            self._decide([Change(ChangeKind.FILTERED, obj, key)])
        else:
            self._stats.suppressed += 1

    def _confirm(self, uncertain: Digest, obj: RawObject) -> tuple[list[Change], str | None]:
        """The first news of a key a previous run left uncertain (its event may be on the
        bus): the changes to publish, and the resourceVersion their id keeps, if any."""
        d = self.detector.digest_of(obj)
        if d.uid == uncertain.uid and d.fingerprint == uncertain.fingerprint:
            # Unchanged: republish with the id it was written ahead with.
            rv = uncertain.resource_version
            digest = Digest(d.key, d.uid, rv, d.fingerprint)
            return [Change(ChangeKind.MODIFIED, obj, d.key, digest=digest)], rv
        # Changed, or another object of the same name: as any update against a digest.
        return self.detector.on_update(uncertain, obj), None

    def _decide(self, changes: list[Change], resource_version: str | None = None) -> None:
        if not changes:
            self._stats.suppressed += 1
            return
        outbox, build = self.outbox, self._build
        for change in changes:
            # Sealed: encoded now, so the parsed object dies here, not at the ack.
            event = build(change, resource_version=resource_version, sealed=True)
            uid = str(meta(change.object).get("uid", ""))
            outbox.decide(change.key, uid, event, change.digest)
        self._decided()


def _uid_of(obj: CachedObject | DeletedFinalStateUnknown) -> str:
    """The uid of a notification's object ("" when a tombstone does not say)."""
    if isinstance(obj, DeletedFinalStateUnknown):
        if obj.obj is None:
            return ""
        obj = obj.obj
    if isinstance(obj, dict):
        return str(meta(obj).get("uid", ""))
    return str(obj.values()[0])
