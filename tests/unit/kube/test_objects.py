"""Keys of objects, records and tombstones (client-go's MetaNamespaceKeyFunc)."""

from __future__ import annotations

from bridge.ground.records import make_record
from bridge.kube.objects import DeletedFinalStateUnknown, namespace_key


def test_each_object_gets_its_own_key_however_often_asked() -> None:
    """The last object keyed is remembered: asking again, or asking of another
    object between, never hands one object's key to another."""
    a = {"metadata": {"namespace": "ns", "name": "a"}}
    b = {"metadata": {"namespace": "ns", "name": "b"}}
    node = {"metadata": {"name": "node-1"}}
    asked = [a, a, b, a, node, node, b, {"metadata": {"namespace": "ns", "name": "a"}}]
    assert [namespace_key(o) for o in asked] == [
        "ns/a", "ns/a", "ns/b", "ns/a", "node-1", "node-1", "ns/b", "ns/a"
    ]  # fmt: skip


def test_records_and_tombstones_carry_their_own_key() -> None:
    record = make_record("ns/r", "0b7e8f3c-1234-4a5b-9c8d-0123456789ab", "7", "0" * 32)
    tombstone = DeletedFinalStateUnknown("ns/t", None)
    obj = {"metadata": {"namespace": "ns", "name": "o"}}
    assert [namespace_key(x) for x in (obj, record, tombstone, obj)] == [
        "ns/o", "ns/r", "ns/t", "ns/o"
    ]  # fmt: skip


def test_metadata_of_another_type_keys_as_empty() -> None:
    assert namespace_key({"metadata": None}) == ""
    assert namespace_key({"metadata": ["not", "a", "dict"]}) == ""
