"""``Mirror.apply`` without a bus: idempotent per object, deletes, filtered, slim mode,
handlers with the old and the new object, heartbeats and freshness."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from bridge.mirroring.mirror import Mirror, MirrorStats, slimmer
from bridge.service.settings import load_settings

SETTINGS = load_settings(
    None,
    {
        "cluster": {"kubeconfig": "/dev/null", "name": "c1"},
        "resources": [{"apiVersion": "v1", "kind": "Pod"}],
        "sink": {"kind": "kafka"},
    },
    env={},
)


def raw(change: str, name: str, uid: str, rv: int, *, ns: str = "ns", **labels: str) -> bytes:
    eid = {"deleted": f"{uid}:deleted", "filtered": f"{uid}:filtered:{rv}"}.get(
        change, f"{uid}:{rv}"
    )
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": uid, "resourceVersion": str(rv),
                     "labels": labels, "annotations": {"big": "x" * 100}},
        "spec": {"nodeName": f"n{rv}"},
    }  # fmt: skip
    return orjson.dumps({
        "specversion": "1.0", "id": eid, "type": f"io.k8s.core.v1.Pod.{change}",
        "source": "k8s://c1/v1/pods", "subject": f"{ns}/{name}", "resourceversion": str(rv),
        "data": {"object": obj},
    })  # fmt: skip


def mirror(**kw: Any) -> tuple[Mirror, list[tuple[Any, Any]]]:
    m = Mirror(SETTINGS, **kw)
    seen: list[tuple[Any, Any]] = []
    m.add_handler(lambda old, new: seen.append((old and old["metadata"]["resourceVersion"],
                                                new and new["metadata"]["resourceVersion"])))  # fmt: skip
    return m, seen


def test_upserts_apply_once_in_resource_version_order() -> None:
    m, seen = mirror()
    m.apply_raw(raw("added", "a", "u1", 5, app="web"))
    m.apply_raw(raw("modified", "a", "u1", 7, app="web"))
    m.apply_raw(raw("modified", "a", "u1", 6))  # older: a redelivery
    m.apply_raw(raw("added", "a", "u1", 7))  # the same again
    m.apply_raw(raw("snapshot", "a", "u1", 7))  # a re-statement
    assert m.get("Pod", "ns", "a")["metadata"]["resourceVersion"] == "7"  # type: ignore[index]
    assert seen == [(None, "5"), ("5", "7")]
    assert m.stats == MirrorStats(applied=2, stale=3)
    assert [p["metadata"]["name"] for p in m.list("v1/Pod", labels={"app": "web"})] == ["a"]
    assert m.list("Pod", namespace="other") == []


def test_a_delete_ends_the_uid_and_a_new_uid_may_reuse_the_name() -> None:
    m, seen = mirror()
    m.apply_raw(raw("added", "a", "u1", 5))
    m.apply_raw(raw("deleted", "a", "u1", 5))  # a tombstone: the last known version
    m.apply_raw(raw("modified", "a", "u1", 9))  # anything later of u1 is stale
    assert m.get("Pod", "ns", "a") is None
    m.apply_raw(raw("added", "a", "u2", 10))
    assert m.get("Pod", "ns", "a")["metadata"]["uid"] == "u2"  # type: ignore[index]
    assert seen == [(None, "5"), ("5", None), (None, "10")]


def test_filtered_leaves_view_and_an_older_upsert_cannot_bring_it_back() -> None:
    m, seen = mirror()
    m.apply_raw(raw("added", "a", "u1", 5))
    m.apply_raw(raw("filtered", "a", "u1", 8))
    m.apply_raw(raw("modified", "a", "u1", 7))  # redelivered from before it left
    assert m.get("Pod", "ns", "a") is None
    m.apply_raw(raw("added", "a", "u1", 12))  # it entered again
    assert m.get("Pod", "ns", "a")["metadata"]["resourceVersion"] == "12"  # type: ignore[index]
    assert seen == [(None, "5"), ("5", None), (None, "12")]


def test_slim_mode_keeps_what_the_caller_asked_for() -> None:
    m, _ = mirror(keep=["spec.nodeName"])
    m.apply_raw(raw("added", "a", "u1", 5, app="web"))
    assert m.get("Pod", "ns", "a") == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "5",
                     "labels": {"app": "web"}},
        "spec": {"nodeName": "n5"},
    }  # fmt: skip
    assert slimmer(lambda o: {"x": 1})({"y": 2}) == {"x": 1}


def test_bad_input_is_counted_and_skipped() -> None:
    m, _ = mirror()
    m.apply_raw(b"not json")
    m.apply_raw(None)
    m.apply_raw(b'{"id": "x"}')
    m.apply_raw(raw("added", "a", "u1", 5))
    assert (m.stats.skipped, len(m)) == (3, 1)


def test_kinds_limit_what_is_mirrored() -> None:
    m, _ = mirror(kinds=["Deployment"])
    m.apply_raw(raw("added", "a", "u1", 5))
    assert len(m) == 0


def beat(**data: Any) -> bytes:
    return orjson.dumps({
        "specversion": "1.0", "id": "hb:r:1", "type": "io.k8s.bridge.heartbeat",
        "source": "k8s://c1/v1/pods", "subject": "v1/pods",
        "data": {"apiVersion": "v1", "kind": "Pod", "namespace": None, "intervalSeconds": 1.0,
                 "synced": True, "watchUp": True, **data},
    })  # fmt: skip


def test_freshness_from_heartbeats() -> None:
    m, _ = mirror(quiet_after=60)
    assert m.freshness("Pod").state == "unknown"
    m.apply_raw(beat(secondsSinceLastChange=2.0))
    assert m.freshness("Pod").state == "fresh"
    m.apply_raw(beat(secondsSinceLastChange=600.0))
    assert m.freshness("Pod").state == "quiet"
    m.apply_raw(beat(secondsSinceLastChange=1.0, watchUp=False))
    assert m.freshness("v1/Pod").state == "stuck"
    m.apply_raw(beat(secondsSinceLastChange=1.0))
    m._beats[("v1/Pod", "")].at = time.monotonic() - 10  # three intervals without one
    f = m.freshness("Pod")
    assert f.state == "stuck" and "no heartbeat" in f.reason


def test_an_ambiguous_kind_needs_its_api_version() -> None:
    m, _ = mirror()
    m.apply_raw(raw("added", "a", "u1", 5))
    other = raw("added", "b", "u9", 6).replace(b"io.k8s.core.v1.Pod", b"io.k8s.x.io.v1.Pod")
    m.apply_raw(other)
    with pytest.raises(ValueError, match="ambiguous"):
        m.get("Pod", "ns", "a")
    assert m.get("x.io/v1/Pod", "ns", "b") is not None


class Record:
    def __init__(self, key: bytes, value: bytes | None, headers: list[tuple[str, bytes]]) -> None:
        self.key, self.value, self.headers = key, value, headers


def test_a_state_table_tombstone_deletes_what_the_table_held_before() -> None:
    """The table is read from its start: a key's object, then its tombstone (not yet
    compacted away) must leave nothing behind."""
    from bridge.mirroring.readers import state_table_event

    m, seen = mirror()
    obj = orjson.loads(raw("added", "a", "u1", 5))["data"]["object"]
    headers = [("ce_id", b"u1:5"), ("ce_type", b"io.k8s.core.v1.Pod.added")]
    upsert = state_table_event(Record(b"v1/Pod/ns/a", orjson.dumps(obj), headers))
    gone = [("ce_id", b"u1:deleted"), ("ce_type", b"io.k8s.core.v1.Pod.deleted")]
    tombstone = state_table_event(Record(b"v1/Pod/ns/a", None, gone))
    assert upsert is not None and tombstone is not None
    m.apply(upsert)
    m.apply(tombstone)
    assert m.get("Pod", "ns", "a") is None
    assert seen == [(None, "5"), ("5", None)]
    assert state_table_event(Record(b"v1/Pod/ns/a", None, [])) is None  # not ours


def test_as_json_holds_the_same_objects() -> None:
    a, _ = mirror()
    b, seen = mirror(as_json=True)
    for m in (a, b):
        m.apply_raw(raw("added", "a", "u1", 5, app="web"))
        m.apply_raw(raw("modified", "a", "u1", 6, app="db"))
        m.apply_raw(raw("added", "b", "u2", 7, app="web"))
    assert b.get("Pod", "ns", "a") == a.get("Pod", "ns", "a")
    assert b.list("Pod", labels={"app": "web"}) == a.list("Pod", labels={"app": "web"})
    assert seen == [(None, "5"), ("5", "6"), (None, "7")]
