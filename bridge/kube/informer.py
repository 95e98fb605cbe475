"""client-go's informer, asyncio-native, with the one handler the pipeline is.

A Reflector fills a RealFIFO; one processing loop pops it, keeps the cache
(``Indexer``) in step and awaits the handler for every notification: a slow
handler stops the loop, the FIFO fills up to ``max_queued``, and the reflector
waits, which is how a slow sink slows the watch instead of growing memory.

Only what the bridge runs is here (docs/architecture.md says why):
one FIFO, client-go's ``RealFIFO`` (its default since 1.33, strict arrival
order, which ties the reflector's resourceVersion to the handler's progress),
and one handler given at construction. client-go's ``SharedIndexInformer`` also
takes handlers late, catching them up from the cache, and resyncs each on its
own period; ``NewInformer``, which this resembles, has one handler from the start.

Notifications follow client-go's ``HandleDeltas``:

- Added / Updated / Replaced / Sync: the cache is updated; the handler gets
  ``on_update(old, new)`` if the key was cached, else ``on_add(new, initial)``.
  An update whose resourceVersion equals the cached one (a Sync, or a relist
  echo) is a *resync* and reaches the handler only once a resync is due.
- Deleted: the key leaves the cache; the handler gets ``on_delete(obj)``, where
  ``obj`` may be a ``DeletedFinalStateUnknown`` whose ``obj`` is None.

Slim mode keeps per key only what change detection needs (identity,
resourceVersion and a fingerprint) as a compact record (bridge/ground/records.py,
~100 B), so a large cluster costs little memory; the handler still receives the
full new object, while ``old`` is the record.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from bridge.aiotasks import run_group
from bridge.ground.records import LooseRecord, PackedColumns, PackedRecord, make_record
from bridge.kube.fifo import Delta, DeltaType, FIFOClosedError, RealFIFO
from bridge.kube.objects import (
    CachedObject,
    DeletedFinalStateUnknown,
    RawObject,
    meta,
    namespace_key,
    resource_version,
)
from bridge.kube.store import Indexer
from bridge.logging import get_logger

if TYPE_CHECKING:
    from bridge.kube.protocols import ListerWatcher
    from bridge.kube.reflector import Reflector, ReflectorSettings

__all__ = ["ResourceEventHandler", "SharedInformer", "slim_record"]

log = get_logger(__name__)

SlimFunc = Callable[[RawObject], str]

# At most this many deltas per pop of a RealFIFO (``RealFIFO.pop_batch``): what
# arrives together (a socket read of a busy watch holds ~40 pods) is handled in one
# pop. The FIFO's bound (``max_queued``, 100 by default) caps it anyway.
POP_BATCH = 100


class ResourceEventHandler(Protocol):
    """Informer notifications. In slim mode ``old`` (and ``new`` of a resync) is a
    cache record, not an object."""

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


class SharedInformer:
    """Reflector → RealFIFO → cache + the handler, for one resource in one scope."""

    def __init__(
        self,
        lw: ListerWatcher,
        handler: ResourceEventHandler,
        *,
        name: str = "",
        slim: SlimFunc | None = None,
        resync_period: float | None = None,
        reflector_settings: ReflectorSettings | None = None,
        initial_objects: list[CachedObject] | None = None,
        initial_packed: PackedColumns | None = None,
        initial_resource_version: str | None = None,
        max_queued: int | None = 100,
        drop_stale: bool = False,
        notify_unknown_deletes: bool = True,
    ) -> None:
        self._lw = lw
        self._handler = handler
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
        # A resync (a Sync, or a relist's unchanged item) reaches the handler only
        # from the first periodic resync on, as in client-go, where a handler is
        # "due" once its period has passed and stays so while it keeps passing.
        self._due_resync = False
        self._reflector_settings = reflector_settings
        self._initial_rv = initial_resource_version
        # Started from a checkpoint: the cache already holds what was published,
        # so the informer is synced at once and a relist is not a "first list".
        self._resumed = initial_resource_version is not None
        # Nothing asks the cache by index: no namespace index (31-38 B per object).
        self.store = Indexer(key_func=namespace_key)
        if initial_objects or initial_packed:
            objects = initial_objects or []
            self.store.replace(
                (self._to_stored(obj) for obj in objects),
                initial_resource_version or "",
                expected=len(objects),
                packed=initial_packed,
            )
        self.fifo = RealFIFO(
            key_func=namespace_key, known_objects=self.store, max_queued=max_queued
        )
        self._started = False
        self._reflector: Reflector | None = None

    # -- state ----------------------------------------------------------------

    def has_synced(self) -> bool:
        """True once the first list is in the cache and the handler was told about it."""
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
        coros: dict[str, Coroutine[Any, Any, None]] = {**extra, "process": self._process_loop()}
        if self._resync_period is not None:
            coros["resync"] = self._resync_loop(self._resync_period)
        try:
            await run_group(coros, prefix=f"informer:{self.name}:")
        finally:
            self.fifo.close()

    async def _process_loop(self) -> None:
        fifo = self.fifo
        with contextlib.suppress(FIFOClosedError):
            while True:
                await fifo.pop_batch(self._handle_batch, POP_BATCH)

    async def _resync_loop(self, period: float) -> None:
        """Ask the FIFO for a resync every ``period`` (client-go's resync loop)."""
        while True:
            await asyncio.sleep(period)
            self._due_resync = True
            await self.fifo.resync()

    async def _handle_batch(self, batch: deque[Delta], is_in_initial_list: bool) -> None:
        initial = is_in_initial_list and not self._resumed
        while batch:
            # Off the batch before it is handled: the FIFO counts it processed.
            await self._handle_delta(batch.popleft(), initial)

    async def _handle_delta(self, delta: Delta, is_in_initial_list: bool) -> None:
        obj = delta.object
        handler = self._handler
        if delta.type is DeltaType.Deleted:
            if not isinstance(obj, DeletedFinalStateUnknown):
                cached = self.store.get(obj)
                if cached is None and not self._notify_unknown_deletes:
                    return
                if self._drop_stale and cached is not None and _older(obj, cached):
                    return  # the delete of an earlier object of the same name
            self.store.delete(obj)
            await handler.on_delete(obj)
            return
        if isinstance(obj, DeletedFinalStateUnknown):
            log.warning("ignoring a tombstone", informer=self.name, delta_type=str(delta.type))
            return
        old = self.store.get(obj)
        if old is None:
            self.store.update(self._to_stored(obj))
            await handler.on_add(obj, is_in_initial_list)
            return
        # Each read once: a cache record unpacks its resourceVersion on every read.
        old_rv, new_rv = resource_version(old), resource_version(obj)
        if self._drop_stale and _older_version(new_rv, old_rv):
            return
        if obj is not old:
            # A Sync carries the cached record itself: storing it again is a no-op.
            self.store.update(self._to_stored(obj))
        if old_rv != new_rv or _unconfirmed(old) or self._due_resync:
            await handler.on_update(old, obj)

    def _to_stored(self, obj: CachedObject) -> CachedObject:
        if self._slim is None or not isinstance(obj, dict):
            return obj
        return slim_record(obj, self._slim)
