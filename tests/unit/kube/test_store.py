"""Indexer: objects by key (client-go thread_safe_store.go; its indexes are not reproduced)."""

from __future__ import annotations

from typing import Any

from bridge.ground.records import PackedColumns, make_record
from bridge.kube.objects import DeletedFinalStateUnknown, RawObject
from bridge.kube.store import Indexer

FP = "0123456789abcdef0123456789abcdef"
UID = "0b5c7f3e-5d2a-4c57-9d7e-8f1b6c1f2a3b"


def obj(name: str, ns: str | None = "ns1", rv: int = 1) -> RawObject:
    metadata: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "resourceVersion": str(rv)}
    if ns is not None:
        metadata["namespace"] = ns
    return {"metadata": metadata}


def test_checklist_27_keys_are_namespace_slash_name_or_name_for_cluster_scoped() -> None:
    store = Indexer()
    store.add(obj("p", "ns1"))
    store.add(obj("node-1", None))
    assert store.list_keys() == ["ns1/p", "node-1"]
    assert store.get_by_key("node-1") == obj("node-1", None)
    assert store.get(obj("p", "ns1", rv=9)) == obj("p", "ns1")


def test_checklist_27_a_tombstone_is_deleted_by_its_own_key() -> None:
    store = Indexer()
    store.add(obj("p"))
    store.add(obj("q"))
    store.delete(DeletedFinalStateUnknown("ns1/p", None))
    assert store.list_keys() == ["ns1/q"]


def test_update_of_an_unknown_key_adds_and_delete_of_unknown_key_is_quiet() -> None:
    store = Indexer()
    store.update(obj("p"))
    assert store.list() == [obj("p")]
    store.delete(obj("ghost"))
    store.delete_by_key("ghost")
    assert len(store) == 1


def test_replace_swaps_the_whole_content_of_records_and_objects() -> None:
    store = Indexer()
    store.add(obj("old", ns="ns9"))
    store.update(obj("a", rv=2))
    store.replace([make_record("ns1/a", UID, "7", FP), obj("b"), obj("c", ns="ns2")], "42")
    assert sorted(store.list_keys()) == ["ns1/a", "ns1/b", "ns2/c"]
    assert store.get_by_key("ns1/a") == make_record("ns1/a", UID, "7", FP)
    assert "ns9/old" not in store and "ns1/b" in store


def test_a_restart_loads_packed_columns_empties_them_and_items_win() -> None:
    """A checkpoint's packed columns go into the table whole (and are emptied, so their
    strings are freed); the items given beside them win over a column's key; a key the
    table cannot hold is kept all the same."""
    records = [make_record(f"ns/p{i}", UID, str(i), FP) for i in range(3000)]
    odd = make_record("ns/\udc80", UID, "1", FP)  # a lone surrogate: not for the table
    columns = PackedColumns(
        [r.key for r in records],
        [r.packed for r in records],  # type: ignore[union-attr]
    )
    store = Indexer()
    store.add(obj("old"))
    store.replace([make_record("ns/p5", "not-a-uuid", "9", FP)], "42", packed=columns)
    assert not columns.keys and not columns.packed
    assert len(store) == 3000 and "ns1/old" not in store
    assert store.get_by_key("ns/p5") == make_record("ns/p5", "not-a-uuid", "9", FP)
    assert store.get_by_key("ns/p2999") == records[2999]
    with_odd = PackedColumns(
        ["ns/a", odd.key],
        [records[0].packed, odd.packed],  # type: ignore[union-attr]
    )
    store.replace([], packed=with_odd)
    assert sorted(store.list_keys()) == sorted(["ns/a", odd.key])
    assert store.get_by_key(odd.key) == odd
