"""``k8s-bridge check`` as a process: the pre-flight a platform team runs before ``run``.

Against the emulator over HTTP and a real nats-server: every check on its own
line; exit 0 only when all pass; a failure names what to fix (the kind, the
verb and resource, the sink, the config key).
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.checkpoints.sqlite import SqliteCheckpointStore
from bridge.emulator import Emulator
from tests.e2e.bridge_process import cli, free_port, write_config
from tests.fixtures.nats import NatsServer
from tests.fixtures.natscluster import NatsCluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


async def check(config: Path, timeout: float = 40.0) -> tuple[int, list[str], str]:
    """Run ``k8s-bridge check --config``; return (exit code, stdout lines, stderr)."""
    code, out, err = await cli("check", "--config", str(config), timeout=timeout)
    return code, out.splitlines(), err


def nats_config(tmp_path: Path, kubeconfig: Path, url: str, **extra: Any) -> Path:
    return write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [url]}},
        **extra,
    )


def failures(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("FAIL")]


async def test_all_ok_exits_0_with_one_line_per_check(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    code, lines, err = await check(nats_config(tmp_path, kubeconfig, nats_control.url))
    assert "Traceback" not in err, err
    assert code == 0, (lines, err)
    assert failures(lines) == []
    # A single nats-server cannot keep 3 replicas: a warning, never a failure.
    assert [line for line in lines if not line.startswith("ok ")] == [
        "WARN  sink nats stream K8S: stream K8S has 1 replica(s): the loss of that server's "
        "disk loses acknowledged events; use 3 replicas on a cluster of 3 or more servers"
    ], lines
    # config, api, then per resource (Pod, Secret, Widget): served + list + watch,
    # the control endpoint's reviews (controlAuth kubernetes by default), then the
    # sink, its stream's durability and the checkpoint store.
    assert len(lines) == 2 + 3 * 3 + 1 + 3, lines
    assert lines[0].startswith("ok    config:")
    assert lines[1].startswith("ok    api:") and emulator.url.split("//")[1] in lines[1]
    for what in ("v1/Pod", "v1/Secret", "example.com/v1/Widget"):
        mine = [line for line in lines if f"resource {what}" in line]
        assert len(mine) == 3, (what, lines)
        assert any(f"resource {what} watch: allowed" in line for line in mine)
    assert any(line.startswith("ok    sink nats: reachable") for line in lines)
    assert any(line.startswith("ok    checkpoint sqlite: opens") for line in lines)
    assert any(line.startswith("ok    control endpoint reviews: create allowed") for line in lines)


async def test_unknown_kind_fails_naming_the_kind(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    config = nats_config(
        tmp_path,
        kubeconfig,
        nats_control.url,
        resources=[
            {"apiVersion": "v1", "kind": "Pod"},
            {"apiVersion": "example.com/v1", "kind": "Gadget"},
        ],
    )
    code, lines, err = await check(config)
    assert "Traceback" not in err, err
    assert code != 0, lines
    failed = failures(lines)
    assert len(failed) == 1, lines
    assert "Gadget" in failed[0] and "example.com/v1" in failed[0]
    # The other resource and the sink are still checked: one run shows every problem.
    assert any("resource v1/Pod watch: allowed" in line for line in lines)
    assert any(line.startswith("ok    sink nats") for line in lines)


async def test_forbidden_watch_fails_naming_verb_and_resource(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    emulator.forbid(verb="watch", resource="pods")
    code, lines, err = await check(nats_config(tmp_path, kubeconfig, nats_control.url))
    assert "Traceback" not in err, err
    assert code != 0, lines
    failed = failures(lines)
    assert len(failed) == 1, lines
    assert "watch" in failed[0] and "pods" in failed[0] and "v1/Pod" in failed[0]
    assert any("resource v1/Pod list: allowed" in line for line in lines)


async def test_unreachable_bus_fails_naming_the_sink(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator
) -> None:
    dead = f"nats://127.0.0.1:{free_port()}"  # nothing listens there
    config = nats_config(tmp_path, kubeconfig, dead)
    started = time.monotonic()
    code, lines, err = await check(config)
    assert "Traceback" not in err, err
    elapsed = time.monotonic() - started
    assert code != 0, lines
    failed = failures(lines)
    assert failed and failed[0].startswith("FAIL  sink nats"), lines
    assert all("resource" not in line for line in failed)
    assert elapsed < 30, f"check took {elapsed:.1f}s against a dead bus"


async def test_bad_config_key_exits_2_with_one_line_naming_the_key(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator
) -> None:
    config = nats_config(tmp_path, kubeconfig, "nats://127.0.0.1:4222")
    doc = yaml.safe_load(config.read_text())
    doc["checkpoint"]["flushIntervall"] = 1
    config.write_text(yaml.safe_dump(doc))
    code, lines, err = await check(config)
    assert "Traceback" not in err, err
    assert code == 2, (lines, err)
    assert lines == []
    err_lines = err.strip().splitlines()
    assert len(err_lines) == 1, err
    assert "checkpoint.flushIntervall" in err_lines[0]
    assert "flushInterval" in err_lines[0].replace("checkpoint.flushIntervall", "")


LEADER = {"enabled": True, "leaseName": "bridge-lock", "namespace": "default"}


async def test_leader_election_checks_the_lease_rights_run_uses(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    config = nats_config(tmp_path, kubeconfig, nats_control.url, leaderElection=LEADER)
    code, lines, err = await check(config)
    assert code == 0, (lines, err)
    assert "ok    leader election namespace default: exists" in lines
    assert (
        "ok    leader election lease default/bridge-lock: get, create, update allowed on "
        "leases.coordination.k8s.io in namespace default"
    ) in lines
    # run reads its Lease before anything else: without get it stays a standby.
    emulator.forbid(verb="get", resource="leases", group="coordination.k8s.io")
    code, lines, err = await check(config)
    assert "Traceback" not in err, err
    assert code == 1, lines
    (failed,) = failures(lines)
    assert failed.startswith("FAIL  leader election lease default/bridge-lock: forbidden to get")
    assert "grant get, create, update" in failed
    # A Lease in another namespace is not the bridge's: the rule there changes nothing.
    emulator.forbid_rules.clear()
    emulator.forbid(verb="update", resource="leases", namespace="kube-system")
    code, lines, err = await check(config)
    assert code == 0, lines


async def test_leader_election_in_a_missing_namespace_fails_naming_it(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    config = nats_config(
        tmp_path, kubeconfig, nats_control.url, leaderElection=LEADER | {"namespace": "nowhere"}
    )
    code, lines, err = await check(config)
    assert "Traceback" not in err, err
    assert code == 1, lines
    (failed,) = failures(lines)
    assert failed.startswith("FAIL  leader election namespace nowhere: does not exist")
    assert "leaderElection.namespace" in failed


async def test_control_reviews_forbidden_fail_naming_auth_delegator(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    emulator.forbid(verb="create", resource="subjectaccessreviews")
    code, lines, err = await check(nats_config(tmp_path, kubeconfig, nats_control.url))
    assert "Traceback" not in err, err
    assert code == 1, lines
    (failed,) = failures(lines)
    assert failed.startswith("FAIL  control endpoint reviews:")
    assert "subjectaccessreviews.authorization.k8s.io" in failed and "tokenreviews" not in failed
    assert "system:auth-delegator" in failed and "server.controlAuth token or none" in failed
    # With a static control token the bridge reviews nothing: no line, exit 0.
    config = nats_config(
        tmp_path, kubeconfig, nats_control.url, server={"host": "127.0.0.1", "port": 0}
    )
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["BRIDGE_SERVER__CONTROLTOKEN"] = "s3cret"
    code, out, err = await cli("check", "--config", str(config), env=env)
    assert code == 0, (out, err)
    assert "control endpoint" not in out


async def test_a_checkpoint_held_by_a_live_process_is_read_not_failed(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    config = nats_config(tmp_path, kubeconfig, nats_control.url)
    path = tmp_path / "state.db"
    held = SqliteCheckpointStore(path)  # takes the same lock a running bridge holds
    await held.open()
    try:
        code, lines, err = await check(config)
        assert "Traceback" not in err, err
        assert code == 0, lines
        assert (
            f"ok    checkpoint sqlite: opens read-only: a running k8s-bridge (pid {os.getpid()})"
            f" holds {path}"
        ) in lines
        await held.commit("r", "42", [], [])
    finally:
        await held.close()
    # Released: check opens it for writing again, as run would.
    code, lines, err = await check(config)
    assert code == 0, lines
    assert "ok    checkpoint sqlite: opens" in lines


async def test_a_missing_checkpoint_bucket_is_said_and_left_missing(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    """The store's open creates a missing bucket; check says the first start will."""
    import nats
    import nats.js.errors

    bucket = f"cp-{uuid.uuid4().hex[:8]}"
    checkpoint = {"kind": "nats-kv", "bucket": bucket}
    config = nats_config(tmp_path, kubeconfig, nats_control.url, checkpoint=checkpoint)
    code, lines, err = await check(config)
    assert "Traceback" not in err, err
    assert code == 0, (lines, err)
    assert (
        f"ok    checkpoint nats-kv: bucket {bucket!r} does not exist yet: the first start"
        " creates it (history 1)"
    ) in lines, lines
    nc = await nats.connect(nats_control.url)
    try:
        js = nc.jetstream()
        with pytest.raises(nats.js.errors.BucketNotFoundError):
            await js.key_value(bucket)
        await js.create_key_value(bucket=bucket, history=1)
        code, lines, err = await check(config)
        assert code == 0, (lines, err)
        assert f"ok    checkpoint nats-kv: bucket {bucket!r} exists" in lines, lines
    finally:
        await nc.close()


# -- the bus's durability: warnings, one line each, never a failure ------------------------


def warnings(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("WARN")]


async def test_a_memory_stream_is_a_warning_and_a_file_stream_is_not(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    import nats
    from nats.js.api import StorageType

    nc = await nats.connect(nats_control.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="MEM", subjects=["mem.>"], storage=StorageType.MEMORY)
        await js.add_stream(name="DISK", subjects=["disk.>"], storage=StorageType.FILE)
    finally:
        await nc.close()
    for stream in ("MEM", "DISK"):
        home = tmp_path / stream
        home.mkdir()
        config = write_config(
            home / "bridge.yaml",
            kubeconfig=kubeconfig,
            sink={
                "kind": "nats",
                "nats": {
                    "servers": [nats_control.url],
                    "stream": stream,
                    "subjects": [f"{stream.lower()}.>"],
                },
            },
            resources=[{"apiVersion": "v1", "kind": "Pod"}],
        )
        code, lines, err = await check(config)
        assert code == 0, (lines, err)
        warned = warnings(lines)
        memory = [w for w in warned if "memory storage" in w]
        if stream == "MEM":
            assert memory == [
                "WARN  sink nats stream MEM: stream MEM has memory storage: a server restart "
                "loses every acknowledged event; use file storage"
            ], lines
        else:
            assert memory == [], lines
        # One server: fewer than 3 replicas either way.
        assert any(f"stream {stream} has 1 replica(s)" in w for w in warned), lines


async def test_the_checkpoint_bucket_below_r3_or_in_memory_warns_and_r3_file_is_ok(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_cluster: NatsCluster
) -> None:
    """The NATS KV checkpoint is read as the stream is: on a real three-node JetStream
    cluster, a bucket of one replica in memory warns twice (each naming the bucket),
    one of three replicas on file says what it read."""
    import nats
    from nats.js.api import StorageType

    nc = await nats.connect(servers=nats_cluster.urls)
    try:
        js = nc.jetstream()
        await js.add_stream(name="K8S", subjects=["k8s.>"], num_replicas=3)
        await js.create_key_value(bucket="weak", history=1, storage=StorageType.MEMORY)
        await js.create_key_value(bucket="strong", history=1, replicas=3)
    finally:
        await nc.close()
    seen = {}
    for bucket in ("weak", "strong"):
        home = tmp_path / bucket
        home.mkdir()
        config = write_config(
            home / "bridge.yaml",
            kubeconfig=kubeconfig,
            sink={"kind": "nats", "nats": {"servers": nats_cluster.urls}},
            checkpoint={"kind": "nats-kv", "bucket": bucket},
            resources=[{"apiVersion": "v1", "kind": "Pod"}],
        )
        code, lines, err = await check(config)
        assert code == 0, (lines, err)
        seen[bucket] = [line for line in lines if "checkpoint nats-kv bucket" in line]
    assert seen["weak"] == [
        "WARN  checkpoint nats-kv bucket weak: bucket weak has memory storage: a server"
        " restart loses every acknowledged checkpoint row; use file storage",
        "WARN  checkpoint nats-kv bucket weak: bucket weak has 1 replica(s): the loss of"
        " that server's disk loses acknowledged checkpoint rows; use 3 replicas on a"
        " cluster of 3 or more servers",
    ], seen
    assert len(seen["strong"]) == 1 and seen["strong"][0].startswith(
        "ok    checkpoint nats-kv bucket strong: file storage, 3 replica(s)"
    ), seen


async def kafka_topic_with(bootstrap: str, name: str, configs: dict[str, str]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(name, num_partitions=1, replication_factor=1, topic_configs=configs)]
        )
    finally:
        await admin.close()


def kafka_check_config(home: Path, kubeconfig: Path, bootstrap: str, topic: str, acks: Any) -> Path:
    home.mkdir()
    return write_config(
        home / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={
            "kind": "kafka",
            # acks other than all needs the idempotent producer off (aiokafka refuses both).
            "kafka": {
                "bootstrapServers": [bootstrap],
                "topic": topic,
                "acks": acks,
                "enableIdempotence": acks == "all",
            },
        },
        resources=[{"apiVersion": "v1", "kind": "Pod"}],
    )


@pytest.mark.timeout(180)  # three checks and a broker of its own to start
async def test_kafka_topic_below_what_the_guarantees_need_warns_one_line_each(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, kafka_broker: str
) -> None:
    weak, sound = f"weak-{uuid.uuid4().hex[:8]}", f"sound-{uuid.uuid4().hex[:8]}"
    await kafka_topic_with(
        kafka_broker,
        weak,
        {"min.insync.replicas": "1", "unclean.leader.election.enable": "true"},
    )
    # All a single broker can express: a replication factor of 3 it cannot.
    await kafka_topic_with(
        kafka_broker,
        sound,
        {"min.insync.replicas": "2", "unclean.leader.election.enable": "false"},
    )
    code, lines, err = await check(
        kafka_check_config(tmp_path / "weak", kubeconfig, kafka_broker, weak, 1)
    )
    assert code == 0, (lines, err)
    what = f"WARN  sink kafka topic {weak}: "
    assert warnings(lines) == [
        what + "sink.kafka.acks is 1: the broker acknowledges before the in-sync replicas "
        "have the event, so a leader failover loses acknowledged events; set acks: all",
        what + "replication factor is 1: the loss of one broker's disk loses acknowledged "
        "events; use 3 or more",
        what + "min.insync.replicas is 1: acks=all is then satisfied by the leader alone; "
        "set it to 2 or more (with a replication factor of 3)",
        what + "unclean.leader.election.enable is true: an out-of-sync replica may become "
        "leader and drop acknowledged events; set it to false",
    ], lines

    code, lines, err = await check(
        kafka_check_config(tmp_path / "sound", kubeconfig, kafka_broker, sound, "all")
    )
    assert code == 0, (lines, err)
    assert warnings(lines) == [
        f"WARN  sink kafka topic {sound}: replication factor is 1: the loss of one broker's "
        "disk loses acknowledged events; use 3 or more"
    ], lines

    # A topic per resource is created when first published to: the broker's defaults.
    templated = f"t-{uuid.uuid4().hex[:8]}-{{resource}}"
    code, lines, err = await check(
        kafka_check_config(tmp_path / "templated", kubeconfig, kafka_broker, templated, "all")
    )
    assert code == 0, (lines, err)
    what = f"WARN  sink kafka topics {templated} (to be created with the broker's defaults): "
    assert warnings(lines) == [
        what + "default.replication.factor is 1: the loss of one broker's disk loses "
        "acknowledged events; use 3 or more",
        what + "min.insync.replicas is 1: acks=all is then satisfied by the leader alone; "
        "set it to 2 or more (with a replication factor of 3)",
    ], lines


@pytest.mark.parametrize("gate", ["on", "off"])
async def test_a_sharded_config_says_whether_the_server_honours_the_selector(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer, gate: str
) -> None:
    emulator.sharded_list_watch = gate == "on"
    config = nats_config(
        tmp_path,
        kubeconfig,
        nats_control.url,
        sharding={"by": "uid", "shards": 3, "shardIndex": 1},
    )
    code, lines, err = await check(config)
    assert code == 0, (lines, err)
    shard = [line for line in lines if " shard:" in line]
    assert len(shard) == 3, lines  # one per resource: Pod, Secret, Widget
    if gate == "on":
        assert all("shardSelector honoured by the server for uid:5555-aaaa" in s for s in shard)
    else:
        assert all("NOT honoured" in s and "filtered on the client" in s for s in shard), shard


async def test_dead_letters_are_shown_and_a_missing_destination_is_one_line(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    config = nats_config(tmp_path, kubeconfig, nats_control.url)
    doc = yaml.safe_load(config.read_text())
    doc["sink"]["poisonPolicy"] = "deadLetter"
    config.write_text(yaml.safe_dump(doc))
    code, lines, err = await check(config)
    assert code == 2 and lines == [], (lines, err)
    assert err.strip() == (
        "config error: sink.poisonPolicy: deadLetter needs sink.nats.deadLetterSubject"
    ), err
    doc["sink"]["nats"]["deadLetterSubject"] = "deadletters.k8s"
    config.write_text(yaml.safe_dump(doc))
    code, lines, err = await check(config)
    assert code == 0, (lines, err)
    assert (
        "ok    dead letters: v1/Pod, v1/Secret, example.com/v1/Widget: refused events go to"
        " subject deadletters.k8s (stream K8S_DEAD_LETTERS); their truncated copies to the"
        " main stream"
    ) in lines, lines
