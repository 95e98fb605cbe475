"""Routes: which of sink.routes an event goes to, decided once when it is built.

``first`` takes the first route whose ``when`` holds, ``all`` every one, and no
route holding means the default destination (``Event.routes == ()``). A route
that cannot be evaluated does not hold. Bad routes are one config line naming
the route's key.
"""

from __future__ import annotations

from typing import Any

import pytest

from bridge.delivery.changes import ChangeDetector, Fingerprinter
from bridge.delivery.events import EventBuilder
from bridge.delivery.routes import Router
from bridge.errors import ConfigError
from bridge.ground.envelope import Event
from bridge.service.settings import load_settings
from bridge.service.wiring import event_builder, router

TEAM_A = "object.metadata.namespace.startsWith('team-a')"
WEB = "object.metadata.labels.app == 'web'"
ROUTES = [("team-a", TEAM_A), ("web", WEB)]


def obj(ns: str, app: str = "db", rv: str = "1") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": ns,
            "uid": f"u-{ns}",
            "resourceVersion": rv,
            "labels": {"app": app},
        },
    }


def test_first_takes_the_first_route_that_holds_and_none_is_the_default() -> None:
    r = Router(ROUTES, "first")
    assert r.decide(obj("team-a-1", "web"), None, "added") == ("team-a",)
    assert r.decide(obj("team-b", "web"), None, "added") == ("web",)
    assert r.decide(obj("team-b"), None, "added") == ()


def test_all_takes_every_route_that_holds_in_their_order() -> None:
    r = Router(ROUTES, "all")
    assert r.decide(obj("team-a-1", "web"), None, "modified") == ("team-a", "web")
    assert r.decide(obj("team-a-1"), None, "modified") == ("team-a",)
    assert r.decide(obj("x"), None, "modified") == ()


def test_routes_see_old_object_and_type_and_an_error_is_does_not_hold() -> None:
    r = Router(
        [("deletes", "type == 'deleted'"), ("moved", "oldObject.metadata.namespace != 'x'")],
        "all",
    )
    assert r.decide(obj("a"), obj("b"), "deleted") == ("deletes", "moved")
    # oldObject is null on an add: the second route cannot be evaluated, so it does not hold.
    assert r.decide(obj("a"), None, "added") == ()
    assert r.errors == 1


def test_only_the_fields_the_routes_read_are_parsed() -> None:
    assert Router(ROUTES).reads() == frozenset({"metadata"})
    assert Router([("all", "size(object) > 0")]).reads() is None


def build(builder: EventBuilder, o: dict[str, Any]) -> Event:
    [change] = ChangeDetector(Fingerprinter([])).on_add(o)
    return builder.build(change, sealed=True)


def test_the_event_carries_its_routes_and_without_routes_none() -> None:
    plain = EventBuilder(cluster="c", group="", version="v1", kind="Pod", plural="pods")
    routed = EventBuilder(
        cluster="c", group="", version="v1", kind="Pod", plural="pods", router=Router(ROUTES)
    )
    assert build(plain, obj("team-a")).routes == ()
    e = build(routed, obj("team-a"))
    assert e.routes == ("team-a",)
    # The CloudEvent itself is the same with or without routes: same id, no new field.
    assert e.id == build(plain, obj("team-a")).id
    assert b"routes" not in e.to_json()
    assert e.route_msg_id("team-a") == f"{e.id}@team-a"


def config(sink: dict[str, Any]) -> dict[str, Any]:
    return {"resources": [{"apiVersion": "v1", "kind": "Pod"}], "sink": sink}


KAFKA = {"kind": "kafka", "kafka": {"topic": "k8s"}}


def test_settings_build_the_router_the_builder_uses() -> None:
    s = load_settings(
        None,
        env={},
        overrides=config(
            {
                **KAFKA,
                "routing": "all",
                "routes": [{"name": "a", "when": TEAM_A, "topic": "team-a.k8s"}],
            }
        ),
    )
    r = router(s)
    assert r is not None and r.mode == "all"
    assert load_settings(None, env={}, overrides=config(KAFKA)).sink.routes == []
    assert router(load_settings(None, env={}, overrides=config(KAFKA))) is None


@pytest.mark.parametrize(
    ("sink", "message"),
    [
        (
            {**KAFKA, "routes": [{"name": "a", "when": "object.metadata.(", "topic": "t"}]},
            "sink.routes[0].when (route 'a'): does not compile: line 1",
        ),
        (
            {**KAFKA, "routes": [{"name": "a", "when": "spec.x == 1", "topic": "t"}]},
            "sink.routes[0].when (route 'a'): unknown variable 'spec'",
        ),
        (
            {
                **KAFKA,
                "routes": [
                    {"name": "a", "when": "true", "topic": "t"},
                    {"name": "a", "when": "true", "topic": "u"},
                ],
            },
            "sink.routes[1].name: 'a' names two routes",
        ),
        (
            {**KAFKA, "routes": [{"name": "a", "when": "true", "subjectPrefix": "a"}]},
            "sink.routes[0] (route 'a'): a kafka sink needs the route's topic",
        ),
        (
            {"kind": "nats", "routes": [{"name": "a", "when": "true", "topic": "t"}]},
            "sink.routes[0] (route 'a'): a nats sink needs the route's subjectPrefix",
        ),
        (
            {"kind": "nats", "routes": [{"name": "a", "when": "true", "subjectPrefix": "team-a"}]},
            "sink.routes[0].subjectPrefix: 'team-a' is outside sink.nats.subjects ['k8s.>']",
        ),
        (
            {"kind": "nats", "routes": [{"name": "a", "when": "true", "subjectPrefix": "a.*"}]},
            "sink.routes[0].subjectPrefix: 'a.*' is not a plain NATS subject prefix",
        ),
        (
            {"kind": "stdout", "routes": [{"name": "a", "when": "true", "topic": "t"}]},
            "sink.routes[0]: routes need a kafka or nats sink (sink.kind is stdout)",
        ),
        (
            {**KAFKA, "routing": "some"},
            "sink.routing: 'some' is not one of first, all",
        ),
        (
            {**KAFKA, "routes": [{"name": "a b", "when": "true", "topic": "t"}]},
            "sink.routes[0].name: 'a b'",
        ),
    ],
)
def test_a_bad_route_is_one_line_naming_its_key(sink: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_settings(None, env={}, overrides=config(sink))
    text = str(e.value)
    assert message in text, text
    assert "\n" not in text


def test_a_nats_route_inside_the_stream_subjects_is_accepted() -> None:
    s = load_settings(
        None,
        env={},
        overrides=config(
            {
                "kind": "nats",
                "nats": {"subjects": ["k8s.>", "team-a.>"]},
                "routes": [{"name": "a", "when": "true", "subjectPrefix": "team-a"}],
            }
        ),
    )
    assert s.sink.routes[0].subject_prefix == "team-a"


def test_the_resource_builder_decides_routes_from_the_settings() -> None:
    from bridge.kube.discovery import ResourceInfo

    s = load_settings(
        None,
        env={},
        overrides=config({**KAFKA, "routes": [{"name": "a", "when": TEAM_A, "topic": "t"}]}),
    )
    info = ResourceInfo(
        group="", version="v1", kind="Pod", plural="pods", namespaced=True, verbs=("list",)
    )
    builder = event_builder(s, s.resources[0], info)
    assert build(builder, obj("team-a-x")).routes == ("a",)
    assert build(builder, obj("team-b")).routes == ()
    # The decoder parses metadata for the route even though nothing else reads it.
    assert builder.reads() is not None and "metadata" in builder.reads()  # type: ignore[operator]


def test_a_route_topic_template_is_checked_naming_the_route() -> None:
    from bridge.sinks.kafka import KafkaSink

    with pytest.raises(ConfigError, match=r"sink.routes \(a\).topic 'x-\{nope\}'"):
        KafkaSink(["127.0.0.1:1"], routes={"a": "x-{nope}"})


def test_a_resource_takes_the_routes_it_names_or_all_or_none() -> None:
    routes = [
        {"name": "a", "when": TEAM_A, "topic": "ta"},
        {"name": "web", "when": WEB, "topic": "tw"},
    ]
    s = load_settings(
        None,
        env={},
        overrides={
            "resources": [
                {"apiVersion": "v1", "kind": "Pod"},
                {"apiVersion": "v1", "kind": "ConfigMap", "routes": ["web"]},
                {"apiVersion": "v1", "kind": "Secret", "routes": []},
            ],
            "sink": {**KAFKA, "routing": "all", "routes": routes},
        },
    )
    pods, configmaps, secrets = (router(s, res) for res in s.resources)
    assert pods is not None and pods.decide(obj("team-a", "web"), None, "added") == ("a", "web")
    assert configmaps is not None
    assert configmaps.decide(obj("team-a", "web"), None, "added") == ("web",)
    assert secrets is None
    with pytest.raises(ConfigError) as e:
        load_settings(
            None,
            env={},
            overrides={
                "resources": [{"apiVersion": "v1", "kind": "Pod", "routes": ["nope"]}],
                "sink": {**KAFKA, "routes": routes},
            },
        )
    assert "resources[0].routes: 'nope' is not the name of one of sink.routes (a, web)" in str(
        e.value
    )


def test_the_kafka_sink_makes_one_record_per_route_and_one_without() -> None:
    from bridge.sinks.kafka import KafkaSink

    builder = EventBuilder(
        cluster="c", group="", version="v1", kind="Pod", plural="pods", router=Router(ROUTES, "all")
    )
    evs = [
        build(builder, obj("team-a-1", "web")),
        build(builder, obj("x")),
        build(builder, obj("y", "web")),
    ]
    sink = KafkaSink(
        ["127.0.0.1:1"], topic="k8s-{resource}", routes={"team-a": "a", "web": "w-{kind}"}
    )
    records = sink.records(evs)
    assert [(i, topic) for i, topic, *_ in records] == [
        (0, "a"),
        (0, "w-Pod"),
        (1, "k8s-pods"),
        (2, "w-Pod"),
    ]
    # The same key, value and headers on every route of an event.
    assert records[0][2:] == records[1][2:]
    # Without routes configured: one record per event, as the routed path makes it.
    plain = KafkaSink(["127.0.0.1:1"], topic="k8s-{resource}")
    assert [r[1:] for r in plain.records([evs[1]])] == [records[2][1:]]
    assert [
        r[:2] for r in KafkaSink(["127.0.0.1:1"], topic="t", state_table=True).records(evs[1:2])
    ] == [(0, "t")]
