"""``k8s-bridge check``: everything ``run`` needs, one line per check, non-zero on any failure."""

from __future__ import annotations

import asyncio
import fcntl
import os
from typing import TextIO

from bridge.checkpoints.base import CheckpointStore, ProbedStore
from bridge.errors import BridgeError, ForbiddenError, NotFoundError
from bridge.ground.natsconfig import subject_matches
from bridge.kube.client import KubeClient
from bridge.kube.discovery import ResourceInfo
from bridge.kube.kinds import read_catalog
from bridge.kube.protocols import ListOptions
from bridge.kube.sharding import ShardRange
from bridge.service.kinds import resolve_entries
from bridge.service.settings import (
    ResourceSettings,
    Settings,
    lease_name,
    resources_for_shard,
)
from bridge.service.wiring import build_checkpoints, build_sink, list_watch

SSAR_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


async def can_i(client: KubeClient, verb: str, info: ResourceInfo, namespace: str | None) -> bool:
    """Ask the API server (SelfSubjectAccessReview) whether we may ``verb`` the resource."""
    return await may(client, verb, info.group, info.plural, namespace)


async def may(
    client: KubeClient,
    verb: str,
    group: str,
    resource: str,
    namespace: str | None = None,
    name: str | None = None,
) -> bool:
    """SelfSubjectAccessReview of ``verb`` on ``resource.group`` (in ``namespace``, on ``name``)."""
    attributes: dict[str, str] = {"verb": verb, "group": group, "resource": resource}
    if namespace:
        attributes["namespace"] = namespace
    if name:
        attributes["name"] = name
    review = await client.request_json(
        "POST",
        SSAR_PATH,
        body={
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        },
    )
    return bool((review.get("status") or {}).get("allowed"))


async def trial_list(
    client: KubeClient,
    info: ResourceInfo,
    namespace: str | None,
    res: ResourceSettings,
    timeout: float,
) -> str | None:
    """LIST one object the way ``run`` will (same selectors); why it fails, or None.

    Access review says nothing about a selector the server rejects (400): only
    the request itself does.
    """
    lw = list_watch(client, info, namespace, res)
    try:
        async with asyncio.timeout(timeout):
            await lw.list(ListOptions(limit=1))
    except (BridgeError, TimeoutError) as e:
        return str(e) or "timed out"
    return None


async def shard_selector_check(
    client: KubeClient,
    info: ResourceInfo,
    namespace: str | None,
    res: ResourceSettings,
    shard: ShardRange,
    timeout: float,
) -> str:
    """LIST one object of ``shard`` and say whether the server applied the selector
    (its echo in the list metadata) or the bridge will filter on the client."""
    lw = list_watch(client, info, namespace, res, shard=shard)
    async with asyncio.timeout(timeout):
        honoured = await lw.probe_shard()
    if honoured:
        return f"shardSelector honoured by the server for {shard.label()}"
    return (
        f"shardSelector NOT honoured (gate ShardedListAndWatch off or a server older than"
        f" 1.36): {shard.label()} is filtered on the client, the whole resource is received"
    )


class _Report:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.failed = 0

    def ok(self, what: str, detail: str) -> None:
        self.out.write(f"ok    {what}: {detail}\n")

    def warn(self, what: str, detail: str) -> None:
        # Something run can live with but a guarantee cannot: said, never an exit 1.
        self.out.write(f"WARN  {what}: {detail}\n")

    def fail(self, what: str, detail: str) -> None:
        self.failed += 1
        self.out.write(f"FAIL  {what}: {detail}\n")
        self.out.flush()


async def run_checks(settings: Settings, out: TextIO, *, timeout: float = 10.0) -> int:
    report = _Report(out)
    report.ok("config", f"{len(settings.resources)} resource(s), sink {settings.sink.kind}")
    try:
        client = await KubeClient.from_kubeconfig(
            settings.cluster.kubeconfig,
            settings.cluster.context,
            compression=settings.cluster.compression,
        )
    except BridgeError as e:
        report.fail("kubeconfig", str(e))
        return 1
    try:
        try:
            async with asyncio.timeout(timeout):
                version = await client.request_json("GET", "/version")
            report.ok("api", f"{client.host} answers, version {version.get('gitVersion', '?')}")
        except (BridgeError, TimeoutError) as e:
            report.fail("api", f"{client.host}: {e or 'timed out'}")
            return 1
        for res, info in await _resources(settings, client, report):
            what = f"resource {res.api_version}/{res.kind}"
            report.ok(
                what,
                f"served as {info.plural} ({'namespaced' if info.namespaced else 'cluster-scoped'})",
            )
            scopes: list[str | None] = list(res.namespaces) or [None]
            shard = settings.sharding.range()
            if shard is not None:
                try:
                    detail = await shard_selector_check(
                        client, info, scopes[0], res, shard, timeout
                    )
                    report.ok(f"{what} shard", detail)
                except (BridgeError, TimeoutError) as e:
                    report.fail(f"{what} shard", f"the sharded LIST fails: {e or 'timed out'}")
            if res.heartbeat_interval:
                _check_heartbeat(settings, res, info, scopes, report)
            for ns in scopes:
                scope = f"in namespace {ns}" if ns else "in all namespaces"
                for verb in ("list", "watch"):
                    try:
                        allowed = await can_i(client, verb, info, ns)
                    except BridgeError as e:
                        report.fail(f"{what} {verb}", f"access review failed: {e}")
                        continue
                    problem = None
                    if allowed and verb == "list":
                        problem = await trial_list(client, info, ns, res, timeout)
                    if problem is not None:
                        report.fail(
                            f"{what} {verb}", f"allowed {scope}, but the LIST fails: {problem}"
                        )
                    elif allowed:
                        report.ok(f"{what} {verb}", f"allowed {scope}")
                    else:
                        report.fail(
                            f"{what} {verb}",
                            f"forbidden {scope}: grant {verb} on {info.plural}"
                            f"{'.' + info.group if info.group else ''}",
                        )
        if settings.leader_election.enabled:
            await _check_lease(settings, client, report)
        if settings.server.control_mode == "kubernetes":
            await _check_control_reviews(client, report)
    finally:
        await client.close()
    _check_dead_letters(settings, report)
    if await _check_sink(settings, report, timeout):
        await _check_bus_durability(settings, report, timeout)
    await _check_checkpoints(settings, report)
    if settings.checkpoint.kind == "nats-kv":
        await _check_bucket_durability(settings, report, timeout)
    _check_ha_checkpoint(settings, report)
    return 1 if report.failed else 0


async def _resources(
    settings: Settings, client: KubeClient, report: _Report
) -> list[tuple[ResourceSettings, ResourceInfo]]:
    """Each entry's resources as ``run`` resolves them; a selecting entry (group, kinds,
    allKinds) says which kinds it takes today, a failing entry fails its line."""
    out: list[tuple[ResourceSettings, ResourceInfo]] = []
    mine = {id(r) for r in resources_for_shard(settings)}
    catalog = None
    for index, res in enumerate(settings.resources):
        if id(res) not in mine:
            continue
        what = f"resources[{index}] kinds" if res.selects_kinds else f"resource {res.gvk}"
        try:
            if res.selects_kinds and catalog is None:
                catalog = await read_catalog(client)
            # One entry at a time: explicit entries taking kinds out are a run-time matter.
            resolved = await resolve_entries(settings, client, [(index, res)], catalog=catalog)
        except BridgeError as e:
            report.fail(what, str(e))
            continue
        if res.selects_kinds:
            report.ok(what, "selects " + (", ".join(r.settings.gvk for r in resolved) or "none"))
        out.extend((r.settings, r.info) for r in resolved)
    return out


# What bridge/kube/lease.py does to its Lease: GET it, POST it when it is missing,
# PUT it to take, renew and release it. A role may limit get and update to the
# Lease's name (the chart does); create cannot be limited by name, so it is asked
# without one.
_LEASE_VERBS = (("get", True), ("create", False), ("update", True))


async def _check_lease(settings: Settings, client: KubeClient, report: _Report) -> None:
    """The rights leader election needs, and its namespace: without them ``run``
    stays a standby for ever, saying so only in one warning."""
    le = settings.leader_election
    ns_what = f"leader election namespace {le.namespace}"
    try:
        await client.request_json("GET", f"/api/v1/namespaces/{le.namespace}")
        report.ok(ns_what, "exists")
    except NotFoundError:
        report.fail(
            ns_what,
            "does not exist, so the Lease cannot be created: create the namespace or set "
            "leaderElection.namespace",
        )
    except ForbiddenError:
        # run never reads namespaces: their absence of rights is no failure.
        report.ok(ns_what, "not verified (get on namespaces is not granted; run needs none)")
    except BridgeError as e:
        report.fail(ns_what, f"cannot read it: {e}")
    name = lease_name(settings)
    what = f"leader election lease {le.namespace}/{name}"
    group, plural = "coordination.k8s.io", "leases"
    denied: list[str] = []
    for verb, named in _LEASE_VERBS:
        try:
            allowed = await may(client, verb, group, plural, le.namespace, name if named else None)
        except BridgeError as e:
            report.fail(what, f"access review failed: {e}")
            return
        if not allowed:
            denied.append(verb)
    verbs = ", ".join(v for v, _ in _LEASE_VERBS)
    if denied:
        report.fail(
            what,
            f"forbidden to {', '.join(denied)} leases.{group} in namespace {le.namespace}: "
            f"grant {verbs} there (a Role bound to the bridge's account), or run stays a "
            "standby and never publishes",
        )
    else:
        report.ok(what, f"{verbs} allowed on leases.{group} in namespace {le.namespace}")


# server.controlAuth kubernetes: each POST /snapshot is a TokenReview and a
# SubjectAccessReview created with the bridge's own credentials (bridge/kube/review.py).
_REVIEWS = (
    ("authentication.k8s.io", "tokenreviews"),
    ("authorization.k8s.io", "subjectaccessreviews"),
)


async def _check_control_reviews(client: KubeClient, report: _Report) -> None:
    what = "control endpoint reviews"
    denied: list[str] = []
    for group, plural in _REVIEWS:
        try:
            allowed = await may(client, "create", group, plural)
        except BridgeError as e:
            report.fail(what, f"access review failed: {e}")
            return
        if not allowed:
            denied.append(f"{plural}.{group}")
    if denied:
        report.fail(
            what,
            f"server.controlAuth is kubernetes but create on {' and '.join(denied)} is "
            "forbidden, so every POST /snapshot would get 503: bind the bridge's account to "
            "the ClusterRole system:auth-delegator, or set server.controlAuth token or none",
        )
    else:
        report.ok(
            what,
            "create allowed on tokenreviews and subjectaccessreviews "
            "(server.controlAuth kubernetes)",
        )


def _check_heartbeat(
    settings: Settings,
    res: ResourceSettings,
    info: ResourceInfo,
    scopes: list[str | None],
    report: _Report,
) -> None:
    """Where the resource's heartbeats go, and whether the NATS stream stores them."""
    from bridge.delivery.heartbeat import HeartbeatTarget

    what = f"resource {res.api_version}/{res.kind} heartbeat"
    every = f"every {res.heartbeat_interval:g}s"
    kind = settings.sink.kind
    if kind == "kafka":
        k = settings.sink.kafka
        report.ok(what, f"{every} to topic {k.heartbeat_topic or k.topic + '.heartbeats'}")
        return
    if kind != "nats":
        report.ok(what, f"{every} to {kind}")
        return
    stream = settings.sink.nats
    for ns in scopes:
        subject = HeartbeatTarget(
            settings.cluster.name, info.group, info.version, info.kind, info.plural, ns
        ).nats_subject
        if any(subject_matches(p, subject) for p in stream.subjects):
            report.ok(what, f"{every} on {subject}")
        else:
            report.fail(
                what,
                f"{subject} is outside sink.nats.subjects {stream.subjects}: the stream would "
                "not store it",
            )


def _check_dead_letters(settings: Settings, report: _Report) -> None:
    """Where ``poisonPolicy: deadLetter`` sends refused events (settings made sure of one)."""
    policy = settings.sink.poison_policy
    users = [r for r in settings.resources if (r.poison_policy or policy) == "deadLetter"]
    if not users:
        return
    which = ", ".join(f"{r.api_version}/{r.kind}" for r in users)
    if settings.sink.kind == "kafka":
        where = f"topic {settings.sink.kafka.dead_letter_topic}"
    else:
        from bridge.sinks.nats import NatsSink

        sink = build_sink(settings)
        assert isinstance(sink, NatsSink)
        stream = sink.dead_letter_stream or sink.stream
        where = f"subject {sink.dead_letter_subject} (stream {stream})"
    report.ok(
        "dead letters",
        f"{which}: refused events go to {where}; their truncated copies to the main stream",
    )


async def _check_sink(settings: Settings, report: _Report, timeout: float) -> bool:
    """Whether the bus answers (the durability check asks it more)."""
    sink = build_sink(settings)
    what = f"sink {settings.sink.kind}"
    try:
        async with asyncio.timeout(timeout):
            await sink.start()
        async with asyncio.timeout(timeout):
            reachable = await sink.ping()
    except (BridgeError, TimeoutError) as e:
        report.fail(what, str(e) or "timed out")
        return False
    finally:
        try:
            await sink.close()
        except BridgeError:
            pass
    if reachable:
        report.ok(what, "reachable")
    else:
        report.fail(what, "not reachable")
    return reachable


async def _check_bus_durability(settings: Settings, report: _Report, timeout: float) -> None:
    """One warning per bus setting below what the guarantees need (bridge/cli/durability.py)."""
    from bridge.cli import durability

    kind = settings.sink.kind
    found: durability.Durability | None
    try:
        if kind == "nats":
            found = await durability.nats_stream(settings.sink.nats, timeout)
        elif kind == "kafka":
            found = await durability.kafka_topic(settings.sink.kafka, timeout)
        else:
            return
    except Exception as e:  # an admin API refused or absent: say so, run may still work
        report.warn(f"sink {kind} durability", f"cannot read it: {e!r}")
        return
    if found is None:
        return
    for problem in found.problems:
        report.warn(found.what, problem)
    if not found.problems:
        report.ok(found.what, found.seen)


async def _check_bucket_durability(settings: Settings, report: _Report, timeout: float) -> None:
    """The NATS KV checkpoint bucket's storage and replicas, warned as the stream's are."""
    from bridge.cli import durability

    bucket = settings.checkpoint.bucket
    try:
        found = await durability.nats_kv_bucket(settings.sink.nats, bucket, timeout)
    except Exception as e:  # as for the stream: say so, run may still work
        report.warn(f"checkpoint nats-kv bucket {bucket} durability", f"cannot read it: {e!r}")
        return
    if found is None:
        return
    for problem in found.problems:
        report.warn(found.what, problem)
    if not found.problems:
        report.ok(found.what, found.seen)


def _check_ha_checkpoint(settings: Settings, report: _Report) -> None:
    if settings.leader_election.enabled and settings.checkpoint.kind == "sqlite":
        report.warn(
            "checkpoint sqlite with leader election",
            "works only for replicas on one host sharing the file; across hosts each "
            "has its own (a volume per pod, or ReadWriteOnce) and a new leader resumes "
            "from a stale checkpoint: use checkpoint.kind nats-kv or kafka",
        )


def sqlite_holder(path: str) -> str | None:
    """The pid of the live process holding the SQLite checkpoint's lock, else None.

    The same ``flock`` the store takes (bridge/checkpoints/sqlite.py), asked
    shared and without waiting; the lock file is never created here.
    """
    try:
        fd = os.open(f"{path}.lock", os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


async def _check_checkpoints(settings: Settings, report: _Report) -> None:
    what = f"checkpoint {settings.checkpoint.kind}"
    path = settings.checkpoint.path
    sqlite_file = settings.checkpoint.kind == "sqlite" and path != ":memory:"
    holder = await asyncio.to_thread(sqlite_holder, path) if sqlite_file else None
    store = _checkpoint_store(settings, holder)
    if isinstance(store, ProbedStore):
        # Its open would create a missing topic or bucket (and the Kafka store reads
        # its whole topic): asked what open would find instead, nothing created or read.
        try:
            report.ok(what, await store.probe())
        except BridgeError as e:
            report.fail(what, str(e))
        finally:
            await _close(store)
        return
    problem = await _opens(store)
    if problem is not None and sqlite_file and holder is None:
        # A bridge may have taken the lock since it was probed: read beside it then.
        holder = await asyncio.to_thread(sqlite_holder, path)
        if holder is not None:
            problem = await _opens(_checkpoint_store(settings, holder))
    if problem is not None:
        report.fail(what, problem)
    elif holder is not None:
        report.ok(what, f"opens read-only: a running k8s-bridge (pid {holder}) holds {path}")
    else:
        report.ok(what, "opens")


def _checkpoint_store(settings: Settings, holder: str | None) -> CheckpointStore:
    if holder is None:
        return build_checkpoints(settings)
    from bridge.checkpoints.sqlite import SqliteCheckpointStore

    # Beside the running bridge: read it as replay does, never take its lock.
    return SqliteCheckpointStore(settings.checkpoint.path, read_only=True)


async def _opens(store: CheckpointStore) -> str | None:
    """Open and close ``store``; why it cannot be opened, or None."""
    try:
        await store.open()
    except BridgeError as e:
        return str(e)
    except OSError as e:
        return f"cannot open: {e}"
    finally:
        await _close(store)
    return None


async def _close(store: CheckpointStore) -> None:
    try:
        await store.close()
    except BridgeError:
        pass
