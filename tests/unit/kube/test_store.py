"""Indexer: objects by key plus secondary indices (client-go thread_safe_store.go, index.go)."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.kube.objects import DeletedFinalStateUnknown, RawObject
from bridge.kube.store import Indexer, IndexerError, label_index, namespace_index


def obj(name: str, ns: str | None = "ns1", rv: int = 1, **labels: str) -> RawObject:
    metadata: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "resourceVersion": str(rv)}
    if ns is not None:
        metadata["namespace"] = ns
    if labels:
        metadata["labels"] = labels
    return {"metadata": metadata}


def names(objs: list[RawObject]) -> list[str]:
    return [o["metadata"]["name"] for o in objs]


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
    store.delete(DeletedFinalStateUnknown("ns1/p", None))
    assert len(store) == 0
    assert store.by_index("namespace", "ns1") == []


def test_checklist_25_namespace_index_is_exactly_the_objects_in_that_namespace() -> None:
    store = Indexer()
    for name, ns in [("a", "ns1"), ("b", "ns2"), ("c", "ns1"), ("n", None)]:
        store.add(obj(name, ns))
    assert names(store.by_index("namespace", "ns1")) == ["a", "c"]
    assert names(store.by_index("namespace", "ns2")) == ["b"]
    assert store.by_index("namespace", "nope") == []
    # client-go indexes cluster-scoped objects under the empty namespace.
    assert names(store.by_index("namespace", "")) == ["n"]
    assert store.list_index_func_values("namespace") == ["", "ns1", "ns2"]

    store.delete(obj("a"))
    assert names(store.by_index("namespace", "ns1")) == ["c"]
    store.delete(obj("c"))
    assert "ns1" not in store.list_index_func_values("namespace")


def test_checklist_25_an_index_follows_an_object_whose_value_changes() -> None:
    store = Indexer(indexers={"app": label_index("app")})
    store.add(obj("p", app="web"))
    store.add(obj("q", app="web"))
    assert store.index_keys("app", "web") == ["ns1/p", "ns1/q"]

    store.update(obj("p", rv=2, app="db"))
    assert store.index_keys("app", "web") == ["ns1/q"]
    assert store.index_keys("app", "db") == ["ns1/p"]

    store.update(obj("p", rv=3))  # label removed
    assert store.index_keys("app", "db") == []
    assert store.list_index_func_values("app") == ["web"]


def test_index_function_with_several_values() -> None:
    def containers(o: RawObject) -> list[str]:
        return list(o["metadata"].get("labels", {}).values())

    store = Indexer(indexers={"values": containers})
    store.add(obj("p", a="x", b="y"))
    assert store.index_keys("values", "x") == ["ns1/p"]
    assert store.index_keys("values", "y") == ["ns1/p"]
    store.update(obj("p", a="x"))
    assert store.index_keys("values", "y") == []


def test_checklist_25_adding_indexers_to_a_store_holding_objects_is_an_error() -> None:
    store = Indexer()
    store.add_indexers({"app": label_index("app")})
    store.add(obj("p", app="web"))
    with pytest.raises(IndexerError, match="already holds objects"):
        store.add_indexers({"tier": label_index("tier")})


def test_conflicting_and_unknown_index_names_are_errors() -> None:
    store = Indexer()
    with pytest.raises(IndexerError, match="conflict"):
        store.add_indexers({"namespace": namespace_index})
    with pytest.raises(IndexerError, match="does not exist"):
        store.by_index("nope", "x")
    with pytest.raises(IndexerError):
        store.list_index_func_values("nope")


def test_replace_swaps_content_and_rebuilds_indices() -> None:
    store = Indexer(indexers={"app": label_index("app")})
    store.add(obj("old", app="web"))
    store.replace([obj("new", "ns2", app="db")], "42")
    assert store.list_keys() == ["ns2/new"]
    assert store.index_keys("app", "web") == []
    assert store.index_keys("app", "db") == ["ns2/new"]
    assert store.list_index_func_values("namespace") == ["ns2"]


def test_update_of_an_unknown_key_adds_and_delete_of_unknown_key_is_quiet() -> None:
    store = Indexer()
    store.update(obj("p"))
    assert store.list() == [obj("p")]
    store.delete(obj("ghost"))
    store.delete_by_key("ghost")
    assert len(store) == 1


@pytest.mark.parametrize("extra", [None, {"app": label_index("app")}])
def test_a_store_without_the_namespace_index_keeps_objects_and_other_indices(
    extra: dict[str, Any] | None,
) -> None:
    from bridge.kube.records import make_record

    fp = "0123456789abcdef0123456789abcdef"
    uid = "0b5c7f3e-5d2a-4c57-9d7e-8f1b6c1f2a3b"
    store = Indexer(by_namespace=False, indexers=extra)
    assert "namespace" not in store.indexers
    store.add(obj("a", app="web"))
    store.update(obj("a", rv=2, app="db"))
    store.add(obj("b", ns="ns2"))
    assert store.get_by_key("ns1/a") == obj("a", rv=2, app="db")
    with pytest.raises(IndexerError):
        store.index_keys("namespace", "ns1")
    if extra:
        assert store.index_keys("app", "db") == ["ns1/a"]
    store.delete(obj("a"))
    assert store.list_keys() == ["ns2/b"]
    store.replace([make_record("ns3/c", uid, "7", fp), obj("d", ns="ns4", app="web")])
    assert sorted(store.list_keys()) == ["ns3/c", "ns4/d"]
    assert store.get_by_key("ns3/c") == make_record("ns3/c", uid, "7", fp)
    if extra:
        assert store.index_keys("app", "web") == ["ns4/d"]


def test_replace_rebuilds_the_namespace_index_of_records_and_objects() -> None:
    from bridge.kube.records import make_record

    fp = "0123456789abcdef0123456789abcdef"
    uid = "0b5c7f3e-5d2a-4c57-9d7e-8f1b6c1f2a3b"
    store = Indexer()
    store.add(obj("old", ns="ns9"))
    store.replace([make_record("ns1/a", uid, "7", fp), obj("b"), obj("c", ns="ns2")])
    assert store.index_keys("namespace", "ns1") == ["ns1/a", "ns1/b"]
    assert store.index_keys("namespace", "ns2") == ["ns2/c"]
    assert store.list_index_func_values("namespace") == ["ns1", "ns2"]
