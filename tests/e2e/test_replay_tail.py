"""``k8s-bridge replay`` and ``k8s-bridge tail`` as processes, against the emulator and real buses.

Replay re-publishes events with their original CloudEvent ids, so consumers
recognise them, but with a ``Nats-Msg-Id`` of the replay run: the originals
(and earlier replays) are still inside JetStream's duplicate window, which
would otherwise drop every copy. So replayed copies land next to the
originals and the tests compare them one by one.
"""

from __future__ import annotations

import re
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from cloudevents.v1.http import from_json

from bridge.delivery.changes import ChangeDetector, Fingerprinter
from bridge.delivery.events import EventBuilder
from bridge.emulator import Emulator
from bridge.ground.envelope import Event
from bridge.sinks.kafka import KafkaSink
from bridge.sinks.nats import NatsSink
from tests.e2e.bridge_process import BridgeProcess, changes, cli, jetstream_events, write_config
from tests.fixtures.nats import NatsServer
from tests.fixtures.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


def pod(name: str, ns: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"containers": [{"name": "c", "image": "nginx:1"}]},
        "status": {"phase": "Pending"},
    }


def widget(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"size": 1},
    }


def checkpoint_rows(db: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The watermarks and digests tables, read independently of the bridge's store."""
    con = sqlite3.connect(db)
    try:
        marks = con.execute("select * from watermarks order by 1").fetchall()
        digests = con.execute("select * from digests order by 1, 2").fetchall()
        return marks, digests
    finally:
        con.close()


def resource_count(config: Path) -> int:
    return len(yaml.safe_load(config.read_text())["resources"])


def pod_watermark(db: Path) -> int:
    marks, _ = checkpoint_rows(db)
    return next((int(rv) for rid, rv in marks if rid == "core/v1/pods" and rv), 0)


@pytest.fixture
def config(tmp_path: Path, kubeconfig: Path, nats_control: NatsServer) -> Path:
    return write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [nats_control.url]}},
    )


async def create_stream(url: str, duplicate_window: float) -> None:
    import nats

    nc = await nats.connect(url)
    try:
        await nc.jetstream().add_stream(
            name="K8S", subjects=["k8s.>"], duplicate_window=duplicate_window
        )
    finally:
        await nc.close()


# -- replay ------------------------------------------------------------------------


def replay_run(err: str) -> str:
    """The run id a replay printed (``... (replay run R)``)."""
    match = re.search(r"\(replay run ([0-9a-f]+)[;)]", err)
    assert match, err
    return match.group(1)


def of_run(events: list[dict[str, Any]], run: str) -> list[dict[str, Any]]:
    return [e for e in events if (e["_msg_id"] or "").endswith(f":replay:{run}")]


async def test_replay_within_history_republishes_the_same_events_with_the_same_ids(
    config: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    emulator.create(pod("a"))
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready()
        mid = emulator.resource_version
        emulator.create(pod("b"))
        emulator.patch("v1", "Pod", "a", {"spec": {"nodeName": "n1"}}, namespace="default")
        # Only an ignored field: the bridge published nothing, so replay must not either.
        emulator.patch(
            "v1", "Pod", "a", {"status": {"conditions": [{"type": "Ready"}]}}, namespace="default"
        )
        emulator.create(widget("w1"))  # another resource: not replayed with --resource Pod
        emulator.delete("v1", "Pod", "b", namespace="default")

        async def all_published() -> bool:
            return len(await jetstream_events(nats_control.url)) >= 5

        await until(all_published, 20, bridge.tail_log)
        # Committed up to the last change: every change was decided and acknowledged,
        # the ignored one included (published, it would be in the stream by now).
        last = emulator.resource_version
        await until(lambda: pod_watermark(config.parent / "state.db") >= last, 20)
    finally:
        assert await bridge.stop() == 0
    first = await jetstream_events(nats_control.url)
    after_mid = [e for e in first if e["type"].startswith("io.k8s.core.v1.Pod.")][1:]
    assert changes(after_mid) == [
        ("Pod", "added", "default/b"),
        ("Pod", "modified", "default/a"),
        ("Pod", "deleted", "default/b"),
    ]

    started = time.monotonic()
    rc, _, err = await cli(
        "replay", "--config", str(config), "--resource", "Pod", "--from-resource-version", str(mid)
    )
    took = time.monotonic() - started
    assert rc == 0, err
    assert f"replayed 3 change(s) of pods after resourceVersion {mid}" in err
    run = replay_run(err)
    replayed = (await jetstream_events(nats_control.url))[len(first) :]
    assert [e["id"] for e in replayed] == [e["id"] for e in after_mid]
    assert [e["_msg_id"] for e in replayed] == [f"{e['id']}:replay:{run}" for e in after_mid]
    assert [e["_subject"] for e in replayed] == [e["_subject"] for e in after_mid]
    for old, new in zip(after_mid, replayed, strict=True):
        assert new["data"] == old["data"]
        assert new["resourceversion"] == old["resourceversion"]
        from_json(new["_raw"])
    print(f"replay of 3 changes within history: {took:.2f}s (process start included)")


async def test_replay_twice_within_the_duplicate_window_stores_both_runs_and_counts_them(
    config: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    """Issue 9: JetStream dropped replays as redeliveries while replay claimed them all."""
    emulator.create(pod("a"))
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready()
        mid = emulator.resource_version
        emulator.create(pod("b"))
        emulator.delete("v1", "Pod", "a", namespace="default")

        async def published() -> bool:
            return len(await jetstream_events(nats_control.url)) >= 3

        await until(published, 20, bridge.tail_log)
    finally:
        assert await bridge.stop() == 0
    originals = (await jetstream_events(nats_control.url))[1:]
    args = ("--config", str(config), "--resource", "v1/Pod", "--from-resource-version", str(mid))
    # Both runs within the stream's duplicate window (2 minutes) of the originals and each other.
    rc1, _, err1 = await cli("replay", *args)
    rc2, _, err2 = await cli("replay", *args)
    assert (rc1, rc2) == (0, 0), err1 + err2
    for err in (err1, err2):
        assert f"replayed 2 change(s) of pods after resourceVersion {mid}" in err
        assert "dropped" not in err
    stream = await jetstream_events(nats_control.url)
    assert len(stream) == 3 + 2 + 2
    runs = [replay_run(err1), replay_run(err2)]
    assert runs[0] != runs[1]
    for run in runs:
        copies = of_run(stream, run)
        assert [e["id"] for e in copies] == [e["id"] for e in originals]
        assert [e["data"] for e in copies] == [e["data"] for e in originals]


async def test_replay_after_compaction_publishes_the_checkpoint_diff_and_leaves_it_alone(
    config: Path, emulator: Emulator, nats_control: NatsServer, tmp_path: Path
) -> None:
    db = tmp_path / "state.db"
    for name in ("keep", "change", "gone"):
        emulator.create(pod(name))
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready()
        mid = emulator.resource_version
        await until(lambda: pod_watermark(db) >= mid, 20, bridge.tail_log)
    finally:
        assert await bridge.stop() == 0
    first = await jetstream_events(nats_control.url)
    assert len(first) == 3
    # While nothing runs: a change, a delete, an add, and an ignored-field change.
    emulator.patch("v1", "Pod", "change", {"spec": {"nodeName": "n1"}}, namespace="default")
    emulator.delete("v1", "Pod", "gone", namespace="default")
    emulator.create(pod("new"))
    emulator.patch(
        "v1", "Pod", "keep", {"status": {"conditions": [{"type": "Ready"}]}}, namespace="default"
    )
    emulator.chaos.compact()
    before = checkpoint_rows(db)

    rc, _, err = await cli(
        "replay", "--config", str(config), "--resource", "Pod", "--from-resource-version", str(mid)
    )
    assert rc == 0, err
    gone_lines = [line for line in err.splitlines() if "no longer available" in line]
    assert len(gone_lines) == 1, err
    assert f"resourceVersion {mid} of pods" in gone_lines[0]
    assert "difference" in gone_lines[0] and "checkpoint" in gone_lines[0]
    assert "published 3 change(s) of pods from a relist diff" in err
    diff = (await jetstream_events(nats_control.url))[3:]
    assert sorted(changes(diff)) == [
        ("Pod", "added", "default/new"),
        ("Pod", "deleted", "default/gone"),
        ("Pod", "modified", "default/change"),
    ]
    tomb = next(e for e in diff if e["subject"] == "default/gone")
    assert tomb["data"]["tombstone"] is True
    assert tomb["data"]["object"]["metadata"]["uid"] == next(
        e["data"]["object"]["metadata"]["uid"] for e in first if e["subject"] == "default/gone"
    )
    # Replay never writes the checkpoint: the running bridge owns it.
    assert checkpoint_rows(db) == before


async def test_replay_after_compaction_beside_the_running_bridge_reads_its_checkpoint(
    config: Path, emulator: Emulator, nats_control: NatsServer, tmp_path: Path
) -> None:
    """Issue 23: the fallback announced "publishing the difference … instead", then
    exited 1 with "checkpoint store … is in use by another k8s-bridge process"."""
    db = tmp_path / "state.db"
    emulator.create(pod("keep"))
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready()
        mid = emulator.resource_version
        resources = resource_count(config)

        def settled() -> bool:
            # Every resource's first watermark is in: the running bridge writes
            # nothing more, so any change to the file below is the replay's.
            marks, _ = checkpoint_rows(db)
            return len(marks) == resources and all(rv and int(rv) >= mid for _, rv in marks)

        await until(settled, 20, bridge.tail_log)
        emulator.chaos.compact()
        before = checkpoint_rows(db)
        rc, _, err = await cli(
            "replay", "--config", str(config), "--resource", "Pod", "--from-resource-version", "1"
        )
        assert rc == 0, err
        assert "no longer available" in err and "in use" not in err
        assert "published 0 change(s) of pods from a relist diff" in err
        assert checkpoint_rows(db) == before
        # The bridge goes on publishing and checkpointing.
        emulator.create(pod("after"))
        now = emulator.resource_version
        await until(lambda: pod_watermark(db) >= now, 20, bridge.tail_log)
        assert (await bridge.readyz())[0] == 200
    finally:
        assert await bridge.stop() == 0


async def test_replay_from_a_future_resource_version_says_so_in_one_line(
    config: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    """Issue 23: it exited with "k8s-bridge replay: Too large resource version"."""
    emulator.create(pod("a"))
    future = emulator.resource_version + 1000
    rc, out, err = await cli(
        "replay", "--config", str(config), "--resource", "Pod", "--from-resource-version",
        str(future),
    )  # fmt: skip
    assert rc == 2, err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert f"--from-resource-version {future}: resourceVersion {future} of pods" in lines[0]
    assert f"newer than the API server's ({emulator.resource_version})" in lines[0]
    assert await jetstream_events(nats_control.url) == []


async def test_replay_of_an_unconfigured_resource_exits_2_naming_it_and_the_configured(
    config: Path,
) -> None:
    rc, out, err = await cli(
        "replay", "--config", str(config), "--resource", "Gadget", "--from-resource-version", "5"
    )
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "'Gadget'" in lines[0]
    assert "v1/Pod, v1/Secret, example.com/v1/Widget" in lines[0]


async def test_replay_from_a_resource_version_that_is_not_one_exits_2(config: Path) -> None:
    rc, _, err = await cli(
        "replay", "--config", str(config), "--resource", "Pod", "--from-resource-version", "0"
    )
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and "--from-resource-version '0'" in err


def with_resources(config: Path, resources: list[dict[str, Any]]) -> Path:
    doc = yaml.safe_load(config.read_text())
    doc["resources"] = resources
    config.write_text(yaml.safe_dump(doc))
    return config


async def test_replay_of_a_namespace_not_configured_exits_2_and_publishes_nothing(
    config: Path, nats_control: NatsServer
) -> None:
    """Issue 9: it published every pod of that namespace as a spurious ``added``."""
    with_resources(config, [{"apiVersion": "v1", "kind": "Pod", "namespaces": ["a", "b"]}])
    rc, out, err = await cli(
        "replay",
        "--config",
        str(config),
        "--resource",
        "Pod",
        "--namespace",
        "x",
        "--from-resource-version",
        "5",
    )
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "--namespace 'x'" in lines[0] and "configured namespaces: a, b" in lines[0]
    assert await jetstream_events(nats_control.url) == []


async def test_replay_with_a_namespace_of_a_cluster_scoped_resource_exits_2(
    config: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    with_resources(config, [{"apiVersion": "v1", "kind": "Node"}])
    rc, _, err = await cli(
        "replay",
        "--config",
        str(config),
        "--resource",
        "Node",
        "--namespace",
        "default",
        "--from-resource-version",
        "1",
    )
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "--namespace 'default'" in lines[0] and "v1/Node is cluster-scoped" in lines[0]
    assert await jetstream_events(nats_control.url) == []


async def test_replay_of_one_namespace_of_an_all_namespaces_resource_diffs_only_that_namespace(
    config: Path, emulator: Emulator, nats_control: NatsServer, tmp_path: Path
) -> None:
    """The checkpoint of all namespaces, narrowed to the one asked for: no spurious adds."""
    db = tmp_path / "state.db"
    for ns in ("a", "b"):
        for name in ("keep", "change"):
            emulator.create(pod(name, ns))
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready()
        mid = emulator.resource_version
        await until(lambda: pod_watermark(db) >= mid, 20, bridge.tail_log)
    finally:
        assert await bridge.stop() == 0
    first = await jetstream_events(nats_control.url)
    assert len(first) == 4
    # While nothing runs: changes in both namespaces; only a's may be replayed.
    for ns in ("a", "b"):
        emulator.patch("v1", "Pod", "change", {"spec": {"nodeName": "n1"}}, namespace=ns)
    emulator.delete("v1", "Pod", "keep", namespace="b")
    emulator.create(pod("new", "a"))
    emulator.chaos.compact()

    rc, _, err = await cli(
        "replay",
        "--config",
        str(config),
        "--resource",
        "Pod",
        "--namespace",
        "a",
        "--from-resource-version",
        str(mid),
    )
    assert rc == 0, err
    assert "checkpoint of core/v1/pods instead" in err
    assert "published 2 change(s) of pods from a relist diff" in err
    diff = (await jetstream_events(nats_control.url))[4:]
    assert sorted(changes(diff)) == [("Pod", "added", "a/new"), ("Pod", "modified", "a/change")]


# -- tail ----------------------------------------------------------------------------


def sample_events(cluster: str = "e2e") -> list[Event]:
    detector = ChangeDetector(Fingerprinter([]))
    pods = EventBuilder(cluster=cluster, group="", version="v1", kind="Pod", plural="pods")
    widgets = EventBuilder(
        cluster=cluster, group="example.com", version="v1", kind="Widget", plural="widgets"
    )
    out: list[Event] = []
    for i in range(3):
        p = pod(f"p{i}")
        p["metadata"].update(uid=f"uid-p{i}", resourceVersion=str(10 + i))
        out.extend(pods.build(c) for c in detector.on_add(p))
    for i in range(2):
        w = widget(f"w{i}")
        w["metadata"].update(uid=f"uid-w{i}", resourceVersion=str(20 + i))
        out.extend(widgets.build(c) for c in detector.on_add(w))
    return out


def parsed(out: str) -> list[dict[str, Any]]:
    lines = out.splitlines()
    for line in lines:
        from_json(line)  # each line is a CloudEvent the SDK accepts
    return [orjson.loads(line) for line in lines]


async def test_tail_prints_cloudevents_from_nats(config: Path, nats_control: NatsServer) -> None:
    events = sample_events()
    sink = NatsSink(nats_control.url)
    await sink.start()
    try:
        await sink.publish(events)
    finally:
        await sink.close()

    rc, out, err = await cli("tail", "--config", str(config), "--count", "4", "--from-start")
    assert rc == 0, err
    assert [e["id"] for e in parsed(out)] == [e.id for e in events[:4]]

    rc, out, err = await cli(
        "tail", "--config", str(config), "--resource", "Widget", "--from-start", "--timeout", "1"
    )
    assert rc == 0, err
    assert [e["subject"] for e in parsed(out)] == ["default/w0", "default/w1"]


async def test_tail_timeout_ends_an_idle_tail_with_exit_0(
    config: Path, nats_control: NatsServer
) -> None:
    await create_stream(nats_control.url, 120.0)
    started = time.monotonic()
    rc, out, err = await cli("tail", "--config", str(config), "--timeout", "1")
    took = time.monotonic() - started
    assert rc == 0, err
    assert out == ""
    assert took < 15


async def test_tail_of_a_stream_that_does_not_exist_says_so_in_one_line(config: Path) -> None:
    rc, out, err = await cli("tail", "--config", str(config), "--timeout", "1")
    assert rc == 1
    assert out == ""
    assert err.strip().splitlines() == [
        f"k8s-bridge tail: NATS stream 'K8S' not found at {config_nats_url(config)}"
        " (nothing published yet?)"
    ]


async def test_tail_of_an_unconfigured_resource_exits_2_naming_it_and_the_configured(
    config: Path, nats_control: NatsServer
) -> None:
    """Issue 9: it waited for events that never come, and printed nothing."""
    await create_stream(nats_control.url, 120.0)
    rc, out, err = await cli(
        "tail", "--config", str(config), "--resource", "Frob", "--from-start", "--timeout", "1"
    )
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "--resource 'Frob'" in lines[0]
    assert "v1/Pod, v1/Secret, example.com/v1/Widget" in lines[0]


def config_nats_url(config: Path) -> str:
    return str(yaml.safe_load(config.read_text())["sink"]["nats"]["servers"][0])


async def test_tail_prints_cloudevents_from_kafka(
    tmp_path: Path, kubeconfig: Path, kafka_broker: str
) -> None:
    topic = f"tail-{uuid.uuid4().hex[:8]}"
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={"kind": "kafka", "kafka": {"bootstrapServers": [kafka_broker], "topic": topic}},
    )
    events = sample_events()
    sink = KafkaSink(kafka_broker, topic=topic)
    await sink.start()
    try:
        await sink.publish(events)
    finally:
        await sink.close()

    rc, out, err = await cli("tail", "--config", str(config), "--count", "5", "--from-start")
    assert rc == 0, err
    # One partition per object key: the order is per object, so compare as sets.
    assert sorted(e["id"] for e in parsed(out)) == sorted(e.id for e in events)

    rc, out, err = await cli(
        "tail", "--config", str(config), "--resource", "Widget", "--from-start", "--timeout", "3"
    )
    assert rc == 0, err
    assert sorted(e["subject"] for e in parsed(out)) == ["default/w0", "default/w1"]
