"""Change detection: fingerprints, ignored paths, what the informer callbacks publish."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from bridge.delivery.changes import (
    ChangeDetector,
    ChangeKind,
    Fingerprinter,
    compile_ignore_paths,
    strip_paths,
    transform_paths,
)
from bridge.errors import ConfigError
from bridge.ground.digest import Digest
from bridge.kube.objects import DeletedFinalStateUnknown


def pod(name: str = "web", *, uid: str = "u1", rv: str = "10", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ns1",
            "uid": uid,
            "resourceVersion": rv,
            "managedFields": [{"manager": "kubectl", "time": f"t{rv}"}],
        },
        "spec": {"containers": [{"name": "c", "image": "nginx:1"}], **spec},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True", "lastHeartbeatTime": "t1"},
                {"type": "Scheduled", "status": "True", "lastHeartbeatTime": "t1"},
            ],
        },
    }


# --- ignored paths -----------------------------------------------------------------


def test_resource_version_and_managed_fields_are_always_ignored() -> None:
    fp = Fingerprinter([])
    a = pod(rv="10")
    b = pod(rv="11")
    b["metadata"]["managedFields"] = [{"manager": "other"}]
    assert fp.fingerprint(a) == fp.fingerprint(b)


def test_other_fields_change_the_fingerprint() -> None:
    fp = Fingerprinter([])
    a = pod()
    b = pod()
    b["spec"]["containers"][0]["image"] = "nginx:2"
    assert fp.fingerprint(a) != fp.fingerprint(b)


def test_key_order_does_not_matter() -> None:
    fp = Fingerprinter([])
    a = {"metadata": {"name": "x", "uid": "u"}, "spec": {"a": 1, "b": 2}}
    b = {"spec": {"b": 2, "a": 1}, "metadata": {"uid": "u", "name": "x"}}
    assert fp.fingerprint(a) == fp.fingerprint(b)


def test_segment_on_a_list_applies_to_every_element() -> None:
    fp = Fingerprinter(["status.conditions.lastHeartbeatTime"])
    a = pod()
    b = pod()
    for c in b["status"]["conditions"]:
        c["lastHeartbeatTime"] = "t999"
    assert fp.fingerprint(a) == fp.fingerprint(b)
    b["status"]["conditions"][1]["status"] = "False"
    assert fp.fingerprint(a) != fp.fingerprint(b)


def test_index_selects_one_element() -> None:
    fp = Fingerprinter(["status.conditions[0].lastHeartbeatTime"])
    a = pod()
    b = pod()
    b["status"]["conditions"][0]["lastHeartbeatTime"] = "t2"
    assert fp.fingerprint(a) == fp.fingerprint(b)
    b["status"]["conditions"][1]["lastHeartbeatTime"] = "t2"
    assert fp.fingerprint(a) != fp.fingerprint(b)


def test_whole_subtree_and_list_element_removal() -> None:
    trie = compile_ignore_paths(["status", "spec.containers[0]"])
    obj = pod()
    obj["spec"]["containers"].append({"name": "sidecar"})
    out = strip_paths(obj, trie)
    assert "status" not in out
    assert out["spec"]["containers"] == [{"name": "sidecar"}]
    assert "resourceVersion" not in out["metadata"]
    assert "managedFields" not in out["metadata"]


def test_stripping_never_mutates_the_input_and_shares_untouched_branches() -> None:
    obj = pod()
    before = copy.deepcopy(obj)
    fp = Fingerprinter(["status.conditions.lastHeartbeatTime", "spec.containers[0].image"])
    fp.fingerprint(obj)
    out = strip_paths(obj, compile_ignore_paths(["status.conditions.lastHeartbeatTime"]))
    assert obj == before
    assert out["spec"] is obj["spec"]  # copied only along removed paths
    assert out["status"] is not obj["status"]
    assert "lastHeartbeatTime" not in out["status"]["conditions"][0]


def test_paths_that_do_not_exist_are_harmless() -> None:
    fp = Fingerprinter(["spec.nothing.here", "status.conditions[7].x", "metadata.name.deep"])
    assert fp.fingerprint(pod()) == Fingerprinter([]).fingerprint(pod())


@pytest.mark.parametrize("bad", ["", "a..b", ".a", "a.", "a[x]", "a]"])
def test_bad_paths_are_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError, match="ignore path"):
        compile_ignore_paths([bad])


def test_fingerprint_is_128_bit_hex() -> None:
    fp = Fingerprinter([]).fingerprint(pod())
    assert len(fp) == 32
    int(fp, 16)


# --- change detector ---------------------------------------------------------------

detector = ChangeDetector(Fingerprinter(["status.conditions.lastHeartbeatTime"]))


def test_add_without_knowledge_publishes_added_with_digest() -> None:
    [c] = detector.on_add(pod(), None, initial=True)
    assert c.kind is ChangeKind.ADDED
    assert c.initial
    assert c.key == "ns1/web"
    assert c.digest == Digest("ns1/web", "u1", "10", detector.fingerprinter.fingerprint(pod()))


def test_add_matching_a_checkpointed_digest_is_a_restart_echo() -> None:
    known = detector.digest_of(pod(rv="10"))
    assert detector.on_add(pod(rv="10"), known) == []
    # Only ignored fields moved while we were away: still nothing.
    later = pod(rv="12")
    later["status"]["conditions"][0]["lastHeartbeatTime"] = "t9"
    assert detector.on_add(later, known) == []


def test_add_differing_from_the_digest_is_a_modification() -> None:
    known = detector.digest_of(pod(rv="10"))
    [c] = detector.on_add(pod(rv="15", nodeName="n2"), known)
    assert c.kind is ChangeKind.MODIFIED
    assert c.digest is not None and c.digest.resource_version == "15"


def test_checklist_28_add_with_a_new_uid_is_delete_then_add() -> None:
    known = detector.digest_of(pod(uid="old", rv="10"))
    deleted, added = detector.on_add(pod(uid="new", rv="20"), known)
    assert deleted.kind is ChangeKind.DELETED and deleted.tombstone
    assert deleted.object["metadata"]["uid"] == "old"
    assert deleted.object["metadata"]["resourceVersion"] == "10"
    assert deleted.object["metadata"]["namespace"] == "ns1"
    assert deleted.digest is None
    assert added.kind is ChangeKind.ADDED and added.object["metadata"]["uid"] == "new"


def test_noop_update_publishes_nothing() -> None:
    old = pod(rv="10")
    new = pod(rv="11")  # resync / relist echo / managedFields churn
    new["status"]["conditions"][1]["lastHeartbeatTime"] = "t5"
    assert detector.on_update(old, new) == []
    assert detector.on_update(detector.fingerprinter.fingerprint(old), new) == []
    assert detector.on_update(detector.digest_of(old), new) == []


def test_slim_record_as_old() -> None:
    old = pod(rv="10")
    slim = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "ns1", "uid": "u1", "resourceVersion": "10"},
        "fingerprint": detector.fingerprinter.fingerprint(old),
    }
    assert detector.on_update(slim, pod(rv="11")) == []
    [c] = detector.on_update(slim, pod(rv="12", nodeName="n1"))
    assert c.kind is ChangeKind.MODIFIED
    assert c.old is None  # a slim record is not an object to diff against


def test_real_update_is_modified_with_old() -> None:
    old = pod(rv="10")
    new = pod(rv="11", nodeName="n1")
    [c] = detector.on_update(old, new)
    assert c.kind is ChangeKind.MODIFIED
    assert c.old is old and c.object is new
    assert c.digest == detector.digest_of(new)


def test_checklist_28_update_with_different_uid_is_delete_of_old_and_add_of_new() -> None:
    old = pod(uid="old", rv="10")
    new = pod(uid="new", rv="30")
    deleted, added = detector.on_update(old, new)
    assert deleted.kind is ChangeKind.DELETED and deleted.tombstone
    assert deleted.object["metadata"] == {
        "name": "web",
        "namespace": "ns1",
        "uid": "old",
        "resourceVersion": "10",
    }
    assert added.kind is ChangeKind.ADDED and added.digest is not None
    assert added.digest.uid == "new"
    # The same from a digest.
    deleted, added = detector.on_update(detector.digest_of(old), new)
    assert deleted.object["metadata"]["uid"] == "old"
    assert added.kind is ChangeKind.ADDED


def test_delete_is_always_published() -> None:
    obj = pod()
    [c] = detector.on_delete(obj)
    assert c.kind is ChangeKind.DELETED and not c.tombstone and c.object is obj
    assert c.digest is None
    assert detector.on_delete(obj) == [c]  # no memory: a second delete publishes again


def test_tombstone_delete_carries_last_known_state() -> None:
    [c] = detector.on_delete(DeletedFinalStateUnknown("ns1/web", pod()))
    assert c.tombstone and c.key == "ns1/web" and c.object["metadata"]["uid"] == "u1"
    [c] = detector.on_delete(DeletedFinalStateUnknown("ns1/gone", None))
    assert c.tombstone
    assert c.object["metadata"] == {"name": "gone", "namespace": "ns1"}
    slim = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "n", "uid": "u"},
        "fingerprint": "f",
    }
    [c] = detector.on_delete(DeletedFinalStateUnknown("n", slim))
    assert "fingerprint" not in c.object and c.object["metadata"]["uid"] == "u"


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
_metadata = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "name": st.text(max_size=5),
            "resourceVersion": st.text(max_size=5),
            "managedFields": st.lists(_json, max_size=2),
            "labels": st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
        },
    ),
    _json,  # not a dict: a list of dicts too, which a trie path reaches into
)


@given(
    st.fixed_dictionaries({"metadata": _metadata}, optional={"kind": st.just("Pod"), "spec": _json})
)
def test_the_default_fingerprint_strips_as_the_ignore_trie_does(obj: dict[str, Any]) -> None:
    """The shortcut for no ignoreFields hashes what the general path hashes."""
    general = transform_paths(obj, compile_ignore_paths([]), None)
    want = xxhash.xxh3_128_hexdigest(orjson.dumps(general, option=orjson.OPT_SORT_KEYS))
    before = copy.deepcopy(obj)
    assert Fingerprinter().fingerprint(obj) == want
    assert obj == before  # never mutated
