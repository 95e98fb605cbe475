"""The queue between a Reflector and the informer: client-go's RealFIFO.

It implements ``ReflectorStore`` (what the reflector writes) and ``pop_batch``
(what the informer reads). Everything runs on one event loop, so there are no
locks: a method either completes without awaiting or waits on an explicit
condition.

``RealFIFO`` (client-go's ``InOrderInformers``, the default since 1.33) keeps
strict arrival order across keys and pops one delta at a time, or a run of
them (``pop_batch``, as client-go's ``PopBatch`` under its
``InOrderInformersBatchProcess`` feature gate). client-go's older
``DeltaFIFO``, which groups deltas per key, is not reproduced: arrival order
is what lets the bridge tie the reflector's resourceVersion to its progress
(``queued_total``).

``has_synced`` turns true once every item queued by the first ``replace``
(tombstones included) has been popped *and* processed, so a caller that sees
it true knows the cache behind it holds the whole first list.

With ``max_queued`` set, ``add``/``update``/``delete`` wait while the queue is
full: a slow consumer slows the watch instead of growing memory. ``replace``
and ``resync`` never wait, because a relist must land as one piece.

``begin_replace`` is ``replace`` fed item by item as a large list arrives, so
the consumer can take items while later ones are still being read.
``begin_replace(paced=True)`` waits for room like ``add``, so a slow consumer
pauses the list (a streaming list's watch, or a LIST's body, which the
reflector reads ahead as bytes past a deadline so the server's request
timeout cannot cut it) and a 100k-object list never piles up in the queue
as decoded items. Unpaced, it only yields to the consumer every so often,
which keeps the queue short only while the consumer keeps up. Vanished keys are known only
after the last item, so the tombstones are queued then: after the items,
where the all-at-once ``replace`` puts them first as client-go does. Per key
nothing changes (a tombstone's key is never among the items).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from bridge.errors import BridgeError
from bridge.kube.objects import CachedObject, DeletedFinalStateUnknown, RawObject, namespace_key

__all__ = [
    "REPLACE_YIELD_EVERY",
    "Delta",
    "DeltaType",
    "FIFOClosedError",
    "KeyFunc",
    "KeyListerGetter",
    "PopBatchProcessFunc",
    "PopProcessFunc",
    "RealFIFO",
]


class DeltaType(StrEnum):
    Added = "Added"
    Updated = "Updated"
    Deleted = "Deleted"
    # A relist saw the object; whether it changed is for the consumer to decide.
    Replaced = "Replaced"
    # A periodic resync re-delivers what the cache already holds.
    Sync = "Sync"


@dataclass(slots=True)  # one per queued item: not frozen, for a cheaper __init__
class Delta:
    type: DeltaType
    object: CachedObject | DeletedFinalStateUnknown


class FIFOClosedError(BridgeError):
    """``pop`` was called on a closed, drained FIFO."""


class KeyListerGetter(Protocol):
    """What a FIFO asks about the objects the consumer already knows (the cache)."""

    def list_keys(self) -> list[str]: ...

    def get_by_key(self, key: str) -> CachedObject | None: ...


KeyFunc = Callable[[CachedObject], str]
PopProcessFunc = Callable[[list[Delta], bool], Awaitable[None]]
PopBatchProcessFunc = Callable[[deque[Delta], bool], Awaitable[None]]

# A streamed replace lets the consumer run after this many items. Each turn of
# the loop wakes the informer, and what it feeds (write-ahead rows, publishes),
# for what came since: a turn every few items takes a tenth of the loop's time
# per listed object; one every 64 makes a first sync faster at the same peak
# memory (``python -m bench e2e``). Kept below the FIFO's default bound (100).
REPLACE_YIELD_EVERY = 64


class _Waiters:
    """Futures woken together; usable from plain (non-async) methods such as ``close``."""

    __slots__ = ("_futures",)

    def __init__(self) -> None:
        self._futures: list[asyncio.Future[None]] = []

    async def wait(self) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._futures.append(fut)
        try:
            await fut
        finally:
            if fut in self._futures:
                self._futures.remove(fut)

    def notify_all(self) -> None:
        futures, self._futures = self._futures, []
        for fut in futures:
            if not fut.done():
                fut.set_result(None)


class RealFIFO:
    """Strict arrival order across keys, one delta per pop (or a run of them)."""

    def __init__(
        self,
        *,
        key_func: KeyFunc = namespace_key,
        known_objects: KeyListerGetter | None = None,
        max_queued: int | None = None,
    ) -> None:
        if max_queued is not None and max_queued < 1:
            raise ValueError(f"max_queued must be at least 1, got {max_queued}")
        self._key_func = key_func
        self._known_objects = known_objects
        self._in_process = 0
        self._max_queued = max_queued
        self._closed = False
        self._replacing = False
        # populated: anything was ever added or replaced. The count is the number
        # of pops (of the first replace's items) still to be processed.
        self._populated = False
        self._initial_population_count = 0
        self._not_empty = _Waiters()
        self._has_room = _Waiters()
        self._synced_waiters = _Waiters()
        self._items: deque[Delta] = deque()
        # Items ever queued and ever processed. As the FIFO keeps arrival
        # order, "processed >= queued-at-some-moment" proves that everything
        # queued up to that moment is done: how a consumer ties the reflector's
        # resourceVersion to its own progress while the queue never drains.
        self.queued_total = 0
        self.processed_total = 0

    def key_of(self, obj: CachedObject | DeletedFinalStateUnknown) -> str:
        if isinstance(obj, DeletedFinalStateUnknown):
            return obj.key
        return self._key_func(obj)

    def has_synced(self) -> bool:
        return self._populated and self._initial_population_count == 0

    async def wait_for_sync(self) -> None:
        """Return once ``has_synced`` is true."""
        while not self.has_synced():
            await self._synced_waiters.wait()

    def _populate(self) -> None:
        if not self._populated:
            self._populated = True
            self._synced_waiters.notify_all()

    def close(self) -> None:
        """Wake every waiter; ``pop`` raises ``FIFOClosedError`` once the queue is drained."""
        self._closed = True
        self._not_empty.notify_all()
        self._has_room.notify_all()

    async def _wait_for_room(self) -> None:
        if self._max_queued is None:
            return
        while len(self) >= self._max_queued and not self._closed:
            await self._has_room.wait()

    async def _wait_for_item(self) -> None:
        while not len(self):
            if self._closed:
                raise FIFOClosedError("FIFO is closed")
            await self._not_empty.wait()

    def _popped(self) -> None:
        self._in_process += 1
        self._has_room.notify_all()

    def is_idle(self) -> bool:
        """Nothing queued and nothing being processed: every item handed in so far is done.

        A consumer checkpointing the reflector's resourceVersion may do so only
        then. A streamed replace still arriving is not done, however short the queue.
        """
        return self._in_process == 0 and len(self) == 0 and not self._replacing

    def begin_replace(self, paced: bool = False) -> Replacement:
        """``replace``, fed item by item (see the module doc); one at a time.

        ``paced``: each item waits for room under ``max_queued``.
        """
        if self._replacing:
            raise RuntimeError("a replace is already being fed")
        self._replacing = True
        return Replacement(self, paced)

    def _present_keys(self) -> set[str]:
        """Every key queued or known."""
        keys = set(self._queued_keys())
        if self._known_objects is not None:
            keys.update(self._known_objects.list_keys())
        return keys

    def _may_vanish(self) -> bool:
        """Whether a replace beginning now could leave keys out: something is queued or known."""
        if len(self):
            return True
        known = self._known_objects
        return known is not None and bool(known.list_keys())

    def _processed(self, popped: int = 1, done: int = 1) -> None:
        """``popped`` items are out of process, ``done`` of them processed."""
        self._in_process -= popped
        self.processed_total += done
        if self._initial_population_count > 0:
            self._initial_population_count = max(0, self._initial_population_count - done)
            if self._initial_population_count == 0:
                self._synced_waiters.notify_all()

    def _mark_populated_by_replace(self) -> None:
        if not self._populated:
            self._populated = True
            # Everything queued now, or popped and still being processed (a streamed
            # replace's consumer runs meanwhile), must be done before the cache holds
            # the first list.
            self._initial_population_count = len(self) + self._in_process
            self._synced_waiters.notify_all()

    def __len__(self) -> int:
        return len(self._items)

    async def add(self, obj: RawObject) -> None:
        await self._wait_for_room()
        self._populate()
        self._append(DeltaType.Added, obj)

    async def update(self, obj: RawObject) -> None:
        await self._wait_for_room()
        self._populate()
        self._append(DeltaType.Updated, obj)

    async def delete(self, obj: RawObject | DeletedFinalStateUnknown) -> None:
        await self._wait_for_room()
        self._populate()
        self._append(DeltaType.Deleted, obj)

    async def replace(self, items: list[RawObject], resource_version: str) -> None:
        new_keys = {self.key_of(obj) for obj in items}

        last_queued: dict[str, Delta] = {}
        for delta in self._items:
            last_queued[self.key_of(delta.object)] = delta

        # Tombstones first, so a consumer never sees a key's replacement and then
        # a delete that belongs to the world before the relist.
        tombstones: list[DeletedFinalStateUnknown] = []
        for key, delta in last_queued.items():
            if key in new_keys or delta.type is DeltaType.Deleted:
                continue
            obj = delta.object
            last_obj = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
            tombstones.append(DeletedFinalStateUnknown(key, last_obj))
        if self._known_objects is not None:
            for key in self._known_objects.list_keys():
                if key in new_keys or key in last_queued:
                    continue
                tombstones.append(
                    DeletedFinalStateUnknown(key, self._known_objects.get_by_key(key))
                )

        for tombstone in tombstones:
            self._append(DeltaType.Deleted, tombstone)
        for obj in items:
            self._append(DeltaType.Replaced, obj)

        self._mark_populated_by_replace()

    def _queue_replaced(self, obj: RawObject) -> None:
        self._append(DeltaType.Replaced, obj)

    def _queued_keys(self) -> Iterable[str]:
        return [self.key_of(delta.object) for delta in self._items]

    def _finish_replace(self, keys: set[str] | None) -> None:
        """Tombstones for what the replace did not list, then the synced latch.
        ``keys`` None: nothing was queued or known when the replace began, so
        nothing can have vanished."""
        if keys is None:
            self._mark_populated_by_replace()
            return
        # The items are queued already (see the module doc): only the tombstones are left.
        last_queued: dict[str, Delta] = {}
        for delta in self._items:
            last_queued[self.key_of(delta.object)] = delta
        for key, delta in last_queued.items():
            if key in keys or delta.type is DeltaType.Deleted:
                continue
            obj = delta.object
            last_obj = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
            self._append(DeltaType.Deleted, DeletedFinalStateUnknown(key, last_obj))
        if self._known_objects is not None:
            for key in self._known_objects.list_keys():
                if key in keys or key in last_queued:
                    continue
                self._append(
                    DeltaType.Deleted,
                    DeletedFinalStateUnknown(key, self._known_objects.get_by_key(key)),
                )
        self._mark_populated_by_replace()

    async def resync(self) -> None:
        """Queue ``Sync`` for every known key with nothing queued; no calls outward."""
        if self._known_objects is None or self._replacing:
            return  # a replace being fed re-delivers everything anyway
        queued = {self.key_of(d.object) for d in self._items}
        for key in self._known_objects.list_keys():
            if key in queued:
                continue
            known = self._known_objects.get_by_key(key)
            if known is None:
                continue
            self._append(DeltaType.Sync, known)

    async def pop(self, process: PopProcessFunc) -> None:
        await self._wait_for_item()
        is_in_initial_list = not self.has_synced()
        delta = self._items.popleft()
        self._popped()
        try:
            await process([delta], is_in_initial_list)
        finally:
            self._processed()

    async def pop_batch(self, process: PopBatchProcessFunc, limit: int) -> None:
        """Pop up to ``limit`` deltas at once, in arrival order, and hand them to ``process``.

        What a consumer pays per pop (a wait, a wake-up, its own lock) is paid
        once per run of deltas that arrived together: paid per delta, it is a
        few per cent of the bridge's time per event in a burst
        (``python -m bench inprocess``). The deltas share ``is_in_initial_list``,
        so a batch never runs past the end of the first list. ``process`` takes
        each delta off the front of ``batch`` as it handles it: a delta taken
        counts as processed, as a popped one does in ``pop``, and those still in
        ``batch`` when it returns or raises (cancelled mid-batch) count as never
        processed, so no one reading ``processed_total`` takes them for done.
        client-go's ``PopBatch`` also closes a batch at a repeated key, for
        handlers that take a batch as a set; ``process`` here handles deltas one
        by one, in order, so a key may repeat.
        """
        await self._wait_for_item()
        is_in_initial_list = not self.has_synced()
        items = self._items
        n = min(limit, len(items))
        if 0 < self._initial_population_count < n:
            n = self._initial_population_count
        batch = deque([items.popleft() for _ in range(n)])
        self._in_process += n
        self._has_room.notify_all()
        try:
            await process(batch, is_in_initial_list)
        finally:
            self._processed(n, n - len(batch))

    def _append(self, delta_type: DeltaType, obj: CachedObject | DeletedFinalStateUnknown) -> None:
        self._items.append(Delta(delta_type, obj))
        self.queued_total += 1
        self._not_empty.notify_all()


class Replacement:
    """One streamed replace of a FIFO (``bridge.kube.protocols.Replacement``)."""

    __slots__ = ("_count", "_fifo", "_gone", "_keys", "_open", "_paced")

    def __init__(self, fifo: RealFIFO, paced: bool = False) -> None:
        self._fifo = fifo
        # The listed keys, to tell what vanished; a first list into an empty cache
        # and queue has nothing to compare, and keys held for the length of the
        # list would add ~120 B per object to its peak memory.
        self._keys: set[str] | None = set() if fifo._may_vanish() else None
        # Without the listed keys: the keys discarded (and not handed in again) since.
        self._gone: set[str] = set()
        self._count = 0
        self._open = True
        self._paced = paced

    async def add(self, obj: RawObject) -> None:
        fifo = self._fifo
        if self._paced:
            await fifo._wait_for_room()
        if self._keys is not None:
            self._keys.add(fifo.key_of(obj))
        elif self._gone:
            self._gone.discard(fifo.key_of(obj))
        fifo._queue_replaced(obj)
        self._count += 1
        if self._count % REPLACE_YIELD_EVERY == 0:
            await asyncio.sleep(0)

    def discard(self, obj: RawObject) -> None:
        if self._keys is not None:
            self._keys.discard(self._fifo.key_of(obj))
        else:
            self._gone.add(self._fifo.key_of(obj))

    def commit(self, resource_version: str) -> None:
        self._close()
        keys = self._keys
        if keys is None and self._gone:
            # Everything present came from this list, except what it discarded.
            keys = self._fifo._present_keys() - self._gone
        self._fifo._finish_replace(keys)

    def abort(self) -> None:
        if self._open:
            self._close()

    def _close(self) -> None:
        if not self._open:
            raise RuntimeError("this replace was already committed or aborted")
        self._open = False
        self._fifo._replacing = False
