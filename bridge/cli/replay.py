"""``k8s-bridge replay``: re-publish the changes made after a resourceVersion.

While the API server still keeps history from that version, a watch from it
yields exactly those changes and they are published again with the ids they
had the first time (consumers recognise them). When the version is gone (410:
compacted, or, on kube-apiserver, older than the watch cache that serves
watches, which a restart empties), the only truth left is the current state: it is listed and diffed
against the digests in the checkpoint, and that difference is published.
Replay never writes the checkpoint: the running bridge owns it.

Each replayed event keeps its CloudEvent ``id`` but gets a bus-level dedupe
id of its own run (``{id}:replay:{run}``): the originals, or an earlier
replay, are still inside JetStream's duplicate window when someone replays,
and the stream would otherwise drop every copy and replay would claim
changes nobody received. The count printed is what the bus kept (see
``bridge.cli.stored``).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from bridge.checkpoints.base import Checkpoint, CheckpointStore
from bridge.checkpoints.sqlite import SqliteCheckpointStore
from bridge.cli.stored import AckedCounter, JetStreamCounter, StoredCounter
from bridge.delivery.changes import Change, ChangeDetector, ChangeKind, object_from_digest
from bridge.delivery.events import EventBuilder
from bridge.delivery.filters import Filter
from bridge.errors import ConfigError, ExpiredError, TooLargeResourceVersionError, status_error
from bridge.ground.digest import GONE
from bridge.ground.envelope import Event
from bridge.kube.client import KubeClient
from bridge.kube.discovery import Discovery, ResourceInfo
from bridge.kube.listwatch import ListWatch
from bridge.kube.objects import DeletedFinalStateUnknown, RawObject, namespace_key
from bridge.kube.protocols import ListOptions, WatchOptions
from bridge.logging import get_logger
from bridge.service.configured import find_resource, pick_namespace
from bridge.service.settings import Settings
from bridge.service.wiring import (
    build_checkpoints,
    build_sink,
    checkpoint_id,
    event_builder,
    list_watch,
    object_decoder,
    resource_fingerprinter,
)
from bridge.sinks.base import Sink

log = get_logger(__name__)


def _rv_int(rv: str) -> int:
    try:
        return int(rv)
    except ValueError:
        return -1


def _positive_rv(raw: str) -> str:
    # "0" and "" mean "any version" to the API server: nothing to replay from.
    if not raw.isdigit() or int(raw) <= 0:
        raise ConfigError(
            f"config error: --from-resource-version {raw!r} is not a resourceVersion "
            "(a positive integer as shown in metadata.resourceVersion or an event)"
        )
    return raw


class _RunPublisher:
    """Publishes replayed events under this run's bus-level dedupe id, counting the acks.

    An event the bus refused for good was not published: it is counted apart
    (``refused``) and logged, never among ``acked``, and the batches are cut at
    the sink's ``maxBatch`` as the running bridge cuts them.
    """

    def __init__(self, sink: Sink, run_id: str, max_batch: int) -> None:
        self.sink = sink
        self.suffix = f":replay:{run_id}"
        self.max_batch = max_batch
        self.acked = 0
        self.refused = 0

    async def publish(self, events: Sequence[Event]) -> None:
        for i in range(0, len(events), self.max_batch):
            part = events[i : i + self.max_batch]
            refused = await self.sink.publish([replace(e, msg_id=e.id + self.suffix) for e in part])
            for j, reason in sorted(refused.items()):
                log.warning(
                    "the bus refused a replayed event for good",
                    subject=part[j].subject,
                    id=part[j].id,
                    reason=reason,
                )
            self.refused += len(refused)
            self.acked += len(part) - len(refused)


def _stored_counter(settings: Settings, suffix: str) -> StoredCounter:
    if settings.sink.kind != "nats":
        return AckedCounter()

    n = settings.sink.nats
    return JetStreamCounter(
        n.servers,
        n.stream,
        suffix,
        credentials=n.credentials,
        nkey_seed=n.nkey_seed,
        tls=settings.sink.nats.tls_context(),
    )


def _outcome(stored: int | None, acked: int, run_id: str, refused: int = 0) -> tuple[int, str]:
    """The count to print (what the bus kept) and the note that follows the line."""
    note = f"; {refused} refused by the bus for good (see the log)" if refused else ""
    if stored is None:
        stored = acked
        note += "; acknowledged, but the stream could not be read back to count what it kept"
    elif stored < acked:
        note += f"; {acked - stored} more were dropped by the bus as duplicates"
    return stored, f" (replay run {run_id}{note})"


async def replay(
    settings: Settings,
    wanted: str,
    from_rv: str,
    namespace: str | None,
    stop: asyncio.Event,
    err: TextIO,
    *,
    quiet: float = 2.0,
    sink: Sink | None = None,
    counter: StoredCounter | None = None,
) -> int:
    """Publish again what changed in ``wanted`` after ``from_rv``; returns the exit code.

    Without ``counter``, the count printed is read back from the bus the
    settings name when it is NATS (an injected ``sink`` is trusted by its acks).
    """
    res = find_resource(settings, wanted)
    from_rv = _positive_rv(from_rv)
    namespace = pick_namespace(res, namespace)
    run_id = secrets.token_hex(4)
    cluster = settings.cluster
    client = await KubeClient.from_kubeconfig(
        cluster.kubeconfig, cluster.context, compression=cluster.compression
    )
    injected = sink is not None
    sink = sink or build_sink(settings)
    out = _RunPublisher(sink, run_id, settings.sink.max_batch)
    if counter is None:
        counter = AckedCounter() if injected else _stored_counter(settings, out.suffix)
    try:
        info = await Discovery(client).resolve(res.api_version, res.kind)
        if namespace and not info.namespaced:
            raise ConfigError(
                f"config error: --namespace {namespace!r}: {res.api_version}/{res.kind} is "
                "cluster-scoped"
            )
        builder = event_builder(settings, res, info)
        fingerprinter = resource_fingerprinter(res)
        detector = ChangeDetector(fingerprinter)
        filter = Filter(res.filter, label=info.plural) if res.filter else None
        view = _View(filter)
        lw = list_watch(
            client,
            info,
            namespace,
            res,
            decoder=object_decoder(fingerprinter, builder, filter),
            # A shard replays its own slice, against its own checkpoint.
            shard=settings.sharding.range(),
        )
        await sink.start()
        await counter.start()
        try:
            try:
                await _replay_watch(lw, builder, detector, view, out, from_rv, stop, quiet)
            except TooLargeResourceVersionError:
                raise await _future_rv(lw, info, from_rv) from None
            n, note = _outcome(await counter.count(out.acked), out.acked, run_id, out.refused)
            err.write(
                f"replayed {n} change(s) of {info.plural} after resourceVersion {from_rv}{note}\n"
            )
        except ExpiredError:
            # The checkpoint is kept per configured scope: all namespaces in one, or one each.
            rid = checkpoint_id(settings, info, namespace if res.namespaces else None, res)
            err.write(
                f"resourceVersion {from_rv} of {info.plural} is no longer available on the "
                f"API server (compacted, or older than its watch cache); publishing the difference between the current state "
                f"and the checkpoint of {rid} instead\n"
            )
            # One namespace of an all-namespaces checkpoint: only its digests take part.
            only = namespace if not res.namespaces else None
            await _replay_diff(settings, lw, info, rid, only, builder, detector, view, out, err)
            n, note = _outcome(await counter.count(out.acked), out.acked, run_id, out.refused)
            err.write(f"published {n} change(s) of {info.plural} from a relist diff{note}\n")
        return 0
    finally:
        with contextlib.suppress(Exception):
            await counter.close()
        with contextlib.suppress(Exception):
            await sink.close()
        await client.close()


async def _future_rv(lw: ListWatch, info: ResourceInfo, from_rv: str) -> ConfigError:
    """The one line for an RV the server has not reached (its own says "Too large
    resource version", naming neither the resource nor the RV)."""
    head = await lw.list(ListOptions(limit=1))
    current = str((head.get("metadata") or {}).get("resourceVersion", "")) or "unknown"
    return ConfigError(
        f"config error: --from-resource-version {from_rv}: resourceVersion {from_rv} of "
        f"{info.plural} is newer than the API server's ({current}); replay needs a "
        "resourceVersion the server has served (an event's resourceversion, or a "
        "checkpoint's watermark)"
    )


async def _list_all(lw: ListWatch, options: ListOptions) -> tuple[list[RawObject], str]:
    """Every page of a LIST; returns the items and the list's resourceVersion."""
    items: list[RawObject] = []
    token: str | None = None
    list_rv = ""
    while True:
        page = await lw.list(replace(options, continue_token=token))
        items.extend(page.get("items") or [])
        md = page.get("metadata") or {}
        list_rv = list_rv or str(md.get("resourceVersion", ""))
        token = md.get("continue") or None
        if not token:
            return items, list_rv


class _View:
    """A resource's filter as the running bridge applies it: which objects are in view
    (published), and what entering or leaving it publishes (see bridge/delivery/filters.py)."""

    def __init__(self, filter: Filter | None) -> None:
        self.filter = filter
        self.keys: set[str] = set()

    def holds(self, obj: RawObject, old: RawObject | None, type: str) -> bool:
        return self.filter is None or self.filter.matches(obj, old, type)

    def changes(
        self, detector: ChangeDetector, previous: RawObject | None, obj: RawObject
    ) -> list[Change] | None:
        """What the filter decides for an add or update; None: the detector decides."""
        if self.filter is None:
            return None
        key = namespace_key(obj)
        was_in = key in self.keys
        if not self.filter.matches(obj, previous, "modified" if previous else "added"):
            self.keys.discard(key)
            return [Change(ChangeKind.FILTERED, obj, key)] if was_in else []
        self.keys.add(key)
        return None if was_in else detector.on_add(obj)


async def _replay_watch(
    lw: ListWatch,
    builder: EventBuilder,
    detector: ChangeDetector,
    view: _View,
    out: _RunPublisher,
    from_rv: str,
    stop: asyncio.Event,
    quiet: float,
) -> None:
    """The changes after ``from_rv``, decided exactly as the running bridge decided them.

    The bridge published only real changes (an update of ignored fields published
    nothing), so replay needs the state at ``from_rv`` to compare against: an
    exact LIST at that version (410 when compacted, like the watch).
    """
    baseline, _ = await _list_all(
        lw, ListOptions(resource_version=from_rv, resource_version_match="Exact", limit=500)
    )
    state: dict[str, RawObject] = {namespace_key(o): o for o in baseline}
    # In view at from_rv: what the filter holds for then (the bridge's history before
    # it is not known; an object's membership follows its state).
    view.keys = {k for k, o in state.items() if view.holds(o, None, "modified")}
    # Where "now" is: replay ends there (or when the stream stays quiet).
    head = await lw.list(ListOptions(limit=1))
    target = _rv_int(str((head.get("metadata") or {}).get("resourceVersion", "")))
    batch: list[Event] = []
    options = WatchOptions(resource_version=from_rv, allow_watch_bookmarks=True, timeout_seconds=60)
    async with lw.watch(options) as stream:
        while not stop.is_set() and _rv_int(from_rv) < target:
            try:
                async with asyncio.timeout(quiet):
                    event = await anext(stream)
            except (TimeoutError, StopAsyncIteration):
                break
            etype = event.get("type")
            obj = event.get("object") or {}
            if etype == "ERROR":
                raise status_error(dict(obj))
            rv = _rv_int(str((obj.get("metadata") or {}).get("resourceVersion", "")))
            if etype in ("ADDED", "MODIFIED", "DELETED"):
                changes = _changes(detector, view, state, str(etype), obj)
                batch.extend(builder.build(c) for c in changes)
                if len(batch) >= out.max_batch:
                    await out.publish(batch)
                    batch = []
            if target >= 0 and rv >= target:
                break
    await out.publish(batch)


def _changes(
    detector: ChangeDetector,
    view: _View,
    state: dict[str, RawObject],
    etype: str,
    obj: RawObject,
) -> list[Change]:
    key = namespace_key(obj)
    if etype == "DELETED":
        state.pop(key, None)
        if view.filter is not None and key not in view.keys:
            return []  # never published
        view.keys.discard(key)
        return detector.on_delete(obj)
    previous = state.get(key)
    state[key] = obj
    decided = view.changes(detector, previous, obj)
    if decided is not None:
        return decided
    if previous is None:
        return detector.on_add(obj)
    return detector.on_update(previous, obj)


async def _load_checkpoint(settings: Settings, rid: str, err: TextIO) -> Checkpoint | None:
    """The running bridge's checkpoint, read without creating or changing anything."""
    kind = settings.checkpoint.kind
    if kind == "memory":
        err.write("checkpoint.kind is memory: no stored digests, every object counts as added\n")
        return None
    if kind == "sqlite" and not await asyncio.to_thread(Path(settings.checkpoint.path).exists):
        err.write(
            f"no checkpoint file at {settings.checkpoint.path}: every object counts as added\n"
        )
        return None
    # Read-only and without the process lock: the running bridge holds that lock
    # and keeps writing; SQLite's WAL serves this reader its last commit meanwhile.
    store: CheckpointStore = (
        SqliteCheckpointStore(settings.checkpoint.path, read_only=True)
        if kind == "sqlite"
        else build_checkpoints(settings)
    )
    await store.open()
    try:
        checkpoint = await store.load(rid)
    finally:
        await store.close()
    if checkpoint is None:
        err.write(f"no checkpoint for {rid}: every object counts as added\n")
    return checkpoint


async def _replay_diff(
    settings: Settings,
    lw: ListWatch,
    info: ResourceInfo,
    rid: str,
    only_namespace: str | None,
    builder: EventBuilder,
    detector: ChangeDetector,
    view: _View,
    out: _RunPublisher,
    err: TextIO,
) -> None:
    checkpoint = await _load_checkpoint(settings, rid, err)
    # A GONE row is an object whose delete is already on the bus.
    digests = {k: d for k, d in checkpoint.digests.items() if d.state != GONE} if checkpoint else {}
    if only_namespace:
        digests = {k: d for k, d in digests.items() if k.startswith(f"{only_namespace}/")}
    items, _ = await _list_all(lw, ListOptions(limit=500))
    changes: list[Change] = []
    for obj in items:
        known = digests.pop(namespace_key(obj), None)
        if not view.holds(obj, None, "modified" if known else "added"):
            # Outside the filter: published as leaving it if the checkpoint holds it.
            if known is not None:
                changes.append(Change(ChangeKind.FILTERED, obj, namespace_key(obj)))
            continue
        changes.extend(detector.on_add(obj, known))
    for key, digest in digests.items():
        last = object_from_digest(digest, api_version=info.api_version, kind=info.kind)
        changes.extend(detector.on_delete(DeletedFinalStateUnknown(key, last)))
    await out.publish([builder.build(c) for c in changes])
