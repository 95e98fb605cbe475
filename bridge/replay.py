"""``k8s-bridge replay``: re-publish the changes made after a resourceVersion.

While the API server still keeps history from that version, a watch from it
yields exactly those changes and they are published again with the ids they
had the first time (consumers recognise them). When the version is compacted
(410), the only truth left is the current state: it is listed and diffed
against the digests in the checkpoint, and that difference is published.
Replay never writes the checkpoint: the running bridge owns it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TextIO

from bridge.app import build_checkpoints, build_sink, resource_id
from bridge.changes import Change, ChangeDetector, ChangeKind, Fingerprinter, object_from_digest
from bridge.errors import ConfigError, ExpiredError
from bridge.events import Event, EventBuilder
from bridge.kube.client import KubeClient
from bridge.kube.discovery import Discovery, ResourceInfo
from bridge.kube.listwatch import ListWatch
from bridge.kube.objects import DeletedFinalStateUnknown, RawObject, namespace_key
from bridge.kube.protocols import ListOptions, WatchOptions
from bridge.logging import get_logger
from bridge.settings import ResourceSettings, Settings
from bridge.sinks.base import Sink

log = get_logger(__name__)

_KINDS = {"ADDED": ChangeKind.ADDED, "MODIFIED": ChangeKind.MODIFIED, "DELETED": ChangeKind.DELETED}


def find_resource(settings: Settings, wanted: str) -> ResourceSettings:
    """The configured resource named by ``Kind`` or ``apiVersion/Kind``."""
    api_version, _, kind = wanted.rpartition("/")
    for res in settings.resources:
        if res.kind.lower() == kind.lower() and (not api_version or res.api_version == api_version):
            return res
    known = ", ".join(f"{r.api_version}/{r.kind}" for r in settings.resources)
    raise ConfigError(
        f"config error: --resource {wanted!r} is not configured (configured: {known})"
    )


def _rv_int(rv: str) -> int:
    try:
        return int(rv)
    except ValueError:
        return -1


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
) -> int:
    res = find_resource(settings, wanted)
    if res.namespaces and namespace is None:
        if len(res.namespaces) > 1:
            raise ConfigError(
                f"config error: --namespace is required: {res.kind} is configured for "
                f"namespaces {', '.join(res.namespaces)}"
            )
        namespace = res.namespaces[0]
    client = await KubeClient.from_kubeconfig(settings.cluster.kubeconfig, settings.cluster.context)
    sink = sink or build_sink(settings)
    try:
        info = await Discovery(client).resolve(res.api_version, res.kind)
        lw = ListWatch(
            client,
            info,
            namespace=namespace,
            label_selector=res.label_selector,
            field_selector=res.field_selector,
        )
        builder = _builder(settings, res, info)
        detector = ChangeDetector(Fingerprinter(res.ignore_fields))
        await sink.start()
        try:
            n = await _replay_watch(lw, builder, detector, sink, from_rv, stop, quiet)
            err.write(f"replayed {n} change(s) of {info.plural} after resourceVersion {from_rv}\n")
        except ExpiredError as e:
            err.write(
                f"resourceVersion {from_rv} is no longer available on the API server ({e}); "
                "publishing the difference between the current state and the stored checkpoint instead\n"
            )
            n = await _replay_diff(settings, lw, info, res, namespace, builder, detector, sink)
            err.write(f"published {n} change(s) of {info.plural} from a relist diff\n")
        return 0
    finally:
        with contextlib.suppress(Exception):
            await sink.close()
        await client.close()


def _builder(settings: Settings, res: ResourceSettings, info: ResourceInfo) -> EventBuilder:
    return EventBuilder(
        cluster=settings.cluster.name,
        group=info.group,
        version=info.version,
        kind=info.kind,
        plural=info.plural,
        redact_secrets=res.redact_secrets,
        mask_paths=res.mask_paths,
    )


async def _replay_watch(
    lw: ListWatch,
    builder: EventBuilder,
    detector: ChangeDetector,
    sink: Sink,
    from_rv: str,
    stop: asyncio.Event,
    quiet: float,
) -> int:
    # Where "now" is: replay ends there (or when the stream stays quiet).
    head = await lw.list(ListOptions(limit=1))
    target = _rv_int(str((head.get("metadata") or {}).get("resourceVersion", "")))
    published = 0
    batch: list[Event] = []
    options = WatchOptions(resource_version=from_rv, allow_watch_bookmarks=True, timeout_seconds=60)
    async with lw.watch(options) as stream:
        while not stop.is_set():
            try:
                event = await asyncio.wait_for(anext(stream), quiet)
            except (TimeoutError, StopAsyncIteration):
                break
            etype = event.get("type")
            obj = event.get("object") or {}
            if etype == "ERROR":
                from bridge.errors import status_error

                raise status_error(obj)
            rv = _rv_int(str((obj.get("metadata") or {}).get("resourceVersion", "")))
            kind = _KINDS.get(str(etype))
            if kind is not None:
                digest = detector.digest_of(obj) if kind is not ChangeKind.DELETED else None
                batch.append(builder.build(Change(kind, obj, namespace_key(obj), digest=digest)))
                if len(batch) >= 500:
                    await sink.publish(batch)
                    published += len(batch)
                    batch = []
            if target >= 0 and rv >= target:
                break
    if batch:
        await sink.publish(batch)
        published += len(batch)
    return published


async def _replay_diff(
    settings: Settings,
    lw: ListWatch,
    info: ResourceInfo,
    res: ResourceSettings,
    namespace: str | None,
    builder: EventBuilder,
    detector: ChangeDetector,
    sink: Sink,
) -> int:
    store = build_checkpoints(settings)
    await store.open()
    try:
        checkpoint = await store.load(resource_id(info, namespace, res))
    finally:
        await store.close()
    digests = dict(checkpoint.digests) if checkpoint else {}
    items: list[RawObject] = []
    token: str | None = None
    while True:
        page = await lw.list(ListOptions(limit=500, continue_token=token))
        for item in page.get("items") or []:
            item.setdefault("apiVersion", info.api_version)
            item.setdefault("kind", info.kind)
            items.append(item)
        token = (page.get("metadata") or {}).get("continue") or None
        if not token:
            break
    changes: list[Change] = []
    for obj in items:
        changes.extend(detector.on_add(obj, digests.pop(namespace_key(obj), None)))
    for key, digest in digests.items():
        last = object_from_digest(digest, api_version=info.api_version, kind=info.kind)
        changes.extend(detector.on_delete(DeletedFinalStateUnknown(key, last)))
    events = [builder.build(c) for c in changes]
    for i in range(0, len(events), 500):
        await sink.publish(events[i : i + 500])
    return len(events)
