"""Change triggers and projections (bridge/delivery/views.py): path selection, fingerprints, events."""

from __future__ import annotations

import copy
import re
from typing import Any

import orjson
import pytest

from bridge.delivery.changes import ChangeDetector, ChangeKind, Fingerprinter, compile_paths
from bridge.delivery.events import REDACTED, EventBuilder
from bridge.delivery.views import (
    ViewFingerprinter,
    compile_projection,
    fingerprinter_for,
    select,
)
from bridge.errors import ConfigError
from bridge.service.settings import load_settings

HEX32 = re.compile(r"^[0-9a-f]{32}$")


def pod(**over: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web",
            "namespace": "default",
            "uid": "u1",
            "resourceVersion": "10",
            "generation": 1,
            "labels": {"app": "web"},
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {
            "nodeName": "n1",
            "containers": [
                {"name": "a", "image": "nginx:1", "ports": [{"containerPort": 80}]},
                {"name": "b", "image": "redis:7"},
            ],
        },
        "status": {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]},
    }
    for path, value in over.items():
        node = obj
        *parents, last = path.split("__")
        for p in parents:
            node = node[p]
        node[last] = value
    return obj


def sel(obj: dict[str, Any], *paths: str) -> dict[str, Any]:
    return select(obj, compile_paths(list(paths)))


# --- select_paths -------------------------------------------------------------


def test_select_keeps_only_the_paths_and_never_mutates() -> None:
    obj = pod()
    before = copy.deepcopy(obj)
    assert sel(obj, "spec.nodeName", "status.phase") == {
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Pending"},
    }
    assert obj == before


def test_select_a_leaf_keeps_the_whole_subtree_shared() -> None:
    obj = pod()
    out = sel(obj, "spec")
    assert out == {"spec": obj["spec"]} and out["spec"] is obj["spec"]


def test_select_a_key_on_a_list_applies_to_every_element_and_keeps_positions() -> None:
    assert sel(pod(), "spec.containers.image") == {
        "spec": {"containers": [{"image": "nginx:1"}, {"image": "redis:7"}]}
    }
    # An element without the key stays as {} so the positions keep their meaning.
    assert sel(pod(), "spec.containers.ports") == {
        "spec": {"containers": [{"ports": [{"containerPort": 80}]}, {}]}
    }


def test_select_by_index_keeps_the_picked_elements_negative_too() -> None:
    assert sel(pod(), "spec.containers[1].image") == {
        "spec": {"containers": [{"image": "redis:7"}]}
    }
    assert sel(pod(), "spec.containers[-1]") == {
        "spec": {"containers": [pod()["spec"]["containers"][1]]}
    }
    # A key path and an index path into the same list: their union.
    assert sel(pod(), "spec.containers.name", "spec.containers[0].image") == {
        "spec": {"containers": [{"name": "a", "image": "nginx:1"}, {"name": "b"}]}
    }


def test_select_missing_paths_give_nothing_not_empty_parents() -> None:
    assert sel(pod(), "spec.nothing", "nope.x", "status.phase.deeper") == {}
    assert sel(pod(), "spec.containers[5]") == {}


# --- fingerprints -------------------------------------------------------------


def test_view_fingerprints_are_32_lowercase_hex() -> None:
    for fp in (
        ViewFingerprinter(["spec"]),
        fingerprinter_for(fields=["status"]),
        fingerprinter_for(generation_only=True),
    ):
        assert HEX32.match(fp.fingerprint(pod()))


def test_trigger_paths_decide_what_is_a_change() -> None:
    fp = fingerprinter_for(trigger=["spec.containers.image"])
    base = fp.fingerprint(pod())
    assert fp.fingerprint(pod(status__phase="Running")) == base
    assert fp.fingerprint(pod(metadata__labels={"app": "x"})) == base
    changed = pod()
    changed["spec"]["containers"][1]["image"] = "redis:8"
    assert fp.fingerprint(changed) != base


def test_ignore_fields_still_remove_paths_inside_triggers() -> None:
    fp = fingerprinter_for(trigger=["status"], ignore_fields=["status.conditions"])
    base = fp.fingerprint(pod())
    assert fp.fingerprint(pod(status__conditions=[])) == base
    assert fp.fingerprint(pod(status__phase="Running")) != base


def test_generation_only_compares_the_generation() -> None:
    fp = fingerprinter_for(generation_only=True)
    base = fp.fingerprint(pod())
    assert fp.fingerprint(pod(status__phase="Running", spec__nodeName="n2")) == base
    assert fp.fingerprint(pod(metadata__generation=2)) != base


def test_generation_only_without_generation_falls_back_to_the_whole_object() -> None:
    cm: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "default", "uid": "u", "resourceVersion": "1"},
        "data": {"k": "v"},
    }
    fp = fingerprinter_for(generation_only=True, label="v1/ConfigMap")
    changed = copy.deepcopy(cm)
    changed["data"]["k"] = "w"
    assert fp.fingerprint(changed) != fp.fingerprint(cm)
    assert fp.fingerprint(cm) == Fingerprinter().fingerprint(cm)


def test_fields_without_triggers_fingerprint_the_projection() -> None:
    fp = fingerprinter_for(fields=["status.phase"])
    base = fp.fingerprint(pod())
    assert fp.fingerprint(pod(spec__nodeName="n2")) == base
    assert fp.fingerprint(pod(metadata__resourceVersion="11")) == base
    assert fp.fingerprint(pod(status__phase="Running")) != base


def test_with_triggers_and_fields_the_triggers_decide() -> None:
    fp = fingerprinter_for(trigger=["spec.nodeName"], fields=["status.phase"])
    base = fp.fingerprint(pod())
    assert fp.fingerprint(pod(status__phase="Running")) == base
    assert fp.fingerprint(pod(spec__nodeName="n2")) != base


def test_no_views_is_the_plain_fingerprinter() -> None:
    fp = fingerprinter_for(ignore_fields=["status"])
    assert type(fp) is Fingerprinter


def test_detector_publishes_modifications_only_of_triggers_adds_and_deletes_always() -> None:
    detector = ChangeDetector(fingerprinter_for(trigger=["spec"]))
    old = pod()
    (added,) = detector.on_add(old)
    assert added.kind is ChangeKind.ADDED
    assert (
        detector.on_update(old, pod(status__phase="Running", metadata__resourceVersion="11")) == []
    )
    (mod,) = detector.on_update(old, pod(spec__nodeName="n2", metadata__resourceVersion="12"))
    assert mod.kind is ChangeKind.MODIFIED
    (gone,) = detector.on_delete(old)
    assert gone.kind is ChangeKind.DELETED


# --- projection in events -----------------------------------------------------


def builder(kind: str = "Pod", **kw: Any) -> EventBuilder:
    return EventBuilder(cluster="c", group="", version="v1", kind=kind, plural="pods", **kw)


def test_projection_keeps_fields_and_identity_in_object_old_and_patch() -> None:
    b = builder(fields=["status.phase"], include_old=True, patch=True)
    detector = ChangeDetector(fingerprinter_for(fields=["status.phase"]))
    old = pod()
    b.build(detector.on_add(old)[0])
    new = pod(status__phase="Running", metadata__resourceVersion="11")
    (change,) = detector.on_update(old, new)
    data = b.build(change).data
    identity = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web",
            "namespace": "default",
            "uid": "u1",
            "resourceVersion": "11",
        },
    }
    assert data["object"] == {**identity, "status": {"phase": "Running"}}
    assert data["old"]["status"] == {"phase": "Pending"} and "spec" not in data["old"]
    assert {"op": "replace", "path": "/status/phase", "value": "Running"} in data["patch"]
    assert all(not op["path"].startswith("/spec") for op in data["patch"])


def test_projection_of_secret_data_is_still_redacted() -> None:
    secret: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "s",
            "namespace": "default",
            "uid": "u",
            "resourceVersion": "1",
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": orjson.dumps(
                    {"data": {"password": "aHVudGVyMg=="}}
                ).decode()
            },
        },
        "data": {"password": "aHVudGVyMg=="},
        "stringData": {"token": "s3cr3t"},
    }
    b = EventBuilder(
        cluster="c",
        group="",
        version="v1",
        kind="Secret",
        plural="secrets",
        fields=["data", "stringData.token", "metadata.annotations"],
        include_old=True,
    )
    detector = ChangeDetector(fingerprinter_for(fields=["data"]))
    event = b.build(detector.on_add(secret)[0])
    wire = event.to_json()
    assert b"aHVudGVyMg==" not in wire and b"s3cr3t" not in wire
    assert event.data["object"]["data"] == {"password": REDACTED}
    assert event.data["object"]["stringData"] == {"token": REDACTED}


def test_projection_then_masks_apply() -> None:
    b = builder(fields=["spec.containers"], mask_paths=["spec.containers.image"])
    obj = b.build(ChangeDetector(Fingerprinter()).on_add(pod())[0]).data["object"]
    assert [c["image"] for c in obj["spec"]["containers"]] == [REDACTED, REDACTED]
    assert "status" not in obj


def test_tombstones_are_not_projected() -> None:
    from bridge.kube.objects import DeletedFinalStateUnknown

    b = builder(fields=["status.phase"])
    detector = ChangeDetector(Fingerprinter())
    (change,) = detector.on_delete(DeletedFinalStateUnknown("default/web", pod()))
    data = b.build(change).data
    assert data["tombstone"] is True
    assert data["object"]["metadata"]["labels"] == {"app": "web"}


def test_no_fields_no_projection() -> None:
    assert compile_projection([]) is None


# --- configuration ------------------------------------------------------------


def _load(tmp_path: Any, resource: dict[str, Any]) -> Any:
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"resources": [resource], "sink": {"kind": "stdout"}}))
    return load_settings(str(path), env={})


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("triggerPaths", ["spec..x"], r"resources\[0\]\.triggerPaths: .*bad path 'spec\.\.x'"),
        ("fields", ["data[x"], r"resources\[0\]\.fields: .*bad path 'data\[x'"),
        ("fields", [""], r"resources\[0\]\.fields: .*bad path ''"),
    ],
)
def test_bad_paths_are_one_line_config_errors(
    tmp_path: Any, key: str, value: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        _load(tmp_path, {"apiVersion": "v1", "kind": "Pod", key: value})
    assert "\n" not in str(info.value)


def test_generation_only_with_trigger_paths_is_a_config_error(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match=r"resources\[0\]\.generationOnly: .*triggerPaths"):
        _load(
            tmp_path,
            {"apiVersion": "v1", "kind": "Pod", "generationOnly": True, "triggerPaths": ["spec"]},
        )


def test_keys_load(tmp_path: Any) -> None:
    s = _load(
        tmp_path,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "triggerPaths": ["spec.containers[0].image"],
            "fields": ["status.phase"],
        },
    )
    res = s.resources[0]
    assert res.trigger_paths == ["spec.containers[0].image"]
    assert res.fields == ["status.phase"] and res.generation_only is False
