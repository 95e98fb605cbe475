"""``k8s-bridge replay`` against kube-apiserver: a LIST at an exact older resourceVersion
and a watch from it, which the real server answers while it still holds that history.

A running bridge publishes a history of ConfigMap changes in two namespaces of the
test's own; replay of one namespace after an RV republishes exactly that namespace's
original events with their ids, and never writes the checkpoint. Once the history is
lost (an API server restart empties the watch cache that serves watches; an etcd
compaction), the fallback diffs the current state against the checkpoint of the
bridge that is still running beside it. An RV the server has not reached gives one
line naming it.

What the real server answers (asserted below, so a change of it shows here first):
a watch is served from the watch cache alone: from an RV older than the cache holds
(after a restart, though etcd still has it) it is an ERROR event, 410 Expired "too
old resource version: RV (oldest)", while the exact LIST at that RV is still served
(from etcd). At an RV neither holds (compacted in etcd) the exact LIST is
``410 Expired``, "The resourceVersion for the provided list is too old.". At a
future RV, after waiting up to 3 s for it: ``504 Timeout`` "Timeout: Too large
resource version: <RV>, current: <current>" with the cause
``ResourceVersionTooLarge``. (Seen, not asserted: right after an etcd compaction an
exact LIST and a watch at an older RV the watch cache still holds are served from it.)
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.bridge_process import BridgeProcess, cli, jetstream_events, write_config
from tests.fixtures.kube import KubeCluster
from tests.fixtures.nats import NatsServer
from tests.fixtures.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CM = ("v1", "ConfigMap")


def configmap(name: str, namespace: str, **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        # The ignored annotation is there from the start: a change of it alone is no change.
        "metadata": {"name": name, "namespace": namespace, "annotations": {"noise": "0"}},
        "data": data,
    }


def bridge_config(tmp_path: Path, kubeconfig: Path, nats_url: str, *namespaces: str) -> Path:
    return write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [nats_url]}},
        resources=[
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "namespaces": list(namespaces),
                "ignoreFields": ["metadata.annotations.noise"],
            }
        ],
    )


def checkpoint_rows(db: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The watermarks and digests tables, read with a connection of the test's own."""
    con = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)
    try:
        marks = con.execute("select * from watermarks order by 1").fetchall()
        digests = con.execute("select * from digests order by 1, 2").fetchall()
        return marks, digests
    finally:
        con.close()


def watermark(db: Path, namespace: str) -> int:
    if not db.exists():
        return 0
    marks, _ = checkpoint_rows(db)
    rid = f"core/v1/configmaps@{namespace}"
    return next((int(rv) for r, rv in marks if r == rid and rv), 0)


def rv_of(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


def replay_run(err: str) -> str:
    match = re.search(r"\(replay run ([0-9a-f]+)[;)]", err)
    assert match, err
    return match.group(1)


def in_namespace(events: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    return [e for e in events if e["subject"].startswith(f"{namespace}/")]


async def test_replay_within_history_republishes_the_namespace_s_originals_with_their_ids(
    kube_cluster: KubeCluster,
    kube_namespace: str,
    real_kubeconfig: Path,
    nats_control: NatsServer,
    tmp_path: Path,
) -> None:
    a, b = kube_namespace, kube_cluster.namespace("replay-b")
    try:
        db = tmp_path / "state.db"
        config = bridge_config(tmp_path, real_kubeconfig, nats_control.url, a, b)
        kube_cluster.create(configmap("keep", a, v="1"))
        mid = rv_of(kube_cluster.create(configmap("keep", b, v="1")))
        bridge = BridgeProcess(config)
        await bridge.start()
        try:
            await bridge.wait_ready(60)
            # The history after mid, in both namespaces; one change of an ignored field only.
            kube_cluster.create(configmap("new", a, v="1"))
            kube_cluster.patch(*CM, "keep", {"data": {"v": "2"}}, namespace=a)
            kube_cluster.patch(*CM, "keep", {"metadata": {"annotations": {"noise": "x"}}}, a)
            kube_cluster.create(configmap("other", b, v="1"))
            kube_cluster.delete(*CM, "new", namespace=a)
            last_b = rv_of(kube_cluster.patch(*CM, "keep", {"data": {"v": "2"}}, namespace=b))
            last = rv_of(kube_cluster.create(configmap("late", a, v="1")))

            async def published() -> bool:
                return len(await jetstream_events(nats_control.url)) >= 2 + 6

            await until(published, 30, bridge.tail_log)
            # Each scope's watermark reaches its own last change (bookmarks come rarely).
            await until(lambda: watermark(db, a) >= last and watermark(db, b) >= last_b, 30)
        finally:
            assert await bridge.stop() == 0, bridge.tail_log()
        first = await jetstream_events(nats_control.url)
        assert len(first) == 8, [(e["type"], e["subject"]) for e in first]
        originals = in_namespace(first[2:], a)
        assert [(e["type"].rsplit(".", 1)[-1], e["subject"]) for e in originals] == [
            ("added", f"{a}/new"),
            ("modified", f"{a}/keep"),
            ("deleted", f"{a}/new"),
            ("added", f"{a}/late"),
        ]
        before = checkpoint_rows(db)

        rc, _, err = await cli(
            "replay", "--config", str(config), "--resource", "ConfigMap",
            "--namespace", a, "--from-resource-version", str(mid),
        )  # fmt: skip
        assert rc == 0, err
        assert f"replayed 4 change(s) of configmaps after resourceVersion {mid}" in err
        run = replay_run(err)
        replayed = (await jetstream_events(nats_control.url))[len(first) :]
        assert [e["id"] for e in replayed] == [e["id"] for e in originals]
        assert [e["type"] for e in replayed] == [e["type"] for e in originals]
        assert [e["_msg_id"] for e in replayed] == [f"{e['id']}:replay:{run}" for e in originals]
        assert [e["_subject"] for e in replayed] == [e["_subject"] for e in originals]
        for old, new in zip(originals, replayed, strict=True):
            assert new["data"] == old["data"]
            assert new["resourceversion"] == old["resourceversion"]
        assert checkpoint_rows(db) == before
    finally:
        kube_cluster.raw("DELETE", f"/api/v1/namespaces/{b}")


async def test_replay_of_a_lost_history_diffs_against_the_running_bridge_s_checkpoint(
    kube_cluster: KubeCluster,
    kube_namespace: str,
    real_kubeconfig: Path,
    nats_control: NatsServer,
    tmp_path: Path,
) -> None:
    """Issue 23: the fallback announced itself, then exited 1 with "checkpoint store …
    is in use by another k8s-bridge process"."""
    ns = kube_namespace
    db = tmp_path / "state.db"
    config = bridge_config(tmp_path, real_kubeconfig, nats_control.url, ns)
    for name in ("keep", "change", "gone"):
        mid = rv_of(kube_cluster.create(configmap(name, ns, v="1")))
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready(60)
        kube_cluster.patch(*CM, "change", {"data": {"v": "2"}}, namespace=ns)
        kube_cluster.delete(*CM, "gone", namespace=ns)
        last = rv_of(kube_cluster.create(configmap("new", ns, v="1")))
        await until(lambda: watermark(db, ns) >= last, 30, bridge.tail_log)
        published = len(await jetstream_events(nats_control.url))
        assert published == 6
        path = kube_cluster.path(*CM, ns)
        exact = {"resourceVersion": str(mid), "resourceVersionMatch": "Exact"}
        _, digests = checkpoint_rows(db)

        async def falls_back() -> None:
            rc, _, err = await cli(
                "replay", "--config", str(config), "--resource", "ConfigMap",
                "--from-resource-version", str(mid),
            )  # fmt: skip
            assert rc == 0, err
            gone = [line for line in err.splitlines() if "no longer available" in line]
            assert len(gone) == 1, err
            assert f"resourceVersion {mid} of configmaps" in gone[0]
            assert f"checkpoint of core/v1/configmaps@{ns} instead" in gone[0]
            # Every object matched the running bridge's digests: the checkpoint was read.
            assert "published 0 change(s) of configmaps from a relist diff" in err, err
            assert "in use" not in err
            assert len(await jetstream_events(nats_control.url)) == published
            assert checkpoint_rows(db)[1] == digests

        # A restarted API server: etcd still has mid, but watches are served from the
        # watch cache, which starts afresh, so the history from mid cannot be watched.
        kube_cluster.restart_apiserver()
        status, body = kube_cluster.raw("GET", path, params=exact)
        assert status == 200, body
        watch = {"watch": "1", "resourceVersion": str(mid), "timeoutSeconds": "1"}
        status, body = kube_cluster.raw("GET", path, params=watch)
        assert (status, body["type"], body["object"]["reason"]) == (200, "ERROR", "Expired")
        assert body["object"]["message"].startswith(f"too old resource version: {mid} (")
        await bridge.wait_ready(60)
        await falls_back()
        # Compacted: the exact LIST (no longer in the watch cache either) is 410 too.
        kube_cluster.compact()
        status, body = kube_cluster.raw("GET", path, params=exact)
        assert (status, body["reason"]) == (410, "Expired"), body
        assert body["message"] == "The resourceVersion for the provided list is too old."
        await falls_back()
        # The running bridge goes on: it publishes and checkpoints the next change.
        after = rv_of(kube_cluster.create(configmap("after", ns, v="1")))
        await until(lambda: watermark(db, ns) >= after, 30, bridge.tail_log)
        assert (await bridge.readyz())[0] == 200
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
    events = await jetstream_events(nats_control.url)
    assert [(e["type"].rsplit(".", 1)[-1], e["subject"]) for e in events[published:]] == [
        ("added", f"{ns}/after")
    ]


async def test_replay_from_a_future_resource_version_names_the_resource_and_the_rv(
    kube_cluster: KubeCluster,
    kube_namespace: str,
    real_kubeconfig: Path,
    nats_control: NatsServer,
    tmp_path: Path,
) -> None:
    """Issue 23: it exited with "k8s-bridge replay: Too large resource version"."""
    ns = kube_namespace
    config = bridge_config(tmp_path, real_kubeconfig, nats_control.url, ns)
    now = rv_of(kube_cluster.create(configmap("a", ns, v="1")))
    future = now + 1_000_000
    status, body = kube_cluster.raw(
        "GET",
        kube_cluster.path(*CM, ns),
        params={"resourceVersion": str(future), "resourceVersionMatch": "Exact"},
    )
    assert (status, body["reason"]) == (504, "Timeout"), body
    assert body["message"].startswith(f"Timeout: Too large resource version: {future}, current: ")
    assert body["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge", body

    rc, out, err = await cli(
        "replay", "--config", str(config), "--resource", "ConfigMap",
        "--from-resource-version", str(future),
    )  # fmt: skip
    assert rc == 2, err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert f"--from-resource-version {future}: resourceVersion {future} of configmaps" in lines[0]
    current = re.search(r"newer than the API server's \((\d+)\)", lines[0])
    assert current is not None, lines[0]
    assert now <= int(current.group(1)) < future
    assert await jetstream_events(nats_control.url) == []
