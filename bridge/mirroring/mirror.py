"""``Mirror``: an informer over the bus, for Python services.

Used as a client-go informer is::

    mirror = Mirror(settings, kinds=["Pod"], keep=["metadata.labels", "spec.nodeName"])
    mirror.add_handler(lambda old, new: ...)      # (None, obj) add, (obj, obj) update, (obj, None) delete
    async with mirror:
        await mirror.synced()
        pod = mirror.get("Pod", "default", "web-0")
        pods = mirror.list("Pod", namespace="default", labels={"app": "web"})

It bootstraps, then follows the change stream (bridge/mirroring/ holds the
readers): on Kafka from the retained change topic read from its start, or
from a ``stateTable`` topic (``state_table_topic=``) and then the change topic
from a little before the state table's newest record; on JetStream from the
last message of every subject (``DeliverPolicy.LAST_PER_SUBJECT``, which then
goes on with every new message), or from the whole retained stream.

Applying is idempotent per object, so overlaps and redeliveries change
nothing: an upsert (``added``, ``modified``, ``snapshot``) is applied only when
its resourceVersion is newer than the one held for the same uid; ``deleted``
removes the object and marks the uid gone (every later event of that uid is
stale); ``filtered`` (the object left the resource's filter) removes it from
view, and the mirror keeps the version it left at, so an older upsert
redelivered later cannot bring it back. A name re-used by a new uid replaces
the old object (its delete comes first on the bus; after a bootstrap from a
state table it may not have).

Heartbeats give each resource's freshness: ``freshness(kind)`` says
``fresh``, ``quiet`` (the bridge is up and synced, nothing changed for
``quiet_after`` s), ``stuck`` (heartbeats stopped for ``stale_intervals``
intervals, or they say the watch is down / not synced) or ``unknown`` (no
heartbeat seen: the resource has no ``heartbeatInterval``).

Memory: objects are kept as the parsed dicts of their JSON. ``keep`` slims
each object to the listed dotted paths (``metadata.name``, ``namespace``,
``uid``, ``resourceVersion``, ``labels`` are always kept); a callable
``keep`` is applied as it is. BENCHMARKS.md states the bytes per mirrored Pod
for both, measured at 100k Pods (bench/mirror.py). ``as_json=True`` holds
each (slimmed) object as its JSON bytes instead, decoded again by ``get`` and
``list`` (a new dict each time): about a quarter of the memory, for a decode
per access.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import orjson

from bridge.consuming.positions import event_uid, rv_of
from bridge.ground.envelope import HEARTBEAT_TYPE, ReceivedEvent
from bridge.logging import get_logger

if TYPE_CHECKING:
    from bridge.service.settings import Settings

log = get_logger(__name__)

Object = dict[str, Any]
Handler = Callable[[Object | None, Object | None], Awaitable[None] | None]
Bootstrap = Literal["auto", "stream", "state-table", "last-per-subject"]
State = Literal["fresh", "quiet", "stuck", "unknown"]

_ALWAYS = ("metadata.name", "metadata.namespace", "metadata.uid", "metadata.resourceVersion",
           "metadata.labels", "apiVersion", "kind")  # fmt: skip


@dataclass(slots=True)
class _Entry:
    uid: str
    rv: int
    # The object, or its JSON (``as_json``): a quarter of the memory, decoded on access.
    held: Object | bytes
    labels: Mapping[str, str]

    @property
    def obj(self) -> Object:
        held = self.held
        return orjson.loads(held) if isinstance(held, bytes) else held


@dataclass(slots=True)
class MirrorStats:
    applied: int = 0  # changes that moved the mirror
    stale: int = 0  # redeliveries and overlaps: not newer than what the mirror holds
    skipped: int = 0  # not ours: not a CloudEvent, not JSON
    heartbeats: int = 0


@dataclass(frozen=True, slots=True)
class Freshness:
    state: State
    reason: str
    seconds_since_heartbeat: float | None = None
    seconds_since_change: float | None = None


@dataclass(slots=True)
class _Beat:
    data: Mapping[str, Any]
    at: float  # time.monotonic() when it arrived


def kind_key(api_version: str, kind: str) -> str:
    """``v1/Pod``, ``apps/v1/Deployment``: how the mirror names a resource."""
    return f"{api_version}/{kind}"


def event_kind_key(event: ReceivedEvent) -> str:
    """The resource of an event, from its type ``io.k8s.{group|core}.{version}.{Kind}.{change}``."""
    parts = event.type.split(".")
    group = ".".join(parts[2:-3])
    version, kind = parts[-3], parts[-2]
    return kind_key(version if group in ("core", "") else f"{group}/{version}", kind)


def slimmer(keep: Sequence[str] | Callable[[Object], Object] | None) -> Callable[[Object], Object]:
    """What the mirror keeps of an object (see the module doc)."""
    if keep is None:
        return lambda obj: obj
    if callable(keep):
        return keep
    paths = [p.split(".") for p in (*_ALWAYS, *keep)]

    def slim(obj: Object) -> Object:
        out: Object = {}
        for path in paths:
            src: Any = obj
            for part in path:
                if not isinstance(src, dict) or part not in src:
                    break
                src = src[part]
            else:
                dst = out
                for part in path[:-1]:
                    dst = dst.setdefault(part, {})
                dst[path[-1]] = src
        return out

    return slim


class Mirror:
    def __init__(
        self,
        settings: Settings,
        *,
        kinds: Iterable[str] | None = None,
        keep: Sequence[str] | Callable[[Object], Object] | None = None,
        bootstrap: Bootstrap = "auto",
        state_table_topic: str | None = None,
        state_table_margin: float = 60.0,
        quiet_after: float = 300.0,
        stale_intervals: float = 3.0,
        as_json: bool = False,
    ) -> None:
        self.settings = settings
        self.as_json = as_json
        self.kinds = {k.lower() for k in kinds} if kinds else None
        self._slim = slimmer(keep)
        if bootstrap == "auto":
            if settings.sink.kind == "nats":
                bootstrap = "last-per-subject"
            else:
                bootstrap = "state-table" if state_table_topic else "stream"
        self.bootstrap = bootstrap
        self.state_table_topic = state_table_topic
        self.state_table_margin = state_table_margin
        self.quiet_after = quiet_after
        self.stale_intervals = stale_intervals
        self.stats = MirrorStats()
        self._tables: dict[str, dict[str, _Entry]] = {}
        self._gone: set[str] = set()  # deleted uids: every later event of theirs is stale
        self._left: dict[str, int] = {}  # uid → resourceVersion it left the filter at
        self._handlers: list[Handler] = []
        self._beats: dict[tuple[str, str], _Beat] = {}
        self._last_change: dict[str, float] = {}
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._pending: list[Awaitable[None]] = []

    # -- the informer API ---------------------------------------------------------

    def add_handler(self, handler: Handler) -> None:
        """``handler(old, new)`` for every change the mirror applies, bootstrap included:
        ``(None, obj)`` added, ``(old, new)`` updated, ``(old, None)`` deleted or filtered."""
        self._handlers.append(handler)

    async def synced(self, timeout: float | None = None) -> None:
        """Returns once the bootstrap is applied (the state up to when the mirror started)."""
        waiter = asyncio.ensure_future(self._synced.wait())
        tasks: set[asyncio.Future[Any]] = {waiter}
        if self._task is not None:
            tasks.add(self._task)
        done, _ = await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if waiter not in done:
            waiter.cancel()
            if self._task is not None and self._task in done:
                self._task.result()  # the reader failed: say why
                raise RuntimeError("the mirror's reader stopped before it synced")
            raise TimeoutError(f"mirror not synced after {timeout}s")

    @property
    def has_synced(self) -> bool:
        return self._synced.is_set()

    def _table(self, kind: str) -> dict[str, _Entry]:
        table = self._tables.get(kind)
        if table is not None:
            return table
        wanted = kind.lower()
        matches = [k for k in self._tables if k.rsplit("/", 1)[-1].lower() == wanted]
        if len(matches) > 1:
            raise ValueError(f"{kind!r} is ambiguous: {', '.join(sorted(matches))}")
        return self._tables[matches[0]] if matches else {}

    def get(self, kind: str, namespace: str | None, name: str) -> Object | None:
        """The object, or None. ``kind``: ``Pod``, or ``v1/Pod`` when two groups share it."""
        entry = self._table(kind).get(f"{namespace}/{name}" if namespace else name)
        return entry.obj if entry else None

    def list(
        self,
        kind: str,
        *,
        namespace: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> list[Object]:
        """Objects of ``kind`` (in ``namespace``; with every label of ``labels``)."""
        out = []
        prefix = f"{namespace}/" if namespace else None
        for key, entry in self._table(kind).items():
            if prefix is not None and not key.startswith(prefix):
                continue
            if labels and any(entry.labels.get(k) != v for k, v in labels.items()):
                continue
            out.append(entry.obj)
        return out

    def __len__(self) -> int:
        return sum(len(t) for t in self._tables.values())

    def freshness(self, kind: str, namespace: str | None = None) -> Freshness:
        """How current the mirror of ``kind`` is, from the bridge's heartbeats."""
        wanted = kind.lower()
        beats = [
            b
            for (k, ns), b in self._beats.items()
            if (k.lower() == wanted or k.rsplit("/", 1)[-1].lower() == wanted)
            and (namespace is None or ns in (namespace, ""))
        ]
        if not beats:
            return Freshness("unknown", "no heartbeat seen (no heartbeatInterval?)")
        beat = max(beats, key=lambda b: b.at)
        now = time.monotonic()
        age = now - beat.at
        data = beat.data
        interval = float(data.get("intervalSeconds") or 30.0)
        since = data.get("secondsSinceLastChange")
        since_change = None if since is None else float(since) + age
        if age > self.stale_intervals * interval:
            return Freshness(
                "stuck",
                f"no heartbeat for {age:.0f}s: the bridge is down, not leading, or cannot reach the bus",
                age,
                since_change,
            )
        if not data.get("watchUp", True) or not data.get("synced", True):
            return Freshness(
                "stuck", "the bridge says its watch is down or not synced", age, since_change
            )
        if since_change is None or since_change > self.quiet_after:
            return Freshness(
                "quiet", "the bridge is up and synced; nothing changed lately", age, since_change
            )
        return Freshness("fresh", "changes and heartbeats are flowing", age, since_change)

    # -- running --------------------------------------------------------------------

    async def start(self) -> None:
        from bridge.mirroring.readers import reader_for

        read = reader_for(self)
        self._task = asyncio.create_task(read, name="mirror-reader")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def __aenter__(self) -> Mirror:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def mark_synced(self) -> None:
        if not self._synced.is_set():
            log.info("mirror synced", objects=len(self), bootstrap=self.bootstrap)
            self._synced.set()

    # -- applying -------------------------------------------------------------------

    def apply_raw(self, raw: bytes | None) -> None:
        if raw is None:
            self.stats.skipped += 1
            return
        try:
            event = ReceivedEvent.parse(raw)
        except ValueError as e:
            self.stats.skipped += 1
            log.warning("mirror: skipping a message that is not a CloudEvent", error=str(e))
            return
        self.apply(event)

    def apply(self, event: ReceivedEvent) -> None:
        """Apply one event (idempotent per object, see the module doc)."""
        if event.type == HEARTBEAT_TYPE:
            self._beat(event)
            return
        kind = event_kind_key(event)
        if self.kinds is not None and not (
            kind.lower() in self.kinds or kind.rsplit("/", 1)[-1].lower() in self.kinds
        ):
            return
        uid = event_uid(event)
        if uid in self._gone:
            self.stats.stale += 1
            return
        rv = rv_of(event) or 0
        change = event.change
        table = self._tables.setdefault(kind, {})
        obj = event.object
        md = obj.get("metadata") or {}
        namespace = md.get("namespace") or ""
        key = f"{namespace}/{md.get('name', '')}" if namespace else str(md.get("name", ""))
        if not md.get("name"):
            key = event.subject
        current = table.get(key)
        if change in ("deleted", "filtered"):
            if change == "deleted":
                self._gone.add(uid)
                self._left.pop(uid, None)
            else:
                if rv <= self._left.get(uid, 0):
                    self.stats.stale += 1
                    return
                self._left[uid] = rv
            if (
                current is not None
                and current.uid == uid
                and (change == "deleted" or rv >= current.rv)
            ):
                del table[key]
                self._changed(kind, current.obj if self._handlers else None, None)
            else:
                self.stats.stale += 1
            return
        if current is not None and current.uid == uid and rv <= current.rv:
            self.stats.stale += 1
            return
        if rv <= self._left.get(uid, 0):
            self.stats.stale += 1
            return
        self._left.pop(uid, None)
        kept = self._slim(obj)
        labels = (kept.get("metadata") or {}).get("labels") or {}
        # orjson's bytes keep the capacity of its write buffer (8 KB for a 3 KB Pod,
        # by tracemalloc): a copy of exactly the bytes is what is held.
        held = bytes(memoryview(orjson.dumps(kept))) if self.as_json else kept
        entry = _Entry(uid, rv, held, labels)
        table[key] = entry
        self._changed(kind, current.obj if current and self._handlers else None, kept)

    def _changed(self, kind: str, old: Object | None, new: Object | None) -> None:
        self.stats.applied += 1
        self._last_change[kind] = time.monotonic()
        for handler in self._handlers:
            result = handler(old, new)
            if result is not None:
                self._pending.append(result)

    @property
    def handlers_pending(self) -> bool:
        return bool(self._pending)

    async def drain_handlers(self) -> None:
        """Await what async handlers returned (the reader does, once per batch)."""
        pending, self._pending = self._pending, []
        for awaitable in pending:
            await awaitable

    def _beat(self, event: ReceivedEvent) -> None:
        self.stats.heartbeats += 1
        data = event.data
        kind = kind_key(str(data.get("apiVersion", "")), str(data.get("kind", "")))
        self._beats[(kind, str(data.get("namespace") or ""))] = _Beat(data, time.monotonic())
