"""The event envelope: CloudEvents validity, ids, types, subjects, redaction, extras."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import jsonpatch
import orjson
import pytest
from cloudevents.core.formats.json import JSONFormat
from cloudevents.v1.http import from_json

from bridge.delivery.changes import Change, ChangeDetector, ChangeKind, Fingerprinter
from bridge.delivery.events import LAST_APPLIED, REDACTED, EventBuilder
from bridge.ground.envelope import nats_token
from bridge.kube.objects import DeletedFinalStateUnknown

FIXED = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
detector = ChangeDetector(Fingerprinter([]))


def builder(**kw: Any) -> EventBuilder:
    defaults: dict[str, Any] = {
        "cluster": "dev",
        "group": "",
        "version": "v1",
        "kind": "Pod",
        "plural": "pods",
        "clock": lambda: FIXED,
    }
    return EventBuilder(**{**defaults, **kw})


def pod(name: str = "web", ns: str | None = "ns1", rv: str = "7", **extra: Any) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "uid": "uid-1", "resourceVersion": rv}
    if ns:
        md["namespace"] = ns
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": {"x": 1, **extra}}


def secret(**kw: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "db", "namespace": "prod", "uid": "s1", "resourceVersion": "3"},
        "type": "Opaque",
        "data": {"password": "aHVudGVyMg==", "user": "YWRtaW4="},
        "stringData": {"token": "plain-s3cr3t"},
        **kw,
    }


def assert_valid_cloudevent(raw: bytes) -> Any:
    ce = from_json(raw)
    assert ce["specversion"] == "1.0"
    # The newer core reader validates required attributes and extension names too.
    core = JSONFormat().read(None, raw)
    assert core.get_id() == ce["id"]
    return ce


def test_every_kind_of_change_is_a_valid_cloudevent() -> None:
    b = builder()
    changes = [
        *detector.on_add(pod(), None, initial=True),
        *detector.on_update(pod(), pod(rv="8", y=2)),
        *detector.on_delete(pod(rv="9")),
        *detector.on_delete(DeletedFinalStateUnknown("ns1/web", None)),
    ]
    for change in changes:
        event = b.build(change)
        ce = assert_valid_cloudevent(event.to_json())
        assert ce["source"] == "k8s://dev/v1/pods"
        assert ce["subject"] == "ns1/web"
        assert ce["datacontenttype"] == "application/json"
        assert ce["time"] == "2024-05-01T12:00:00.000000Z"
        assert ce["resourceversion"] == event.resource_version
        assert ce["initial"] == event.initial
        assert ce.get_data() == event.data


def test_id_is_deterministic_and_type_names_the_change() -> None:
    b = builder()
    [add] = detector.on_add(pod(), None)
    e1, e2 = b.build(add), builder(clock=lambda: datetime.now(UTC)).build(add)
    assert e1.id == e2.id == "uid-1:7"
    assert e1.type == "io.k8s.core.v1.Pod.added"
    [mod] = detector.on_update(pod(), pod(rv="8", y=2))
    assert b.build(mod).id == "uid-1:8"
    [gone] = detector.on_delete(pod(rv="9"))
    assert b.build(gone).type == "io.k8s.core.v1.Pod.deleted"
    assert b.build(gone).id == "uid-1:deleted"


def test_initial_flag_follows_the_change() -> None:
    [c] = detector.on_add(pod(), None, initial=True)
    assert builder().build(c).initial is True
    [c] = detector.on_add(pod(), None)
    assert builder().build(c).initial is False


def test_grouped_custom_resource_source_type_and_nats_subject() -> None:
    b = builder(group="example.com", version="v1alpha1", kind="Widget", plural="widgets")
    obj = {
        "apiVersion": "example.com/v1alpha1",
        "kind": "Widget",
        "metadata": {"name": "w.1", "namespace": "team-a", "uid": "w", "resourceVersion": "5"},
    }
    [c] = detector.on_add(obj, None)
    e = b.build(c)
    assert e.type == "io.k8s.example.com.v1alpha1.Widget.added"
    assert e.source == "k8s://dev/example.com/v1alpha1/widgets"
    assert e.nats_subject == "k8s.dev.example%2Ecom.v1alpha1.widgets.team-a.w%2E1"
    assert_valid_cloudevent(e.to_json())


def test_cluster_scoped_subject_and_namespace_placeholder() -> None:
    b = builder(kind="Node", plural="nodes")
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n1", "uid": "n", "resourceVersion": "1"},
    }
    e = b.build(detector.on_add(node, None)[0])
    assert e.subject == "n1"
    assert e.key == b"n1"
    assert e.nats_subject == "k8s.dev.core.v1.nodes._.n1"


@pytest.mark.parametrize(
    ("raw", "escaped"),
    [
        ("kube-root-ca.crt", "kube-root-ca%2Ecrt"),
        ("a*b>c", "a%2Ab%3Ec"),
        ("with space", "with%20space"),
        ("50%", "50%25"),
        ("system:controller:x", "system:controller:x"),
        ("", "_"),
    ],
)
def test_nats_tokens_are_escaped_deterministically(raw: str, escaped: str) -> None:
    assert nats_token(raw) == escaped
    for ch in ".*> \t":
        assert ch not in nats_token(raw)


def test_nats_subject_of_dotted_names_has_exactly_seven_tokens() -> None:
    e = builder().build(detector.on_add(pod(name="a.b.c", ns="x"), None)[0])
    assert len(e.nats_subject.split(".")) == 7


def test_kafka_key_and_headers() -> None:
    e = builder().build(detector.on_add(pod(), None)[0])
    assert e.key == b"ns1/web"
    assert dict(e.headers) == {
        "ce_id": b"uid-1:7",
        "ce_type": b"io.k8s.core.v1.Pod.added",
        "ce_source": b"k8s://dev/v1/pods",
        "ce_subject": b"ns1/web",
    }


def test_secret_values_never_reach_the_bytes_but_keys_stay() -> None:
    b = builder(kind="Secret", plural="secrets", include_old=True, patch=True)
    old = secret()
    new = secret(data={"password": "bmV3LXBhc3M=", "user": "YWRtaW4="})
    new["metadata"]["resourceVersion"] = "4"
    events = [b.build(c) for c in detector.on_add(old, None)]
    events += [b.build(c) for c in detector.on_update(old, new)]
    events += [b.build(c) for c in detector.on_delete(new)]
    for e in events:
        raw = e.to_json()
        for value in ("aHVudGVyMg==", "YWRtaW4=", "plain-s3cr3t", "bmV3LXBhc3M="):
            assert value.encode() not in raw
        obj = orjson.loads(raw)["data"]["object"]
        assert obj["data"] == {"password": REDACTED, "user": REDACTED}
        assert obj["stringData"] == {"token": REDACTED}
        assert obj["type"] == "Opaque"
    assert old["data"]["password"] == "aHVudGVyMg=="  # the input is untouched


def applied_secret(annotation: str) -> dict[str, Any]:
    obj = secret()
    obj["metadata"]["annotations"] = {LAST_APPLIED: annotation, "team": "db"}
    return obj


def test_secret_values_in_the_last_applied_annotation_are_redacted_keys_kept() -> None:
    """kubectl apply copies the manifest, values included, into an annotation."""
    manifest = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "db", "namespace": "prod"},
        "data": {"password": "aHVudGVyMg=="},
        "stringData": {"token": "plain-s3cr3t"},
        "type": "Opaque",
    }
    annotation = orjson.dumps(manifest).decode() + "\n"
    b = builder(kind="Secret", plural="secrets", include_old=True, patch=True)
    old = applied_secret(annotation)
    new = applied_secret(annotation.replace("plain-s3cr3t", "plain-n3w"))
    new["metadata"]["resourceVersion"] = "4"
    events = [b.build(c) for c in detector.on_add(old, None)]
    events += [b.build(c) for c in detector.on_update(old, new)]
    events += [b.build(c) for c in detector.on_delete(new)]
    events += [b.build(c) for c in detector.on_delete(DeletedFinalStateUnknown("prod/db", new))]
    for e in events:
        raw = e.to_json()
        for value in ("aHVudGVyMg==", "plain-s3cr3t", "plain-n3w"):
            assert value.encode() not in raw
        annotations = orjson.loads(raw)["data"]["object"]["metadata"]["annotations"]
        assert annotations["team"] == "db"
        assert annotations[LAST_APPLIED].endswith("\n")
        applied = orjson.loads(annotations[LAST_APPLIED])
        assert applied == {
            **manifest,
            "data": {"password": REDACTED},
            "stringData": {"token": REDACTED},
        }
    assert LAST_APPLIED in old["metadata"]["annotations"]  # the input is untouched
    assert "plain-s3cr3t" in old["metadata"]["annotations"][LAST_APPLIED]


@pytest.mark.parametrize("annotation", ['{"data": {"password": "aHVudGVyMg=="', "[1]", "x"])
def test_a_last_applied_annotation_that_does_not_parse_is_redacted_whole(annotation: str) -> None:
    b = builder(kind="Secret", plural="secrets")
    e = b.build(detector.on_add(applied_secret(annotation), None)[0])
    annotations = e.data["object"]["metadata"]["annotations"]
    assert annotations == {LAST_APPLIED: REDACTED, "team": "db"}


def test_last_applied_annotation_of_other_kinds_is_left_alone() -> None:
    obj = pod()
    obj["metadata"]["annotations"] = {LAST_APPLIED: '{"spec": {"x": 1}}\n'}
    e = builder().build(detector.on_add(obj, None)[0])
    assert e.data["object"]["metadata"]["annotations"][LAST_APPLIED] == '{"spec": {"x": 1}}\n'


def test_secret_redaction_can_be_turned_off() -> None:
    b = builder(kind="Secret", plural="secrets", redact_secrets=False)
    e = b.build(detector.on_add(secret(), None)[0])
    assert b"aHVudGVyMg==" in e.to_json()


def test_a_custom_kind_named_secret_in_a_group_is_not_redacted() -> None:
    b = builder(group="example.com", kind="Secret", plural="secrets")
    obj = secret(apiVersion="example.com/v1")
    assert b"aHVudGVyMg==" in b.build(detector.on_add(obj, None)[0]).to_json()


def test_mask_paths_replace_values() -> None:
    b = builder(mask_paths=["spec.env.value", "metadata.annotations"])
    obj = pod(env=[{"name": "A", "value": "secret-a"}, {"name": "B", "value": "secret-b"}])
    obj["metadata"]["annotations"] = {"token": "t0k"}
    raw = b.build(detector.on_add(obj, None)[0]).to_json()
    assert b"secret-a" not in raw and b"secret-b" not in raw and b"t0k" not in raw
    data = orjson.loads(raw)["data"]["object"]
    assert data["spec"]["env"] == [
        {"name": "A", "value": REDACTED},
        {"name": "B", "value": REDACTED},
    ]
    assert data["metadata"]["annotations"] == REDACTED


def test_include_old_adds_data_old() -> None:
    [c] = detector.on_update(pod(), pod(rv="8", y=2))
    assert builder(include_old=True).build(c).data["old"] == pod()
    assert "old" not in builder().build(c).data


def test_patch_is_rfc6902_from_the_last_published_object() -> None:
    b = builder(patch=True)
    v1, v2, v3 = pod(rv="1"), pod(rv="2", y=2), pod(rv="3", y=3)
    assert "patch" not in b.build(detector.on_add(v1, None)[0]).data
    # The update arrives without the old object (slim mode): the builder remembers.
    [c2] = detector.on_update(detector.digest_of(v1), v2)
    p2 = b.build(c2).data["patch"]
    assert jsonpatch.apply_patch(v1, p2) == v2
    [c3] = detector.on_update(v2, v3)
    p3 = b.build(c3).data["patch"]
    assert jsonpatch.apply_patch(v2, p3) == v3


def test_tombstone_event_carries_last_known_metadata_only() -> None:
    b = builder()
    [c] = detector.on_delete(DeletedFinalStateUnknown("ns1/web", pod(rv="9")))
    e = b.build(c)
    assert e.data["tombstone"] is True
    assert e.data["object"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "ns1", "uid": "uid-1", "resourceVersion": "9"},
    }
    assert e.id == "uid-1:deleted"


def test_checklist_28_uid_change_becomes_two_events_with_distinct_ids() -> None:
    b = builder()
    old, new = pod(rv="5"), pod(rv="9")
    new["metadata"]["uid"] = "uid-2"
    events = [b.build(c) for c in detector.on_update(old, new)]
    assert [e.id for e in events] == ["uid-1:deleted", "uid-2:9"]
    assert events[0].data["tombstone"] is True


def test_change_objects_are_not_mutated_by_building() -> None:
    obj = secret()
    c = Change(ChangeKind.ADDED, obj, "prod/db")
    builder(kind="Secret", plural="secrets", mask_paths=["metadata.name"]).build(c)
    assert obj == secret()


@pytest.mark.parametrize(
    "make",
    [
        lambda: Change(ChangeKind.ADDED, pod(), "ns1/web", initial=True),
        lambda: Change(ChangeKind.MODIFIED, pod(rv="8"), "ns1/web", old=pod()),
        lambda: Change(ChangeKind.DELETED, pod(), "ns1/web", tombstone=True),
        lambda: Change(ChangeKind.FILTERED, pod(rv="9"), "ns1/web"),
        lambda: Change(ChangeKind.MODIFIED, secret(), "prod/db"),
    ],
)
def test_a_sealed_build_is_byte_for_byte_the_built_event_encoded(make: Any) -> None:
    """The pipeline builds events sealed, in one pass; consumers must not see a difference."""
    for kw in ({}, {"include_old": True, "patch": True}, {"kind": "Secret", "plural": "secrets"}):
        plain, sealed = builder(**kw), builder(**kw)
        want = plain.build(make()).to_json()
        assert sealed.build(make(), sealed=True).encoded == want
        assert (
            plain.build(make(), resource_version="5").to_json()
            == sealed.build(make(), resource_version="5", sealed=True).to_json()
        )


def test_the_default_clock_stamps_rfc3339_utc_microseconds_now() -> None:
    b = EventBuilder(cluster="dev", group="", version="v1", kind="Pod", plural="pods")
    before = datetime.now(UTC)
    stamps = [b.build(Change(ChangeKind.ADDED, pod(), "ns1/web")).time for _ in range(3)]
    after = datetime.now(UTC)
    for stamp in stamps:
        assert len(stamp) == len("2024-05-01T12:00:00.000000Z") and stamp.endswith("Z")
        at = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        assert before - timedelta(milliseconds=1) <= at <= after + timedelta(milliseconds=1)
    assert stamps == sorted(stamps)


def test_a_sealed_event_holds_about_its_own_size() -> None:
    """Up to max_pending sealed events wait for their acks: each must not keep the
    encoder's larger output buffer (it was ~3x the event's length)."""
    import tracemalloc

    b = builder()
    objects = [pod(f"p{i}", annotation="x" * 2800) for i in range(200)]
    changes = [Change(ChangeKind.MODIFIED, o, "ns1/p") for o in objects]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        events = [b.build(c, sealed=True) for c in changes]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    size = sum(len(e.encoded) for e in events)
    assert held < 1.5 * size, (
        f"{held / len(events):.0f} B held per {size / len(events):.0f} B event"
    )
