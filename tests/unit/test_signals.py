"""Heartbeats and snapshot signals, piece by piece: the outbox's announcements, the
heartbeat event, where Kafka puts heartbeats, the control endpoint, the settings and
the CLI's answers when the bridge is not there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from bridge.cli.check import subject_matches
from bridge.cli.main import main
from bridge.cli.snapshot import control_url, summary
from bridge.delivery.heartbeat import HeartbeatBuilder, HeartbeatTarget
from bridge.delivery.outbox import Outbox
from bridge.errors import ConfigError, SnapshotError
from bridge.ground.digest import UNCERTAIN, Digest
from bridge.ground.envelope import HEARTBEAT_TYPE, Event
from bridge.ground.prometheus import Registry
from bridge.service.control import StaticToken
from bridge.service.health import HealthServer
from bridge.service.settings import load_settings, settings_json_schema
from bridge.sinks.kafka import KafkaSink
from tests.fixtures.nats import free_port


def event(uid: str, rv: str, change: str = "modified", subject: str = "ns/x") -> Event:
    return Event(
        id=f"{uid}:{rv}",
        type=f"io.k8s.core.v1.Pod.{change}",
        source="k8s://t/v1/pods",
        subject=subject,
        time="2024-01-01T00:00:00Z",
        resource_version=rv,
        initial=False,
        data={},
    )


# -- the outbox: announcements are ordered, and change nothing the checkpoint holds --------


def test_an_announcement_leaves_in_decision_order_and_writes_nothing_ahead() -> None:
    cache = {"a": Digest("a", "ua", "10", "f1")}
    outbox = Outbox(cache.get)
    outbox.decide("a", "ua", event("ua", "10"), cache["a"])
    outbox.announce("a", "ua", event("ua", "10", "snapshot"))
    outbox.announce("b", "ub", event("ub", "7", "snapshot"))
    cache["a"] = Digest("a", "ua", "11", "f2")
    outbox.decide("a", "ua", event("ua", "11"), cache["a"])
    batch = outbox.take(10)
    assert batch is not None
    assert [e.event.type.rsplit(".")[-1] for e in batch.entries] == [
        "modified",
        "snapshot",
        "snapshot",
        "modified",
    ]
    # Only the decisions' state is written ahead; b (announced alone) gets no row.
    assert batch.ahead == [Digest("a", "ua", "11", "f2", UNCERTAIN)]


def test_an_acknowledged_announcement_commits_nothing() -> None:
    cache = {"b": Digest("b", "ub", "7", "f")}
    outbox = Outbox(cache.get, watermark="7")
    outbox.announce("b", "ub", event("ub", "7", "snapshot"))
    batch = outbox.take(10)
    assert batch is not None and batch.ahead == []
    assert not outbox.is_open("b")
    outbox.acknowledged(batch)
    assert outbox.unacknowledged == 0
    assert outbox.checkpoint() is None  # no key dirtied, the watermark unchanged


# -- the heartbeat event ---------------------------------------------------------------------


class Source:
    label = "example.com/v1/widgets@team.a"
    resource_id = "example.com/v1/widgets@team.a"
    committed_resource_version = "42"
    sink_healthy = True

    def has_synced(self) -> bool:
        return True

    def watch_up(self) -> bool:
        return False

    def object_count(self) -> int:
        return 3

    def unacknowledged(self) -> int:
        return 0

    def seconds_since_last_change(self) -> float | None:
        return None

    def checkpoint_lag(self) -> float:
        return 0.25


def test_a_heartbeat_says_where_the_resource_stands_under_an_id_of_its_own() -> None:
    target = HeartbeatTarget("prod.eu", "example.com", "v1", "Widget", "widgets", "team.a")
    builder = HeartbeatBuilder(target, 15.0, run_id="r1")
    first, second = builder.build(Source()), builder.build(Source())
    assert (first.id, second.id) == ("hb:r1:1", "hb:r1:2")
    assert first.type == HEARTBEAT_TYPE
    assert first.source == "k8s://prod.eu/example.com/v1/widgets"
    # Escaped like every subject token (dots in cluster, group and namespace).
    assert first.nats_subject == "k8s.prod%2Eeu.heartbeat.example%2Ecom.v1.widgets.team%2Ea"
    assert first.resource_version == "42"
    assert first.data == {
        "cluster": "prod.eu",
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "resource": "widgets",
        "namespace": "team.a",
        "checkpointId": "example.com/v1/widgets@team.a",
        "watermark": "42",
        "objects": 3,
        "secondsSinceLastChange": None,
        "synced": True,
        "watchUp": False,
        "unacknowledged": 0,
        "checkpointLagSeconds": 0.25,
        "intervalSeconds": 15.0,
        "sequence": 1,
    }


def test_kafka_puts_heartbeats_on_their_own_topic() -> None:
    target = HeartbeatTarget("dev", "", "v1", "Pod", "pods")
    beat = HeartbeatBuilder(target, 5.0).build(Source())
    assert KafkaSink(["k:9092"]).topic_for(beat) == "k8s-events.heartbeats"
    templated = KafkaSink(["k:9092"], topic="k8s.{cluster}.{resource}")
    assert templated.topic_for(beat) == "k8s.dev.pods.heartbeats"
    assert templated.topic_for(event("u", "1")) == "k8s.t.pods"
    chosen = KafkaSink(["k:9092"], heartbeat_topic="beats-{kind}")
    assert chosen.topic_for(beat) == "beats-Pod"
    with pytest.raises(ConfigError, match=r"sink\.kafka\.heartbeatTopic"):
        KafkaSink(["k:9092"], heartbeat_topic="beats-{nope}")


# -- settings --------------------------------------------------------------------------------


def config(tmp_path: Path, **extra: Any) -> Path:
    doc: dict[str, Any] = {
        "resources": [{"apiVersion": "v1", "kind": "Pod", "heartbeatInterval": 30}],
        "sink": {"kind": "nats"},
        "server": {"host": "127.0.0.1", "port": free_port()},
    }
    doc.update(extra)
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_new_keys_are_settings_and_in_the_schema(tmp_path: Path) -> None:
    s = load_settings(
        str(config(tmp_path)),
        {"server.controlToken": "t0ken", "sink.kafka.heartbeatTopic": "beats"},
    )
    assert s.resources[0].heartbeat_interval == 30.0
    assert s.server.control_token is not None
    assert s.server.control_token.get_secret_value() == "t0ken"
    assert s.sink.kafka.heartbeat_topic == "beats"
    schema = settings_json_schema()["$defs"]
    assert "heartbeatInterval" in schema["ResourceSettings"]["properties"]
    assert "heartbeatTopic" in schema["KafkaSettings"]["properties"]
    assert "controlToken" in schema["ServerSettings"]["properties"]
    with pytest.raises(ConfigError, match=r"resources\[0\].heartbeatInterval"):
        load_settings(
            str(config(tmp_path)),
            {"resources": [{"apiVersion": "v1", "kind": "Pod", "heartbeatInterval": 0}]},
        )


def test_the_control_url_reaches_a_server_bound_everywhere_over_loopback(tmp_path: Path) -> None:
    s = load_settings(str(config(tmp_path)), {"server.host": "0.0.0.0", "server.port": 9090})
    assert control_url(s) == "http://127.0.0.1:9090"
    s = load_settings(str(config(tmp_path)), {"server.host": "::1", "server.port": 9090})
    assert control_url(s) == "http://[::1]:9090"


# -- the control endpoint ----------------------------------------------------------------


async def test_the_snapshot_endpoint_wants_post_the_token_and_a_resource() -> None:
    asked: list[str] = []

    async def snapshot(resource: str) -> dict[str, Any]:
        asked.append(resource)
        if resource == "Nope":
            raise SnapshotError("resource 'Nope' is not configured", status=404)
        return {"signalId": "s1", "announced": 2}

    server = HealthServer(
        "127.0.0.1",
        0,
        Registry(),
        lambda: (True, []),
        snapshot=snapshot,
        control_auth=StaticToken("t0ken"),
    )
    good = {"Authorization": "Bearer t0ken"}
    async with server, aiohttp.ClientSession() as http:
        url = f"{server.url}/snapshot"
        async with http.get(url, params={"resource": "Pod"}, headers=good) as r:
            assert r.status == 405  # a probe or a scrape never starts one
        async with http.post(url, params={"resource": "Pod"}) as r:
            assert r.status == 401
        async with http.post(
            url, params={"resource": "Pod"}, headers={"Authorization": "Bearer x"}
        ) as r:
            assert r.status == 401
        async with http.post(url, headers=good) as r:
            assert r.status == 400
        async with http.post(url, params={"resource": "Nope"}, headers=good) as r:
            assert (r.status, await r.json()) == (
                404,
                {"error": "resource 'Nope' is not configured"},
            )
        async with http.post(url, params={"resource": "Pod"}, headers=good) as r:
            assert (r.status, await r.json()) == (200, {"signalId": "s1", "announced": 2})
    assert asked == ["Nope", "Pod"]


# -- the CLI ---------------------------------------------------------------------------------


def test_snapshot_of_a_resource_not_configured_exits_2_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["snapshot", "--config", str(config(tmp_path)), "--resource", "Widget"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--resource 'Widget' is not configured" in err


def test_snapshot_without_a_running_bridge_exits_1_naming_host_and_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(tmp_path)
    port = yaml.safe_load(path.read_text())["server"]["port"]
    assert main(["snapshot", "--config", str(path), "--resource", "pod"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"cannot reach the bridge at 127.0.0.1:{port}" in err


def test_check_matches_subjects_as_nats_does() -> None:
    assert subject_matches("k8s.>", "k8s.dev.heartbeat.core.v1.pods._")
    assert subject_matches("k8s.*.heartbeat.>", "k8s.dev.heartbeat.core.v1.pods._")
    assert not subject_matches("k8s.dev.core.>", "k8s.dev.heartbeat.core.v1.pods._")
    assert not subject_matches("k8s.>", "k8s")
    assert not subject_matches("k8s.*", "k8s.a.b")


def test_the_summary_names_the_signal_and_the_counts() -> None:
    line = summary(
        {
            "signalId": "ab12",
            "resources": ["v1/pods"],
            "listed": 5,
            "announced": 3,
            "skipped": 2,
            "skippedBy": {"changed": 1, "not-cached": 1},
            "seconds": 0.5,
        }
    )
    assert line == (
        "snapshot ab12 of v1/pods: announced 3, skipped 2 (1 changed, 1 not-cached),"
        " listed 5 in 0.5s"
    )
