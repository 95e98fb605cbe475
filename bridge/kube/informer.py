"""client-go's SharedIndexInformer, asyncio-native.

A Reflector fills a FIFO; one processing loop pops it, keeps the cache
(``Indexer``) in step and calls the handlers. Handlers are awaited one after
another, in registration order, for every notification: a slow handler stops
the loop, the FIFO fills up to ``max_queued``, and the reflector waits, which
is how a slow sink slows the watch instead of growing memory.

Notifications follow client-go's ``HandleDeltas``:

- Added / Updated / Replaced / Sync: the cache is updated; handlers get
  ``on_update(old, new)`` if the key was cached, else ``on_add(new, initial)``.
  An update whose resourceVersion equals the cached one (a Sync, or a relist
  echo) is a *resync* and goes only to handlers due a resync.
- Deleted: the key leaves the cache; handlers get ``on_delete(obj)``, where
  ``obj`` may be a ``DeletedFinalStateUnknown`` whose ``obj`` is None.

Slim mode keeps per key only what change detection needs (identity,
resourceVersion and a fingerprint) as a compact record (bridge/kube/records.py,
~100 B), so a large cluster costs little memory; handlers still receive the
full new object, while ``old`` is the record. A slim cache indexes by
namespace only: a record keeps no labels.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Literal, Protocol

from bridge.aiotasks import run_group
from bridge.kube.fifo import Delta, DeltaFIFO, DeltaType, FIFOClosedError, RealFIFO
from bridge.kube.objects import (
    CachedObject,
    DeletedFinalStateUnknown,
    RawObject,
    meta,
    namespace_key,
    resource_version,
)
from bridge.kube.records import LooseRecord, PackedRecord, make_record
from bridge.kube.store import Indexer, IndexerError, IndexFunc
from bridge.logging import get_logger

if TYPE_CHECKING:
    from bridge.kube.protocols import ListerWatcher
    from bridge.kube.reflector import Reflector, ReflectorSettings

__all__ = [
    "HandlerRegistration",
    "ResourceEventHandler",
    "SharedInformer",
    "slim_record",
]

log = get_logger(__name__)

SlimFunc = Callable[[RawObject], str]

# At most this many deltas per pop of a RealFIFO (``RealFIFO.pop_batch``): what
# arrives together (a socket read of a busy watch holds ~40 pods) is handled in one
# pop. The FIFO's bound (``max_queued``, 100 by default) caps it anyway.
POP_BATCH = 100


class ResourceEventHandler(Protocol):
    """Informer notifications. In slim mode ``old`` (and ``new`` of a resync, or an
    add caught up from the cache) is a cache record, not an object."""

    async def on_add(self, obj: CachedObject, is_in_initial_list: bool) -> None: ...

    async def on_update(self, old: CachedObject, new: CachedObject) -> None: ...

    async def on_delete(self, obj: CachedObject | DeletedFinalStateUnknown) -> None: ...


def slim_record(obj: RawObject, fingerprint: SlimFunc) -> PackedRecord | LooseRecord:
    """What slim mode caches for ``obj``: identity, resourceVersion and a fingerprint."""
    m = meta(obj)
    return make_record(
        namespace_key(obj),
        str(m.get("uid", "")),
        str(m.get("resourceVersion", "")),
        fingerprint(obj),
    )


def _unconfirmed(obj: CachedObject) -> bool:
    """A record restored from a checkpoint written ahead: a state the consumer is not
    sure of, so the next notification for its key is delivered even at the same
    resourceVersion."""
    return not isinstance(obj, dict) and obj.unconfirmed


class HandlerRegistration:
    """One handler attached to an informer; client-go's processorListener."""

    def __init__(
        self, informer: SharedInformer, handler: ResourceEventHandler, resync_period: float | None
    ) -> None:
        self.handler = handler
        self.resync_period = resync_period if resync_period and resync_period > 0 else None
        self._informer = informer
        # Objects cached before this handler joined, still to be delivered as adds.
        self._backlog: deque[CachedObject] = deque()
        self._pending_initial = 0
        self._removed = False
        self._due_resync = False
        self._next_resync = (
            asyncio.get_running_loop().time() + self.resync_period
            if self.resync_period is not None and _loop_running()
            else 0.0
        )

    def has_synced(self) -> bool:
        """True once the informer synced and this handler got every object it had to catch up on."""
        return not self._removed and self._informer.has_synced() and self._pending_initial == 0

    async def _drain_backlog(self) -> None:
        while self._backlog:
            obj = self._backlog.popleft()
            try:
                await self.handler.on_add(obj, True)
            finally:
                self._pending_initial -= 1

    async def _on_add(self, obj: CachedObject, is_in_initial_list: bool) -> None:
        await self._drain_backlog()
        await self.handler.on_add(obj, is_in_initial_list)

    async def _on_update(self, old: CachedObject, new: CachedObject) -> None:
        await self._drain_backlog()
        await self.handler.on_update(old, new)

    async def _on_delete(self, obj: CachedObject | DeletedFinalStateUnknown) -> None:
        await self._drain_backlog()
        await self.handler.on_delete(obj)

    def _check_resync(self, now: float) -> bool:
        if self.resync_period is None:
            self._due_resync = False
            return False
        if not self._next_resync:
            self._next_resync = now + self.resync_period
        # asyncio may wake a timer up to a clock tick early.
        self._due_resync = now + 0.001 >= self._next_resync
        if self._due_resync:
            self._next_resync = now + self.resync_period
        return self._due_resync


def _older(new: CachedObject, old: CachedObject) -> bool:
    """``new`` is an earlier state of this key than the cached ``old``: an earlier state
    of the same object, or an object of the same name that was deleted before ``old``.

    resourceVersions are opaque by contract, but every API server backed by
    etcd serves them as increasing integers (one sequence for all objects);
    anything else is never "older".
    """
    return _older_version(resource_version(new), resource_version(old))


def _older_version(new: str, old: str) -> bool:
    """``_older`` of two resourceVersions already read."""
    try:
        return int(new) < int(old)
    except ValueError:
        return False


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class SharedInformer:
    """Reflector → FIFO → cache + handlers, for one resource in one scope."""

    def __init__(
        self,
        lw: ListerWatcher,
        *,
        name: str = "",
        fifo: Literal["real", "delta"] = "real",
        indexers: dict[str, IndexFunc] | None = None,
        slim: SlimFunc | None = None,
        resync_period: float | None = None,
        reflector_settings: ReflectorSettings | None = None,
        initial_objects: list[CachedObject] | None = None,
        initial_resource_version: str | None = None,
        max_queued: int | None = 100,
        drop_stale: bool = False,
        notify_unknown_deletes: bool = True,
        by_namespace: bool = True,
    ) -> None:
        self._lw = lw
        # client-go tells handlers of every delete, cached or not. A handler that
        # keeps only some objects (a filter) and was started from a checkpoint
        # cannot tell "never cached" from "cached, then dropped", so it may ask
        # to hear only of deletes of objects the cache held.
        self._notify_unknown_deletes = notify_unknown_deletes
        # A watch resumed from a checkpoint's watermark replays changes the
        # cache (seeded from the checkpoint) may already be past; an older
        # state of the same object must not overwrite a newer one.
        self._drop_stale = drop_stale
        self.name = name
        self._slim = slim
        self._resync_period = resync_period if resync_period and resync_period > 0 else None
        self._reflector_settings = reflector_settings
        self._initial_rv = initial_resource_version
        # Started from a checkpoint: the cache already holds what was published,
        # so the informer is synced at once and a relist is not a "first list".
        self._resumed = initial_resource_version is not None
        self.store = Indexer(key_func=namespace_key, indexers=indexers, by_namespace=by_namespace)
        if initial_objects:
            self.store.replace(
                (self._to_stored(obj) for obj in initial_objects),
                initial_resource_version or "",
                expected=len(initial_objects),
            )
        fifo_cls = RealFIFO if fifo == "real" else DeltaFIFO
        self.fifo: RealFIFO | DeltaFIFO = fifo_cls(
            key_func=namespace_key, known_objects=self.store, max_queued=max_queued
        )
        self._registrations: list[HandlerRegistration] = []
        self._lock = asyncio.Lock()
        self._backlog_wakeup = asyncio.Event()
        self._handlers_changed = asyncio.Event()
        self._started = False
        self._stopped = False
        self._reflector: Reflector | None = None

    # -- handlers -------------------------------------------------------------

    def add_event_handler(
        self, handler: ResourceEventHandler, resync_period: float | None = None
    ) -> HandlerRegistration:
        """Attach ``handler``; once started, it first catches up on every cached object."""
        if self._stopped:
            raise RuntimeError(f"informer {self.name!r} has stopped; handler not added")
        period = resync_period if resync_period is not None else self._resync_period
        reg = HandlerRegistration(self, handler, period)
        if self._started:
            # Snapshot and registration happen without an await in between, so
            # every later change reaches the handler after this snapshot.
            reg._backlog.extend(self.store.list())
            reg._pending_initial = len(reg._backlog)
            self._backlog_wakeup.set()
        self._registrations.append(reg)
        self._handlers_changed.set()
        return reg

    def remove_event_handler(self, registration: HandlerRegistration) -> None:
        if registration in self._registrations:
            self._registrations.remove(registration)
        registration._removed = True
        registration._backlog.clear()
        registration._pending_initial = 0

    # -- state ----------------------------------------------------------------

    def has_synced(self) -> bool:
        """True once the first list is in the cache and every handler was told about it."""
        return self._resumed or self.fifo.has_synced()

    async def wait_for_sync(self, timeout: float | None = None) -> bool:
        if self.has_synced():
            return True
        try:
            async with asyncio.timeout(timeout):
                await self.fifo.wait_for_sync()
        except TimeoutError:
            return False
        return True

    @property
    def reflector(self) -> Reflector | None:
        """The running reflector (None before ``run``): its counters feed the metrics."""
        return self._reflector

    @property
    def last_sync_resource_version(self) -> str:
        if self._reflector is not None:
            return str(self._reflector.last_sync_resource_version)
        return self._initial_rv or ""

    def add_indexers(self, indexers: dict[str, IndexFunc]) -> None:
        if self._started:
            raise IndexerError(f"informer {self.name!r} has already started; cannot add indexers")
        if len(self.store):
            # Objects loaded from a checkpoint: re-index them under the new set.
            items = self.store.list()
            self.store.replace([])
            self.store.add_indexers(indexers)
            self.store.replace(items, self._initial_rv or "")
        else:
            self.store.add_indexers(indexers)

    # -- running --------------------------------------------------------------

    async def run(self) -> None:
        """List-then-watch and process until cancelled (or until something fails)."""
        # Imported here so this module stands on its own in tests without a reflector.
        from bridge.kube.reflector import Reflector

        self._reflector = Reflector(
            self._lw,
            self.fifo,
            name=self.name,
            settings=self._reflector_settings,
            resource_version=self._initial_rv,
        )
        await self._run_tasks({"reflector": self._reflector.run()})

    async def run_processing(self) -> None:
        """Process the FIFO without a reflector: for callers that feed ``fifo`` themselves."""
        await self._run_tasks({})

    async def _run_tasks(self, extra: dict[str, Coroutine[Any, Any, None]]) -> None:
        if self._started:
            for coro in extra.values():
                coro.close()
            raise RuntimeError(f"informer {self.name!r} was already started")
        self._started = True
        coros: dict[str, Coroutine[Any, Any, None]] = {
            **extra,
            "process": self._process_loop(),
            "catch-up": self._backlog_loop(),
            "resync": self._resync_loop(),
        }
        try:
            await run_group(coros, prefix=f"informer:{self.name}:")
        finally:
            self._stopped = True
            self.fifo.close()

    async def _process_loop(self) -> None:
        fifo = self.fifo
        with contextlib.suppress(FIFOClosedError):
            if isinstance(fifo, RealFIFO):
                while True:
                    await fifo.pop_batch(self._handle_batch, POP_BATCH)
            else:
                while True:
                    await fifo.pop(self._handle_deltas)

    async def _backlog_loop(self) -> None:
        """Deliver late handlers' catch-up adds even when no change arrives to carry them."""
        while True:
            await self._backlog_wakeup.wait()
            self._backlog_wakeup.clear()
            async with self._lock:
                for reg in list(self._registrations):
                    await reg._drain_backlog()

    async def _resync_loop(self) -> None:
        """Ask the FIFO for a resync whenever some handler is due one (client-go's ShouldResync)."""
        loop = asyncio.get_running_loop()
        while True:
            periods = [r.resync_period for r in self._registrations if r.resync_period]
            if not periods:
                self._handlers_changed.clear()
                await self._handlers_changed.wait()
                continue
            await asyncio.sleep(min(periods))
            now = loop.time()
            due = [reg._check_resync(now) for reg in self._registrations]
            if any(due):
                await self.fifo.resync()

    async def _handle_deltas(self, deltas: list[Delta], is_in_initial_list: bool) -> None:
        # One key's deltas from a DeltaFIFO: handled as a batch is.
        await self._handle_batch(deque(deltas), is_in_initial_list)

    async def _handle_batch(self, batch: deque[Delta], is_in_initial_list: bool) -> None:
        initial = is_in_initial_list and not self._resumed
        async with self._lock:
            while batch:
                # Off the batch before it is handled: the FIFO counts it processed.
                await self._handle_delta(batch.popleft(), initial)

    async def _handle_delta(self, delta: Delta, is_in_initial_list: bool) -> None:
        obj = delta.object
        # The handlers to tell are fixed together with the cache write (no await
        # in between), so a handler joining meanwhile sees this change exactly
        # once: either in its catch-up snapshot or as this notification.
        regs = list(self._registrations)
        if delta.type is DeltaType.Deleted:
            if not isinstance(obj, DeletedFinalStateUnknown):
                cached = self.store.get(obj)
                if cached is None and not self._notify_unknown_deletes:
                    return
                if self._drop_stale and cached is not None and _older(obj, cached):
                    return  # the delete of an earlier object of the same name
            self.store.delete(obj)
            for reg in regs:
                await reg._on_delete(obj)
            return
        if isinstance(obj, DeletedFinalStateUnknown):
            log.warning("ignoring a tombstone", informer=self.name, delta_type=str(delta.type))
            return
        old = self.store.get(obj)
        if old is None:
            self.store.update(self._to_stored(obj))
            for reg in regs:
                await reg._on_add(obj, is_in_initial_list)
            return
        # Each read once: a cache record unpacks its resourceVersion on every read.
        old_rv, new_rv = resource_version(old), resource_version(obj)
        if self._drop_stale and _older_version(new_rv, old_rv):
            return
        if obj is not old:
            # A Sync carries the cached record itself: storing it again is a no-op.
            self.store.update(self._to_stored(obj))
        is_resync = old_rv == new_rv and not _unconfirmed(old)
        for reg in regs:
            if not is_resync or reg._due_resync:
                await reg._on_update(old, obj)

    def _to_stored(self, obj: CachedObject) -> CachedObject:
        if self._slim is None or not isinstance(obj, dict):
            return obj
        return slim_record(obj, self._slim)
