"""The bridge's own scenarios on a real kube-apiserver + etcd, through a real JetStream.

``k8s-bridge run`` as a process watches Pods in the test's own namespace:
the first sync by paginated LIST and by streaming list (and proof, from the
bridge's log and from kube-apiserver's own metrics, of which one was used);
live changes; a watch cut and resumed from the streaming list's bookmark
without a relist; an API server restart; a 410 after a real etcd compaction
with deletes while the bridge was down; and a graceful restart that
publishes nothing.

"Nothing else was published" is never a sleep: each test waits until the
bridge's checkpoint watermark reached the resourceVersion of the last change
it made (every event up to it is then acknowledged by the bus), and until
the bridge's own metrics counted what it published.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.bridge_process import BridgeProcess, jetstream_events, kill9, write_config
from tests.e2e.sharding_world import pod
from tests.fixtures.kube import KubeCluster
from tests.fixtures.nats import NatsServer
from tests.fixtures.waiting import until

pytestmark = [pytest.mark.timeout(240)]

Body = dict[str, Any]


def make_pods(cluster: KubeCluster, ns: str, n: int, prefix: str = "p") -> dict[str, Body]:
    return {f"{prefix}{i}": cluster.create(pod(f"{prefix}{i}", ns)) for i in range(n)}


def uid_rv(obj: Body) -> tuple[str, int]:
    md = obj["metadata"]
    return md["uid"], int(md["resourceVersion"])


def set_condition(cluster: KubeCluster, ns: str, name: str, status: str) -> Body:
    """A change of status.conditions alone (the status subresource), which ignoreFields hides."""
    path = cluster.path("v1", "Pod", ns, name) + "/status"
    body = {"status": {"conditions": [{"type": "Ready", "status": status}]}}
    out: Body = cluster.request("PATCH", path, body, content_type="application/merge-patch+json")
    return out


def relabel(cluster: KubeCluster, ns: str, name: str, value: str) -> Body:
    return cluster.patch("v1", "Pod", name, {"metadata": {"labels": {"v": value}}}, namespace=ns)


class Setup:
    """One bridge's config, checkpoint and bus for Pods in one namespace."""

    def __init__(
        self,
        tmp_path: Path,
        cluster: KubeCluster,
        ns: str,
        nats: NatsServer,
        *,
        informer: Body | None = None,
        kubeconfig: Path | None = None,
        max_batch: int | None = None,
    ) -> None:
        self.cluster = cluster
        self.ns = ns
        self.nats = nats
        self.db = tmp_path / "state.db"
        self.resource_id = f"core/v1/pods@{ns}"
        self.label = f"v1/pods@{ns}"
        extra: Body = {"informer": informer} if informer else {}
        self.config = write_config(
            tmp_path / "bridge.yaml",
            kubeconfig=kubeconfig or cluster.write_kubeconfig(tmp_path / "kubeconfig"),
            sink={"kind": "nats", "nats": {"servers": [nats.url]}}
            | ({"maxBatch": max_batch} if max_batch else {}),
            resources=[
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "namespaces": [ns],
                    "ignoreFields": ["status.conditions"],
                }
            ],
            checkpoint={"kind": "sqlite", "path": str(self.db), "commitInterval": 0.1},
            **extra,
        )

    def bridge(self) -> BridgeProcess:
        return BridgeProcess(self.config)

    async def events(self) -> list[Body]:
        return await jetstream_events(self.nats.url)

    def written_ahead(self) -> tuple[int, str]:
        """(digest rows, stored watermark) as the checkpoint has them now."""
        if not self.db.exists():
            return 0, ""
        con = sqlite3.connect(self.db)
        try:
            rows = con.execute(
                "select count(*) from digests where resource_id = ?", (self.resource_id,)
            ).fetchone()[0]
            row = con.execute(
                "select resource_version from watermarks where resource_id = ?",
                (self.resource_id,),
            ).fetchone()
        except sqlite3.OperationalError:  # the tables are not there yet
            return 0, ""
        finally:
            con.close()
        return int(rows), str(row[0]) if row and row[0] else ""

    def watermark(self) -> int:
        """The committed watermark (0 before the first commit) and no digest uncertain."""
        if not self.db.exists():
            return 0
        con = sqlite3.connect(self.db)
        try:
            row = con.execute(
                "select resource_version from watermarks where resource_id = ?",
                (self.resource_id,),
            ).fetchone()
            pending = con.execute(
                "select count(*) from digests where resource_id = ? and state != ''",
                (self.resource_id,),
            ).fetchone()[0]
        except sqlite3.OperationalError:  # the tables are not there yet
            return 0
        finally:
            con.close()
        return int(row[0]) if row and row[0] and pending == 0 else 0

    async def caught_up(self, bridge: BridgeProcess, rv: int, timeout: float = 30) -> None:
        """Every event up to ``rv`` is acknowledged by the bus and checkpointed."""
        await until(
            lambda: self.watermark() >= rv,
            timeout,
            lambda: f"watermark {self.watermark()} < {rv}; log:\n{bridge.tail_log()}",
        )

    async def published(self, bridge: BridgeProcess, want: dict[str, int]) -> None:
        """The bridge's metrics count exactly ``want`` events per type (its observer
        carries counts over once a second): a second publish would show here even
        where JetStream's duplicate window dropped it."""

        async def counted() -> dict[str, int]:
            text = await bridge.metrics()
            return {
                t: int(v)
                for (t, v) in by_label(
                    text, "k8s_bridge_events_published_total", "type", resource=self.label
                ).items()
            }

        seen: dict[str, int] = {}

        async def ok() -> bool:
            nonlocal seen
            seen = await counted()
            return seen == {k: v for k, v in want.items() if v}

        try:
            await until(ok, 10, lambda: f"published {seen}, want {want}")
        except AssertionError as e:
            raise AssertionError(f"{e}; on the bus: {summary(await self.events())}") from None


def by_label(text: str, name: str, label: str, **match: str) -> dict[str, float]:
    """Samples of ``name`` whose labels include ``match``, summed by ``label``."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in match.items()):
                key = s.labels.get(label, "")
                out[key] = out.get(key, 0.0) + s.value
    return out


def apiserver_count(cluster: KubeCluster, name: str, **match: str) -> float:
    """A counter of kube-apiserver's own /metrics (summed over the other labels)."""
    status, text = cluster.raw("GET", "/metrics")
    assert status == 200, text
    return sum(by_label(text, name, "__none__", **match).values())


async def watch_down(bridge: BridgeProcess, label: str) -> bool:
    up = by_label(await bridge.metrics(), "k8s_bridge_watch_up", "resource", resource=label)
    return up == {label: 0.0}


def log_lines(bridge: BridgeProcess, event: str, since: int = 0) -> list[Body]:
    """The bridge's JSON log lines of ``event``, from byte ``since`` of its log on."""
    with bridge.log.open("rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    out = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if doc.get("event") == event:
                out.append(doc)
    return out


def ids_of(objs: dict[str, Body]) -> list[str]:
    return sorted(
        f"{o['metadata']['uid']}:{o['metadata']['resourceVersion']}" for o in objs.values()
    )


def summary(events: list[Body]) -> list[tuple[str, str, str]]:
    """(change, subject, id) of each event in bus order."""
    return [(e["type"].rsplit(".", 1)[-1], e["subject"], e["id"]) for e in events]


# -- 1. the first sync ----------------------------------------------------------------------


async def initial_sync(setup: Setup, pods: dict[str, Body]) -> tuple[list[Body], BridgeProcess]:
    bridge = setup.bridge()
    await bridge.start()
    try:
        await bridge.wait_ready(60)
        await setup.caught_up(bridge, max(uid_rv(o)[1] for o in pods.values()))
        await setup.published(bridge, {"added": len(pods)})
        events = await setup.events()
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
    assert sorted(e["id"] for e in events) == ids_of(pods)
    assert all(e["initial"] is True for e in events), summary(events)
    assert {e["type"] for e in events} == {"io.k8s.core.v1.Pod.added"}
    return events, bridge


async def test_first_sync_by_list_publishes_each_pod_once(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, nats_control: NatsServer
) -> None:
    pods = make_pods(kube_cluster, kube_namespace, 300)
    lists = {"verb": "LIST", "resource": "pods", "scope": "namespace"}
    before = apiserver_count(kube_cluster, "apiserver_request_total", **lists)
    setup = Setup(
        tmp_path,
        kube_cluster,
        kube_namespace,
        nats_control,
        informer={"watchList": "off", "pageSize": 25},
    )
    _, bridge = await initial_sync(setup, pods)
    # The first LIST asks for resourceVersion "0" with limit=25, as client-go's
    # reflector does, and kube-apiserver's watch cache serves "0" whole: it ignores
    # the limit (cacher.go computeListLimit). One page, one request.
    listed = log_lines(bridge, "listed")
    assert [(x["mode"], x["items"], x["pages"]) for x in listed] == [("list", 300, 1)], listed
    after = apiserver_count(kube_cluster, "apiserver_request_total", **lists)
    assert after - before == 1


async def test_first_sync_cut_by_kill9_is_redone_by_a_paginated_consistent_list(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, nats_control: NatsServer
) -> None:
    """The paginated LIST, for real: a bridge killed in its first sync left events
    written ahead and no watermark, so the next one lists the latest state (a
    consistent read, resourceVersion "") in pages of informer.pageSize, diffed
    against those rows: each Pod reaches the stream once."""
    pods = make_pods(kube_cluster, kube_namespace, 300)
    setup = Setup(
        tmp_path,
        kube_cluster,
        kube_namespace,
        nats_control,
        informer={"watchList": "off", "pageSize": 25},
        max_batch=1,  # a first sync of 300 publishes: the kill lands inside it
    )
    bridge = setup.bridge()
    await bridge.start()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    # Rows written ahead, no watermark yet (it comes once all 300 are acknowledged).
    while not setup.written_ahead()[0]:
        assert bridge.proc is not None and bridge.proc.returncode is None, bridge.tail_log()
        assert loop.time() < deadline, bridge.tail_log()
        await asyncio.sleep(0.005)
    kill9(bridge)
    assert bridge.proc is not None
    await bridge.proc.wait()
    assert not setup.written_ahead()[1], "the first sync ended before the kill"
    since = bridge.log.stat().st_size
    lists = {"verb": "LIST", "resource": "pods", "scope": "namespace"}
    before = apiserver_count(kube_cluster, "apiserver_request_total", **lists)

    bridge = setup.bridge()
    await bridge.start()
    try:
        await bridge.wait_ready(60)
        await setup.caught_up(bridge, max(uid_rv(o)[1] for o in pods.values()))
        events = await setup.events()
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
    resumed = log_lines(bridge, "resuming from checkpoint", since)
    assert [(x["relist"], x["resource_version"]) for x in resumed] == [(True, "")], resumed
    listed = log_lines(bridge, "listed", since)
    assert [(x["mode"], x["items"], x["pages"]) for x in listed] == [("list", 300, 12)], listed
    after = apiserver_count(kube_cluster, "apiserver_request_total", **lists)
    assert after - before == 12
    # Each Pod once, with the id of its one state: an event written ahead and sent
    # before the kill is sent again with the same id, and the stream keeps one.
    assert sorted(e["id"] for e in events) == ids_of(pods)
    assert {e["type"].rsplit(".", 1)[-1] for e in events} <= {"added", "modified"}


async def test_first_sync_by_streaming_list_publishes_each_pod_once(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, nats_control: NatsServer
) -> None:
    pods = make_pods(kube_cluster, kube_namespace, 300)
    streams = {"resource": "pods", "scope": "namespace"}
    lists = {"verb": "LIST", **streams}
    before_streams = apiserver_count(
        kube_cluster, "apiserver_watch_list_duration_seconds_count", **streams
    )
    before_lists = apiserver_count(kube_cluster, "apiserver_request_total", **lists)
    # watchList "auto", the default: a bridge that silently fell back to LIST would
    # still publish every Pod, so the proof is which request the server served.
    setup = Setup(tmp_path, kube_cluster, kube_namespace, nats_control)
    _, bridge = await initial_sync(setup, pods)
    listed = log_lines(bridge, "listed")
    assert [(x["mode"], x["items"]) for x in listed] == [("watch-list", 300)], listed
    assert not log_lines(bridge, "streaming list unavailable, listing")
    # The server's side: one watch-list request reached its initial-events-end
    # bookmark, and no LIST of pods was made.
    after_streams = apiserver_count(
        kube_cluster, "apiserver_watch_list_duration_seconds_count", **streams
    )
    assert after_streams - before_streams == 1
    assert apiserver_count(kube_cluster, "apiserver_request_total", **lists) == before_lists


# -- 2. live changes ------------------------------------------------------------------------


async def test_live_changes_publish_once_each_in_order_and_ignored_fields_nothing(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, nats_control: NatsServer
) -> None:
    ns, cluster = kube_namespace, kube_cluster
    before = make_pods(cluster, ns, 2, prefix="old")
    setup = Setup(tmp_path, cluster, ns, nats_control)
    bridge = setup.bridge()
    await bridge.start()
    try:
        await bridge.wait_ready(60)
        await setup.caught_up(bridge, max(uid_rv(o)[1] for o in before.values()))
        created = cluster.create(pod("web", ns))
        modified = relabel(cluster, ns, "web", "2")
        # status.conditions alone changes (and managedFields with it): ignored.
        quiet = set_condition(cluster, ns, "web", "True")
        quiet_old = set_condition(cluster, ns, "old0", "False")
        gone = cluster.delete("v1", "Pod", "web", namespace=ns)
        assert uid_rv(quiet)[1] > uid_rv(modified)[1] and uid_rv(quiet_old)[1] > 0
        await setup.caught_up(bridge, uid_rv(gone)[1])
        await setup.published(bridge, {"added": 3, "modified": 2, "deleted": 1})
        events = await setup.events()
        suppressed = by_label(
            await bridge.metrics(), "k8s_bridge_changes_suppressed_total", "reason"
        )
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
    uid = created["metadata"]["uid"]
    live = [e for e in events if e["subject"] == f"{ns}/web"]
    # kube-apiserver deletes a Pod in two writes, even one never scheduled (grace
    # period 0): deletionTimestamp set (MODIFIED), then the delete (DELETED). The
    # first is a real change and is published as one.
    terminating = live[2]
    assert summary(live) == [
        ("added", f"{ns}/web", f"{uid}:{created['metadata']['resourceVersion']}"),
        ("modified", f"{ns}/web", f"{uid}:{modified['metadata']['resourceVersion']}"),
        ("modified", f"{ns}/web", terminating["id"]),
        ("deleted", f"{ns}/web", f"{uid}:deleted"),
    ]
    assert terminating["data"]["object"]["metadata"]["deletionTimestamp"]
    assert uid_rv(quiet)[1] < int(terminating["resourceversion"]) < uid_rv(gone)[1]
    assert [e["initial"] for e in live] == [False] * 4
    assert len(events) == 6, summary(events)
    assert suppressed.get("unchanged", 0) >= 2  # the two condition updates
    # The delete carries the object as the server last had it, not a tombstone.
    deleted = live[-1]
    assert deleted["resourceversion"] == gone["metadata"]["resourceVersion"]
    assert not deleted["data"].get("tombstone")


# -- 3. a watch cut, resumed from the streaming list's bookmark ------------------------------


async def watch_past_short(bridge: BridgeProcess) -> None:
    """Until the watch after the bridge's one list is 1.5 s old.

    A watch that ends within a second of opening with no event is taken for a
    server that refuses watches and answered by a relist (client-go's "very
    short watch"); a watch cut later resumes from its resourceVersion."""
    listed = log_lines(bridge, "listed")
    assert len(listed) == 1, listed
    opened = datetime.fromisoformat(listed[0]["timestamp"].replace("Z", "+00:00"))
    age = (datetime.now(UTC) - opened).total_seconds()
    await asyncio.sleep(max(0.0, 1.5 - age))


class CuttableProxy:
    """A TCP relay to kube-apiserver (TLS passes through) that the test can cut.

    ``cut()`` closes every relayed connection and stops listening, so the
    bridge's watch breaks and reconnects are refused; ``resume()`` listens
    again on the same port. The API server itself, and its watch cache, stay.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    resume = start

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer)),
            asyncio.create_task(self._pump(up_reader, writer)),
        ]
        self._tasks.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in (writer, up_writer):
                w.close()
                self._writers.discard(w)
            for t in pumps:
                t.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self._tasks.difference_update(pumps)

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            w.close()
        await until(lambda: not self._tasks, 10, lambda: "relayed connections still open")

    close = cut


async def test_watch_cut_resumes_from_the_bookmark_without_a_relist(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, nats_control: NatsServer
) -> None:
    ns, cluster = kube_namespace, kube_cluster
    pods = make_pods(cluster, ns, 5)
    # A write of another kind moves etcd's revision past the Pods': the streaming
    # list's initial-events-end bookmark then carries a resourceVersion no Pod has.
    other = cluster.create(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bump", "namespace": ns}}
    )
    proxy = CuttableProxy(cluster.port)
    await proxy.start()
    try:
        kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
        kubeconfig.write_text(
            kubeconfig.read_text().replace(cluster.url, f"https://127.0.0.1:{proxy.port}")
        )
        setup = Setup(tmp_path, cluster, ns, nats_control, kubeconfig=kubeconfig)
        bridge = setup.bridge()
        await bridge.start()
        try:
            await bridge.wait_ready(60)
            await setup.caught_up(bridge, uid_rv(other)[1])
            bookmark = setup.watermark()
            assert bookmark > max(uid_rv(o)[1] for o in pods.values())
            listed = log_lines(bridge, "listed")
            assert [x["resource_version"] for x in listed] == [str(bookmark)]
            await watch_past_short(bridge)

            await proxy.cut()
            created = cluster.create(pod("new", ns))
            modified = relabel(cluster, ns, "p1", "2")
            set_condition(cluster, ns, "p3", "True")  # ignored: nothing
            gone = cluster.delete("v1", "Pod", "p2", namespace=ns)
            # The bridge notices: its watch broke and reconnecting is refused.
            await until(
                lambda: watch_down(bridge, setup.label),
                20,
                lambda: f"watch still up; log:\n{bridge.tail_log()}",
            )
            await proxy.resume()
            await setup.caught_up(bridge, uid_rv(gone)[1])
            await setup.published(bridge, {"added": 6, "modified": 2, "deleted": 1})
            events = await setup.events()
            metrics = await bridge.metrics()
        finally:
            assert await bridge.stop() == 0, bridge.tail_log()
    finally:
        await proxy.close()
    terminating = events[-2]  # a Pod's delete is two writes (see the live changes test)
    assert summary(events[5:]) == [
        ("added", f"{ns}/new", "{}:{}".format(*uid_rv(created))),
        ("modified", f"{ns}/p1", "{}:{}".format(*uid_rv(modified))),
        ("modified", f"{ns}/p2", terminating["id"]),
        ("deleted", f"{ns}/p2", f"{pods['p2']['metadata']['uid']}:deleted"),
    ]
    assert terminating["data"]["object"]["metadata"]["deletionTimestamp"]
    # Resumed, not relisted: the only list is the first one, and the watch restarted.
    assert len(log_lines(bridge, "listed")) == 1
    relists = by_label(metrics, "k8s_bridge_relists_total", "reason", resource=setup.label)
    assert relists == {"initial": 1.0}, relists
    restarts = by_label(metrics, "k8s_bridge_watch_restarts_total", "reason", resource=setup.label)
    assert sum(restarts.values()) >= 1, restarts


async def test_apiserver_restart_is_a_410_and_the_relist_publishes_exactly_the_changes(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, nats_control: NatsServer
) -> None:
    """kube-apiserver restarted under a running bridge: its new watch cache starts at
    etcd's revision of that moment, which the API server's own writes (its identity
    Lease, every 10 s) have moved past the bridge's, so the resumed watch meets a 410
    and the bridge relists. The changes made meanwhile are published once each."""
    ns, cluster = kube_namespace, kube_cluster
    pods = make_pods(cluster, ns, 5)
    proxy = CuttableProxy(cluster.port)
    await proxy.start()
    try:
        kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
        kubeconfig.write_text(
            kubeconfig.read_text().replace(cluster.url, f"https://127.0.0.1:{proxy.port}")
        )
        setup = Setup(tmp_path, cluster, ns, nats_control, kubeconfig=kubeconfig)
        bridge = setup.bridge()
        await bridge.start()
        try:
            await bridge.wait_ready(60)
            await setup.caught_up(bridge, max(uid_rv(o)[1] for o in pods.values()))
            await watch_past_short(bridge)
            # The bridge is cut off while the changes are made and the server restarts,
            # so it meets the fresh server with its old resourceVersion whatever the timing.
            await proxy.cut()
            created = cluster.create(pod("new", ns))
            modified = relabel(cluster, ns, "p1", "2")
            set_condition(cluster, ns, "p3", "True")  # ignored: nothing
            gone = cluster.delete("v1", "Pod", "p2", namespace=ns)
            cluster.restart_apiserver()
            await proxy.resume()
            await setup.caught_up(bridge, uid_rv(gone)[1])
            await setup.published(bridge, {"added": 6, "modified": 1, "deleted": 1})
            events = await setup.events()
            metrics = await bridge.metrics()
        finally:
            assert await bridge.stop() == 0, bridge.tail_log()
    finally:
        await proxy.close()
    relists = by_label(metrics, "k8s_bridge_relists_total", "reason", resource=setup.label)
    assert relists == {"initial": 1.0, "expired": 1.0}, relists
    relisting = [x["error"] for x in log_lines(bridge, "relisting")]
    assert len(relisting) == 1 and relisting[0].startswith("too old resource version"), relisting
    assert sorted(summary(events[5:])) == sorted(
        [
            ("added", f"{ns}/new", "{}:{}".format(*uid_rv(created))),
            ("modified", f"{ns}/p1", "{}:{}".format(*uid_rv(modified))),
            # Seen gone by the relist: a tombstone, no terminating state before it.
            ("deleted", f"{ns}/p2", f"{pods['p2']['metadata']['uid']}:deleted"),
        ]
    )
    (deleted,) = [e for e in events if e["type"].endswith(".deleted")]
    assert deleted["data"]["tombstone"] is True


# -- 4. 410 after a real etcd compaction, deletes while down -------------------------------


async def test_410_after_compaction_publishes_exactly_the_differences_with_tombstones(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, nats_control: NatsServer
) -> None:
    ns, cluster = kube_namespace, kube_cluster
    pods = make_pods(cluster, ns, 6)
    setup = Setup(tmp_path, cluster, ns, nats_control)
    bridge = setup.bridge()
    await bridge.start()
    try:
        await bridge.wait_ready(60)
        await setup.caught_up(bridge, max(uid_rv(o)[1] for o in pods.values()))
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
    stopped_at = setup.watermark()

    modified = relabel(cluster, ns, "p0", "2")
    cluster.delete("v1", "Pod", "p1", namespace=ns)
    created = cluster.create(pod("new", ns))
    set_condition(cluster, ns, "p2", "True")  # ignored: nothing
    # The same name again: the old uid's delete, then the new uid's add.
    cluster.delete("v1", "Pod", "p3", namespace=ns)
    reborn = cluster.create(pod("p3", ns))
    # A short-lived object the bridge never saw: nothing at all.
    cluster.create(pod("brief", ns))
    cluster.delete("v1", "Pod", "brief", namespace=ns)
    cluster.compact()
    # etcd no longer has the history after the bridge's watermark, but kube-apiserver's
    # watch cache does (it keeps the last events in memory): a watch from the watermark
    # is still served, event by event. Only a watch cache that starts afresh after the
    # compaction answers 410 (an API server restart, or the cache's history rolling
    # over), so the test restarts kube-apiserver to reach the relist path.
    assert watch_status(cluster, ns, stopped_at) == "served"
    cluster.restart_apiserver()
    assert watch_status(cluster, ns, stopped_at) == "410 Expired"
    last = uid_rv(reborn)[1]

    bridge = setup.bridge()
    await bridge.start()
    try:
        await bridge.wait_ready(60)
        await setup.caught_up(bridge, last)
        await setup.published(bridge, {"added": 2, "modified": 1, "deleted": 2})
        events = await setup.events()
        metrics = await bridge.metrics()
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
    relists = by_label(metrics, "k8s_bridge_relists_total", "reason", resource=setup.label)
    assert relists.get("expired") == 1, relists
    missed = events[6:]
    uid = {name: o["metadata"]["uid"] for name, o in pods.items()}
    assert sorted(summary(missed)) == sorted(
        [
            ("modified", f"{ns}/p0", "{}:{}".format(*uid_rv(modified))),
            ("deleted", f"{ns}/p1", f"{uid['p1']}:deleted"),
            ("added", f"{ns}/new", "{}:{}".format(*uid_rv(created))),
            ("deleted", f"{ns}/p3", f"{uid['p3']}:deleted"),
            ("added", f"{ns}/p3", "{}:{}".format(*uid_rv(reborn))),
        ]
    )
    p3 = [x[0] for x in summary(missed) if x[1] == f"{ns}/p3"]
    assert p3 == ["deleted", "added"]
    # Deletes seen only through the relist: tombstones with the last known metadata.
    for e in missed:
        if e["type"].endswith(".deleted"):
            assert e["data"]["tombstone"] is True
            assert e["data"]["object"]["metadata"]["name"] in ("p1", "p3")
        assert e["initial"] is False


def watch_status(cluster: KubeCluster, ns: str, rv: int) -> str:
    """How kube-apiserver answers a watch of the namespace's Pods from ``rv``."""
    status, body = cluster.raw(
        "GET",
        cluster.path("v1", "Pod", ns),
        params={"watch": "1", "resourceVersion": str(rv), "timeoutSeconds": "1"},
    )
    assert status == 200, body
    text = body if isinstance(body, str) else json.dumps(body)
    lines = text.splitlines()
    if not lines:
        return "served"  # nothing happened since: an empty stream
    first = json.loads(lines[0])
    if first["type"] == "ERROR":
        return f"{first['object']['code']} {first['object']['reason']}"
    return "served"


# -- 5. a graceful restart publishes nothing ---------------------------------------------------


async def test_graceful_restart_publishes_nothing(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, nats_control: NatsServer
) -> None:
    ns, cluster = kube_namespace, kube_cluster
    pods = make_pods(cluster, ns, 20)
    setup = Setup(tmp_path, cluster, ns, nats_control)
    bridge = setup.bridge()
    await bridge.start()
    try:
        await bridge.wait_ready(60)
        await setup.caught_up(bridge, max(uid_rv(o)[1] for o in pods.values()))
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
    first = await setup.events()
    assert len(first) == 20

    since = bridge.log.stat().st_size  # both runs log to the same file
    bridge = setup.bridge()
    await bridge.start()
    try:
        await bridge.wait_ready(60)
        # Past its resume: a change after it arrives, so anything the restart had
        # decided is published before it (one pipeline publishes in order).
        sentinel = cluster.create(pod("sentinel", ns))
        await setup.caught_up(bridge, uid_rv(sentinel)[1])
        await setup.published(bridge, {"added": 1})
        events = await setup.events()
        metrics = await bridge.metrics()
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
    assert summary(events[20:]) == [("added", f"{ns}/sentinel", "{}:{}".format(*uid_rv(sentinel)))]
    assert not log_lines(bridge, "listed", since)  # resumed by a watch, not relisted
    assert [x["relist"] for x in log_lines(bridge, "resuming from checkpoint", since)] == [False]
    relists = by_label(metrics, "k8s_bridge_relists_total", "reason", resource=setup.label)
    assert relists == {}, relists
