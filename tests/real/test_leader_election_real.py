"""Leader election on real ``coordination.k8s.io/v1`` Leases of kube-apiserver.

Two ``k8s-bridge run`` replicas, as a Deployment with ``replicas: 2`` runs them
(examples/ha.yaml): both watch the test's namespace, share one JetStream and one
checkpoint (a NATS KV bucket, or one SQLite file as two replicas on one host
share it; a replica's own disk would resume from a stale state), and campaign
for one Lease in that namespace. A standby never opens the checkpoint store until
it holds the Lease: with SQLite, the leader alone holds the file's lock. While ConfigMaps are
created, patched and deleted without pause, the leader is kill -9'd at a random
moment. The standby takes over once the lease, as last renewed, has run out,
and the bus ends up exact: every live object's last event is its current
state, every published object that was deleted has its delete published, and
per object the events are in resourceVersion order (nothing the dead leader
published lands out of order against the new leader's).

The Lease is the real server's: its fields as the bridge writes them
(``holderIdentity``, ``leaseDurationSeconds``, ``acquireTime``/``renewTime`` as
MicroTime, ``leaseTransitions``) pass the server's validation, and a renewal
that meets a 409 (someone wrote the Lease in between) re-reads and renews, as
client-go's optimistic-update fallback does.
"""

from __future__ import annotations

import asyncio
import random
import re
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import pytest

from bridge.cli.check import sqlite_holder
from bridge.errors import ConflictError, KubeError
from bridge.kube.client import KubeClient
from bridge.kube.lease import KubeLeaseClient, LeaderElector, Lease
from tests.e2e.bridge_process import (
    BridgeProcess,
    gauge,
    is_leader,
    jetstream_events,
    kill9,
    published,
    write_config,
)
from tests.fixtures.kube import KubeCluster
from tests.fixtures.nats import NatsServer
from tests.fixtures.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

# leaseDurationSeconds is whole seconds on the wire: a whole LEASE is what the standby waits.
LEASE, RENEW, RETRY = 3, 2.0, 0.4
LEASE_NAME = "k8s-bridge"
MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def micro_time(value: str) -> float:
    assert MICRO_TIME.match(value), f"not a MicroTime: {value!r}"
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def replica(
    tmp_path: Path,
    kubeconfig: Path,
    nats: NatsServer,
    namespace: str,
    identity: str,
    *,
    lease_namespace: str | None = None,
    checkpoint: str = "nats-kv",
    **extra: Any,
) -> BridgeProcess:
    home = tmp_path / identity
    home.mkdir()
    store: dict[str, Any] = {"kind": "nats-kv", "bucket": "k8s-bridge-ha", "commitInterval": 0.1}
    if checkpoint == "sqlite":
        store = {"kind": "sqlite", "path": str(tmp_path / "shared.db"), "commitInterval": 0.1}
    config = write_config(
        home / "bridge.yaml",
        kubeconfig=kubeconfig,
        resources=[{"apiVersion": "v1", "kind": "ConfigMap", "namespaces": [namespace]}],
        sink={"kind": "nats", "nats": {"servers": [nats.url]}},
        checkpoint=store,
        **extra,
        leaderElection={
            "enabled": True,
            "namespace": lease_namespace or namespace,
            "leaseName": LEASE_NAME,
            "identity": identity,
            "leaseDuration": LEASE,
            "renewDeadline": RENEW,
            "retryPeriod": RETRY,
        },
    )
    return BridgeProcess(config)


def configmap(namespace: str, name: str, n: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": {"n": str(n)},
    }


class Churn:
    """Creates, patches and deletes ConfigMaps of one namespace from a thread of its own
    (the cluster client is synchronous), until stopped; never reuses a name."""

    def __init__(self, cluster: KubeCluster, namespace: str, seed: int) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.rng = random.Random(seed)
        self.made: list[tuple[str, str]] = []  # (uid, resourceVersion) of each create/patch
        self.deleted: set[str] = set()  # uids
        self.live: dict[str, tuple[str, int]] = {}  # name -> (uid, n)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def _step(self, i: int) -> None:
        ns = self.namespace
        body = self.cluster.create(configmap(ns, f"cm-{i}", 0))
        self.live[f"cm-{i}"] = (body["metadata"]["uid"], 0)
        self.made.append((body["metadata"]["uid"], body["metadata"]["resourceVersion"]))
        for name in self.rng.sample(sorted(self.live), min(2, len(self.live))):
            uid, n = self.live[name]
            body = self.cluster.patch("v1", "ConfigMap", name, {"data": {"n": str(n + 1)}}, ns)
            self.live[name] = (uid, n + 1)
            self.made.append((uid, body["metadata"]["resourceVersion"]))
        if i % 3 == 2:
            name = self.rng.choice(sorted(self.live))
            self.cluster.delete("v1", "ConfigMap", name, ns)
            self.deleted.add(self.live.pop(name)[0])

    def _run(self) -> None:
        i = 0
        try:
            while not self._stop.is_set():
                self._step(i)
                i += 1
                self._stop.wait(0.05)
        except BaseException as e:  # reported by stop()
            self.error = e

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="churn", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30)
        if self.error is not None:
            raise AssertionError(f"churn failed: {self.error!r}") from self.error


def uid_of(event: dict[str, Any]) -> str:
    return str(event["id"]).split(":", 1)[0]


def change_of(event: dict[str, Any]) -> str:
    return str(event["type"]).rsplit(".", 1)[-1]


@pytest.mark.parametrize("checkpoint", ["nats-kv", "sqlite"])
async def test_kill9_failover_under_churn_on_real_leases(
    tmp_path: Path,
    kube_cluster: KubeCluster,
    kube_namespace: str,
    nats_control: NatsServer,
    checkpoint: str,
) -> None:
    ns = kube_namespace
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    kubeconfig = kube_cluster.write_kubeconfig(tmp_path / "kubeconfig")
    for i in range(3):
        kube_cluster.create(configmap(ns, f"before-{i}", 0))
    a = replica(tmp_path, kubeconfig, nats_control, ns, "replica-a", checkpoint=checkpoint)
    b = replica(tmp_path, kubeconfig, nats_control, ns, "replica-b", checkpoint=checkpoint)
    shared = str(tmp_path / "shared.db")
    churn = Churn(kube_cluster, ns, seed)
    await a.start()
    try:
        await until(lambda: is_leader(a), 60, a.tail_log)
        await a.wait_ready(60)
        await b.start()
        await b.wait_ready(60)  # a standby is ready: healthy and able to lead
        lease = kube_cluster.get("coordination.k8s.io/v1", "Lease", LEASE_NAME, ns)
        spec = lease["spec"]
        assert spec["holderIdentity"] == "replica-a"
        assert spec["leaseDurationSeconds"] == LEASE
        assert spec["leaseTransitions"] == 0
        assert a.proc is not None and b.proc is not None
        if checkpoint == "sqlite":
            # The standby, ready, has not touched the store: the leader alone holds it.
            assert sqlite_holder(shared) == str(a.proc.pid)
        first_acquired = micro_time(spec["acquireTime"])
        assert micro_time(spec["renewTime"]) >= first_acquired

        churn.start()

        async def some_published() -> bool:
            return len(await jetstream_events(nats_control.url)) >= 30

        await until(some_published, 30, a.tail_log)

        # The stream took them; the leader counts an event once its ack is back.
        async def a_counts() -> bool:
            return published(await a.metrics(), None) > 0

        await until(a_counts, 10, a.tail_log)
        # Exactly one replica publishes.
        a_metrics, b_metrics = await a.metrics(), await b.metrics()
        assert gauge(a_metrics, "k8s_bridge_leader") == 1.0
        assert gauge(b_metrics, "k8s_bridge_leader") == 0.0
        assert published(a_metrics, None) > 0
        assert published(b_metrics, None) == 0.0
        renewed = kube_cluster.get("coordination.k8s.io/v1", "Lease", LEASE_NAME, ns)["spec"]
        assert micro_time(renewed["renewTime"]) > micro_time(spec["renewTime"]), "renewals"
        assert renewed["acquireTime"] == spec["acquireTime"]

        await asyncio.sleep(rng.uniform(0, 2 * RETRY))  # a random point of the renew cycle
        kill9(a)
        killed_at = time.monotonic()
        assert a.proc is not None
        await a.proc.wait()
        last_renewal = kube_cluster.get("coordination.k8s.io/v1", "Lease", LEASE_NAME, ns)
        await until(lambda: is_leader(b), 4 * LEASE + 10, b.tail_log)
        takeover = time.monotonic() - killed_at

        # Changes keep coming until the new leader has published some of them.
        async def b_publishes() -> bool:
            return published(await b.metrics(), None) >= 5

        await until(b_publishes, 30, b.tail_log)
        if checkpoint == "sqlite":
            assert sqlite_holder(shared) == str(b.proc.pid)
        await churn.stop()

        def current() -> dict[str, str]:
            items = kube_cluster.list("v1", "ConfigMap", ns)["items"]
            return {o["metadata"]["uid"]: o["metadata"]["resourceVersion"] for o in items}

        live = current()

        async def caught_up() -> bool:
            events = await jetstream_events(nats_control.url)
            last = {uid_of(e): (change_of(e), e["resourceversion"]) for e in events}
            current = all(last.get(uid, ("", ""))[1] == rv for uid, rv in live.items())
            gone = all(last.get(uid, ("deleted", ""))[0] == "deleted" for uid in churn.deleted)
            return current and gone

        await until(caught_up, 60, b.tail_log)
        events = await jetstream_events(nats_control.url)
        b_metrics = await b.metrics()
        lease = kube_cluster.get("coordination.k8s.io/v1", "Lease", LEASE_NAME, ns)
        assert await b.stop() == 0
        released = kube_cluster.get("coordination.k8s.io/v1", "Lease", LEASE_NAME, ns)
    finally:
        await churn.stop()
        if a.proc is not None and a.proc.returncode is None:
            kill9(a)
            await a.proc.wait()
        if b.proc is not None and b.proc.returncode is None:
            await b.stop()

    # The Lease as the real server stored the standby's take-over.
    spec, before = lease["spec"], last_renewal["spec"]
    assert before["holderIdentity"] == "replica-a"
    assert spec["holderIdentity"] == "replica-b"
    assert spec["leaseTransitions"] == 1
    assert spec["leaseDurationSeconds"] == LEASE
    acquired = micro_time(spec["acquireTime"])
    # Never before the lease ran out as the standby last saw it renewed (one clock here).
    assert acquired - micro_time(before["renewTime"]) >= LEASE, (spec, before)
    assert takeover <= LEASE + 2.2 * RETRY + 2.0, takeover
    assert published(b_metrics, None) > 0
    # A graceful stop hands the Lease back (client-go's ReleaseOnCancel): the server took it.
    assert released["spec"]["holderIdentity"] == ""
    assert released["spec"]["leaseDurationSeconds"] == 1
    assert released["spec"]["leaseTransitions"] == 1

    # The bus: per object in resourceVersion order, nothing after its delete, once per id.
    by_uid: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        by_uid[uid_of(e)].append(e)
    for uid, evs in by_uid.items():
        rvs = [int(e["resourceversion"]) for e in evs]
        assert rvs == sorted(rvs), (uid, [(change_of(e), e["resourceversion"]) for e in evs])
        assert all(change_of(e) != "deleted" for e in evs[:-1]), uid
    ids = Counter(e["_msg_id"] for e in events)
    assert not {k: n for k, n in ids.items() if n > 1}, "published more than once"
    last = {uid: evs[-1] for uid, evs in by_uid.items()}
    for uid, rv in live.items():
        assert change_of(last[uid]) in ("added", "modified") and last[uid]["resourceversion"] == rv
    for uid in churn.deleted:
        if uid in last:
            assert change_of(last[uid]) == "deleted", uid
    # The new leader resumed from the shared checkpoint. A watch from its watermark (the
    # server's watch cache keeps minutes of history) brings every change made: none may
    # be missing. Only a relist (which the bridge chooses when a watch cannot settle
    # every key written ahead) may collapse states in between, as the README says.
    resumed = [
        orjson.loads(line)
        for line in b.log.read_text().splitlines()
        if "resuming from checkpoint" in line
    ]
    assert len(resumed) == 1, resumed
    relisted = resumed[0]["relist"]
    on_bus = {(uid_of(e), e["resourceversion"]) for e in events if change_of(e) != "deleted"}
    missing = set(churn.made) - on_bus
    if not relisted:
        assert not missing, f"{len(missing)} changes never published: {sorted(missing)[:5]}"
        assert churn.deleted <= {u for u, evs in by_uid.items() if change_of(evs[-1]) == "deleted"}
    print(
        f"{checkpoint}, seed {seed}: take-over {takeover:.2f}s after kill -9 "
        f"({acquired - micro_time(before['renewTime']):.2f}s after the last renewal, "
        f"lease {LEASE}s); {len(churn.made)} changes, {len(churn.deleted)} deletes, "
        f"{len(events)} events; resumed by {'relist' if relisted else 'watch'}"
    )


async def test_a_lease_the_replica_cannot_write_is_one_warning_line(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, nats_control: NatsServer
) -> None:
    """A ``leaderElection.namespace`` that does not exist (404 on create) or RBAC without
    the Lease verbs (403 on get) keeps a replica a standby for ever, and a standby is
    ready: the log must say why, once, not at every retry."""
    ns = kube_namespace
    absent = f"absent-{uuid.uuid4().hex[:8]}"
    kube_cluster.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "configmaps-only", "namespace": ns},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]}],
        }
    )
    kube_cluster.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "bridge", "namespace": ns},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "configmaps-only",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "bridge", "namespace": ns}],
        }
    )
    token = kube_cluster.service_account_token(ns, "bridge")
    admin = kube_cluster.write_kubeconfig(tmp_path / "admin.kubeconfig")
    account = kube_cluster.write_kubeconfig(tmp_path / "sa.kubeconfig", token=token)
    debug: dict[str, Any] = {"logging": {"format": "json", "level": "debug"}}
    missing = replica(
        tmp_path, admin, nats_control, ns, "no-namespace", lease_namespace=absent, **debug
    )
    forbidden = replica(tmp_path, account, nats_control, ns, "no-rbac", **debug)

    def lines(bridge: BridgeProcess) -> list[dict[str, Any]]:
        text = bridge.log.read_text() if bridge.log.exists() else ""
        return [orjson.loads(line) for line in text.splitlines() if line.startswith("{")]

    def retried(bridge: BridgeProcess, n: int = 4) -> bool:
        failed = [x for x in lines(bridge) if str(x["event"]).startswith("lease ")]
        return len(failed) >= n

    await missing.start()
    await forbidden.start()
    try:
        await until(lambda: retried(missing) and retried(forbidden), 60, missing.tail_log)
        assert not await is_leader(missing) and not await is_leader(forbidden)
    finally:
        codes = [await missing.stop(), await forbidden.stop()]
    assert codes == [0, 0]
    for bridge, lease, why in (
        (missing, f"{absent}/{LEASE_NAME}", f'namespaces "{absent}" not found'),
        (forbidden, f"{ns}/{LEASE_NAME}", 'cannot get resource "leases"'),
    ):
        warned = [x for x in lines(bridge) if x["level"] == "warning" and x.get("lease") == lease]
        assert len(warned) == 1, (lease, warned)
        assert why in warned[0]["error"], warned[0]
        assert "leader election lease" in warned[0]["event"]


# -- the Lease API itself, in process ----------------------------------------------------


class RecordingLeases:
    """The real ``KubeLeaseClient``, recording what each update met."""

    def __init__(self, inner: KubeLeaseClient) -> None:
        self.inner = inner
        self.outcomes: list[KubeError | None] = []  # per update: None when it succeeded

    async def get(self, namespace: str, name: str) -> Lease:
        return await self.inner.get(namespace, name)

    async def create(self, namespace: str, lease: Lease) -> Lease:
        return await self.inner.create(namespace, lease)

    async def update(self, namespace: str, lease: Lease) -> Lease:
        try:
            updated = await self.inner.update(namespace, lease)
        except KubeError as e:
            self.outcomes.append(e)
            raise
        self.outcomes.append(None)
        return updated

    def renewed_after_conflict(self, since: int) -> bool:
        """An update refused with 409 since ``since``, then one that succeeded."""
        later = self.outcomes[since:]
        first = next((i for i, e in enumerate(later) if isinstance(e, ConflictError)), None)
        return first is not None and None in later[first:]


@pytest.fixture
async def client(tmp_path: Path, kube_cluster: KubeCluster) -> AsyncIterator[KubeClient]:
    path = kube_cluster.write_kubeconfig(tmp_path / "kubeconfig")
    made = await KubeClient.from_kubeconfig(str(path))
    try:
        yield made
    finally:
        await made.close()


async def test_lease_fields_and_conflicts_on_the_real_server(
    client: KubeClient, kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    ns = kube_namespace
    leases = KubeLeaseClient(client)
    # The premise: the server validates a Lease's times (a bad MicroTime is refused),
    # so the elector's leases being stored means their fields are well formed.
    status, body = kube_cluster.raw(
        "POST",
        f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
        {"metadata": {"name": "bad"}, "spec": {"renewTime": "2026-11-26 10:00:00"}},
    )
    assert status == 400, (status, body)
    status, body = kube_cluster.raw(
        "POST",
        f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
        {"metadata": {"name": "bad"}, "spec": {"leaseDurationSeconds": 0}},
    )
    assert status == 422, (status, body)

    # Create twice: AlreadyExists; a PUT over a stale resourceVersion: Conflict.
    created = await leases.create(
        ns, {"metadata": {"name": "x", "namespace": ns}, "spec": {"holderIdentity": "a"}}
    )
    with pytest.raises(ConflictError) as exists:
        await leases.create(ns, {"metadata": {"name": "x", "namespace": ns}, "spec": {}})
    assert exists.value.reason == "AlreadyExists"
    created["spec"]["holderIdentity"] = "b"
    await leases.update(ns, created)
    created["spec"]["holderIdentity"] = "c"
    with pytest.raises(ConflictError) as stale:
        await leases.update(ns, created)
    assert stale.value.reason == "Conflict"
    assert (await leases.get(ns, "x"))["spec"]["holderIdentity"] == "b"

    # A leader whose renewal meets a 409 (the Lease was written by someone else, the
    # record unchanged) re-reads and renews in the same attempt: it never stops leading.
    recording = RecordingLeases(leases)
    elector = LeaderElector(
        recording,
        namespace=ns,
        name=LEASE_NAME,
        identity="in-process",
        lease_duration=LEASE,
        renew_deadline=RENEW,
        retry_period=RETRY,
    )
    stops: list[float] = []
    leading = asyncio.Event()

    async def started() -> None:
        leading.set()

    async def stopped() -> None:
        stops.append(time.monotonic())

    run = asyncio.create_task(elector.run(started, stopped), name="elector")
    try:
        async with asyncio.timeout(30):
            await leading.wait()
        stored = kube_cluster.get("coordination.k8s.io/v1", "Lease", LEASE_NAME, ns)
        spec = stored["spec"]
        assert spec["holderIdentity"] == "in-process"
        assert spec["leaseDurationSeconds"] == LEASE and spec["leaseTransitions"] == 0
        micro_time(spec["acquireTime"])
        for round_ in range(3):
            since = len(recording.outcomes)
            kube_cluster.patch(
                "coordination.k8s.io/v1",
                "Lease",
                LEASE_NAME,
                {"metadata": {"labels": {"touched": str(round_)}}},
                ns,
            )
            await until(partial(recording.renewed_after_conflict, since), 20)
        conflicts = [e for e in recording.outcomes if isinstance(e, ConflictError)]
        assert len(conflicts) >= 3 and {e.reason for e in conflicts} == {"Conflict"}
        assert micro_time(stored["spec"]["renewTime"]) < micro_time(
            kube_cluster.get("coordination.k8s.io/v1", "Lease", LEASE_NAME, ns)["spec"]["renewTime"]
        )
        assert elector.is_leader and not stops
        stored = kube_cluster.get("coordination.k8s.io/v1", "Lease", LEASE_NAME, ns)
        assert stored["spec"]["holderIdentity"] == "in-process"
        assert stored["spec"]["acquireTime"] == spec["acquireTime"]
        assert stored["spec"]["leaseTransitions"] == 0
        assert stored["metadata"]["labels"] == {"touched": "2"}, "the other writer's change kept"
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
    released = kube_cluster.get("coordination.k8s.io/v1", "Lease", LEASE_NAME, ns)["spec"]
    assert released["holderIdentity"] == "" and released["leaseDurationSeconds"] == 1
